// Transport on UCX (see transport.h; the parts: transport_impl.h): start and stop, the progress
// loop, deadlines, connecting, calls, closing a connection, the service threads, and the
// public methods.
#include "transport/transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sodium.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "transport/transport_impl.h"
#include "transport/wire.h"
#include "transport/wire_format.h"
#include "util/assert.h"
#include "util/clock.h"
#include "util/thread_name.h"

namespace ckpt::transport {

static_assert(crypto_auth_BYTES == kMacBytes);

Status ParseHostPort(const std::string& address, sockaddr_storage* out, socklen_t* len) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return Status::Invalid("address '" + address + "' is not host:port");
  }
  std::string host = address.substr(0, colon);
  std::string port = address.substr(colon + 1);
  for (char ch : port) {
    if (ch < '0' || ch > '9') return Status::Invalid("address '" + address + "': bad port");
  }
  if (port.size() > 5 || std::stoul(port) > 65535) {
    return Status::Invalid("address '" + address + "': port out of range");
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::Invalid("address '" + address + "': cannot resolve '" + host +
                           "': " + gai_strerror(rc));
  }
  std::memcpy(out, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return Status::Ok();
}

std::string SockaddrText(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
    port = ntohs(in->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

Status TransportImpl::Init() {
  if (options_.job_token.empty()) {
    return Status::Invalid(options_.name + ": no job token (set CKPTDB_JOB_TOKEN or job_token)");
  }
  if (options_.max_in_flight == 0 || options_.max_in_flight > 4096) {
    return Status::Invalid(options_.name + ": max_in_flight must be 1..4096");
  }
  if (options_.handshake_timeout_ms <= 0) {
    return Status::Invalid(options_.name + ": handshake_timeout_ms must be positive");
  }
  if (sodium_init() < 0) return Status::Internal("libsodium failed to initialize");
  key_ = HandshakeKey(options_.job_token);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (wake_fd_ < 0 || epoll_fd_ < 0 || spare_fd_ < 0) {
    return Status::FromErrno(errno, options_.name + ": transport eventfd/epoll");
  }
  // ckptdb's own listener first: a port that is taken fails the start before UCX is set up.
  if (!options_.listen.empty()) CKPTDB_RETURN_IF_ERROR(Listen());
  Watch(wake_fd_, EPOLLIN, EPOLL_CTL_ADD);
  if (listen_fd_ >= 0) Watch(listen_fd_, EPOLLIN, EPOLL_CTL_ADD);
  ucx_tls_ = UcxTransports(options_.tls);
  if (!ucx_tls_.empty()) CKPTDB_RETURN_IF_ERROR(StartUcx());
  thread_ = std::thread([this] { Loop(); });
  for (uint32_t i = 0; i < std::max(1u, options_.service_threads); ++i) {
    service_.emplace_back([this] { ServiceLoop(); });
  }
  return Status::Ok();
}

// UCX's tcp transport listens on ports of its own and parses what strangers send there (a
// crafted packet aborts the process in UCX 1.13), so ckptdb never lets UCX use tcp: what UCX
// would carry over tcp goes on ckptdb's own authenticated socket instead. From "tcp", "shm,tcp",
// "^rc" or "" (UCX_TLS from the environment, else everything): the same list without tcp;
// empty when nothing is left (every connection then takes the socket path and no UCX worker
// runs).
std::vector<std::string> TlsItems(const std::string& list) {
  std::vector<std::string> out;
  size_t at = !list.empty() && list[0] == '^' ? 1 : 0;
  while (at <= list.size()) {
    size_t comma = list.find(',', at);
    if (comma == std::string::npos) comma = list.size();
    if (comma > at) out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

std::string UcxTransports(const std::string& tls) {
  std::string spec = tls;
  if (spec.empty()) {
    const char* env = std::getenv("UCX_TLS");
    spec = env != nullptr ? env : "";
  }
  if (spec.empty() || spec == "all") return "^tcp";
  const bool negated = spec[0] == '^';
  std::string out = negated ? "^" : "";
  bool has_tcp = false;
  for (const std::string& item : TlsItems(spec)) {
    if (item == "tcp") {
      has_tcp = true;
      if (!negated) continue;
    }
    if (out.size() > (negated ? 1u : 0u)) out += ",";
    out += item;
  }
  if (negated && !has_tcp) out += out.size() > 1 ? ",tcp" : "tcp";
  return out == "^" ? "" : out;
}

Status TransportImpl::StartUcx() {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return Status::Internal("UCX: ucp_config_read: " + UcsText(s));
  s = ucp_config_modify(config, "TLS", ucx_tls_.c_str());
  if (s != UCS_OK) {
    ucp_config_release(config);
    return Status::Invalid(options_.name + ": UCX_TLS '" + ucx_tls_ + "' (from '" + options_.tls +
                           "'): " + UcsText(s));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "ckptdb";
  s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK) return Status::Internal(options_.name + ": UCX ucp_init: " + UcsText(s));

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  s = ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) return Status::Internal(options_.name + ": UCX worker: " + UcsText(s));
  ucp_worker_attr_t wa{};
  wa.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  s = ucp_worker_query(worker_, &wa);
  if (s == UCS_OK && wa.max_am_header < kWireHeaderBytes + kMaxBodyBytes) {
    return Status::NotSupported(options_.name + ": UCX allows active-message headers of " +
                                std::to_string(wa.max_am_header) + " bytes, ckptdb needs " +
                                std::to_string(kWireHeaderBytes + kMaxBodyBytes));
  }
  ucp_address_t* address = nullptr;
  size_t address_bytes = 0;
  s = ucp_worker_get_address(worker_, &address, &address_bytes);
  if (s != UCS_OK) return Status::Internal(options_.name + ": UCX worker address: " + UcsText(s));
  const auto* a = reinterpret_cast<const uint8_t*>(address);
  worker_address_.assign(a, a + address_bytes);
  ucp_worker_release_address(worker_, address);
  if (worker_address_.empty() || worker_address_.size() > kMaxWorkerAddressBytes) {
    return Status::NotSupported(options_.name + ": UCX's worker address is " +
                                std::to_string(worker_address_.size()) + " bytes, ckptdb sends " +
                                std::to_string(kMaxWorkerAddressBytes) + " at most");
  }
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  hp.id = kAmId;
  hp.cb = &TransportImpl::OnAm;
  hp.arg = this;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG;
  s = ucp_worker_set_am_recv_handler(worker_, &hp);
  if (s != UCS_OK) return Status::Internal("UCX am handler: " + UcsText(s));
  s = ucp_worker_get_efd(worker_, &worker_fd_);
  if (s != UCS_OK) return Status::Internal("UCX worker efd: " + UcsText(s));
  Watch(worker_fd_, EPOLLIN, EPOLL_CTL_ADD);
  return Status::Ok();
}

// A plain TCP listener, ckptdb's own: whatever connects must finish the handshake on it before
// anything is handed to UCX (no ucp_listener is ever created).
Status TransportImpl::Listen() {
  sockaddr_storage ss{};
  socklen_t len = 0;
  CKPTDB_RETURN_IF_ERROR(ParseHostPort(options_.listen, &ss, &len));
  const std::string what = options_.name + ": cannot listen on " + options_.listen;
  listen_fd_ = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return Status::FromErrno(errno, what);
  // A restarted coordinator listens on its old port at once, though connections of its killed
  // predecessor linger in TIME_WAIT there.
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(listen_fd_, reinterpret_cast<const sockaddr*>(&ss), len) != 0 ||
      listen(listen_fd_, kListenBacklog) != 0) {
    return Status::Invalid(what + ": " + std::strerror(errno));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof bound;
  if (getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) {
    return Status::FromErrno(errno, what);
  }
  address_ = SockaddrText(bound);
  // A wildcard listen address is reachable at the host it was asked for, not 0.0.0.0.
  std::string host = options_.listen.substr(0, options_.listen.rfind(':'));
  if (address_.rfind("0.0.0.0:", 0) == 0 && host != "0.0.0.0") {
    address_ = host + address_.substr(address_.rfind(':'));
  }
  return Status::Ok();
}

void TransportImpl::Watch(int fd, uint32_t events, int op) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  int rc = epoll_ctl(epoll_fd_, op, fd, &ev);
  CKPTDB_ASSERT(rc == 0 || op == EPOLL_CTL_DEL);
}

void TransportImpl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (thread_.joinable()) {
    Post([this] {
      std::vector<uint64_t> ids;
      for (auto& [id, c] : conns_) ids.push_back(id);
      for (uint64_t id : ids) CloseConn(id, options_.name + " is shutting down", true);
      stopping_ = true;
    });
    thread_.join();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  requests_cv_.notify_all();
  for (std::thread& t : service_) t.join();
  service_.clear();
  for (auto& [fd, id] : by_fd_) close(fd);
  by_fd_.clear();
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  for (int fd : {listen_fd_, spare_fd_, wake_fd_, epoll_fd_}) {
    if (fd >= 0) close(fd);
  }
}

void TransportImpl::Loop() {
  SetThreadName("ckpt-net");
  // sendfile has no MSG_NOSIGNAL: a peer that closed its end would raise SIGPIPE, whose default
  // ends the process. Blocked in this thread only (a library does not change the process's
  // dispositions); FlushSock takes back a SIGPIPE it raised.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  epoll_event events[64];
  while (true) {
    while (worker_ != nullptr && ucp_worker_progress(worker_) != 0) {
    }
    StartPendingRecvs();
    RunOps();
    CheckDeadlines();
    if (stopping_) {
      // Let the closes finish (bounded): flush requests complete or fail quickly once forced.
      int64_t until = MonoMs() + 2000;
      while (MonoMs() < until) {
        if (worker_ != nullptr) ucp_worker_progress(worker_);
        std::lock_guard<std::mutex> lock(mu_);
        if (conns_.empty()) break;
      }
      return;
    }
    if (!pending_recvs_.empty()) continue;
    if (worker_ != nullptr && ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
    int n = epoll_wait(epoll_fd_, events, 64, 50);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) {
        uint64_t v;
        ssize_t r = read(wake_fd_, &v, sizeof v);
        (void)r;
      } else if (fd == listen_fd_) {
        AcceptAll();
      } else if (fd != worker_fd_) {
        OnSocket(fd, events[i].events);
      }
    }
  }
}

void TransportImpl::RunOps() {
  std::deque<std::function<void()>> ops;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ops.swap(ops_);
  }
  for (auto& op : ops) op();
}

