// Writing a segment (docs/format.md, "Segment"), the inverse of SegmentReader: every block the
// store writes into a segment is made here, whole (its 64-byte header, then zeros to
// kBlockBytes), so the capture, the commit, the demotion and the parity store write the same
// bytes that SegmentReader checks.
#pragma once

#include <cstdint>
#include <vector>

#include "format/segment_format.h"

namespace ckpt::format {

// The segment's header block at out (kBlockBytes): the header, then zeros.
void EncodeSegmentHeaderBlock(const SegmentHeader& h, uint8_t* out);

// Chunk `sequence`'s record header; payload_xxh3 is 0, for the caller to set once it has it.
RecordHeader ChunkRecordHeader(uint64_t version, uint32_t rank, uint32_t sequence,
                               uint64_t payload_bytes, uint64_t record_offset);

// A record's header block at out (kBlockBytes): the header, then zeros.
void EncodeRecordHeaderBlock(const RecordHeader& rh, uint8_t* out);

// Writes the tail of a segment whose manifest record starts at manifest_offset into out, which
// holds exactly tail_bytes (TailBytes(manifest.size())) zeroed bytes: the manifest record and
// the footer block.
void EncodeSegmentTail(uint8_t* out, uint64_t tail_bytes, const std::vector<uint8_t>& manifest,
                       uint64_t manifest_xxh3, uint64_t manifest_offset, uint64_t version,
                       uint32_t rank, uint32_t chunk_count);

}  // namespace ckpt::format
