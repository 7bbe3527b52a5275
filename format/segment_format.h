// The segment file's framing (DESIGN.md section 4; docs/format.md specifies every byte).
//
//   [0, 4096)           file header block: SegmentHeader (64 bytes), then zeros
//   then records, each 4096-aligned:
//     record header block: RecordHeader (64 bytes), then zeros to 4096
//     payload: payload_bytes bytes, then zeros to the next multiple of 4096
//   data chunk records (type 1) in chunk index order, then one manifest record (type 2)
//   [size - 4096, size) footer block: zeros, then SegmentFooter in the last 64 bytes
//
// Every payload starts on a 4096-byte boundary so O_DIRECT can write and read it in place; a
// record's header has its own checksum so a torn or misplaced block is caught by framing alone,
// without the manifest. All integers are little-endian.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "util/status.h"

namespace ckpt::format {

inline constexpr uint32_t kFormatVersion = 1;
inline constexpr uint64_t kBlockBytes = 4096;
inline constexpr size_t kSegmentHeaderBytes = 64;
inline constexpr size_t kRecordHeaderBytes = 64;
inline constexpr size_t kFooterBytes = 64;
// Bounds a reader enforces before trusting a length (TigerBeetle: a limit on everything).
inline constexpr uint64_t kMaxChunkBytes = uint64_t{1} << 30;     // 1 GiB
inline constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;  // 1 GiB
inline constexpr uint32_t kMaxChunksPerSegment = 1u << 24;

// 8-byte magics, compared as little-endian u64 of these ASCII strings.
inline constexpr char kSegmentMagic[9] = "CKPTSEG1";
inline constexpr char kFooterMagic[9] = "CKPTEND1";
inline constexpr uint32_t kRecordMagic = 0x4352'4B43;  // "CKRC" little-endian

enum class RecordType : uint16_t { kChunk = 1, kManifest = 2 };

struct SegmentHeader {
  uint32_t format_version = kFormatVersion;
  uint64_t job_id = 0;
  uint64_t version = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint64_t chunk_bytes = 0;  // the maximum payload of a data chunk in this segment
  uint64_t created_unix_ns = 0;
};

struct RecordHeader {
  RecordType type = RecordType::kChunk;
  uint64_t payload_bytes = 0;
  uint64_t payload_xxh3 = 0;
  uint64_t record_offset = 0;  // where this header sits: a copied or shifted block is caught
  uint64_t version = 0;
  uint32_t rank = 0;
  uint32_t sequence = 0;  // chunk index; the manifest record's is the chunk count
};

struct SegmentFooter {
  uint64_t manifest_offset = 0;  // of the manifest's record header block
  uint64_t manifest_bytes = 0;
  uint64_t manifest_xxh3 = 0;
  uint64_t version = 0;
  uint32_t rank = 0;
  uint32_t chunk_count = 0;
  uint64_t file_bytes = 0;  // the whole file, footer block included
};

inline constexpr uint64_t AlignUp(uint64_t n) { return (n + kBlockBytes - 1) & ~(kBlockBytes - 1); }
inline constexpr bool IsAligned(uint64_t n) { return (n & (kBlockBytes - 1)) == 0; }
// Bytes a record occupies in the file: its header block plus its padded payload.
inline constexpr uint64_t RecordBytes(uint64_t payload_bytes) {
  return kBlockBytes + AlignUp(payload_bytes);
}

// Encoders write exactly 64 bytes (checksum included). Decoders check magic, format version,
// the header's own checksum and internal bounds; `what` names the object in error messages.
void EncodeSegmentHeader(const SegmentHeader& h, std::span<uint8_t, 64> out);
Status DecodeSegmentHeader(std::span<const uint8_t, 64> in, const std::string& what,
                           SegmentHeader* h);
void EncodeRecordHeader(const RecordHeader& h, std::span<uint8_t, 64> out);
Status DecodeRecordHeader(std::span<const uint8_t, 64> in, const std::string& what,
                          RecordHeader* h);
void EncodeFooter(const SegmentFooter& f, std::span<uint8_t, 64> out);
Status DecodeFooter(std::span<const uint8_t, 64> in, const std::string& what, SegmentFooter* f);

// Bytes of a segment's tail: the manifest record (header block, manifest padded) and the footer
// block.
inline constexpr uint64_t TailBytes(uint64_t manifest_bytes) {
  return RecordBytes(manifest_bytes) + kBlockBytes;
}
// (Writing whole blocks and the tail: segment_writer.h.)

// "0x0123456789abcdef"
std::string Hex64(uint64_t v);

// " fails xxh3 (expected X, got Y)": the one form a checksum mismatch takes in every error and
// report, after the name of what failed.
std::string Xxh3Mismatch(uint64_t expected, uint64_t actual);

// Corrupt(what + Xxh3Mismatch(expected, actual)).
Status Xxh3Corrupt(const std::string& what, uint64_t expected, uint64_t actual);

// Xxh3Corrupt(what, ...) unless the xxh3 of [data, data + bytes) is `expected`.
Status CheckXxh3(const void* data, size_t bytes, uint64_t expected, const std::string& what);

}  // namespace ckpt::format
