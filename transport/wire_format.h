// The transport's own framing (docs/commit-protocol.md, "Transport"): the 28-byte header every
// message starts with, and the bodies of the handshake that proves both ends hold the job token.
// Pure encoding, kept apart from UCX so that fuzz/fuzz_wire.cc can feed it any bytes: a decoder
// accepts exactly what its encoder writes.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transport/wire.h"
#include "util/status.h"

namespace ckpt::transport {

inline constexpr uint32_t kWireMagic = 0x5750'4B43;  // "CKPW"
inline constexpr uint16_t kWireVersion = 1;
inline constexpr size_t kWireHeaderBytes = 4 + 2 + 1 + 1 + 2 + 8 + 4 + 4;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;  // crypto_auth (HMAC-SHA512-256)
inline constexpr size_t kMaxPeerNameBytes = 256;

enum class Kind : uint8_t {
  kRequest = 1,
  kReply = 2,
  kHello = 3,      // client -> server: client nonce
  kChallenge = 4,  // server -> client: server nonce, server's proof
  kProof = 5,      // client -> server: client's proof
  kWelcome = 6,    // server -> client: accepted
  kRefused = 7,    // server -> client: the token did not match
};

struct WireHeader {
  Kind kind = Kind::kRequest;
  uint16_t type = 0;
  uint64_t call_id = 0;
  int32_t status = 0;
  uint32_t body_bytes = 0;
};

void EncodeWireHeader(const WireHeader& h, WireWriter* w);

// A whole message (header and body, as one active-message header): Corrupt unless it is one
// EncodeWireHeader wrote, followed by exactly body_bytes (at most kMaxBodyBytes) of body.
Status DecodeWireHeader(std::span<const uint8_t> in, const std::string& what, WireHeader* h,
                        std::span<const uint8_t>* body);

// The handshake's bodies: Hello (name, client nonce), Challenge (name, server nonce, the
// server's proof), Proof (the client's proof). Parse* are Corrupt for anything else.
struct HandshakeBody {
  std::string name;                          // Hello, Challenge: the sender's name
  std::array<uint8_t, kNonceBytes> nonce{};  // Hello, Challenge
  std::array<uint8_t, kMacBytes> mac{};      // Challenge, Proof
};
std::vector<uint8_t> EncodeHandshake(Kind kind, const HandshakeBody& b);
Status ParseHandshake(Kind kind, std::span<const uint8_t> body, const std::string& what,
                      HandshakeBody* out);

}  // namespace ckpt::transport
