// Transport on UCX (see transport.h). Everything that touches the UCX worker runs on the progress
// thread; other threads post closures to it (ops_) and wake it through an eventfd. mu_ guards
// the connection table, the calls and the queues; it is never held across a UCX call.
#include "transport/transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sodium.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "transport/wire.h"
#include "transport/wire_format.h"
#include "util/assert.h"

namespace ckpt::transport {
namespace {

static_assert(crypto_auth_BYTES == kMacBytes);

constexpr uint16_t kAmId = 7;
int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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

std::string UcsText(ucs_status_t s) { return ucs_status_string(s); }

}  // namespace

// ---- Calls ----------------------------------------------------------------------------------

struct Call::State {
  uint64_t id = 0;
  uint64_t conn = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool replied = false;    // a reply, an error or a teardown decided the outcome
  bool released = false;   // UCX no longer uses the payload or the reply buffer
  bool send_done = false;  // the request's send completed (or failed)
  bool recv_busy = false;  // the reply's payload is being received into reply_buffer
  Status status;
  std::vector<uint8_t> body;
  size_t payload_bytes = 0;
  void* reply_buffer = nullptr;
  size_t reply_capacity = 0;

  void Settle(Status st) {  // first outcome wins
    std::lock_guard<std::mutex> lock(mu);
    if (!replied) {
      replied = true;
      status = std::move(st);
    }
    released = send_done && !recv_busy;
    cv.notify_all();
  }
  void UpdateReleased() {
    std::lock_guard<std::mutex> lock(mu);
    released = replied && send_done && !recv_busy;
    cv.notify_all();
  }
};

// ---- Impl -----------------------------------------------------------------------------------

class TransportImpl {
 public:  // internal to this file: everything is open to Transport and Call
  enum class ConnState : uint8_t {
    kClientHello,
    kClientProof,
    kServerNew,
    kServerChallenged,
    kOpen,
    kClosed
  };
  struct Conn {
    uint64_t id = 0;
    ucp_ep_h ep = nullptr;
    std::string peer;  // address, and after the handshake the peer's own name
    bool client = false;
    ConnState state = ConnState::kClientHello;
    uint8_t my_nonce[kNonceBytes] = {};
    uint8_t their_nonce[kNonceBytes] = {};
    int64_t handshake_deadline_ms = 0;
    // Client side: the Connect waiting for the handshake.
    bool connect_done = false;
    Status connect_status;
    uint32_t calls_out = 0;    // our calls awaiting replies (mu_)
    uint32_t requests_in = 0;  // the peer's requests not yet replied (progress thread)
    std::map<uint64_t, std::shared_ptr<Call::State>> calls;  // mu_
    std::string closed_why;
  };
  // A send's buffers and what to do when it completes.
  struct SendCtx {
    TransportImpl* impl = nullptr;
    uint64_t conn = 0;
    std::vector<uint8_t> header;
    std::shared_ptr<const void> keep;
    std::shared_ptr<Call::State> call;  // a request's call: its send_done
    bool reply = false;                 // a reply: frees a requests_in slot when sent
  };
  struct PendingRecv {  // a rendezvous payload to pull, started after progress returns
    uint64_t conn = 0;
    void* desc = nullptr;
    size_t length = 0;
    WireHeader header;
    std::vector<uint8_t> body;
    std::shared_ptr<Call::State> call;  // a reply's payload goes into the call's buffer
  };
  struct RecvCtx {
    TransportImpl* impl = nullptr;
    uint64_t conn = 0;
    WireHeader header;
    std::vector<uint8_t> body;
    std::vector<uint8_t> payload;       // a request's payload
    PayloadPlace placed;                // ... or where the Placer had it go
    std::shared_ptr<Call::State> call;  // a reply's call (payload into its buffer)
  };

  TransportImpl(TransportOptions options, Handler handler)
      : options_(std::move(options)), handler_(std::move(handler)) {}
  ~TransportImpl() { Stop(); }

  Status Init();
  void Stop();

