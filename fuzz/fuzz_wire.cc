// libFuzzer target for the transport's framing (transport/wire_format.h): any bytes as a whole
// message (header and body), and as the body of each handshake message (Hello, Challenge,
// Proof), which a peer sends before it has proved it holds the job token. What decodes must
// encode back to the very same bytes, every refusal is Corrupt, and nothing may read past the
// input or trip a sanitizer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "ckptdb/ckptdb.h"
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
  for (Kind kind : {Kind::kHello, Kind::kChallenge, Kind::kProof}) {
    HandshakeBody b;
    st = ParseHandshake(kind, in, "fuzz", &b);
    if (!st.ok()) {
      if (st.code() != CKPTDB_ECORRUPT) std::abort();
      continue;
    }
    if (b.name.size() > kMaxPeerNameBytes) std::abort();
    const std::vector<uint8_t> again = EncodeHandshake(kind, b);
    if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  }
  return 0;
}
