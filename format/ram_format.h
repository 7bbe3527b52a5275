// The ram tier's arena file (docs/format.md, "The ram tier's arena"): its header area and the
// index of each version's segment image. Both are read back after a crash by a process that did
// not write them, so every field is checked before it is believed. All integers little-endian.
//
// Header area, the first 16384 bytes of the file: two copies of the header, copy A at offset 0
// and copy B at offset 8192, so that one damaged copy loses nothing (the other is used and the
// damaged one rewritten from it). Each copy, in a slot of 8192 bytes:
//   0  magic "CKPTRAM1"      8  format_version u32 (2) 12 rank u32
//   16 job_id u64            24 capacity_bytes u64    32 generation u64
//   40 created_unix_ns u64   48 sequence u64          56 xxh3 of [0, 56)
//   64 root path extension: path_bytes u32, reserved u32 (0), the store's root path
//      (path_bytes <= 4095, no NUL), then xxh3 of [64, 72 + path_bytes) as a u64
//   then zeros to the end of the slot
// The copy with the higher sequence wins; every rewrite of the header raises it and writes copy A
// before copy B.
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

// Version 1 (one 64-byte header, regions from offset 4096) is not read: see docs/format.md.
inline constexpr uint32_t kRamFormatVersion = 2;
inline constexpr size_t kArenaHeaderBytes = 64;        // a copy's fixed header
inline constexpr size_t kArenaHeaderCopyBytes = 8192;  // the slot each copy lies in
inline constexpr uint64_t kArenaHeaderCopyOffsets[2] = {0, kArenaHeaderCopyBytes};  // A, B
inline constexpr uint64_t kArenaHeaderAreaBytes = 2 * kArenaHeaderCopyBytes;  // regions follow
// The root path extension, at offset 64 of each copy.
inline constexpr size_t kArenaExtensionOffset = kArenaHeaderBytes;
inline constexpr size_t kArenaMaxRootPathBytes = 4095;  // PATH_MAX (4096) less its NUL
inline constexpr size_t kRamIndexHeaderBytes = 64;
inline constexpr size_t kRamIndexEntryBytes = 24;

struct ArenaHeader {
  uint32_t format_version = kRamFormatVersion;
  uint32_t rank = 0;
  uint64_t job_id = 0;
  uint64_t capacity_bytes = 0;
  uint64_t generation = 0;
  uint64_t created_unix_ns = 0;
  uint64_t sequence = 0;  // raised on every rewrite: of two valid copies, the higher is newer
  std::string root_path;  // the extension's: the store's root, as its options gave it
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

// Bytes the extension of a root path of `path_bytes` bytes occupies.
inline constexpr size_t ArenaExtensionBytes(size_t path_bytes) { return 16 + path_bytes; }
static_assert(kArenaExtensionOffset + ArenaExtensionBytes(kArenaMaxRootPathBytes) <=
              kArenaHeaderCopyBytes);
static_assert(kArenaHeaderAreaBytes % 4096 == 0, "regions start 4096-aligned");

// One whole copy: the fixed header and the extension, zeros to the end of the slot.
// h.root_path holds at most kArenaMaxRootPathBytes bytes and no NUL.
void EncodeArenaHeaderCopy(const ArenaHeader& h, std::span<uint8_t, kArenaHeaderCopyBytes> out);
// Decodes and checks one copy (fixed header, then extension). `what` names the copy ("header
// copy B at offset 8192"); errors read "<what> fails xxh3 (...)" and the like. NotSupported for a
// copy whose checksum holds but whose format_version is not 2 (h->format_version then says
// which); Corrupt for anything else. The bytes after the extension are not read.
Status DecodeArenaHeaderCopy(std::span<const uint8_t, kArenaHeaderCopyBytes> in,
                             const std::string& what, ArenaHeader* h);

// The two halves, for tests and the fuzzer. The fixed header alone (h->root_path untouched):
void EncodeArenaHeader(const ArenaHeader& h, std::span<uint8_t, kArenaHeaderBytes> out);
Status DecodeArenaHeader(std::span<const uint8_t, kArenaHeaderBytes> in, const std::string& what,
                         ArenaHeader* h);
// The extension alone: out holds at least ArenaExtensionBytes(root_path.size()) bytes; `in`
// may be longer than the extension it holds.
void EncodeArenaExtension(const std::string& root_path, std::span<uint8_t> out);
Status DecodeArenaExtension(std::span<const uint8_t> in, const std::string& what,
                            std::string* root_path);

// Bytes the index of `entries` records occupies, before alignment.
inline uint64_t RamIndexBytes(uint64_t entries) {
  return kRamIndexHeaderBytes + kRamIndexEntryBytes * entries;
}
// True when `in` starts with the index magic: worth decoding (a scan of the arena).
bool LooksLikeRamIndex(std::span<const uint8_t> in);
// Writes the index into out, which holds at least RamIndexBytes(index.entries.size()) bytes.
void EncodeRamIndex(const RamIndex& index, std::span<uint8_t> out);
// Decodes an index from `in` (the index region) and checks its checksums and that it lists at
// most max_entries entries that fit in `in`. The caller checks what the entries point at.
Status DecodeRamIndex(std::span<const uint8_t> in, uint32_t max_entries, const std::string& what,
                      RamIndex* index);

}  // namespace ckpt::format
