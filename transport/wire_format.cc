#include "transport/wire_format.h"

#include <sodium.h>

#include <cstring>

#include "transport/transport.h"

namespace ckpt::transport {

static_assert(crypto_auth_hmacsha512256_BYTES == kMacBytes);
static_assert(crypto_auth_hmacsha512256_KEYBYTES == 32);

void EncodeWireHeader(const WireHeader& h, WireWriter* w) {
  w->U32(kWireMagic);
  w->U16(kWireVersion);
  w->U8(static_cast<uint8_t>(h.kind));
  w->U8(0);
  w->U16(h.type);
  w->U64(h.conn_key);
  w->U64(h.call_id);
  w->I32(h.status);
  w->U32(h.body_bytes);
}

Status DecodeWireHeader(std::span<const uint8_t> in, const std::string& what, WireHeader* h,
                        std::span<const uint8_t>* body) {
  if (in.size() < kWireHeaderBytes) {
    return Status::Corrupt(what + ": a message header of " + std::to_string(in.size()) + " bytes");
  }
  CKPTDB_RETURN_IF_ERROR(DecodeWireHeaderOnly(in.first(kWireHeaderBytes), what, h));
  if (h->body_bytes != in.size() - kWireHeaderBytes) {
    return Status::Corrupt(what + ": body length " + std::to_string(h->body_bytes) +
                           " does not match the message");
  }
  *body = in.subspan(kWireHeaderBytes);
  return Status::Ok();
}

Status DecodeWireHeaderOnly(std::span<const uint8_t> in, const std::string& what, WireHeader* h) {
  if (in.size() != kWireHeaderBytes) {
    return Status::Corrupt(what + ": a message header of " + std::to_string(in.size()) + " bytes");
  }
  WireReader r(in, what);
  uint32_t magic = r.U32("magic");
  uint16_t version = r.U16("version");
  uint8_t kind = r.U8("kind");
  uint8_t reserved = r.U8("reserved");
  h->type = r.U16("type");
  h->conn_key = r.U64("conn_key");
  h->call_id = r.U64("call_id");
  h->status = r.I32("status");
  h->body_bytes = r.U32("body_bytes");
  CKPTDB_RETURN_IF_ERROR(r.Finish());
  if (magic != kWireMagic) return Status::Corrupt(what + ": not a ckptdb message (bad magic)");
  if (version != kWireVersion) {
    return Status::Corrupt(what + ": wire version " + std::to_string(version) + ", expected " +
                           std::to_string(kWireVersion));
  }
  if (kind < 1 || kind > 2) return Status::Corrupt(what + ": unknown message kind");
  if (reserved != 0) return Status::Corrupt(what + ": reserved byte " + std::to_string(reserved));
  h->kind = static_cast<Kind>(kind);
  if (h->body_bytes > kMaxBodyBytes) {
    return Status::Corrupt(what + ": body length " + std::to_string(h->body_bytes) +
                           " does not match the message (at most " + std::to_string(kMaxBodyBytes) +
                           ")");
  }
  return Status::Ok();
}

std::vector<uint8_t> EncodeHandshakeFrame(const HandshakeFrame& f) {
  WireWriter body;
  switch (f.kind) {
    case HandshakeKind::kHello:
    case HandshakeKind::kChallenge:
      body.Str(f.name);
      body.Raw(f.nonce.data(), f.nonce.size());
      if (f.kind == HandshakeKind::kChallenge) body.Raw(f.mac.data(), f.mac.size());
      break;
    case HandshakeKind::kProof:
    case HandshakeKind::kWelcome:
      body.Raw(f.mac.data(), f.mac.size());
      body.U64(f.conn_key);
      if (f.kind == HandshakeKind::kWelcome) body.U8(static_cast<uint8_t>(f.path));
      body.Bytes(f.address);
      break;
    case HandshakeKind::kRefused:
      break;
  }
  WireWriter w;
  w.U32(kHandshakeMagic);
  w.U8(kHandshakeVersion);
  w.U8(static_cast<uint8_t>(f.kind));
  w.U16(0);
  w.U32(static_cast<uint32_t>(body.buffer().size()));
  w.Raw(body.buffer().data(), body.buffer().size());
  return w.Take();
}

Status DecodeHandshakeHeader(std::span<const uint8_t> header, const std::string& what,
                             HandshakeKind* kind, uint32_t* body_bytes) {
  if (header.size() != kHandshakeHeaderBytes) {
    return Status::Corrupt(what + ": a handshake header of " + std::to_string(header.size()) +
                           " bytes");
  }
  WireReader r(header, what);
  uint32_t magic = r.U32("magic");
  uint8_t version = r.U8("version");
  uint8_t k = r.U8("kind");
  uint16_t reserved = r.U16("reserved");
  *body_bytes = r.U32("body_bytes");
  CKPTDB_RETURN_IF_ERROR(r.Finish());
  if (magic != kHandshakeMagic) {
    return Status::Corrupt(what + ": not a ckptdb handshake (bad magic)");
  }
  if (version != kHandshakeVersion) {
    return Status::Corrupt(what + ": handshake version " + std::to_string(version) + ", expected " +
                           std::to_string(kHandshakeVersion));
  }
  if (k < 1 || k > 5)
    return Status::Corrupt(what + ": unknown handshake kind " + std::to_string(k));
  if (reserved != 0) return Status::Corrupt(what + ": reserved field " + std::to_string(reserved));
  if (*body_bytes > kMaxHandshakeBodyBytes) {
    return Status::Corrupt(what + ": a handshake body of " + std::to_string(*body_bytes) +
                           " bytes, more than the " + std::to_string(kMaxHandshakeBodyBytes) +
                           " allowed");
  }
  *kind = static_cast<HandshakeKind>(k);
  return Status::Ok();
}

Status ParseHandshakeBody(HandshakeKind kind, std::span<const uint8_t> body,
                          const std::string& what, HandshakeFrame* out) {
  WireReader r(body, what);
  out->kind = kind;
  switch (kind) {
    case HandshakeKind::kHello:
    case HandshakeKind::kChallenge:
      out->name = r.Str("name", kMaxPeerNameBytes);
      r.Raw(out->nonce.data(), out->nonce.size(), "nonce");
      if (kind == HandshakeKind::kChallenge) r.Raw(out->mac.data(), out->mac.size(), "mac");
      break;
    case HandshakeKind::kProof:
    case HandshakeKind::kWelcome: {
      r.Raw(out->mac.data(), out->mac.size(), "mac");
      out->conn_key = r.U64("conn_key");
      if (kind == HandshakeKind::kWelcome) {
        const uint8_t path = r.U8("path");
        if (r.ok() && path != static_cast<uint8_t>(DataPath::kSocket) &&
            path != static_cast<uint8_t>(DataPath::kUcx)) {
          return Status::Corrupt(what + ": unknown data path " + std::to_string(path));
        }
        out->path = static_cast<DataPath>(path);
      }
      auto a = r.Bytes("address", kMaxWorkerAddressBytes);
      out->address.assign(a.begin(), a.end());
      if (r.ok() && kind == HandshakeKind::kWelcome && out->path == DataPath::kUcx && a.empty()) {
        return Status::Corrupt(what + ": a UCX data path without a worker address");
      }
      break;
    }
    case HandshakeKind::kRefused:
      break;
    default:
      return Status::Corrupt(what + ": unknown handshake kind");
  }
  return r.Finish();
}

std::array<uint8_t, kMacBytes> HandshakeMac(const uint8_t* key, MacRole role,
                                            const uint8_t* client_nonce,
                                            const uint8_t* server_nonce, uint64_t conn_key,
                                            uint8_t path, std::span<const uint8_t> address) {
  uint8_t label[16] = {};
  const char* text = role == MacRole::kServer   ? "ckptdb-server"
                     : role == MacRole::kClient ? "ckptdb-client"
                                                : "ckptdb-welcome";
  std::memcpy(label, text, std::strlen(text));
  crypto_auth_hmacsha512256_state st;
  crypto_auth_hmacsha512256_init(&st, key, crypto_auth_hmacsha512256_KEYBYTES);
  crypto_auth_hmacsha512256_update(&st, label, sizeof label);
  crypto_auth_hmacsha512256_update(&st, client_nonce, kNonceBytes);
  crypto_auth_hmacsha512256_update(&st, server_nonce, kNonceBytes);
  if (role != MacRole::kServer) {
    uint8_t k[8];
    for (int i = 0; i < 8; ++i) k[i] = static_cast<uint8_t>(conn_key >> (8 * i));
    uint8_t n[4];
    for (int i = 0; i < 4; ++i) n[i] = static_cast<uint8_t>(address.size() >> (8 * i));
    crypto_auth_hmacsha512256_update(&st, k, sizeof k);
    crypto_auth_hmacsha512256_update(&st, &path, 1);
    crypto_auth_hmacsha512256_update(&st, n, sizeof n);
    crypto_auth_hmacsha512256_update(&st, address.data(), address.size());
  }
  std::array<uint8_t, kMacBytes> out{};
  crypto_auth_hmacsha512256_final(&st, out.data());
  return out;
}

std::array<uint8_t, 32> HandshakeKey(const std::string& job_token) {
  std::array<uint8_t, 32> key{};
  crypto_generichash(key.data(), key.size(), reinterpret_cast<const uint8_t*>(job_token.data()),
                     job_token.size(), nullptr, 0);
  return key;
}

std::vector<uint8_t> EncodeRmaDescriptor(const RmaDescriptor& d) {
  WireWriter w;
  w.U32(kRmaDescriptorMagic);
  w.U8(kRmaDescriptorVersion);
  w.U64(d.id);
  w.U64(d.bytes);
  w.U64(d.address);
  w.Bytes(d.worker_address);
  w.Bytes(d.rkey);
  return w.Take();
}

Status DecodeRmaDescriptor(std::span<const uint8_t> bytes, const std::string& what,
                           RmaDescriptor* out) {
  if (bytes.size() > kMaxRmaDescriptorBytes) {
    return Status::Invalid(what + ": a window descriptor of " + std::to_string(bytes.size()) +
                           " bytes, more than " + std::to_string(kMaxRmaDescriptorBytes));
  }
  WireReader r(bytes, what + ": window descriptor");
  const uint32_t magic = r.U32("magic");
  const uint8_t version = r.U8("version");
  RmaDescriptor d;
  d.id = r.U64("id");
  d.bytes = r.U64("bytes");
  d.address = r.U64("address");
  auto worker = r.Bytes("worker address", kMaxRmaWorkerAddressBytes);
  auto rkey = r.Bytes("remote key", kMaxRmaKeyBytes);
  CKPTDB_RETURN_IF_ERROR(r.Finish());
  if (magic != kRmaDescriptorMagic || version != kRmaDescriptorVersion) {
    return Status::Invalid(what + ": not a window descriptor of version " +
                           std::to_string(kRmaDescriptorVersion));
  }
  if (d.bytes == 0 || d.bytes > kMaxRmaWindowBytes || d.address == 0 ||
      d.address > UINT64_MAX - d.bytes || worker.empty() || rkey.empty()) {
    return Status::Invalid(what + ": a window descriptor of " + std::to_string(d.bytes) +
                           " bytes at " + std::to_string(d.address) + " with a " +
                           std::to_string(worker.size()) + "-byte worker address and a " +
                           std::to_string(rkey.size()) + "-byte key");
  }
  d.worker_address.assign(worker.begin(), worker.end());
  d.rkey.assign(rkey.begin(), rkey.end());
  *out = std::move(d);
  return Status::Ok();
}

}  // namespace ckpt::transport