  // mu_ must not be held.
  void Post(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ops_.push_back(std::move(op));
    }
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof one);
    (void)n;
  }

  Status Connect(const std::string& address, int timeout_ms, PeerId* out);
  void Disconnect(PeerId peer) {
    Post([this, peer] { CloseConn(peer, "closed by " + options_.name, true); });
  }
  std::string PeerName(PeerId peer) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = conns_.find(peer);
    return it == conns_.end() ? "peer #" + std::to_string(peer) : it->second->peer;
  }
  Status StartCall(PeerId peer, uint16_t type, std::vector<uint8_t> body, const void* payload,
                   size_t payload_bytes, void* reply_buffer, size_t reply_capacity,
                   std::unique_ptr<Call>* out);
  void TimeOut(const std::shared_ptr<Call::State>& call, int timeout_ms);

  TransportOptions options_;
  Handler handler_;
  std::string address_;
  TransportStats stats_;  // mu_

  void Loop();
  void RunOps();
  void CheckDeadlines();
  void StartPendingRecvs();
  static void OnConnRequest(ucp_conn_request_h request, void* arg);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param);
  static void OnSendDone(void* request, ucs_status_t status, void* user_data);
  static void OnRecvDone(void* request, ucs_status_t status, size_t length, void* user_data);
  ucs_status_t HandleAm(Conn* c, const WireHeader& h, std::span<const uint8_t> body, void* data,
                        size_t length, bool rndv);
  void HandleHandshake(Conn* c, const WireHeader& h, std::span<const uint8_t> body);
  void Deliver(uint64_t conn, const WireHeader& h, std::vector<uint8_t> body,
               std::vector<uint8_t> payload, PayloadPlace placed = {}, size_t placed_bytes = 0);
  Status ReplyStatus(const WireHeader& h, std::span<const uint8_t> body);
  void Send(Conn* c, Kind kind, uint16_t type, uint64_t call_id, int32_t status,
            std::span<const uint8_t> body, const void* payload, size_t payload_bytes,
            std::shared_ptr<const void> keep, std::shared_ptr<Call::State> call);
  void CloseConn(uint64_t id, const std::string& why, bool graceful);
  void FailConnect(Conn* c, Status st);
  Conn* FindByEp(ucp_ep_h ep) {
    auto it = by_ep_.find(ep);
    return it == by_ep_.end() ? nullptr : it->second;
  }
  void Mac(const char* role, const uint8_t* client_nonce, const uint8_t* server_nonce,
           uint8_t* out) const;
  bool CheckMac(const char* role, const uint8_t* client_nonce, const uint8_t* server_nonce,
                const uint8_t* mac) const;
  void ServiceLoop();
  void Log(const std::string& line) const {
    std::fprintf(stderr, "ckptdb[%s]: %s\n", options_.name.c_str(), line.c_str());
  }

  uint8_t key_[crypto_auth_KEYBYTES] = {};
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int wake_fd_ = -1;
  int epoll_fd_ = -1;
  int worker_fd_ = -1;
  std::thread thread_;
  std::vector<std::thread> service_;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // connects, call slots, the service queue
  std::deque<std::function<void()>> ops_;
  std::unordered_map<uint64_t, std::shared_ptr<Conn>> conns_;  // written by the progress thread
  uint64_t next_conn_ = 1;
  uint64_t next_call_ = 1;
  std::deque<Request> requests_;  // for the service threads
  std::map<uint64_t, std::pair<int64_t, std::weak_ptr<Call::State>>> deadlines_;  // by call id
  // Progress thread only.
  std::unordered_map<ucp_ep_h, Conn*> by_ep_;
  std::vector<PendingRecv> pending_recvs_;
};

