#include "format/ram_format.h"

#include <cstring>

#include "format/checksum.h"
#include "format/little_endian.h"
#include "format/segment_format.h"
#include "util/assert.h"

namespace ckpt::format {
namespace {

using le::Get;
using le::Magic;
using le::Put;

constexpr char kArenaMagic[9] = "CKPTRAM1";
constexpr char kIndexMagic[9] = "CKPTRIX1";
constexpr size_t kChecked = 56;  // both headers' checksums cover bytes [0, 56)

}  // namespace

void EncodeArenaHeader(const ArenaHeader& h, std::span<uint8_t, kArenaHeaderBytes> out) {
  uint8_t* p = out.data();
  std::memset(p, 0, kArenaHeaderBytes);
  Put<uint64_t>(p, 0, Magic(kArenaMagic));
  Put<uint32_t>(p, 8, h.format_version);
  Put<uint32_t>(p, 12, h.rank);
  Put<uint64_t>(p, 16, h.job_id);
  Put<uint64_t>(p, 24, h.capacity_bytes);
  Put<uint64_t>(p, 32, h.generation);
  Put<uint64_t>(p, 40, h.created_unix_ns);
  Put<uint64_t>(p, 48, h.sequence);
  Put<uint64_t>(p, 56, Xxh3(p, kChecked));
}

Status DecodeArenaHeader(std::span<const uint8_t, kArenaHeaderBytes> in, const std::string& what,
                         ArenaHeader* h) {
  const uint8_t* p = in.data();
  if (Get<uint64_t>(p, 0) != Magic(kArenaMagic)) {
    return Status::Corrupt(what + ": no ckptdb ram arena header here (bad magic)");
  }
  CKPTDB_RETURN_IF_ERROR(CheckXxh3(p, kChecked, Get<uint64_t>(p, 56), what));
  h->format_version = Get<uint32_t>(p, 8);
  if (h->format_version != kRamFormatVersion) {
    return Status::NotSupported(what + ": arena format version " +
                                std::to_string(h->format_version) + ", this build reads " +
                                std::to_string(kRamFormatVersion));
  }
  h->rank = Get<uint32_t>(p, 12);
  h->job_id = Get<uint64_t>(p, 16);
  h->capacity_bytes = Get<uint64_t>(p, 24);
  h->generation = Get<uint64_t>(p, 32);
  h->created_unix_ns = Get<uint64_t>(p, 40);
  h->sequence = Get<uint64_t>(p, 48);
  return Status::Ok();
}

void EncodeArenaExtension(const std::string& root_path, std::span<uint8_t> out) {
  const size_t n = root_path.size();
  CKPTDB_ASSERT(n <= kArenaMaxRootPathBytes && root_path.find('\0') == std::string::npos);
  CKPTDB_ASSERT(out.size() >= ArenaExtensionBytes(n));
  uint8_t* p = out.data();
  Put<uint32_t>(p, 0, static_cast<uint32_t>(n));
  Put<uint32_t>(p, 4, 0);
  std::memcpy(p + 8, root_path.data(), n);
  Put<uint64_t>(p, 8 + n, Xxh3(p, 8 + n));
}

Status DecodeArenaExtension(std::span<const uint8_t> in, const std::string& what,
                            std::string* root_path) {
  const uint8_t* p = in.data();
  if (in.size() < ArenaExtensionBytes(0)) {
    return Status::Corrupt(what + ": root path extension cut short at " +
                           std::to_string(in.size()) + " bytes");
  }
  const uint32_t n = Get<uint32_t>(p, 0);
  // Bounded before the checksum is computed over it: a flipped high bit must not send the hash
  // past the slot.
  if (n > kArenaMaxRootPathBytes || ArenaExtensionBytes(n) > in.size()) {
    return Status::Corrupt(what + ": root path extension claims " + std::to_string(n) +
                           " bytes of path, more than " + std::to_string(kArenaMaxRootPathBytes));
  }
  CKPTDB_RETURN_IF_ERROR(
      CheckXxh3(p, 8 + n, Get<uint64_t>(p, 8 + n), what + ": root path extension"));
  if (Get<uint32_t>(p, 4) != 0) {
    return Status::Corrupt(what + ": root path extension reserved field set");
  }
  if (std::memchr(p + 8, 0, n) != nullptr) {
    return Status::Corrupt(what + ": root path extension holds a NUL byte");
  }
  root_path->assign(reinterpret_cast<const char*>(p + 8), n);
  return Status::Ok();
}

void EncodeArenaHeaderCopy(const ArenaHeader& h, std::span<uint8_t, kArenaHeaderCopyBytes> out) {
  std::memset(out.data(), 0, kArenaHeaderCopyBytes);
  EncodeArenaHeader(h, out.first<kArenaHeaderBytes>());
  EncodeArenaExtension(h.root_path, out.subspan(kArenaExtensionOffset));
}

Status DecodeArenaHeaderCopy(std::span<const uint8_t, kArenaHeaderCopyBytes> in,
                             const std::string& what, ArenaHeader* h) {
  CKPTDB_RETURN_IF_ERROR(DecodeArenaHeader(in.first<kArenaHeaderBytes>(), what, h));
  return DecodeArenaExtension(in.subspan(kArenaExtensionOffset), what, &h->root_path);
}

bool LooksLikeRamIndex(std::span<const uint8_t> in) {
  return in.size() >= kRamIndexHeaderBytes && Get<uint64_t>(in.data(), 0) == Magic(kIndexMagic);
}

void EncodeRamIndex(const RamIndex& index, std::span<uint8_t> out) {
  const uint64_t n = index.entries.size();
  CKPTDB_ASSERT(n <= UINT32_MAX && out.size() >= RamIndexBytes(n));
  uint8_t* p = out.data();
  uint8_t* e = p + kRamIndexHeaderBytes;
  for (uint64_t i = 0; i < n; ++i) {
    Put<uint64_t>(e, i * kRamIndexEntryBytes, index.entries[i].logical_offset);
    Put<uint64_t>(e, i * kRamIndexEntryBytes + 8, index.entries[i].arena_offset);
    Put<uint64_t>(e, i * kRamIndexEntryBytes + 16, index.entries[i].bytes);
  }
  std::memset(p, 0, kRamIndexHeaderBytes);
  Put<uint64_t>(p, 0, Magic(kIndexMagic));
  Put<uint64_t>(p, 8, index.version);
  Put<uint32_t>(p, 16, index.rank);
  Put<uint32_t>(p, 20, static_cast<uint32_t>(n));
  Put<uint64_t>(p, 24, index.file_bytes);
  Put<uint64_t>(p, 32, index.generation);
  Put<uint64_t>(p, 40, index.job_id);
  Put<uint64_t>(p, 48, Xxh3(e, n * kRamIndexEntryBytes));
  Put<uint64_t>(p, 56, Xxh3(p, kChecked));
}

Status DecodeRamIndex(std::span<const uint8_t> in, uint32_t max_entries, const std::string& what,
                      RamIndex* index) {
  if (in.size() < kRamIndexHeaderBytes) {
    return Status::Corrupt(what + ": index region of " + std::to_string(in.size()) +
                           " bytes is shorter than its 64-byte header");
  }
  const uint8_t* p = in.data();
  if (Get<uint64_t>(p, 0) != Magic(kIndexMagic)) {
    return Status::Corrupt(what + ": no ram index here (bad magic)");
  }
  CKPTDB_RETURN_IF_ERROR(CheckXxh3(p, kChecked, Get<uint64_t>(p, 56), what + ": ram index header"));
  const uint32_t n = Get<uint32_t>(p, 20);
  if (n > max_entries || RamIndexBytes(n) > in.size()) {
    return Status::Corrupt(what + ": ram index lists " + std::to_string(n) +
                           " records, more than its region of " + std::to_string(in.size()) +
                           " bytes holds");
  }
  const uint8_t* e = p + kRamIndexHeaderBytes;
  CKPTDB_RETURN_IF_ERROR(CheckXxh3(e, uint64_t{n} * kRamIndexEntryBytes, Get<uint64_t>(p, 48),
                                   what + ": ram index entries"));
  index->version = Get<uint64_t>(p, 8);
  index->rank = Get<uint32_t>(p, 16);
  index->file_bytes = Get<uint64_t>(p, 24);
  index->generation = Get<uint64_t>(p, 32);
  index->job_id = Get<uint64_t>(p, 40);
  index->entries.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    index->entries[i].logical_offset = Get<uint64_t>(e, i * kRamIndexEntryBytes);
    index->entries[i].arena_offset = Get<uint64_t>(e, i * kRamIndexEntryBytes + 8);
    index->entries[i].bytes = Get<uint64_t>(e, i * kRamIndexEntryBytes + 16);
  }
  return Status::Ok();
}

}  // namespace ckpt::format