void TransportImpl::CheckDeadlines() {
  int64_t now = MonoMs();
  std::vector<uint64_t> expired_conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, c] : conns_) {
      if (c->state != ConnState::kOpen && c->state != ConnState::kClosed &&
          c->handshake_deadline_ms != 0 && now > c->handshake_deadline_ms) {
        expired_conns.push_back(id);
      }
    }
  }
  for (uint64_t id : expired_conns) {
    CloseConn(id,
              "the handshake did not finish within " +
                  std::to_string(options_.handshake_timeout_ms) + " ms",
              false);
  }
}

void TransportImpl::LogHostile(const std::string& line) {
  const int64_t now = MonoMs();
  if (now - hostile_window_start_ms_ >= kHostileLogWindowMs) {
    if (hostile_suppressed_ > 0) {
      Log(std::to_string(hostile_suppressed_) + " more connections or messages from strangers " +
          "were refused in the last " + std::to_string(kHostileLogWindowMs / 1000) +
          " s (not logged one by one)");
    }
    hostile_window_start_ms_ = now;
    hostile_logged_ = 0;
    hostile_suppressed_ = 0;
  }
  if (hostile_logged_ < kHostileLogLines) {
    hostile_logged_++;
    Log(line);
  } else {
    hostile_suppressed_++;
  }
}

