#include "format/segment_format.h"

#include <cstdio>
#include <cstring>

#include "format/checksum.h"
#include "format/little_endian.h"

namespace ckpt::format {
namespace {

using le::Get;
using le::Magic;
using le::Put;

// Each structure's last checksummed byte: the checksum covers bytes [0, kChecked).
constexpr size_t kHeaderChecked = 56;
constexpr size_t kRecordChecked = 56;
constexpr size_t kFooterChecked = 48;

}  // namespace

std::string Hex64(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::string Xxh3Mismatch(uint64_t expected, uint64_t actual) {
  return " fails xxh3 (expected " + Hex64(expected) + ", got " + Hex64(actual) + ")";
}

Status Xxh3Corrupt(const std::string& what, uint64_t expected, uint64_t actual) {
  return Status::Corrupt(what + Xxh3Mismatch(expected, actual));
}

Status CheckXxh3(const void* data, size_t bytes, uint64_t expected, const std::string& what) {
  const uint64_t actual = Xxh3(data, bytes);
  if (actual == expected) return Status::Ok();
  return Xxh3Corrupt(what, expected, actual);
}

void EncodeSegmentHeader(const SegmentHeader& h, std::span<uint8_t, 64> out) {
  uint8_t* p = out.data();
  std::memset(p, 0, 64);
  Put<uint64_t>(p, 0, Magic(kSegmentMagic));
  Put<uint32_t>(p, 8, h.format_version);
  Put<uint32_t>(p, 12, static_cast<uint32_t>(kBlockBytes));
  Put<uint64_t>(p, 16, h.job_id);
  Put<uint64_t>(p, 24, h.version);
  Put<uint32_t>(p, 32, h.rank);
  Put<uint32_t>(p, 36, h.world_size);
  Put<uint64_t>(p, 40, h.chunk_bytes);
  Put<uint64_t>(p, 48, h.created_unix_ns);
  Put<uint64_t>(p, 56, Xxh3(p, kHeaderChecked));
}

Status DecodeSegmentHeader(std::span<const uint8_t, 64> in, const std::string& what,
                           SegmentHeader* h) {
  const uint8_t* p = in.data();
  if (Get<uint64_t>(p, 0) != Magic(kSegmentMagic)) {
    return Status::Corrupt(what + ": not a ckptdb segment (bad magic at offset 0)");
  }
  CKPTDB_RETURN_IF_ERROR(
      CheckXxh3(p, kHeaderChecked, Get<uint64_t>(p, 56), what + ": segment header at offset 0"));
  h->format_version = Get<uint32_t>(p, 8);
  if (h->format_version != kFormatVersion) {
    return Status::NotSupported(what + ": segment format version " +
                                std::to_string(h->format_version) + ", this build reads " +
                                std::to_string(kFormatVersion));
  }
  if (Get<uint32_t>(p, 12) != kBlockBytes) {
    return Status::Corrupt(what + ": segment block size " + std::to_string(Get<uint32_t>(p, 12)) +
                           ", expected 4096");
  }
  h->job_id = Get<uint64_t>(p, 16);
  h->version = Get<uint64_t>(p, 24);
  h->rank = Get<uint32_t>(p, 32);
  h->world_size = Get<uint32_t>(p, 36);
  h->chunk_bytes = Get<uint64_t>(p, 40);
  h->created_unix_ns = Get<uint64_t>(p, 48);
  if (h->world_size == 0 || h->rank >= h->world_size) {
    return Status::Corrupt(what + ": segment header names rank " + std::to_string(h->rank) +
                           " of world size " + std::to_string(h->world_size));
  }
  if (h->chunk_bytes == 0 || h->chunk_bytes > kMaxChunkBytes || !IsAligned(h->chunk_bytes)) {
    return Status::Corrupt(what + ": segment header chunk size " + std::to_string(h->chunk_bytes) +
                           " is not a multiple of 4096 in [4096, 1 GiB]");
  }
  return Status::Ok();
}

void EncodeRecordHeader(const RecordHeader& h, std::span<uint8_t, 64> out) {
  uint8_t* p = out.data();
  std::memset(p, 0, 64);
  Put<uint32_t>(p, 0, kRecordMagic);
  Put<uint16_t>(p, 4, static_cast<uint16_t>(h.type));
  Put<uint16_t>(p, 6, 0);
  Put<uint64_t>(p, 8, h.payload_bytes);
  Put<uint64_t>(p, 16, h.payload_xxh3);
  Put<uint64_t>(p, 24, h.record_offset);
  Put<uint64_t>(p, 32, h.version);
  Put<uint32_t>(p, 40, h.rank);
  Put<uint32_t>(p, 44, h.sequence);
  Put<uint64_t>(p, 48, 0);
  Put<uint64_t>(p, 56, Xxh3(p, kRecordChecked));
}

Status DecodeRecordHeader(std::span<const uint8_t, 64> in, const std::string& what,
                          RecordHeader* h) {
  const uint8_t* p = in.data();
  if (Get<uint32_t>(p, 0) != kRecordMagic) {
    return Status::Corrupt(what + ": no record header (bad magic)");
  }
  CKPTDB_RETURN_IF_ERROR(
      CheckXxh3(p, kRecordChecked, Get<uint64_t>(p, 56), what + ": record header"));
  uint16_t type = Get<uint16_t>(p, 4);
  if (type != static_cast<uint16_t>(RecordType::kChunk) &&
      type != static_cast<uint16_t>(RecordType::kManifest)) {
    return Status::Corrupt(what + ": unknown record type " + std::to_string(type));
  }
  h->type = static_cast<RecordType>(type);
  h->payload_bytes = Get<uint64_t>(p, 8);
  h->payload_xxh3 = Get<uint64_t>(p, 16);
  h->record_offset = Get<uint64_t>(p, 24);
  h->version = Get<uint64_t>(p, 32);
  h->rank = Get<uint32_t>(p, 40);
  h->sequence = Get<uint32_t>(p, 44);
  uint64_t limit = h->type == RecordType::kChunk ? kMaxChunkBytes : kMaxManifestBytes;
  if (h->payload_bytes > limit) {
    return Status::Corrupt(what + ": record payload of " + std::to_string(h->payload_bytes) +
                           " bytes exceeds the limit of " + std::to_string(limit));
  }
  if (!IsAligned(h->record_offset)) {
    return Status::Corrupt(what + ": record offset " + std::to_string(h->record_offset) +
                           " is not 4096-aligned");
  }
  return Status::Ok();
}

void EncodeFooter(const SegmentFooter& f, std::span<uint8_t, 64> out) {
  uint8_t* p = out.data();
  std::memset(p, 0, 64);
  Put<uint64_t>(p, 0, f.manifest_offset);
  Put<uint64_t>(p, 8, f.manifest_bytes);
  Put<uint64_t>(p, 16, f.manifest_xxh3);
  Put<uint64_t>(p, 24, f.version);
  Put<uint32_t>(p, 32, f.rank);
  Put<uint32_t>(p, 36, f.chunk_count);
  Put<uint64_t>(p, 40, f.file_bytes);
  Put<uint64_t>(p, 48, Xxh3(p, kFooterChecked));
  Put<uint64_t>(p, 56, Magic(kFooterMagic));
}

Status DecodeFooter(std::span<const uint8_t, 64> in, const std::string& what, SegmentFooter* f) {
  const uint8_t* p = in.data();
  if (Get<uint64_t>(p, 56) != Magic(kFooterMagic)) {
    return Status::Corrupt(what +
                           ": no segment footer (bad magic in the last 8 bytes): the "
                           "segment is truncated or was never finished");
  }
  CKPTDB_RETURN_IF_ERROR(
      CheckXxh3(p, kFooterChecked, Get<uint64_t>(p, 48), what + ": segment footer"));
  f->manifest_offset = Get<uint64_t>(p, 0);
  f->manifest_bytes = Get<uint64_t>(p, 8);
  f->manifest_xxh3 = Get<uint64_t>(p, 16);
  f->version = Get<uint64_t>(p, 24);
  f->rank = Get<uint32_t>(p, 32);
  f->chunk_count = Get<uint32_t>(p, 36);
  f->file_bytes = Get<uint64_t>(p, 40);
  if (f->manifest_bytes > kMaxManifestBytes || f->chunk_count > kMaxChunksPerSegment ||
      !IsAligned(f->manifest_offset) || !IsAligned(f->file_bytes) ||
      f->file_bytes < 3 * kBlockBytes || f->file_bytes > (uint64_t{1} << 62) ||
      f->manifest_offset < kBlockBytes || f->manifest_offset > f->file_bytes ||
      f->manifest_offset + RecordBytes(f->manifest_bytes) + kBlockBytes != f->file_bytes) {
    return Status::Corrupt(what + ": segment footer is inconsistent (manifest at " +
                           std::to_string(f->manifest_offset) + ", " +
                           std::to_string(f->manifest_bytes) + " bytes, file " +
                           std::to_string(f->file_bytes) + " bytes)");
  }
  return Status::Ok();
}

}  // namespace ckpt::format
