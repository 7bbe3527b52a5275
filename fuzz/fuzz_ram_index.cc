// libFuzzer target for the ram tier's decoders (format/ram_format.h, docs/format.md section 15):
// any bytes as an arena header copy (the fixed header, the root path extension after it, and,
// for inputs as long as a slot, the whole copy) and as a copy's index. Whatever decodes must
// encode back to the very same bytes (nothing is accepted that the writer could not have
// written), and no input may read past its end or trip a sanitizer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "format/ram_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt::format;
  if (size >= kArenaHeaderBytes) {
    ArenaHeader h;
    auto in = std::span<const uint8_t, kArenaHeaderBytes>(data, kArenaHeaderBytes);
    if (DecodeArenaHeader(in, "fuzz", &h).ok()) {
      uint8_t again[kArenaHeaderBytes];
      EncodeArenaHeader(h, std::span<uint8_t, kArenaHeaderBytes>(again));
      if (std::memcmp(again, data, kArenaHeaderBytes) != 0) std::abort();
    }
    std::string root_path;
    auto ext = std::span<const uint8_t>(data, size).subspan(kArenaExtensionOffset);
    if (DecodeArenaExtension(ext, "fuzz", &root_path).ok()) {
      const size_t used = ArenaExtensionBytes(root_path.size());
      if (used > ext.size() || root_path.size() > kArenaMaxRootPathBytes) std::abort();
      std::vector<uint8_t> again(used);
      EncodeArenaExtension(root_path, again);
      if (std::memcmp(again.data(), ext.data(), used) != 0) std::abort();
    }
  }
  if (size >= kArenaHeaderCopyBytes) {
    ArenaHeader h;
    auto in = std::span<const uint8_t, kArenaHeaderCopyBytes>(data, kArenaHeaderCopyBytes);
    if (DecodeArenaHeaderCopy(in, "fuzz", &h).ok()) {
      // The slot past the extension is not read, so only the bytes before it must come back.
      const size_t used = kArenaExtensionOffset + ArenaExtensionBytes(h.root_path.size());
      std::vector<uint8_t> again(kArenaHeaderCopyBytes);
      EncodeArenaHeaderCopy(h,
                            std::span<uint8_t, kArenaHeaderCopyBytes>(again.data(), again.size()));
      if (std::memcmp(again.data(), data, used) != 0) std::abort();
    }
  }
  RamIndex index;
  if (DecodeRamIndex(std::span<const uint8_t>(data, size), 1u << 16, "fuzz", &index).ok()) {
    const size_t used = RamIndexBytes(index.entries.size());
    if (used > size) std::abort();
    std::vector<uint8_t> again(used);
    EncodeRamIndex(index, again);
    if (std::memcmp(again.data(), data, used) != 0) std::abort();
  }
  return 0;
}
