// Transport on UCX (see transport.h). Everything that touches the UCX worker or a socket runs on
// the progress thread; other threads post closures to it (ops_) and wake it through an eventfd.
// mu_ guards the connection table, the calls and the queues; it is never held across a UCX call.
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
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
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
#include <set>
#include <thread>
#include <unordered_map>

#include "transport/wire.h"
#include "transport/wire_format.h"
#include "util/assert.h"

namespace ckpt::transport {
namespace {

static_assert(crypto_auth_BYTES == kMacBytes);

constexpr uint16_t kAmId = 7;
constexpr int kListenBacklog = 128;
constexpr int kAcceptPerRound = 256;  // accepts per wakeup, so a storm cannot starve the worker
constexpr uint32_t kHostileLogLines = 5;
constexpr size_t kReadBudgetBytes = 8 << 20;  // socket bytes read from one peer per wakeup
// On the socket path a request's payload of at least this is offered to the Placer (smaller ones
// arrive in the request's vector, as UCX's eager messages do).
constexpr uint64_t kPlaceMinBytes = 64 << 10;
constexpr int64_t kHostileLogWindowMs = 10000;
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
    kClientConnecting,  // the TCP connect is under way
    kClientHello,       // Hello sent, waiting for the Challenge
    kClientProof,       // Proof sent, waiting for the Welcome
    kServerNew,         // accepted, waiting for the Hello
    kServerChallenged,  // Challenge sent, waiting for the Proof
    kOpen,              // authenticated, with a UCX endpoint to the peer's worker
    kClosed
  };
  // A message queued on the socket path: header, payload length and body in `head`, then the
  // payload, which `keep` keeps valid (a request's payload is the caller's until Wait returns).
  struct OutMsg {
    std::vector<uint8_t> head;
    const uint8_t* payload = nullptr;
    size_t payload_bytes = 0;
    size_t sent = 0;  // of head.size() + payload_bytes
    std::shared_ptr<const void> keep;
    std::shared_ptr<Call::State> call;  // a request's call: its send_done
    int file_fd = -1;  // >= 0: the payload is sent from this file (sendfile), not `payload`
    uint64_t file_offset = 0;
  };
  // The message being read on the socket path: its prefix and body in `head`, then its payload
  // straight into where it goes (the Placer's memory, a vector, the caller's reply buffer) or,
  // for a reply nobody waits for, into nothing.
  struct RxState {
    std::vector<uint8_t> head;
    bool have_prefix = false;
    bool in_payload = false;
    WireHeader h;
    uint64_t payload_bytes = 0;
    uint64_t got = 0;
    uint8_t* dst = nullptr;  // nullptr: the payload is read and dropped
    std::vector<uint8_t> vec;
    PayloadPlace placed;
    std::shared_ptr<Call::State> call;  // a reply's call
  };
  struct Conn {
    uint64_t id = 0;
    int fd = -1;            // ckptdb's TCP socket: the handshake, then the connection's lifeline
    ucp_ep_h ep = nullptr;  // once open: to the peer's worker, from the address it proved
    std::string peer;       // address, and after the first frame the peer's own name
    bool client = false;
    ConnState state = ConnState::kClientConnecting;
    DataPath path = DataPath::kSocket;  // once open
    uint64_t my_key = 0;                // what the peer puts in the headers it sends here (by_key_)
    uint64_t peer_key = 0;              // what this side puts in the headers it sends there
    uint8_t my_nonce[kNonceBytes] = {};
    uint8_t their_nonce[kNonceBytes] = {};
    int64_t handshake_deadline_ms = 0;
    bool sent_bytes = false;  // the peer sent something on the socket (for the hostile log)
    std::vector<uint8_t> in;  // the frame being read (at most kMaxHandshakeFrameBytes)
    HandshakeKind in_kind = HandshakeKind::kHello;
    uint32_t in_body = 0;      // its body's length, once its header is in
    std::vector<uint8_t> out;  // frame bytes the socket did not take yet
    bool want_out = false;     // EPOLLOUT is on
    // The socket path: messages waiting to be written, and the one being read.
    std::deque<OutMsg> sendq;
    RxState rx;
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
  Status Listen();
  Status StartUcx();
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
  // The TCP side (progress thread).
  void AcceptAll();
  void OnSocket(int fd, uint32_t events);
  void ReadSocket(const std::shared_ptr<Conn>& c);
  void OnFrame(Conn* c, const HandshakeFrame& f);
  void WriteFrame(Conn* c, const HandshakeFrame& f);
  void FlushOut(Conn* c);
  void WantOut(Conn* c, bool on);
  ssize_t Receive(Conn* c, void* into, size_t want, const char* eof_why);
  void FlushSock(Conn* c);
  void ReadSock(const std::shared_ptr<Conn>& c);
  bool BeginPayload(Conn* c);
  void FinishMessage(Conn* c);
  void FinishConnect(Conn* c);
  Status OpenConn(Conn* c, DataPath path, std::span<const uint8_t> address);
  void Watch(int fd, uint32_t events, int op);
  uint64_t NewKey();
  void EvictOldestPending();
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param);
  static void OnSendDone(void* request, ucs_status_t status, void* user_data);
  static void OnRecvDone(void* request, ucs_status_t status, size_t length, void* user_data);
  ucs_status_t HandleAm(Conn* c, const WireHeader& h, std::span<const uint8_t> body, void* data,
                        size_t length, bool rndv);
  void Deliver(uint64_t conn, const WireHeader& h, std::vector<uint8_t> body,
               std::vector<uint8_t> payload, PayloadPlace placed = {}, size_t placed_bytes = 0);
  Status ReplyStatus(const WireHeader& h, std::span<const uint8_t> body);
  void Send(Conn* c, Kind kind, uint16_t type, uint64_t call_id, int32_t status,
            std::span<const uint8_t> body, const void* payload, size_t payload_bytes,
            std::shared_ptr<const void> keep, std::shared_ptr<Call::State> call, int file_fd = -1,
            uint64_t file_offset = 0);
  void CloseConn(uint64_t id, const std::string& why, bool graceful);
  void FailConnect(Conn* c, Status st);
  void HandshakeFailed(Conn* c, Status st);
  Conn* FindByEp(ucp_ep_h ep) {
    auto it = by_ep_.find(ep);
    return it == by_ep_.end() ? nullptr : it->second;
  }
  void ServiceLoop();
  void Log(const std::string& line) const {
    std::fprintf(stderr, "ckptdb[%s]: %s\n", options_.name.c_str(), line.c_str());
  }
  // What strangers do (garbage, idle connections, messages for no connection) is logged at most
  // kHostileLogLines times per kHostileLogWindowMs, then summed up: a flood cannot fill the log.
  void LogHostile(const std::string& line);

