// ckptdb's TCP listener and the job-token handshake (docs/transport.md, "The handshake, byte by
// byte", "Bounds"): accepting (at most kMaxPendingConnections strangers, the oldest dropped),
// reading frames (at most kMaxHandshakeFrameBytes, within the handshake's deadline), Hello,
// Challenge, Proof, Welcome, and opening the connection's data path once the peer has proved
// it holds the token. Nothing a stranger sends reaches UCX. Progress thread only.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "transport/transport_impl.h"
#include "transport/wire.h"
#include "transport/wire_format.h"
#include "util/assert.h"
#include "util/clock.h"

namespace ckpt::transport {

uint64_t TransportImpl::NewKey() {
  uint64_t k = 0;
  do {
    randombytes_buf(&k, sizeof k);
  } while (k == 0 || by_key_.count(k) != 0);
  CKPTDB_ASSERT(k != 0);
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
    c->handshake_deadline_ms = MonoMs() + options_.handshake_timeout_ms;
    {
      std::lock_guard<std::mutex> lock(mu_);
      c->id = next_conn_++;
      conns_[c->id] = c;
    }
    by_fd_[fd] = c->id;
    pending_.insert(c->id);
    CKPTDB_ASSERT(pending_.size() <= kMaxPendingHandshakes);
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
      if (c->state == ConnState::kOpen) SetLowat(c.get());
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
  // Only a connection still in its handshake reads frames (ReadSocket), and its side decides
  // which states it can be in.
  CKPTDB_ASSERT(
      c->client ? c->state == ConnState::kClientHello || c->state == ConnState::kClientProof
                : c->state == ConnState::kServerNew || c->state == ConnState::kServerChallenged);
  CKPTDB_ASSERT(c->in.empty() && c->in_body == 0);
  if (!c->client && c->state == ConnState::kServerNew && f.kind == HandshakeKind::kHello) {
    OnHello(c, f);
    return;
  }
  if (c->client && c->state == ConnState::kClientHello && f.kind == HandshakeKind::kChallenge) {
    OnChallenge(c, f);
    return;
  }
  if (!c->client && c->state == ConnState::kServerChallenged && f.kind == HandshakeKind::kProof) {
    OnProof(c, f);
    return;
  }
  if (c->client && c->state == ConnState::kClientProof && f.kind == HandshakeKind::kWelcome) {
    OnWelcome(c, f);
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

// Server: a Hello. Answers with a Challenge: its own nonce, and a MAC that proves this side holds
// the token.
void TransportImpl::OnHello(Conn* c, const HandshakeFrame& f) {
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
}

// Client: the Challenge. Checks the server's MAC, then sends the Proof: this side's MAC over both
// nonces, its connection key and its UCX worker's address.
void TransportImpl::OnChallenge(Conn* c, const HandshakeFrame& f) {
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
}

// Server: the Proof. A wrong MAC is refused and closed; a right one opens the connection (over
// UCX where it reaches the peer, else on this socket) and sends the Welcome.
void TransportImpl::OnProof(Conn* c, const HandshakeFrame& f) {
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
  CKPTDB_ASSERT(c->state == ConnState::kOpen && by_key_.at(c->my_key) == c);
  HandshakeFrame out;
  out.kind = HandshakeKind::kWelcome;
  out.conn_key = c->my_key;
  out.path = path;
  if (path == DataPath::kUcx) out.address = worker_address_;
  out.mac = HandshakeMac(key_.data(), MacRole::kWelcome, c->their_nonce, c->my_nonce, c->my_key,
                         static_cast<uint8_t>(path), out.address);
  WriteFrame(c, out);
}

// Client: the Welcome. Checks its MAC and opens the connection on the path the server chose;
// the Connect waiting for it returns.
void TransportImpl::OnWelcome(Conn* c, const HandshakeFrame& f) {
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
}

// Opens the connection on `path`: over UCX, an endpoint to the peer's worker at the address it
// proved in its MAC; on the socket, nothing more to make.
Status TransportImpl::OpenConn(Conn* c, DataPath path, std::span<const uint8_t> address) {
  // Opened once, after the peer's proof (server) or its verified welcome (client), with a key
  // of this side's that no other open connection has.
  CKPTDB_ASSERT(c->state == (c->client ? ConnState::kClientProof : ConnState::kServerChallenged));
  CKPTDB_ASSERT(c->my_key != 0 && by_key_.count(c->my_key) == 0 && c->ep == nullptr);
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
  CKPTDB_ASSERT(c->state != ConnState::kClosed && c->state != ConnState::kClientConnecting);
  std::vector<uint8_t> bytes = EncodeHandshakeFrame(f);
  CKPTDB_ASSERT(bytes.size() <= kMaxHandshakeFrameBytes);
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

}  // namespace ckpt::transport
