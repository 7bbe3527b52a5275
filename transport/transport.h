// Transport: ckptdb's own channel between ranks (DESIGN.md section 7; docs/transport.md).
//
// One progress thread per Transport owns its sockets and, where it runs one, its UCX worker;
// every other thread talks to it through a queue and an eventfd, so the worker runs in UCX's
// single-thread mode.
//
// ckptdb owns the listening socket: a plain TCP listener on "host:port". A connection is a TCP
// connection on which both ends first prove they hold the job token (CKPTDB_JOB_TOKEN): an HMAC
// (HMAC-SHA-512-256 keyed with a BLAKE2b hash of the token) over two fresh 32-byte nonces, one
// from each end, so a recorded handshake cannot be replayed. Only then do the two ends swap their
// connection keys, UCX worker addresses and the server's choice of data path, inside the MACs:
// no unauthenticated byte reaches UCX, and ckptdb creates no ucp_listener. The TCP socket stays
// open as the connection's lifeline (either end closing it closes the connection). The frames
// are transport/wire_format.h; docs/transport.md has them byte by byte.
//
// Messages (a small header naming the receiver's connection by the key it handed out, a body,
// and an optional payload) travel over UCX active messages where UCX reaches the peer without
// tcp and with peer-failure handling (RDMA; a large payload goes by rendezvous straight into the
// buffer the receiver chose), and on the handshake's socket otherwise (the receiver reads a
// payload straight into its place as well). UCX is never given its tcp transport, whose own
// listeners parse strangers' bytes. A message that names no open connection is dropped unread.
//
// Bounds: at most kMaxPendingHandshakes connections wait to authenticate (a new one closes the
// oldest), each for handshake_timeout_ms; a handshake frame is at most kMaxHandshakeFrameBytes
// (refused from its header). A connection carries at most max_in_flight calls each way (the
// caller blocks for a slot; a peer exceeding it is disconnected), bodies are at most
// kMaxBodyBytes, payloads at most max_payload_bytes, and every wait has a timeout. A call whose
// wait times out tears its connection down (an unresponsive peer is treated as a vanished one)
// and fails with ETIMEDOUT; a peer that vanishes fails its calls with EPEER naming it.
//
// What the token protects: only holders of the token join, and strangers (scanners, misdirected
// clients, garbage) are refused before UCX or the engine sees a byte. What it does not: traffic
// is authenticated at connection time, not encrypted or MACed per message; an attacker who can
// read and inject on the network path can read checkpoints and hijack an open connection.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "util/status.h"

namespace ckpt::transport {

inline constexpr size_t kMaxBodyBytes =
    4000;  // fits the active-message header UCX allows on tcp (8 KiB)
// Connections accepted and not yet authenticated, per transport. At the bound a new connection
// closes the oldest waiting one, so idle strangers cannot lock a rank out.
inline constexpr size_t kMaxPendingHandshakes = 64;
inline constexpr int kDefaultHandshakeTimeoutMs = 5000;

// Where a request's payload goes when it arrives by rendezvous (a large payload): memory the
// receiver chose before any payload byte was fetched, so that bulk data lands once, in its final
// place (a replica piece straight into the replica's mapped memory), instead of in a fresh
// vector that the handler then copies. `keep` keeps `data` valid until the handler has returned.
struct PayloadPlace {
  uint8_t* data = nullptr;  // nullptr: receive into Request::payload
  std::shared_ptr<void> keep;
};
// Chooses a PayloadPlace for a request of `type` with `body` (not yet checked by anything but
// the wire decoder) and a payload of payload_bytes. Runs on the progress thread, only for peers
// that authenticated: it must not block, and must return nullptr for anything it does not
// recognize or whose range it cannot vouch for (the handler then sees the payload in a vector
// and refuses it with a clear error).
using Placer =
    std::function<PayloadPlace(uint16_t type, std::span<const uint8_t> body, size_t payload_bytes)>;

struct TransportOptions {
  std::string name;       // who this is, in logs and errors ("rank 3")
  std::string listen;     // "host:port" to accept on (port 0: any free port); empty: no listener
  std::string job_token;  // required: the secret every peer must prove it holds
  std::string tls;        // UCX_TLS for this context ("tcp", "shm,tcp"...); empty: UCX's choice
  uint32_t service_threads = 2;  // threads running the request handler
  uint32_t max_in_flight = 16;   // calls outstanding per connection, each way
  uint64_t max_payload_bytes = uint64_t{1} << 30;
  int handshake_timeout_ms = kDefaultHandshakeTimeoutMs;  // a stranger's time to authenticate
  Placer placer;  // optional: where rendezvous payloads of requests go
  // Tests only: UCX endpoints without peer-failure handling (UCP_ERR_HANDLING_MODE_NONE), so
  // that the UCX path runs over shared memory on a machine without RDMA. A peer's death in the
  // middle of a transfer is then a fatal error inside UCX: never in a job.
  bool ucx_without_peer_failure = false;
};

using PeerId = uint64_t;

// A request as the handler sees it.
struct Request {
  PeerId from = 0;
  std::string peer;  // the peer's name and address, for messages
  uint16_t type = 0;
  std::vector<uint8_t> body;
  std::vector<uint8_t> payload;  // the payload, unless the Placer placed it
  PayloadPlace placed;           // where the Placer had it received (placed_bytes of it)
  size_t placed_bytes = 0;
  uint64_t call_id = 0;  // the transport's, for routing the reply