  std::array<uint8_t, 32> key_{};
  std::string ucx_tls_;           // what UCX may use (never tcp); empty: no UCX worker at all
  bool ucx_unreachable_ = false;  // UCX could not reach a peer: the socket from then on
  std::vector<uint8_t> worker_address_;  // this worker's UCX address, sent after the proof
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int listen_fd_ = -1;
  int spare_fd_ = -1;  // given up to accept (and close) a connection when out of descriptors
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
  std::unordered_map<uint64_t, Conn*> by_key_;  // open connections by my_key
  std::unordered_map<int, uint64_t> by_fd_;     // sockets to connection ids
  std::set<uint64_t> pending_;                  // accepted, not yet authenticated: oldest first
  std::vector<PendingRecv> pending_recvs_;
  int64_t hostile_window_start_ms_ = 0;
  uint32_t hostile_logged_ = 0;
  uint64_t hostile_suppressed_ = 0;
};

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
      int64_t until = NowMs() + 2000;
      while (NowMs() < until) {
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

void TransportImpl::LogHostile(const std::string& line) {
  const int64_t now = NowMs();
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

uint64_t TransportImpl::NewKey() {
  uint64_t k = 0;
  do {
    randombytes_buf(&k, sizeof k);
  } while (k == 0 || by_key_.count(k) != 0);
  return k;
}

void TransportImpl::EvictOldestPending() {
  if (pending_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.evicted++;
  }
  CloseConn(*pending_.begin(),
            "closed to make room: " + std::to_string(kMaxPendingHandshakes) +
                " connections were waiting to authenticate",
            false);
}

void TransportImpl::AcceptAll() {
  for (int round = 0; round < kAcceptPerRound; ++round) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd =
        accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        // Out of descriptors: shed the oldest stranger, or with none the newcomer (through the
        // spare descriptor), so the listener neither spins nor keeps a backlog of strangers.
        if (!pending_.empty()) {
          EvictOldestPending();
        } else if (spare_fd_ >= 0) {
          close(spare_fd_);
          int shed = accept(listen_fd_, nullptr, nullptr);
          if (shed >= 0) close(shed);
          spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
          LogHostile("out of file descriptors: a new connection was closed at once");
        } else {
          return;
        }
        continue;
      }
      return;  // EAGAIN: nothing more to accept
    }
    if (stopping_) {
      close(fd);
      continue;
    }
    if (pending_.size() >= kMaxPendingHandshakes) EvictOldestPending();
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_shared<Conn>();
    c->fd = fd;
    c->client = false;
    c->state = ConnState::kServerNew;
    c->peer = SockaddrText(ss);
    c->handshake_deadline_ms = NowMs() + options_.handshake_timeout_ms;
    {
      std::lock_guard<std::mutex> lock(mu_);
      c->id = next_conn_++;
      conns_[c->id] = c;
    }
    by_fd_[fd] = c->id;
    pending_.insert(c->id);
    Watch(fd, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
  }
}