Status TransportImpl::Init() {
  if (options_.job_token.empty()) {
    return Status::Invalid(options_.name + ": no job token (set CKPTDB_JOB_TOKEN or job_token)");
  }
  if (options_.max_in_flight == 0 || options_.max_in_flight > 4096) {
    return Status::Invalid(options_.name + ": max_in_flight must be 1..4096");
  }
  if (sodium_init() < 0) return Status::Internal("libsodium failed to initialize");
  crypto_generichash(key_, sizeof key_, reinterpret_cast<const uint8_t*>(options_.job_token.data()),
                     options_.job_token.size(), nullptr, 0);

  // A restarted coordinator listens on its old port at once, though connections of its killed
  // predecessor linger in TIME_WAIT there: SO_REUSEADDR on the listener. UCX reads this knob of
  // its tcp connection manager from the environment only (ucp_config_modify does not reach the
  // connection managers in 1.13); a value the user set wins.
  setenv("UCX_TCP_CM_REUSEADDR", "y", /*overwrite=*/0);
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return Status::Internal("UCX: ucp_config_read: " + UcsText(s));
  if (!options_.tls.empty()) {
    s = ucp_config_modify(config, "TLS", options_.tls.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return Status::Invalid(options_.name + ": UCX_TLS '" + options_.tls + "': " + UcsText(s));
    }
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

  if (!options_.listen.empty()) {
    sockaddr_storage ss{};
    socklen_t len = 0;
    CKPTDB_RETURN_IF_ERROR(ParseHostPort(options_.listen, &ss, &len));
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
    lp.sockaddr.addrlen = len;
    lp.conn_handler.cb = &TransportImpl::OnConnRequest;
    lp.conn_handler.arg = this;
    s = ucp_listener_create(worker_, &lp, &listener_);
    if (s != UCS_OK) {
      return Status::Invalid(options_.name + ": cannot listen on " + options_.listen + ": " +
                             UcsText(s));
    }
    ucp_listener_attr_t la{};
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    s = ucp_listener_query(listener_, &la);
    if (s != UCS_OK) return Status::Internal("UCX listener query: " + UcsText(s));
    address_ = SockaddrText(la.sockaddr);
    // A wildcard listen address is reachable at the host it was asked for, not 0.0.0.0.
    std::string host = options_.listen.substr(0, options_.listen.rfind(':'));
    if (address_.rfind("0.0.0.0:", 0) == 0 && host != "0.0.0.0") {
      address_ = host + address_.substr(address_.rfind(':'));
    }
  }

  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ < 0 || epoll_fd_ < 0) return Status::FromErrno(errno, "transport eventfd/epoll");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  ev.data.fd = worker_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, worker_fd_, &ev);

  thread_ = std::thread([this] { Loop(); });
  for (uint32_t i = 0; i < std::max(1u, options_.service_threads); ++i) {
    service_.emplace_back([this] { ServiceLoop(); });
  }
  return Status::Ok();
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
  for (std::thread& t : service_) t.join();
  service_.clear();
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