  // The payload's bytes, wherever they were received.
  std::span<const uint8_t> Payload() const {
    return placed.data != nullptr ? std::span<const uint8_t>(placed.data, placed_bytes)
                                  : std::span<const uint8_t>(payload);
  }
};

// The handler's answer. status != 0 (a CKPTDB_E* code) makes the caller's Wait return that code
// with `message`. The payload is sent from `payload` and `keep` is held until it has been sent.
struct Reply {
  int32_t status = 0;
  std::string message;
  std::vector<uint8_t> body;
  const void* payload = nullptr;
  size_t payload_bytes = 0;
  std::shared_ptr<const void> keep;
  // Optional: the same payload_bytes are also at payload_file_offset of this file, which `keep`
  // keeps open. On the socket path they are then sent with sendfile, from the page cache, and the
  // pages at `payload` are never touched (a replica mapped since this process opened would fault
  // in or have to be populated page by page first). -1: none.
  int payload_fd = -1;
  uint64_t payload_file_offset = 0;
};

// Runs on a service thread; may block (it delays only this request and its connection's slot).
using Handler = std::function<void(const Request& request, Reply* reply)>;

struct TransportStats {
  uint64_t bytes_sent = 0;  // payload and body bytes, both directions of every call
  uint64_t bytes_received = 0;
  uint64_t calls = 0;
  uint64_t refused = 0;             // connections refused for a wrong token
  uint64_t unauthenticated = 0;     // accepted connections closed before they authenticated
  uint64_t evicted = 0;             // ... of them, closed to make room for a newer one
  uint64_t dropped = 0;             // messages dropped: undecodable, or for no open connection
  uint64_t ucx_connections = 0;     // connections opened over UCX (shared memory, RDMA)
  uint64_t socket_connections = 0;  // ... on ckptdb's own socket (between hosts without RDMA)
};

// What UCX may use, from a UCX_TLS-style list ("tcp", "shm,tcp", "^rc", ""): the same without
// tcp, whose listeners parse strangers' bytes (docs/transport.md, "Who owns which socket");
// empty when nothing is left.
std::string UcxTransports(const std::string& tls);
// The items of a UCX_TLS-style list, in order, without its leading '^' and empty items.
std::vector<std::string> TlsItems(const std::string& list);

class Transport;
class TransportImpl;

// One request in flight. The payload it sends and the reply buffer it receives into must stay
// valid until Wait has returned (whatever it returns).
class Call {
 public:
  // The outcome: Ok, the handler's error, ETIMEDOUT (the connection is then torn down), EPEER.
  Status Wait(int timeout_ms);
  const std::vector<uint8_t>& body() const { return body_; }
  size_t payload_bytes() const { return payload_bytes_; }  // received into the reply buffer

  struct State;  // shared with the progress thread (transport.cc)

 private:
  friend class Transport;
  friend class TransportImpl;
  std::shared_ptr<State> state_;
  TransportImpl* owner_ = nullptr;
  std::vector<uint8_t> body_;
  size_t payload_bytes_ = 0;
};

class Transport {
 public:
  static Status Start(const TransportOptions& options, Handler handler,
                      std::unique_ptr<Transport>* out);
  ~Transport();  // closes every connection, waits for the threads
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // The address peers reach the listener at ("host:port"); empty without a listener.
  const std::string& address() const;

  // Connects to "host:port" and runs the handshake. EPEER when it cannot connect, EAUTH-like
  // Invalid when the peer refuses the token or cannot prove it holds it, ETIMEDOUT.
  Status Connect(const std::string& address, int timeout_ms, PeerId* out);
  void Disconnect(PeerId peer);
  // The peer's "name (address)", for messages.
  std::string PeerName(PeerId peer) const;
  // How the connection's messages travel: "socket" (ckptdb's own), "ucx-am" (UCX active
  // messages), "closed".
  std::string PathName(PeerId peer) const;

  // Starts a call: `type` (>= 16; lower ones are the transport's own), `body` (at most
  // kMaxBodyBytes), a payload, and where a reply's payload may go (up to reply_capacity bytes; a
  // bigger one fails the call). Blocks while the connection has max_in_flight calls out.
  Status Start(PeerId peer, uint16_t type, std::vector<uint8_t> body, const void* payload,
               size_t payload_bytes, void* reply_buffer, size_t reply_capacity,
               std::unique_ptr<Call>* out);
  // Start + Wait.
  Status CallSync(PeerId peer, uint16_t type, std::vector<uint8_t> body, const void* payload,
                  size_t payload_bytes, int timeout_ms, std::vector<uint8_t>* reply_body,
                  void* reply_buffer = nullptr, size_t reply_capacity = 0,
                  size_t* reply_payload_bytes = nullptr);

  TransportStats stats() const;

 private:
  explicit Transport(std::unique_ptr<TransportImpl> impl);
  std::unique_ptr<TransportImpl> impl_;
};

}  // namespace ckpt::transport