void TransportImpl::OnSocket(int fd, uint32_t events) {
  auto f = by_fd_.find(fd);
  if (f == by_fd_.end()) return;
  std::shared_ptr<Conn> c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = conns_.find(f->second);
    if (it == conns_.end()) return;
    c = it->second;
  }
  if (c->state == ConnState::kClientConnecting) {
    // A connect that failed may report only EPOLLERR or EPOLLHUP: SO_ERROR says why.
    if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) != 0) FinishConnect(c.get());
  } else if ((events & EPOLLOUT) != 0) {
    if (c->state == ConnState::kOpen) {
      if (c->path == DataPath::kSocket) FlushSock(c.get());
    } else {
      FlushOut(c.get());
    }
  }
  if (c->state != ConnState::kClosed && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
    ReadSocket(c);
  }
}

// Reads what the socket holds, one frame at a time and never more than the frame it is in (its
// header first: a length over the bound is refused before a byte of its body is read). After
// the handshake the socket only tells that the peer is gone: a byte on it is a protocol error.
void TransportImpl::ReadSocket(const std::shared_ptr<Conn>& c) {
  while (c->state != ConnState::kClosed && c->state != ConnState::kClientConnecting) {
    if (c->state == ConnState::kOpen && c->path == DataPath::kSocket) {
      ReadSock(c);
      return;
    }
    if (c->state == ConnState::kOpen) {
      uint8_t b[64];
      ssize_t n = recv(c->fd, b, sizeof b, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      CloseConn(c->id,
                n == 0  ? "the peer closed the connection"
                : n > 0 ? "the peer sent bytes on its socket after the handshake"
                        : std::string("its socket failed: ") + std::strerror(errno),
                false);
      return;
    }
    const bool have_header = c->in.size() >= kHandshakeHeaderBytes;
    const size_t want = have_header ? kHandshakeHeaderBytes + c->in_body - c->in.size()
                                    : kHandshakeHeaderBytes - c->in.size();
    CKPTDB_ASSERT(want > 0 || have_header);
    if (want > 0) {
      const size_t at = c->in.size();
      c->in.resize(at + want);
      ssize_t n = Receive(c.get(), c->in.data() + at, want,
                          "the peer closed the connection during the handshake");
      c->in.resize(at + (n > 0 ? static_cast<size_t>(n) : 0));
      if (n <= 0) return;
      c->sent_bytes = true;
      if (static_cast<size_t>(n) < want) continue;
    }
    CKPTDB_ASSERT(c->in.size() <= kMaxHandshakeFrameBytes);
    const std::string what = "handshake from " + c->peer;
    if (!have_header) {
      Status st = DecodeHandshakeHeader(c->in, what, &c->in_kind, &c->in_body);
      if (!st.ok()) {
        HandshakeFailed(c.get(), st);
        return;
      }
      if (c->in_body > 0) continue;
    }
    HandshakeFrame frame;
    Status st = ParseHandshakeBody(
        c->in_kind, std::span<const uint8_t>(c->in).subspan(kHandshakeHeaderBytes), what, &frame);
    c->in.clear();
    c->in_body = 0;
    if (!st.ok()) {
      HandshakeFailed(c.get(), st);
      return;
    }
    OnFrame(c.get(), frame);
  }
}

namespace {
// A peer's name from the network, fit for a log line: printable ASCII only.
std::string Printable(const std::string& s) {
  std::string out;
  for (char ch : s) out.push_back(ch >= 0x20 && ch < 0x7f ? ch : '?');
  return out;
}
bool MacEqual(const std::array<uint8_t, kMacBytes>& a, const std::array<uint8_t, kMacBytes>& b) {
  return sodium_memcmp(a.data(), b.data(), kMacBytes) == 0;  // constant time
}
}  // namespace

// The handshake (docs/transport.md, "The handshake, byte by byte"): Hello, Challenge, Proof,
// Welcome.
void TransportImpl::OnFrame(Conn* c, const HandshakeFrame& f) {
  if (!c->client && c->state == ConnState::kServerNew && f.kind == HandshakeKind::kHello) {
    std::memcpy(c->their_nonce, f.nonce.data(), kNonceBytes);
    c->peer = Printable(f.name) + " (" + c->peer + ")";
    randombytes_buf(c->my_nonce, kNonceBytes);
    HandshakeFrame out;
    out.kind = HandshakeKind::kChallenge;
    out.name = options_.name.substr(0, kMaxPeerNameBytes);
    std::memcpy(out.nonce.data(), c->my_nonce, kNonceBytes);
    out.mac = HandshakeMac(key_.data(), MacRole::kServer, c->their_nonce, c->my_nonce, 0, 0, {});
    c->state = ConnState::kServerChallenged;
    WriteFrame(c, out);
    return;
  }
  if (c->client && c->state == ConnState::kClientHello && f.kind == HandshakeKind::kChallenge) {
    std::memcpy(c->their_nonce, f.nonce.data(), kNonceBytes);
    c->peer = Printable(f.name) + " (" + c->peer + ")";
    if (!MacEqual(f.mac, HandshakeMac(key_.data(), MacRole::kServer, c->my_nonce, c->their_nonce, 0,
                                      0, {}))) {
      Status st = Status::Auth(c->peer + " could not prove it holds this job's token: refusing it");
      Log(st.message());
      FailConnect(c, st);
      return;
    }
    c->my_key = NewKey();
    HandshakeFrame out;
    out.kind = HandshakeKind::kProof;
    out.conn_key = c->my_key;
    out.address = worker_address_;
    out.mac = HandshakeMac(key_.data(), MacRole::kClient, c->my_nonce, c->their_nonce, c->my_key, 0,
                           worker_address_);
    c->state = ConnState::kClientProof;
    WriteFrame(c, out);
    return;
  }
  if (!c->client && c->state == ConnState::kServerChallenged && f.kind == HandshakeKind::kProof) {
    if (!MacEqual(f.mac, HandshakeMac(key_.data(), MacRole::kClient, c->their_nonce, c->my_nonce,
                                      f.conn_key, 0, f.address))) {
      LogHostile("refused " + c->peer + ": it does not hold this job's token (CKPTDB_JOB_TOKEN)");
      {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.refused++;
      }
      HandshakeFrame out;
      out.kind = HandshakeKind::kRefused;
      WriteFrame(c, out);
      CloseConn(c->id, "wrong job token", false);
      return;
    }
    // Authenticated: from here on the peer is a member of the job. Its messages travel over
    // UCX where both run a worker and UCX reaches the peer's without tcp and with peer-failure
    // handling (RDMA); on this socket otherwise (docs/transport.md, "Data paths").
    c->peer_key = f.conn_key;
    c->my_key = NewKey();
    // Once UCX could not reach a peer, it is not asked again (each try prints an error of
    // UCX's own): a machine without RDMA puts every connection on the socket.
    DataPath path = DataPath::kSocket;
    Status ucx = worker_ == nullptr || f.address.empty() || ucx_unreachable_
                     ? Status::NotSupported("no UCX path")
                     : OpenConn(c, DataPath::kUcx, f.address);
    if (ucx.ok()) {
      path = DataPath::kUcx;
    } else {
      if (!ucx_unreachable_ && worker_ != nullptr && !f.address.empty()) {
        ucx_unreachable_ = true;
        Log(ucx.message() + " (with UCX_TLS '" + ucx_tls_ +
            "', endpoints that report a peer's failure): this process's connections go on "
            "ckptdb's own socket from now on");
      }
      Status st = OpenConn(c, DataPath::kSocket, {});
      CKPTDB_ASSERT(st.ok());
    }
    pending_.erase(c->id);
    HandshakeFrame out;
    out.kind = HandshakeKind::kWelcome;
    out.conn_key = c->my_key;
    out.path = path;
    if (path == DataPath::kUcx) out.address = worker_address_;
    out.mac = HandshakeMac(key_.data(), MacRole::kWelcome, c->their_nonce, c->my_nonce, c->my_key,
                           static_cast<uint8_t>(path), out.address);
    WriteFrame(c, out);
    return;
  }
  if (c->client && c->state == ConnState::kClientProof && f.kind == HandshakeKind::kWelcome) {
    if (!MacEqual(f.mac, HandshakeMac(key_.data(), MacRole::kWelcome, c->my_nonce, c->their_nonce,
                                      f.conn_key, static_cast<uint8_t>(f.path), f.address))) {
      FailConnect(c, Status::Auth(c->peer + " sent a welcome that does not verify: refusing it"));
      return;
    }
    c->peer_key = f.conn_key;
    Status st = f.path == DataPath::kUcx && worker_ == nullptr
                    ? Status::Peer(c->peer + " chose UCX, and " + options_.name + " runs no worker")
                    : OpenConn(c, f.path, f.address);
    if (!st.ok()) {
      FailConnect(c, st);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      c->connect_done = true;
    }
    cv_.notify_all();
    return;
  }
  if (c->client && f.kind == HandshakeKind::kRefused) {
    Status st = Status::Auth(c->peer + " refused this process: the job tokens differ");
    Log(st.message());
    FailConnect(c, st);
    return;
  }
  const std::string why =
      "a handshake frame of kind " + std::to_string(static_cast<int>(f.kind)) + " out of turn";
  HandshakeFailed(c, Status::Corrupt(c->peer + " sent " + why));
}

// Opens the connection on `path`: over UCX, an endpoint to the peer's worker at the address it
// proved in its MAC; on the socket, nothing more to make.
Status TransportImpl::OpenConn(Conn* c, DataPath path, std::span<const uint8_t> address) {
  if (path == DataPath::kSocket) {
    by_key_[c->my_key] = c;
    c->state = ConnState::kOpen;
    c->handshake_deadline_ms = 0;
    std::lock_guard<std::mutex> lock(mu_);  // PathName reads it from other threads
    c->path = DataPath::kSocket;
    stats_.socket_connections++;
    return Status::Ok();
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  ep.err_mode =
      options_.ucx_without_peer_failure ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &TransportImpl::OnEpError;
  ep.err_handler.arg = this;
  ucs_status_t s = ucp_ep_create(worker_, &ep, &c->ep);
  if (s != UCS_OK) {
    c->ep = nullptr;
    return Status::Peer("cannot reach " + c->peer + "'s UCX worker: " + UcsText(s));
  }
  by_ep_[c->ep] = c;
  by_key_[c->my_key] = c;
  c->state = ConnState::kOpen;
  c->handshake_deadline_ms = 0;
  std::lock_guard<std::mutex> lock(mu_);
  c->path = DataPath::kUcx;
  stats_.ucx_connections++;
  return Status::Ok();
}

void TransportImpl::WriteFrame(Conn* c, const HandshakeFrame& f) {
  std::vector<uint8_t> bytes = EncodeHandshakeFrame(f);
  c->out.insert(c->out.end(), bytes.begin(), bytes.end());
  FlushOut(c);
}

void TransportImpl::FlushOut(Conn* c) {
  while (!c->out.empty()) {
    ssize_t n = send(c->fd, c->out.data(), c->out.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      Watch(c->fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP, EPOLL_CTL_MOD);
      return;
    }
    if (n < 0) {
      Status st = Status::Peer("writing to " + c->peer + " failed: " + std::strerror(errno));
      HandshakeFailed(c, st);
      return;
    }
    c->out.erase(c->out.begin(), c->out.begin() + n);
  }
  Watch(c->fd, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
}

void TransportImpl::FinishConnect(Conn* c) {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) {
    FailConnect(c, Status::Peer("cannot connect to " + c->peer + ": " + std::strerror(err)));
    return;
  }
  c->state = ConnState::kClientHello;
  HandshakeFrame hello;
  hello.kind = HandshakeKind::kHello;
  hello.name = options_.name.substr(0, kMaxPeerNameBytes);
  std::memcpy(hello.nonce.data(), c->my_nonce, kNonceBytes);
  WriteFrame(c, hello);
}

// Reads up to `want` bytes: their count, -1 when there is nothing to read now, 0 when the
// connection is closed (at EOF, with `eof_why`, or on an error).
ssize_t TransportImpl::Receive(Conn* c, void* into, size_t want, const char* eof_why) {
  ssize_t n = recv(c->fd, into, want, 0);
  if (n > 0) return n;
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return -1;
  CloseConn(
      c->id,
      n == 0 ? std::string(eof_why) : std::string("its socket failed: ") + std::strerror(errno),
      false);
  return 0;
}

// ---- The socket path -------------------------------------------------------------------------

void TransportImpl::WantOut(Conn* c, bool on) {
  if (c->want_out == on) return;
  c->want_out = on;
  const uint32_t out = on ? static_cast<uint32_t>(EPOLLOUT) : 0u;
  Watch(c->fd, EPOLLIN | EPOLLRDHUP | out, EPOLL_CTL_MOD);
}

// Writes queued messages until the socket is full (then EPOLLOUT resumes) or the queue is empty.
void TransportImpl::FlushSock(Conn* c) {
  while (!c->sendq.empty()) {
    OutMsg& m = c->sendq.front();
    iovec iov[2];
    int n = 0;
    if (m.sent < m.head.size()) {
      iov[n++] = {m.head.data() + m.sent, m.head.size() - m.sent};
    }
    const size_t from = m.sent > m.head.size() ? m.sent - m.head.size() : 0;
    if (m.payload_bytes > from && m.file_fd < 0) {
      iov[n++] = {const_cast<uint8_t*>(m.payload) + from, m.payload_bytes - from};
    }
    ssize_t w = 0;
    if (n == 0 && m.file_fd >= 0) {
      // The payload from its file: the kernel copies from the page cache into the socket.
      off_t off = static_cast<off_t>(m.file_offset + from);
      w = sendfile(c->fd, m.file_fd, &off, m.payload_bytes - from);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EAGAIN) {
        WantOut(c, true);
        return;
      }
      if (w < 0 && errno == EPIPE) {  // the signal it raised, pending on this thread: taken back
        sigset_t pipe;
        sigemptyset(&pipe);
        sigaddset(&pipe, SIGPIPE);
        const timespec now{0, 0};
        (void)sigtimedwait(&pipe, nullptr, &now);
        errno = EPIPE;
      }
      if (w <= 0) {  // 0: the file ends before the payload does (it was cut short under us)
        CloseConn(c->id,
                  w == 0 ? std::string("a payload's file ended before its last byte was sent")
                         : std::string("sending a payload's file failed: ") + std::strerror(errno),
                  false);
        return;
      }
    } else if (n > 0) {
      msghdr mh{};
      mh.msg_iov = iov;
      mh.msg_iovlen = n;
      // A header before a payload sent from a file: held back until the payload follows.
      w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | (m.file_fd >= 0 ? MSG_MORE : 0));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EAGAIN) {
        WantOut(c, true);
        return;
      }
      if (w < 0) {
        CloseConn(c->id, std::string("writing to its socket failed: ") + std::strerror(errno),
                  false);
        return;
      }
    }
    m.sent += static_cast<size_t>(w);
    if (m.sent < m.head.size() + m.payload_bytes) continue;
    std::shared_ptr<Call::State> call = std::move(m.call);
    c->sendq.pop_front();
    if (call != nullptr) {
      {
        std::lock_guard<std::mutex> lock(call->mu);
        call->send_done = true;
      }
      call->UpdateReleased();
    }
  }
  WantOut(c, false);
}

