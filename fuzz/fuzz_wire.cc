// libFuzzer target for the transport's framing (transport/wire_format.h): any bytes as a whole
// message (header and body), and as a handshake frame (its 12-byte header, then its body as each
// kind's), which a stranger sends before it has proved it holds the job token, and as a one-sided
// window's descriptor (transport/rma.h), which a peer sends after it has. What decodes must
// encode back to the very same bytes, every refusal is Corrupt, and nothing may read past the
// input or trip a sanitizer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "transport/rma.h"
#include "transport/wire_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt::transport;
  const std::span<const uint8_t> in(data, size);
  WireHeader h;
  std::span<const uint8_t> body;
  ckpt::Status st = DecodeWireHeader(in, "fuzz", &h, &body);
  if (st.ok()) {
    WireWriter w;
    EncodeWireHeader(h, &w);
    w.Raw(body.data(), body.size());
    const std::vector<uint8_t> again = w.Take();
    if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  } else if (st.code() != CKPTDB_ECORRUPT) {
    std::abort();
  }
  // A whole frame, as the transport reads it: the header, then exactly the body it announces.
  if (size >= kHandshakeHeaderBytes) {
    HandshakeKind kind;
    uint32_t body_bytes = 0;
    st = DecodeHandshakeHeader(in.first(kHandshakeHeaderBytes), "fuzz", &kind, &body_bytes);
    if (st.ok()) {
      if (body_bytes > kMaxHandshakeBodyBytes) std::abort();
      if (size == kHandshakeHeaderBytes + body_bytes) {
        HandshakeFrame f;
        st = ParseHandshakeBody(kind, in.subspan(kHandshakeHeaderBytes), "fuzz", &f);
        if (st.ok()) {
          if (f.name.size() > kMaxPeerNameBytes || f.address.size() > kMaxWorkerAddressBytes) {
            std::abort();
          }
          const std::vector<uint8_t> again = EncodeHandshakeFrame(f);
          if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
        } else if (st.code() != CKPTDB_ECORRUPT) {
          std::abort();
        }
      }
    } else if (st.code() != CKPTDB_ECORRUPT) {
      std::abort();
    }
  }
  // Any bytes as the body of each kind.
  for (uint8_t k = 1; k <= 5; ++k) {
    HandshakeFrame f;
    st = ParseHandshakeBody(static_cast<HandshakeKind>(k), in, "fuzz", &f);
    if (!st.ok()) {
      if (st.code() != CKPTDB_ECORRUPT) std::abort();
      continue;
    }
    const std::vector<uint8_t> again = EncodeHandshakeFrame(f);
    if (again.size() != kHandshakeHeaderBytes + size ||
        !std::equal(again.begin() + kHandshakeHeaderBytes, again.end(), data)) {
      std::abort();
    }
  }
  // Any bytes as a window descriptor.
  RmaDescriptor d;
  st = DecodeRmaDescriptor(in, "fuzz", &d);
  if (st.ok()) {
    if (d.bytes == 0 || d.bytes > kMaxRmaWindowBytes || d.rkey.size() > kMaxRmaKeyBytes ||
        d.worker_address.size() > kMaxRmaWorkerAddressBytes) {
      std::abort();
    }
    const std::vector<uint8_t> again = EncodeRmaDescriptor(d);
    if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  } else if (st.code() != CKPTDB_ECORRUPT && st.code() != CKPTDB_EINVAL) {
    std::abort();
  }
  return 0;
}
