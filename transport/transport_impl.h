// TransportImpl, the body behind Transport (transport.h), shared by the files that make it up:
//   transport.cc     start and stop, the progress loop, deadlines, connecting, calls, closing,
//                    the service threads that run the handler, and Transport's public methods;
//   handshake.cc     ckptdb's TCP listener: accepting, the job-token handshake byte by byte,
//                    the bounds on strangers (pending connections, deadlines, frame sizes);
//   socket_path.cc   messages on the handshake's socket (peers UCX cannot reach);
//   ucx_path.cc      messages over UCX active messages, and sending on either path.
// Everything that touches the UCX worker or a socket runs on the progress thread; other threads
// post closures to it (ops_) and wake it through an eventfd. mu_ guards the connection table,
// the calls and the queues; it is never held across a UCX call. Not part of any interface.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "transport/transport.h"
#include "transport/wire.h"
#include "transport/wire_format.h"
#include "util/status.h"

namespace ckpt::transport {

inline constexpr uint16_t kAmId = 7;
inline constexpr int kListenBacklog = 128;
inline constexpr int kAcceptPerRound =
    256;  // accepts per wakeup, so a storm cannot starve the worker
inline constexpr uint32_t kHostileLogLines = 5;
inline constexpr size_t kReadBudgetBytes = 8 << 20;  // socket bytes read from one peer per wakeup
// While a payload is read, the socket wakes the progress thread only once this much of it (or
// its rest, if less) is queued (SO_RCVLOWAT): a 32 MiB replica woke it about 120 times a
// checkpoint in 64-256 KiB pieces, on cores the trainer needs (docs/performance.md).
inline constexpr int kPayloadLowatBytes = 1 << 20;
// On the socket path a request's payload of at least this is offered to the Placer (smaller ones
// arrive in the request's vector, as UCX's eager messages do).
inline constexpr uint64_t kPlaceMinBytes = 64 << 10;
inline constexpr int64_t kHostileLogWindowMs = 10000;

// "host:port" (an IPv6 host in brackets) to a socket address; Invalid naming the address.
Status ParseHostPort(const std::string& address, sockaddr_storage* out, socklen_t* len);
// "host:port" of a socket address, for messages.
std::string SockaddrText(const sockaddr_storage& ss);
inline std::string UcsText(ucs_status_t s) { return ucs_status_string(s); }

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
    int rcvlowat = 1;          // the socket's SO_RCVLOWAT (SetLowat)
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
  void OnHello(Conn* c, const HandshakeFrame& f);
  void OnChallenge(Conn* c, const HandshakeFrame& f);
  void OnProof(Conn* c, const HandshakeFrame& f);
  void OnWelcome(Conn* c, const HandshakeFrame& f);
  void WriteFrame(Conn* c, const HandshakeFrame& f);
  void FlushOut(Conn* c);
  void WantOut(Conn* c, bool on);
  ssize_t Receive(Conn* c, void* into, size_t want, const char* eof_why);
  void FlushSock(Conn* c);
  void ReadSock(const std::shared_ptr<Conn>& c);
  void SetLowat(Conn* c);
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
  std::condition_variable cv_;  // connects and call slots
  // The service queue's own: one request wakes one service thread, and nothing else (a reply, a
  // connect) wakes any (they ran about 140 times a checkpoint a rank when they shared cv_).
  std::condition_variable requests_cv_;
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

}  // namespace ckpt::transport