// Reads messages: the prefix (header and payload length), the body, then the payload straight
// into its place. At most kReadBudgetBytes per wakeup, so one peer's stream cannot starve the
// others; epoll is level-triggered and comes back for the rest.
void TransportImpl::ReadSock(const std::shared_ptr<Conn>& c) {
  size_t budget = kReadBudgetBytes;
  while (c->state == ConnState::kOpen && budget > 0) {
    RxState& rx = c->rx;
    uint8_t scratch[16384];
    uint8_t* into = nullptr;
    size_t want = 0;
    const size_t at = rx.head.size();
    if (!rx.in_payload) {
      const size_t need =
          rx.have_prefix ? kSocketPrefixBytes + rx.h.body_bytes : kSocketPrefixBytes;
      CKPTDB_ASSERT(at < need && need <= kSocketPrefixBytes + kMaxBodyBytes);
      want = need - at;
      rx.head.resize(need);
      into = rx.head.data() + at;
    } else {
      want = static_cast<size_t>(std::min<uint64_t>(rx.payload_bytes - rx.got, budget));
      into = rx.dst != nullptr ? rx.dst + rx.got : scratch;
      if (rx.dst == nullptr) want = std::min(want, sizeof scratch);
    }
    ssize_t n = Receive(c.get(), into, want, "the peer closed the connection");
    if (!rx.in_payload) rx.head.resize(at + (n > 0 ? static_cast<size_t>(n) : 0));
    if (n <= 0) return;
    budget -= std::min(budget, static_cast<size_t>(n));
    if (rx.in_payload) {
      rx.got += static_cast<uint64_t>(n);
      if (rx.got == rx.payload_bytes) FinishMessage(c.get());
      continue;
    }
    if (!rx.have_prefix) {
      if (rx.head.size() < kSocketPrefixBytes) continue;
      Status st = DecodeWireHeaderOnly(std::span<const uint8_t>(rx.head).first(kWireHeaderBytes),
                                       "message from " + c->peer, &rx.h);
      if (st.ok() && rx.h.conn_key != c->my_key) {
        st = Status::Corrupt("message from " + c->peer + " names another connection");
      }
      if (!st.ok()) {
        Log("dropping " + c->peer + ": " + st.message());
        CloseConn(c->id, st.message(), false);
        return;
      }
      WireReader r(std::span<const uint8_t>(rx.head).subspan(kWireHeaderBytes, 8), "length");
      rx.payload_bytes = r.U64("payload_bytes");
      rx.have_prefix = true;
      if (rx.h.body_bytes > 0) continue;
    }
    if (rx.head.size() < kSocketPrefixBytes + rx.h.body_bytes) continue;
    if (!BeginPayload(c.get())) return;
    if (rx.payload_bytes == 0) FinishMessage(c.get());
  }
}