void TransportImpl::Loop() {
  while (true) {
    while (ucp_worker_progress(worker_) != 0) {
    }
    StartPendingRecvs();
    RunOps();
    CheckDeadlines();
    if (stopping_) {
      // Let the closes finish (bounded): flush requests complete or fail quickly once forced.
      int64_t until = NowMs() + 2000;
      while (NowMs() < until) {
        ucp_worker_progress(worker_);
        std::lock_guard<std::mutex> lock(mu_);
        if (conns_.empty()) break;
      }
      return;
    }
    if (!pending_recvs_.empty()) continue;
    ucs_status_t s = ucp_worker_arm(worker_);
    if (s == UCS_ERR_BUSY) continue;
    epoll_event events[2];
    int n = epoll_wait(epoll_fd_, events, 2, 50);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_fd_) {
        uint64_t v;
        ssize_t r = read(wake_fd_, &v, sizeof v);
        (void)r;
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
  int64_t now = NowMs();
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

void TransportImpl::OnConnRequest(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<TransportImpl*>(arg);
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  std::string peer = "?";
  if (ucp_conn_request_query(request, &attr) == UCS_OK) peer = SockaddrText(attr.client_address);
  if (self->stopping_) {
    ucp_listener_reject(self->listener_, request);
    return;
  }
  auto c = std::make_shared<Conn>();
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.conn_request = request;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &TransportImpl::OnEpError;
  ep.err_handler.arg = self;
  ucs_status_t s = ucp_ep_create(self->worker_, &ep, &c->ep);
  if (s != UCS_OK) {
    self->Log("cannot accept a connection from " + peer + ": " + UcsText(s));
    return;
  }
  c->client = false;
  c->state = ConnState::kServerNew;
  c->peer = peer;
  c->handshake_deadline_ms = NowMs() + self->options_.handshake_timeout_ms;
  std::lock_guard<std::mutex> lock(self->mu_);
  c->id = self->next_conn_++;
  self->by_ep_[c->ep] = c.get();
  self->conns_[c->id] = c;
}

void TransportImpl::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<TransportImpl*>(arg);
  Conn* c = self->FindByEp(ep);
  if (c == nullptr) return;
  self->CloseConn(c->id, "the connection failed: " + UcsText(status), false);
}

void TransportImpl::Mac(const char* role, const uint8_t* client_nonce, const uint8_t* server_nonce,
                        uint8_t* out) const {
  uint8_t msg[16 + 2 * kNonceBytes] = {};
  std::snprintf(reinterpret_cast<char*>(msg), 16, "%s", role);
  std::memcpy(msg + 16, client_nonce, kNonceBytes);
  std::memcpy(msg + 16 + kNonceBytes, server_nonce, kNonceBytes);
  crypto_auth(out, msg, sizeof msg, key_);
}

bool TransportImpl::CheckMac(const char* role, const uint8_t* client_nonce,
                             const uint8_t* server_nonce, const uint8_t* mac) const {
  uint8_t msg[16 + 2 * kNonceBytes] = {};
  std::snprintf(reinterpret_cast<char*>(msg), 16, "%s", role);
  std::memcpy(msg + 16, client_nonce, kNonceBytes);
  std::memcpy(msg + 16 + kNonceBytes, server_nonce, kNonceBytes);
  return crypto_auth_verify(mac, msg, sizeof msg, key_) == 0;
}

ucs_status_t TransportImpl::OnAm(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<TransportImpl*>(arg);
  bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  Conn* c = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? self->FindByEp(param->reply_ep)
                                                                 : nullptr;
  if (c == nullptr || c->state == ConnState::kClosed) {
    return rndv ? UCS_ERR_REJECTED : UCS_OK;  // nobody we know: dropped, never fetched
  }
  WireHeader h;
  std::span<const uint8_t> body;
  Status st = DecodeWireHeader({static_cast<const uint8_t*>(header), header_length},
                               "message from " + c->peer, &h, &body);
  if (!st.ok()) {
    self->Log("dropping " + c->peer + ": " + st.message());
    self->CloseConn(c->id, st.message(), false);
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
  }
  return self->HandleAm(c, h, body, data, length, rndv);
}

ucs_status_t TransportImpl::HandleAm(Conn* c, const WireHeader& h, std::span<const uint8_t> body,
                                     void* data, size_t length, bool rndv) {
  bool handshake = h.kind != Kind::kRequest && h.kind != Kind::kReply;
  if (handshake) {
    if (length != 0) {
      CloseConn(c->id, "a handshake message with a payload", false);
      return rndv ? UCS_ERR_REJECTED : UCS_OK;
    }
    HandleHandshake(c, h, body);
    return UCS_OK;
  }
  if (c->state != ConnState::kOpen) {
    // Not authenticated: nothing it sent goes further than this line.
    Log("refused a message from unauthenticated " + c->peer);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.refused++;
    }
    CloseConn(c->id, "sent a message before authenticating", false);
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
  }
  if (length > options_.max_payload_bytes) {
    CloseConn(c->id,
              "sent a payload of " + std::to_string(length) + " bytes, more than the " +
                  std::to_string(options_.max_payload_bytes) + " allowed",
              false);
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_received += body.size() + length;
  }
  if (h.kind == Kind::kRequest) {
    if (c->requests_in >= options_.max_in_flight) {
      CloseConn(c->id, "exceeded " + std::to_string(options_.max_in_flight) + " requests in flight",
                false);
      return rndv ? UCS_ERR_REJECTED : UCS_OK;
    }
    c->requests_in++;
    if (rndv) {
      pending_recvs_.push_back({c->id, data, length, h, {body.begin(), body.end()}, nullptr});
      return UCS_INPROGRESS;
    }
    const auto* p = static_cast<const uint8_t*>(data);
    Deliver(c->id, h, {body.begin(), body.end()}, std::vector<uint8_t>(p, p + length));
    return UCS_OK;
  }
  // A reply.
  std::shared_ptr<Call::State> call;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = c->calls.find(h.call_id);
    if (it != c->calls.end()) {
      call = it->second;
      c->calls.erase(it);
      c->calls_out--;
      deadlines_.erase(h.call_id);
    }
  }
  cv_.notify_all();
  if (call == nullptr) return rndv ? UCS_ERR_REJECTED : UCS_OK;  // a call given up on
  call->body.assign(body.begin(), body.end());
  if (length > 0 && (h.status != 0 || length > call->reply_capacity)) {
    call->Settle(h.status != 0 ? ReplyStatus(h, body)
                               : Status::Size("the reply from " + c->peer + " is " +
                                              std::to_string(length) + " bytes, more than the " +
                                              std::to_string(call->reply_capacity) +
                                              " the caller has room for"));
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
  }
  if (length > 0 && rndv) {
    {
      std::lock_guard<std::mutex> lock(call->mu);
      call->recv_busy = true;
    }
    PendingRecv pr{c->id, data, length, h, {}, call};
    pending_recvs_.push_back(std::move(pr));
    return UCS_INPROGRESS;
  }
  if (length > 0) std::memcpy(call->reply_buffer, data, length);
  call->payload_bytes = length;
  call->Settle(ReplyStatus(h, body));
  return UCS_OK;
}

