// Writing a segment's blocks (segment_writer.h).
#include "format/segment_writer.h"

#include <cstring>

namespace ckpt::format {

void EncodeSegmentHeaderBlock(const SegmentHeader& h, uint8_t* out) {
  std::memset(out, 0, kBlockBytes);
  EncodeSegmentHeader(h, std::span<uint8_t, 64>(out, 64));
}

RecordHeader ChunkRecordHeader(uint64_t version, uint32_t rank, uint32_t sequence,
                               uint64_t payload_bytes, uint64_t record_offset) {
  RecordHeader rh;
  rh.type = RecordType::kChunk;
  rh.payload_bytes = payload_bytes;
  rh.record_offset = record_offset;
  rh.version = version;
  rh.rank = rank;
  rh.sequence = sequence;
  return rh;
}

void EncodeRecordHeaderBlock(const RecordHeader& rh, uint8_t* out) {
  EncodeRecordHeader(rh, std::span<uint8_t, 64>(out, 64));
  std::memset(out + 64, 0, kBlockBytes - 64);
}

void EncodeSegmentTail(uint8_t* out, uint64_t tail_bytes, const std::vector<uint8_t>& manifest,
                       uint64_t manifest_xxh3, uint64_t manifest_offset, uint64_t version,
                       uint32_t rank, uint32_t chunk_count) {
  RecordHeader rh;
  rh.type = RecordType::kManifest;
  rh.payload_bytes = manifest.size();
  rh.payload_xxh3 = manifest_xxh3;
  rh.record_offset = manifest_offset;
  rh.version = version;
  rh.rank = rank;
  rh.sequence = chunk_count;
  EncodeRecordHeader(rh, std::span<uint8_t, 64>(out, 64));
  std::memcpy(out + kBlockBytes, manifest.data(), manifest.size());
  SegmentFooter f;
  f.manifest_offset = manifest_offset;
  f.manifest_bytes = manifest.size();
  f.manifest_xxh3 = manifest_xxh3;
  f.version = version;
  f.rank = rank;
  f.chunk_count = chunk_count;
  f.file_bytes = manifest_offset + tail_bytes;
  EncodeFooter(f, std::span<uint8_t, 64>(out + tail_bytes - 64, 64));
}

}  // namespace ckpt::format