// A message's header and body are in: decides where its payload goes. False when the message
// closed the connection.
bool TransportImpl::BeginPayload(Conn* c) {
  RxState& rx = c->rx;
  const std::span<const uint8_t> body =
      std::span<const uint8_t>(rx.head).subspan(kSocketPrefixBytes);
  if (rx.payload_bytes > options_.max_payload_bytes) {
    CloseConn(c->id,
              "sent a payload of " + std::to_string(rx.payload_bytes) + " bytes, more than the " +
                  std::to_string(options_.max_payload_bytes) + " allowed",
              false);
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_received += body.size() + rx.payload_bytes;
  }
  rx.in_payload = true;
  rx.got = 0;
  rx.dst = nullptr;
  if (rx.h.kind == Kind::kRequest) {
    if (c->requests_in >= options_.max_in_flight) {
      CloseConn(c->id, "exceeded " + std::to_string(options_.max_in_flight) + " requests in flight",
                false);
      return false;
    }
    c->requests_in++;
    if (rx.payload_bytes >= kPlaceMinBytes && options_.placer) {
      rx.placed = options_.placer(rx.h.type, body, rx.payload_bytes);
    }
    if (rx.placed.data != nullptr) {
      rx.dst = rx.placed.data;
    } else if (rx.payload_bytes > 0) {
      rx.vec.resize(rx.payload_bytes);
      rx.dst = rx.vec.data();
    }
    return true;
  }
  // A reply: into its call's buffer, unless nobody waits for it or it does not fit.
  std::shared_ptr<Call::State> call;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = c->calls.find(rx.h.call_id);
    if (it != c->calls.end()) {
      call = it->second;
      c->calls.erase(it);
      c->calls_out--;
      deadlines_.erase(rx.h.call_id);
    }
  }
  cv_.notify_all();
  if (call == nullptr) return true;  // a call given up on: its payload is read and dropped
  call->body.assign(body.begin(), body.end());
  if (rx.payload_bytes > 0 && (rx.h.status != 0 || rx.payload_bytes > call->reply_capacity)) {
    call->Settle(rx.h.status != 0
                     ? ReplyStatus(rx.h, body)
                     : Status::Size("the reply from " + c->peer + " is " +
                                    std::to_string(rx.payload_bytes) + " bytes, more than the " +
                                    std::to_string(call->reply_capacity) +
                                    " the caller has room for"));
    return true;
  }
  if (rx.payload_bytes > 0) {
    std::lock_guard<std::mutex> lock(call->mu);
    call->recv_busy = true;
  }
  rx.call = std::move(call);
  rx.dst = static_cast<uint8_t*>(rx.call->reply_buffer);
  return true;
}

