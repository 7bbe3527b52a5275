// The socket path (docs/transport.md, "Data paths", "Messages"): messages on the handshake's
// socket, for peers UCX cannot reach: a queue per connection written with sendmsg or sendfile,
// resumed on EPOLLOUT; reading a message's prefix, body, then its payload straight into its
// place. Progress thread only.
#include <signal.h>
#include <sys/epoll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/transport_impl.h"
#include "transport/wire.h"
#include "transport/wire_format.h"
#include "util/assert.h"

namespace ckpt::transport {

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

// Between wakeups: in a payload, the socket wakes the progress thread once kPayloadLowatBytes of
// it are queued, or all of its rest (never more than will come: the rest of this payload is
// owed); otherwise at the first byte. A peer that closes or fails wakes it regardless, and
// Linux wakes it early when the receive window cannot take the rest.
void TransportImpl::SetLowat(Conn* c) {
  const RxState& rx = c->rx;
  int want = 1;
  if (rx.in_payload && rx.payload_bytes > rx.got) {
    want = static_cast<int>(std::min<uint64_t>(rx.payload_bytes - rx.got, kPayloadLowatBytes));
  }
  if (want == c->rcvlowat) return;
  // Best effort: where it cannot be set, the thread wakes at each byte as before.
  if (setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0) c->rcvlowat = want;
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

}  // namespace ckpt::transport