void TransportImpl::Deliver(uint64_t conn, const WireHeader& h, std::vector<uint8_t> body,
                            std::vector<uint8_t> payload, PayloadPlace placed,
                            size_t placed_bytes) {
  Request r;
  r.from = conn;
  r.type = h.type;
  r.body = std::move(body);
  r.payload = std::move(payload);
  r.placed = std::move(placed);
  r.placed_bytes = r.placed.data != nullptr ? placed_bytes : 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = conns_.find(conn);
    if (it == conns_.end()) return;
    r.peer = it->second->peer;
    r.call_id = h.call_id;
    requests_.push_back(std::move(r));
  }
  requests_cv_.notify_one();
}

void TransportImpl::ServiceLoop() {
  SetThreadName("ckpt-net-serve");
  while (true) {
    Request r;
    {
      std::unique_lock<std::mutex> lock(mu_);
      requests_cv_.wait(lock, [this] { return stopping_ || !requests_.empty(); });
      if (stopping_) return;
      r = std::move(requests_.front());
      requests_.pop_front();
    }
    auto reply = std::make_shared<Reply>();
    try {
      handler_(r, reply.get());
    } catch (const std::exception& e) {
      reply->status = CKPTDB_EINTERNAL;
      reply->message = std::string("the request handler threw: ") + e.what();
    }
    uint64_t conn = r.from;
    uint64_t call_id = r.call_id;
    uint16_t type = r.type;
    Post([this, conn, call_id, type, reply] {
      std::shared_ptr<Conn> c;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = conns_.find(conn);
        if (it == conns_.end()) return;
        c = it->second;
      }
      if (c->requests_in > 0) c->requests_in--;
      if (c->state != ConnState::kOpen) return;
      if (reply->status != 0) {
        Send(c.get(), Kind::kReply, type, call_id, reply->status,
             {reinterpret_cast<const uint8_t*>(reply->message.data()), reply->message.size()},
             nullptr, 0, nullptr, nullptr);
      } else {
        Send(c.get(), Kind::kReply, type, call_id, 0, reply->body, reply->payload,
             reply->payload_bytes, std::shared_ptr<const void>(reply, nullptr), nullptr,
             reply->payload_fd, reply->payload_file_offset);
      }
    });
  }
}