void TransportImpl::FinishMessage(Conn* c) {
  RxState rx = std::move(c->rx);
  c->rx = RxState{};
  std::vector<uint8_t> body(rx.head.begin() + kSocketPrefixBytes, rx.head.end());
  if (rx.h.kind == Kind::kRequest) {
    Deliver(c->id, rx.h, std::move(body), std::move(rx.vec), std::move(rx.placed),
            rx.payload_bytes);
    return;
  }
  if (rx.call == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(rx.call->mu);
    rx.call->recv_busy = false;
  }
  rx.call->payload_bytes = rx.payload_bytes;
  rx.call->Settle(ReplyStatus(rx.h, body));
  rx.call->UpdateReleased();
}

void TransportImpl::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<TransportImpl*>(arg);
  Conn* c = self->FindByEp(ep);
  if (c == nullptr) return;
  self->CloseConn(c->id, "the connection failed: " + UcsText(status), false);
}

// Every active message names the receiver's connection by the key it handed out in its
// handshake; one that does not decode, or names no open connection, is dropped unread (a
// rendezvous payload is never fetched).
ucs_status_t TransportImpl::OnAm(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<TransportImpl*>(arg);
  bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  WireHeader h;
  std::span<const uint8_t> body;
  Status st = DecodeWireHeader({static_cast<const uint8_t*>(header), header_length}, "a message",
                               &h, &body);
  Conn* c = nullptr;
  if (st.ok()) {
    auto it = self->by_key_.find(h.conn_key);
    if (it != self->by_key_.end() && it->second->state == ConnState::kOpen) c = it->second;
  }
  if (c == nullptr) {
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->stats_.dropped++;
    }
    self->LogHostile("dropped " +
                     (st.ok() ? std::string("a message for no open connection") : st.message()));
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
  }
  return self->HandleAm(c, h, body, data, length, rndv);
}