Status TransportImpl::ReplyStatus(const WireHeader& h, std::span<const uint8_t> body) {
  if (h.status == 0) return Status::Ok();
  if (h.status > 0 || h.status < -64) {
    return Status::Corrupt("a reply with status " + std::to_string(h.status));
  }
  return Status::FromCode(h.status, std::string(body.begin(), body.end()));
}

void TransportImpl::StartPendingRecvs() {
  std::vector<PendingRecv> recvs;
  recvs.swap(pending_recvs_);
  for (PendingRecv& pr : recvs) {
    auto* ctx = new RecvCtx{this, pr.conn, pr.header, std::move(pr.body), {}, {}, pr.call};
    void* buffer = nullptr;
    if (pr.call != nullptr) {
      buffer = pr.call->reply_buffer;
    } else {
      if (options_.placer) ctx->placed = options_.placer(pr.header.type, ctx->body, pr.length);
      if (ctx->placed.data != nullptr) {
        buffer = ctx->placed.data;
      } else {
        ctx->payload.resize(pr.length);
        buffer = ctx->payload.data();
      }
    }
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.recv_am = &TransportImpl::OnRecvDone;
    param.user_data = ctx;
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker_, pr.desc, buffer, pr.length, &param);
    if (r == nullptr) {
      OnRecvDone(nullptr, UCS_OK, pr.length, ctx);
    } else if (UCS_PTR_IS_ERR(r)) {
      OnRecvDone(nullptr, UCS_PTR_STATUS(r), 0, ctx);
    }
  }
}

void TransportImpl::OnRecvDone(void* request, ucs_status_t status, size_t length, void* user_data) {
  std::unique_ptr<RecvCtx> ctx(static_cast<RecvCtx*>(user_data));
  if (request != nullptr) ucp_request_free(request);
  TransportImpl* self = ctx->impl;
  if (ctx->call != nullptr) {
    {
      std::lock_guard<std::mutex> lock(ctx->call->mu);
      ctx->call->recv_busy = false;
    }
    if (status != UCS_OK) {
      ctx->call->Settle(Status::Peer("receiving a reply's payload failed: " + UcsText(status)));
    } else {
      ctx->call->payload_bytes = length;
      ctx->call->Settle(self->ReplyStatus(ctx->header, ctx->body));
    }
    ctx->call->UpdateReleased();
    return;
  }
  if (status != UCS_OK) {
    self->CloseConn(ctx->conn, "receiving a request's payload failed: " + UcsText(status), false);
    return;
  }
  self->Deliver(ctx->conn, ctx->header, std::move(ctx->body), std::move(ctx->payload),
                std::move(ctx->placed), length);
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
  cv_.notify_all();
}