// Closes a connection: its calls fail (EPEER naming why), its socket is closed (which tells the
// peer), its endpoint is closed (flushed when graceful, else forced) and it leaves the tables.
// Progress thread only.
void TransportImpl::CloseConn(uint64_t id, const std::string& why, bool graceful) {
  std::shared_ptr<Conn> c;
  std::map<uint64_t, std::shared_ptr<Call::State>> calls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    c = it->second;
    conns_.erase(it);
    calls.swap(c->calls);
    for (auto& [cid, call] : calls) deadlines_.erase(cid);
    c->calls_out = 0;
    if (c->client && !c->connect_done) {
      c->connect_done = true;
      c->connect_status = Status::Peer("connecting to " + c->peer + " failed: " + why);
    }
    if (!c->client && c->state != ConnState::kOpen) stats_.unauthenticated++;
  }
  cv_.notify_all();
  if (!c->client && c->state != ConnState::kOpen && !stopping_) {
    LogHostile("connection from " + c->peer + " closed before it authenticated: " + why);
  }
  c->state = ConnState::kClosed;
  c->closed_why = why;
  pending_.erase(c->id);
  if (c->my_key != 0) {
    auto k = by_key_.find(c->my_key);
    if (k != by_key_.end() && k->second == c.get()) by_key_.erase(k);
  }
  if (c->fd >= 0) {
    Watch(c->fd, 0, EPOLL_CTL_DEL);
    by_fd_.erase(c->fd);
    close(c->fd);
    c->fd = -1;
  }
  for (auto& [cid, call] : calls) {
    call->Settle(Status::Peer(c->peer + " is gone: " + why));
  }
  // The socket path's queue and the reply being read: the buffers go back to their callers.
  std::deque<OutMsg> sendq;
  sendq.swap(c->sendq);
  for (OutMsg& m : sendq) {
    if (m.call == nullptr) continue;
    {
      std::lock_guard<std::mutex> lock(m.call->mu);
      m.call->send_done = true;
    }
    m.call->Settle(Status::Peer(c->peer + " is gone: " + why));
    m.call->UpdateReleased();
  }
  if (c->rx.call != nullptr) {
    {
      std::lock_guard<std::mutex> lock(c->rx.call->mu);
      c->rx.call->recv_busy = false;
    }
    c->rx.call->Settle(Status::Peer(c->peer + " is gone: " + why));
    c->rx.call->UpdateReleased();
  }
  c->rx = RxState{};
  if (c->ep == nullptr) return;
  by_ep_.erase(c->ep);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  // A forced close needs peer-failure handling on both ends (ucp.h).
  param.flags = graceful || options_.ucx_without_peer_failure ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(c->ep, &param);
  c->ep = nullptr;
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    // Progress until the close completes (bounded: a forced close does not wait for the peer).
    int64_t until = MonoMs() + 1000;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && MonoMs() < until) {
      ucp_worker_progress(worker_);
    }
    if (ucp_request_check_status(r) == UCS_INPROGRESS) {
      ucp_request_cancel(worker_, r);
    }
    ucp_request_free(r);
  }
}