ucs_status_t TransportImpl::HandleAm(Conn* c, const WireHeader& h, std::span<const uint8_t> body,
                                     void* data, size_t length, bool rndv) {
  CKPTDB_ASSERT(c->state == ConnState::kOpen);
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
             reply->payload_bytes, std::shared_ptr<const void>(reply, nullptr), nullptr,
             reply->payload_fd, reply->payload_file_offset);
      }
    });
  }
}

void TransportImpl::Send(Conn* c, Kind kind, uint16_t type, uint64_t call_id, int32_t status,
                         std::span<const uint8_t> body, const void* payload, size_t payload_bytes,
                         std::shared_ptr<const void> keep, std::shared_ptr<Call::State> call,
                         int file_fd, uint64_t file_offset) {
  CKPTDB_ASSERT(c->state == ConnState::kOpen);
  CKPTDB_ASSERT((c->path == DataPath::kUcx) == (c->ep != nullptr));
  WireWriter w;
  WireHeader h;
  h.kind = kind;
  h.type = type;
  h.conn_key = c->peer_key;
  h.call_id = call_id;
  h.status = status;
  h.body_bytes = static_cast<uint32_t>(body.size());
  EncodeWireHeader(h, &w);
  const bool socket = c->path == DataPath::kSocket;
  if (socket) w.U64(payload_bytes);  // the socket path's prefix: the payload's length
  w.Raw(body.data(), body.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_sent += body.size() + payload_bytes;
  }
  if (socket) {
    OutMsg m;
    m.head = w.Take();
    m.payload = static_cast<const uint8_t*>(payload);
    m.payload_bytes = payload_bytes;
    m.keep = std::move(keep);
    m.call = std::move(call);
    m.file_fd = payload_bytes > 0 ? file_fd : -1;
    m.file_offset = file_offset;
    c->sendq.push_back(std::move(m));
    if (!c->want_out) FlushSock(c);  // else the socket is full: EPOLLOUT resumes the queue
    return;
  }
  auto* ctx = new SendCtx;
  ctx->impl = this;
  ctx->conn = c->id;
  ctx->keep = std::move(keep);
  ctx->call = std::move(call);
  ctx->header = w.Take();
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
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

// A handshake that cannot go on: the client's Connect fails with `st`; a server closes the
// connection, saying why.
void TransportImpl::HandshakeFailed(Conn* c, Status st) {
  if (c->client) {
    FailConnect(c, std::move(st));
  } else {
    CloseConn(c->id, st.message(), false);
  }
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
  c->state = ConnState::kClientConnecting;
  c->handshake_deadline_ms = NowMs() + std::min(timeout_ms, options_.handshake_timeout_ms);
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