void TransportImpl::ServiceLoop() {
  while (true) {
    Request r;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !requests_.empty(); });
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
             reply->payload_bytes, std::shared_ptr<const void>(reply, nullptr), nullptr);
      }
    });
  }
}

void TransportImpl::Send(Conn* c, Kind kind, uint16_t type, uint64_t call_id, int32_t status,
                         std::span<const uint8_t> body, const void* payload, size_t payload_bytes,
                         std::shared_ptr<const void> keep, std::shared_ptr<Call::State> call) {
  auto* ctx = new SendCtx;
  ctx->impl = this;
  ctx->conn = c->id;
  ctx->keep = std::move(keep);
  ctx->call = std::move(call);
  WireWriter w;
  WireHeader h;
  h.kind = kind;
  h.type = type;
  h.call_id = call_id;
  h.status = status;
  h.body_bytes = static_cast<uint32_t>(body.size());
  EncodeWireHeader(h, &w);
  w.Raw(body.data(), body.size());
  ctx->header = w.Take();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_sent += body.size() + payload_bytes;
  }
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  param.cb.send = &TransportImpl::OnSendDone;
  param.user_data = ctx;
  ucs_status_ptr_t r = ucp_am_send_nbx(c->ep, kAmId, ctx->header.data(), ctx->header.size(),
                                       payload, payload_bytes, &param);
  if (r == nullptr) {
    OnSendDone(nullptr, UCS_OK, ctx);
  } else if (UCS_PTR_IS_ERR(r)) {
    OnSendDone(nullptr, UCS_PTR_STATUS(r), ctx);
  }
}

void TransportImpl::OnSendDone(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<SendCtx> ctx(static_cast<SendCtx*>(user_data));
  if (request != nullptr) ucp_request_free(request);
  if (ctx->call != nullptr) {
    {
      std::lock_guard<std::mutex> lock(ctx->call->mu);
      ctx->call->send_done = true;
    }
    if (status != UCS_OK) {
      ctx->call->Settle(Status::Peer("sending to " + ctx->impl->PeerName(ctx->conn) +
                                     " failed: " + UcsText(status)));
    }
    ctx->call->UpdateReleased();
  }
}