Status TransportImpl::Connect(const std::string& address, int timeout_ms, PeerId* out) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  CKPTDB_RETURN_IF_ERROR(ParseHostPort(address, &ss, &len));
  auto c = std::make_shared<Conn>();
  c->client = true;
  c->peer = address;
  c->state = ConnState::kClientConnecting;
  c->handshake_deadline_ms = MonoMs() + std::min(timeout_ms, options_.handshake_timeout_ms);
  randombytes_buf(c->my_nonce, kNonceBytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    c->id = next_conn_++;
  }
  Post([this, c, ss, len] {
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0 && connect(fd, reinterpret_cast<const sockaddr*>(&ss), len) != 0 &&
        errno != EINPROGRESS) {
      err = errno;
      close(fd);
    }
    if (err != 0) {
      std::lock_guard<std::mutex> lock(mu_);
      c->connect_done = true;
      c->connect_status = Status::Peer("cannot connect to " + c->peer + ": " + std::strerror(err));
      cv_.notify_all();
      return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    {
      std::lock_guard<std::mutex> lock(mu_);
      conns_[c->id] = c;
    }
    by_fd_[fd] = c->id;
    Watch(fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP, EPOLL_CTL_ADD);
  });
  std::unique_lock<std::mutex> lock(mu_);
  bool done = cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                           [&] { return c->connect_done || stopping_; });
  if (!done || stopping_) {
    lock.unlock();
    uint64_t id = c->id;
    Post([this, id] { CloseConn(id, "the connection timed out", false); });
    return Status::TimedOut("connecting to " + address + " did not finish within " +
                            std::to_string(timeout_ms) + " ms");
  }
  if (!c->connect_status.ok()) return c->connect_status;
  *out = c->id;
  return Status::Ok();
}

Status TransportImpl::StartCall(PeerId peer, uint16_t type, std::vector<uint8_t> body,
                                const void* payload, size_t payload_bytes, void* reply_buffer,
                                size_t reply_capacity, std::unique_ptr<Call>* out) {
  if (type < 16) return Status::Invalid("message type " + std::to_string(type) + " is reserved");
  if (body.size() > kMaxBodyBytes) {
    return Status::Size("a message body of " + std::to_string(body.size()) +
                        " bytes (send bulk as the payload; at most " +
                        std::to_string(kMaxBodyBytes) + ")");
  }
  if (payload_bytes > options_.max_payload_bytes) {
    return Status::Size("a payload of " + std::to_string(payload_bytes) + " bytes (at most " +
                        std::to_string(options_.max_payload_bytes) + ")");
  }
  auto state = std::make_shared<Call::State>();
  state->conn = peer;
  state->reply_buffer = reply_buffer;
  state->reply_capacity = reply_capacity;
  {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      auto it = conns_.find(peer);
      if (it == conns_.end() || it->second->state == ConnState::kClosed) {
        return Status::Peer("no connection to peer #" + std::to_string(peer) +
                            " (it vanished or was never connected)");
      }
      if (it->second->calls_out < options_.max_in_flight) {
        it->second->calls_out++;
        state->id = next_call_++;
        it->second->calls[state->id] = state;
        stats_.calls++;
        break;
      }
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (stopping_) return Status::Peer(options_.name + " is shutting down");
    }
  }
  auto shared_body = std::make_shared<std::vector<uint8_t>>(std::move(body));
  Post([this, peer, type, state, shared_body, payload, payload_bytes] {
    std::shared_ptr<Conn> c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = conns_.find(peer);
      if (it != conns_.end()) c = it->second;
    }
    if (c == nullptr || c->state != ConnState::kOpen) {
      {
        std::lock_guard<std::mutex> lock(state->mu);
        state->send_done = true;
      }
      state->Settle(Status::Peer("peer #" + std::to_string(peer) + " vanished"));
      return;
    }
    Send(c.get(), Kind::kRequest, type, state->id, 0, *shared_body, payload, payload_bytes, nullptr,
         state);
  });
  auto call = std::make_unique<Call>();
  call->state_ = state;
  *out = std::move(call);
  return Status::Ok();
}

