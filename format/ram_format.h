// The ram tier's arena file (docs/format.md, "The ram tier's arena"): its header block and the
// index of each version's segment image. Both are read back after a crash by a process that did
// not write them, so every field is checked before it is believed. All integers little-endian.
//
// Arena header, the first 64 bytes of the file (the rest of the first 4096 is zero):
//   0  magic "CKPTRAM1"      8  format_version u32   12 rank u32
//   16 job_id u64            24 capacity_bytes u64    32 generation u64
//   40 created_unix_ns u64   48 reserved u64 (0)     56 xxh3 of [0, 56)
// Index region (one per committed copy), 4096-aligned, AlignUp(64 + 24 * record_count) bytes:
//   0  magic "CKPTRIX1"      8  version u64           16 rank u32    20 record_count u32
//   24 file_bytes u64        32 generation u64        40 job_id u64
//   48 entries_xxh3 u64 (of the entries)              56 xxh3 of [0, 56)
//   64 entries: record_count x { logical_offset u64, arena_offset u64, bytes u64 }
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "util/status.h"

namespace ckpt::format {

inline constexpr uint32_t kRamFormatVersion = 1;
inline constexpr size_t kArenaHeaderBytes = 64;
inline constexpr size_t kRamIndexHeaderBytes = 64;
inline constexpr size_t kRamIndexEntryBytes = 24;

struct ArenaHeader {
  uint32_t format_version = kRamFormatVersion;
  uint32_t rank = 0;
  uint64_t job_id = 0;
  uint64_t capacity_bytes = 0;
  uint64_t generation = 0;
  uint64_t created_unix_ns = 0;
};

struct RamIndexEntry {
  uint64_t logical_offset = 0;
  uint64_t arena_offset = 0;
  uint64_t bytes = 0;
};

struct RamIndex {
  uint64_t version = 0;
  uint32_t rank = 0;
  uint64_t file_bytes = 0;
  uint64_t generation = 0;
  uint64_t job_id = 0;
  std::vector<RamIndexEntry> entries;
};

void EncodeArenaHeader(const ArenaHeader& h, std::span<uint8_t, kArenaHeaderBytes> out);
Status DecodeArenaHeader(std::span<const uint8_t, kArenaHeaderBytes> in, const std::string& what,
                         ArenaHeader* h);

// Bytes the index of `entries` records occupies, before alignment.
inline uint64_t RamIndexBytes(uint64_t entries) {
  return kRamIndexHeaderBytes + kRamIndexEntryBytes * entries;
}
// Writes the index into out, which holds at least RamIndexBytes(index.entries.size()) bytes.
void EncodeRamIndex(const RamIndex& index, std::span<uint8_t> out);
// Decodes an index from `in` (the index region) and checks its checksums and that it lists at
// most max_entries entries that fit in `in`. The caller checks what the entries point at.
Status DecodeRamIndex(std::span<const uint8_t> in, uint32_t max_entries, const std::string& what,
                      RamIndex* index);

}  // namespace ckpt::format
