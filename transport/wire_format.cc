#include "transport/wire_format.h"

#include "transport/transport.h"

namespace ckpt::transport {

void EncodeWireHeader(const WireHeader& h, WireWriter* w) {
  w->U32(kWireMagic);
  w->U16(kWireVersion);
  w->U8(static_cast<uint8_t>(h.kind));
  w->U8(0);
  w->U16(h.type);
  w->U64(h.call_id);
  w->I32(h.status);
  w->U32(h.body_bytes);
}

Status DecodeWireHeader(std::span<const uint8_t> in, const std::string& what, WireHeader* h,
                        std::span<const uint8_t>* body) {
  if (in.size() < kWireHeaderBytes) {
    return Status::Corrupt(what + ": a message header of " + std::to_string(in.size()) + " bytes");
  }
  WireReader r(in.first(kWireHeaderBytes), what);
  uint32_t magic = r.U32("magic");
  uint16_t version = r.U16("version");
  uint8_t kind = r.U8("kind");
  uint8_t reserved = r.U8("reserved");
  h->type = r.U16("type");
  h->call_id = r.U64("call_id");
  h->status = r.I32("status");
  h->body_bytes = r.U32("body_bytes");
  CKPTDB_RETURN_IF_ERROR(r.Finish());
  if (magic != kWireMagic) return Status::Corrupt(what + ": not a ckptdb message (bad magic)");
  if (version != kWireVersion) {
    return Status::Corrupt(what + ": wire version " + std::to_string(version) + ", expected " +
                           std::to_string(kWireVersion));
  }
  if (kind < 1 || kind > 7) return Status::Corrupt(what + ": unknown message kind");
  if (reserved != 0) return Status::Corrupt(what + ": reserved byte " + std::to_string(reserved));
  h->kind = static_cast<Kind>(kind);
  if (h->body_bytes != in.size() - kWireHeaderBytes || h->body_bytes > kMaxBodyBytes) {
    return Status::Corrupt(what + ": body length " + std::to_string(h->body_bytes) +
                           " does not match the message");
  }
  *body = in.subspan(kWireHeaderBytes);
  return Status::Ok();
}

std::vector<uint8_t> EncodeHandshake(Kind kind, const HandshakeBody& b) {
  WireWriter w;
  if (kind == Kind::kHello || kind == Kind::kChallenge) {
    w.Str(b.name);
    w.Raw(b.nonce.data(), b.nonce.size());
  }
  if (kind == Kind::kChallenge || kind == Kind::kProof) w.Raw(b.mac.data(), b.mac.size());
  return w.Take();
}

Status ParseHandshake(Kind kind, std::span<const uint8_t> body, const std::string& what,
                      HandshakeBody* out) {
  if (kind != Kind::kHello && kind != Kind::kChallenge && kind != Kind::kProof) {
    return Status::Corrupt(what + ": not a handshake message with a body");
  }
  WireReader r(body, what);
  if (kind == Kind::kHello || kind == Kind::kChallenge) {
    out->name = r.Str("name", kMaxPeerNameBytes);
    r.Raw(out->nonce.data(), out->nonce.size(), "nonce");
  }
  if (kind == Kind::kChallenge || kind == Kind::kProof)
    r.Raw(out->mac.data(), out->mac.size(), "mac");
  return r.Finish();
}

}  // namespace ckpt::transport