// A call that ran out of time: its connection is torn down (which fails every call on it and
// releases the buffers), then the caller may go.
void TransportImpl::TimeOut(const std::shared_ptr<Call::State>& call, int timeout_ms) {
  uint64_t conn = call->conn;
  std::string why = "a call got no reply within " + std::to_string(timeout_ms) + " ms";
  call->Settle(Status::TimedOut(PeerName(conn) + ": " + why + "; the connection is closed"));
  Post([this, conn, why] { CloseConn(conn, why, false); });
}

// ---- Public ---------------------------------------------------------------------------------

Status Call::Wait(int timeout_ms) {
  std::unique_lock<std::mutex> lock(state_->mu);
  bool got = state_->cv.wait_for(lock, std::chrono::milliseconds(std::max(timeout_ms, 0)),
                                 [this] { return state_->replied; });
  if (!got) {
    lock.unlock();
    owner_->TimeOut(state_, timeout_ms);
    lock.lock();
  }
  // The buffers are UCX's until the send and any payload receive are over; a torn-down
  // connection ends both promptly.
  state_->cv.wait(lock, [this] { return state_->released; });
  body_ = state_->body;
  payload_bytes_ = state_->payload_bytes;
  return state_->status;
}

Transport::Transport(std::unique_ptr<TransportImpl> impl) : impl_(std::move(impl)) {}
Transport::~Transport() { impl_->Stop(); }

Status Transport::Start(const TransportOptions& options, Handler handler,
                        std::unique_ptr<Transport>* out) {
  auto impl = std::make_unique<TransportImpl>(options, std::move(handler));
  CKPTDB_RETURN_IF_ERROR(impl->Init());
  out->reset(new Transport(std::move(impl)));
  return Status::Ok();
}

const std::string& Transport::address() const { return impl_->address_; }

Status Transport::Connect(const std::string& address, int timeout_ms, PeerId* out) {
  return impl_->Connect(address, timeout_ms, out);
}

void Transport::Disconnect(PeerId peer) { impl_->Disconnect(peer); }

std::string Transport::PeerName(PeerId peer) const { return impl_->PeerName(peer); }

std::string Transport::PathName(PeerId peer) const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  auto it = impl_->conns_.find(peer);
  if (it == impl_->conns_.end()) return "closed";
  return it->second->path == DataPath::kUcx ? "ucx-am" : "socket";
}

Status Transport::Start(PeerId peer, uint16_t type, std::vector<uint8_t> body, const void* payload,
                        size_t payload_bytes, void* reply_buffer, size_t reply_capacity,
                        std::unique_ptr<Call>* out) {
  CKPTDB_RETURN_IF_ERROR(impl_->StartCall(peer, type, std::move(body), payload, payload_bytes,
                                          reply_buffer, reply_capacity, out));
  (*out)->owner_ = impl_.get();
  return Status::Ok();
}

Status Transport::CallSync(PeerId peer, uint16_t type, std::vector<uint8_t> body,
                           const void* payload, size_t payload_bytes, int timeout_ms,
                           std::vector<uint8_t>* reply_body, void* reply_buffer,
                           size_t reply_capacity, size_t* reply_payload_bytes) {
  std::unique_ptr<Call> call;
  CKPTDB_RETURN_IF_ERROR(Start(peer, type, std::move(body), payload, payload_bytes, reply_buffer,
                               reply_capacity, &call));
  Status st = call->Wait(timeout_ms);
  if (reply_body != nullptr) *reply_body = call->body();
  if (reply_payload_bytes != nullptr) *reply_payload_bytes = call->payload_bytes();
  return st;
}

TransportStats Transport::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  return impl_->stats_;
}

}  // namespace ckpt::transport