void TransportImpl::HandleHandshake(Conn* c, const WireHeader& h, std::span<const uint8_t> body) {
  const std::string what = "handshake from " + c->peer;
  HandshakeBody in;
  if (!c->client && h.kind == Kind::kHello && c->state == ConnState::kServerNew) {
    Status st = ParseHandshake(h.kind, body, what, &in);
    if (!st.ok()) {
      CloseConn(c->id, st.message(), false);
      return;
    }
    std::memcpy(c->their_nonce, in.nonce.data(), kNonceBytes);
    c->peer = in.name + " (" + c->peer + ")";
    HandshakeBody out;
    out.name = options_.name;
    randombytes_buf(c->my_nonce, kNonceBytes);
    std::memcpy(out.nonce.data(), c->my_nonce, kNonceBytes);
    Mac("ckptdb-server", c->their_nonce, c->my_nonce, out.mac.data());
    c->state = ConnState::kServerChallenged;
    Send(c, Kind::kChallenge, 0, 0, 0, EncodeHandshake(Kind::kChallenge, out), nullptr, 0, nullptr,
         nullptr);
    return;
  }
  if (c->client && h.kind == Kind::kChallenge && c->state == ConnState::kClientHello) {
    Status st = ParseHandshake(h.kind, body, what, &in);
    if (st.ok()) std::memcpy(c->their_nonce, in.nonce.data(), kNonceBytes);
    if (st.ok() && !CheckMac("ckptdb-server", c->my_nonce, c->their_nonce, in.mac.data())) {
      st = Status::Auth(c->peer + " (" + in.name +
                        ") could not prove it holds this job's token: refusing it");
    }
    if (!st.ok()) {
      Log(st.message());
      FailConnect(c, st);
      return;
    }
    c->peer = in.name + " (" + c->peer + ")";
    HandshakeBody proof;
    Mac("ckptdb-client", c->my_nonce, c->their_nonce, proof.mac.data());
    c->state = ConnState::kClientProof;
    Send(c, Kind::kProof, 0, 0, 0, EncodeHandshake(Kind::kProof, proof), nullptr, 0, nullptr,
         nullptr);
    return;
  }
  if (!c->client && h.kind == Kind::kProof && c->state == ConnState::kServerChallenged) {
    if (ParseHandshake(h.kind, body, what, &in).ok() &&
        CheckMac("ckptdb-client", c->their_nonce, c->my_nonce, in.mac.data())) {
      c->state = ConnState::kOpen;
      c->handshake_deadline_ms = 0;
      Send(c, Kind::kWelcome, 0, 0, 0, {}, nullptr, 0, nullptr, nullptr);
      return;
    }
    Log("refused " + c->peer + ": it does not hold this job's token (CKPTDB_JOB_TOKEN)");
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.refused++;
    }
    c->state = ConnState::kServerNew;  // nothing more is accepted from it
    Send(c, Kind::kRefused, 0, 0, 0, {}, nullptr, 0, nullptr, nullptr);
    CloseConn(c->id, "wrong job token", true);
    return;
  }
  if (c->client && h.kind == Kind::kWelcome && c->state == ConnState::kClientProof) {
    c->state = ConnState::kOpen;
    c->handshake_deadline_ms = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      c->connect_done = true;
    }
    cv_.notify_all();
    return;
  }
  if (c->client && h.kind == Kind::kRefused) {
    Status st = Status::Auth(c->peer + " refused this process: the job tokens differ");
    Log(st.message());
    FailConnect(c, st);
    return;
  }
  Log("protocol error from " + c->peer + ": unexpected handshake message");
  CloseConn(c->id, "unexpected handshake message", false);
}

void TransportImpl::FailConnect(Conn* c, Status st) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!c->connect_done) {
      c->connect_done = true;
      c->connect_status = st;
    }
  }
  cv_.notify_all();
  CloseConn(c->id, st.message(), false);
}

// Closes a connection: its calls fail (EPEER naming why), its endpoint is closed (flushed when
// graceful, else forced) and it leaves the tables. Progress thread only.
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
  }
  cv_.notify_all();
  if (!c->client && c->state != ConnState::kOpen) {
    Log("connection from " + c->peer + " closed before it authenticated: " + why);
  }
  c->state = ConnState::kClosed;
  c->closed_why = why;
  by_ep_.erase(c->ep);
  for (auto& [cid, call] : calls) {
    call->Settle(Status::Peer(c->peer + " is gone: " + why));
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = graceful ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(c->ep, &param);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    // Progress until the close completes (bounded: a forced close does not wait for the peer).
    int64_t until = NowMs() + 1000;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && NowMs() < until) {
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
  c->state = ConnState::kClientHello;
  c->handshake_deadline_ms = NowMs() + std::min(timeout_ms, options_.handshake_timeout_ms);
  randombytes_buf(c->my_nonce, kNonceBytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    c->id = next_conn_++;
  }
  Post([this, c, ss, len] {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
    ep.sockaddr.addrlen = len;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &TransportImpl::OnEpError;
    ep.err_handler.arg = this;
    ucs_status_t s = ucp_ep_create(worker_, &ep, &c->ep);
    if (s != UCS_OK) {
      std::lock_guard<std::mutex> lock(mu_);
      c->connect_done = true;
      c->connect_status = Status::Peer("cannot connect to " + c->peer + ": " + UcsText(s));
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      conns_[c->id] = c;
    }
    by_ep_[c->ep] = c.get();
    HandshakeBody hello;
    hello.name = options_.name;
    std::memcpy(hello.nonce.data(), c->my_nonce, kNonceBytes);
    Send(c.get(), Kind::kHello, 0, 0, 0, EncodeHandshake(Kind::kHello, hello), nullptr, 0, nullptr,
         nullptr);
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
    if (c == nullptr) {
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
