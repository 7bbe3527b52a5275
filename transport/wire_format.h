// The transport's own framing (docs/transport.md): the 34-byte header every message starts
// with, and the handshake frames that travel on ckptdb's own TCP socket before anything reaches
// UCX (a peer proves it holds the job token, then the two sides swap connection keys, UCX worker
// addresses and the data path), and the descriptor of a one-sided window. Pure encoding, kept apart
// from UCX and sockets so that fuzz/fuzz_wire.cc can feed it any bytes: a decoder accepts exactly
// what its encoder writes.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transport/wire.h"
#include "util/status.h"

namespace ckpt::transport {

// ---- Active messages (over UCX, between authenticated peers) ----

inline constexpr uint32_t kWireMagic = 0x5750'4B43;  // "CKPW"
inline constexpr uint16_t kWireVersion = 2;          // 2: the receiver's connection key
inline constexpr size_t kWireHeaderBytes = 4 + 2 + 1 + 1 + 2 + 8 + 8 + 4 + 4;

enum class Kind : uint8_t {
  kRequest = 1,
  kReply = 2,
};

struct WireHeader {
  Kind kind = Kind::kRequest;
  uint16_t type = 0;
  uint64_t conn_key = 0;  // the receiver's key for this connection, from the handshake
  uint64_t call_id = 0;
  int32_t status = 0;
  uint32_t body_bytes = 0;
};

void EncodeWireHeader(const WireHeader& h, WireWriter* w);

// A whole message (header and body, as one active-message header): Corrupt unless it is one
// EncodeWireHeader wrote, followed by exactly body_bytes (at most kMaxBodyBytes) of body.
Status DecodeWireHeader(std::span<const uint8_t> in, const std::string& what, WireHeader* h,
                        std::span<const uint8_t>* body);
// The header alone (exactly kWireHeaderBytes), as the socket path reads it before the body:
// Corrupt unless EncodeWireHeader wrote it with a body of at most kMaxBodyBytes.
Status DecodeWireHeaderOnly(std::span<const uint8_t> in, const std::string& what, WireHeader* h);

// On the socket path (no UCX endpoint between the two) a message is the header, the payload's
// length (u64) and the body, then the payload.
inline constexpr size_t kSocketPrefixBytes = kWireHeaderBytes + 8;

// ---- The handshake (over ckptdb's TCP socket, before anything reaches UCX) ----

inline constexpr uint32_t kHandshakeMagic = 0x4850'4B43;  // "CKPH"
inline constexpr uint8_t kHandshakeVersion = 1;
inline constexpr size_t kHandshakeHeaderBytes = 4 + 1 + 1 + 2 + 4;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;  // crypto_auth (HMAC-SHA-512-256)
inline constexpr size_t kMaxPeerNameBytes = 256;
// A UCX worker address (all of its transports' interface addresses): a few hundred bytes with
// tcp and shared memory; room for many RDMA devices.
inline constexpr size_t kMaxWorkerAddressBytes = 8192;
// The largest frame body: a Welcome or Proof with the largest address. A frame announcing more
// is refused from its 12-byte header, before its body is read.
inline constexpr size_t kMaxHandshakeBodyBytes = kMacBytes + 8 + 1 + 4 + kMaxWorkerAddressBytes;
inline constexpr size_t kMaxHandshakeFrameBytes = kHandshakeHeaderBytes + kMaxHandshakeBodyBytes;

enum class HandshakeKind : uint8_t {
  kHello = 1,      // client -> server: name, client nonce
  kChallenge = 2,  // server -> client: name, server nonce, the server's MAC
  kProof = 3,      // client -> server: the client's MAC, its connection key, its worker address
  kWelcome = 4,    // server -> client: the server's MAC, its connection key, its worker address
  kRefused = 5,    // server -> client: the proof did not verify (no body)
};

// How a connection's messages travel, as the server decided and its Welcome says: over a UCX
// endpoint (shared memory, RDMA: a transport UCX has and tcp is not among them), or on ckptdb's
// own authenticated socket.
enum class DataPath : uint8_t { kSocket = 1, kUcx = 2 };

struct HandshakeFrame {
  HandshakeKind kind = HandshakeKind::kHello;
  std::string name;                          // Hello, Challenge: the sender's name
  std::array<uint8_t, kNonceBytes> nonce{};  // Hello, Challenge
  std::array<uint8_t, kMacBytes> mac{};      // Challenge, Proof, Welcome
  uint64_t conn_key = 0;                     // Proof, Welcome: what the other side puts in headers
  DataPath path = DataPath::kSocket;         // Welcome
  std::vector<uint8_t> address;              // Proof, Welcome: the sender's UCX worker address
                                             // (empty: it runs no UCX worker)
};

// The frame: header (magic, version, kind, reserved 0, body length) and body.
std::vector<uint8_t> EncodeHandshakeFrame(const HandshakeFrame& f);
// Reads the 12-byte header: Corrupt unless magic, version, kind and reserved are as written and
// the body length is at most kMaxHandshakeBodyBytes.
Status DecodeHandshakeHeader(std::span<const uint8_t> header, const std::string& what,
                             HandshakeKind* kind, uint32_t* body_bytes);
// Reads a body of `kind`: Corrupt for anything EncodeHandshakeFrame would not have written.
Status ParseHandshakeBody(HandshakeKind kind, std::span<const uint8_t> body,
                          const std::string& what, HandshakeFrame* out);

// The MACs (docs/transport.md): HMAC-SHA-512-256 keyed with `key` (crypto_auth_KEYBYTES,
// a BLAKE2b-256 hash of the job token) over a 16-byte role label, both nonces, and for the proof
// and the welcome the sender's connection key, the data path (the welcome's; 0 in a proof) and
// worker address, so that none of them can be swapped.
enum class MacRole : uint8_t { kServer, kClient, kWelcome };
std::array<uint8_t, kMacBytes> HandshakeMac(const uint8_t* key, MacRole role,
                                            const uint8_t* client_nonce,
                                            const uint8_t* server_nonce, uint64_t conn_key,
                                            uint8_t path, std::span<const uint8_t> address);
// The key from a job token.
std::array<uint8_t, 32> HandshakeKey(const std::string& job_token);

// ---- One-sided windows (transport/rma.h), sent over an authenticated connection ----

inline constexpr uint64_t kMaxRmaWindowBytes = uint64_t{1} << 32;
inline constexpr size_t kMaxRmaWorkerAddressBytes = 2048;
inline constexpr size_t kMaxRmaKeyBytes = 1024;
inline constexpr size_t kMaxRmaDescriptorBytes =
    4 + 1 + 8 + 8 + 8 + 4 + kMaxRmaWorkerAddressBytes + 4 + kMaxRmaKeyBytes;
inline constexpr uint32_t kRmaDescriptorMagic = 0x52504B43;  // "CKPR" on the wire
inline constexpr uint8_t kRmaDescriptorVersion = 1;

// A window's descriptor, decoded (what travels between the processes).
struct RmaDescriptor {
  uint64_t id = 0;       // the exposing process's random name for the window
  uint64_t bytes = 0;    // its size
  uint64_t address = 0;  // its address in the exposing process
  std::vector<uint8_t> worker_address;
  std::vector<uint8_t> rkey;
};
std::vector<uint8_t> EncodeRmaDescriptor(const RmaDescriptor& d);
// Refuses anything but an exact descriptor within the bounds; `what` names it in the error.
Status DecodeRmaDescriptor(std::span<const uint8_t> bytes, const std::string& what,
                           RmaDescriptor* out);

}  // namespace ckpt::transport
