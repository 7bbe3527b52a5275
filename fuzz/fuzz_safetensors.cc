// libFuzzer target for the safetensors reader (tools/safetensors.h; `ckptdb import` reads
// untrusted files): any bytes as a file. One that parses must have tensors whose byte ranges
// tile the buffer and whose shapes fill them, and must write back (BuildSafetensorsHeader) to a
// header that parses to the very same tensors and metadata; one that does not gets an Invalid
// status, never a crash, a hang or a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tools/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt::tools;
  SafetensorsFile f;
  ckpt::Status st = ParseSafetensors(data, size, size, "fuzz", &f);
  if (!st.ok()) {
    if (st.code() != -1 || st.message().empty()) std::abort();  // CKPTDB_EINVAL, with a reason
    return 0;
  }
  uint64_t next = f.buffer_offset;
  for (const SafetensorsTensor& t : f.tensors) {
    if (t.end < t.begin || f.buffer_offset + t.end > size) std::abort();
    next += t.end - t.begin;
  }
  if (next != size) std::abort();
  std::string header;
  if (!BuildSafetensorsHeader(f.tensors, f.metadata, &header).ok()) return 0;  // not UTF-8
  const uint64_t buffer = size - f.buffer_offset;
  std::string file = header + std::string(buffer, '\0');
  SafetensorsFile again;
  if (!ParseSafetensors(reinterpret_cast<const uint8_t*>(file.data()), file.size(), file.size(),
                        "again", &again)
           .ok() ||
      again.metadata != f.metadata || again.tensors.size() != f.tensors.size() ||
      again.buffer_offset % 8 != 0) {
    std::abort();
  }
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    const SafetensorsTensor &a = f.tensors[i], &b = again.tensors[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape || a.begin != b.begin ||
        a.end != b.end) {
      std::abort();
    }
  }
  return 0;
}
