// Reading a segment: header and footer first, then the manifest (verified), then chunks on
// demand, each checked against the manifest and its xxh3. format/ knows nothing of io/, so the
// caller supplies the read function (the engine passes an io_uring read, fuzzers a memory copy).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/manifest.h"
#include "format/segment_format.h"
#include "util/status.h"

namespace ckpt::format {

// Reads exactly `length` bytes at `offset`, or returns an error (a short read is an error).
using ReadAtFn = std::function<Status(uint64_t offset, void* buffer, size_t length)>;

// A failed chunk check, for the messages of verify and restore.
struct ChunkProblem {
  int64_t chunk_index = -1;
  uint64_t file_offset = 0;
  uint64_t expected_xxh3 = 0;
  uint64_t actual_xxh3 = 0;
};

class SegmentReader {
 public:
  // `what` names the segment in every message (tier and path). Checks that the file size is
  // aligned, the header and footer decode and agree, and the manifest record's header, checksum
  // and content verify and agree with both.
  static Status Open(const std::string& what, uint64_t file_bytes, ReadAtFn read,
                     std::unique_ptr<SegmentReader>* out);

  const SegmentHeader& header() const { return header_; }
  const SegmentFooter& footer() const { return footer_; }
  const ManifestView& manifest() const { return manifest_; }
  // The manifest's bytes, checked against the footer's xxh3.
  const std::vector<uint8_t>& manifest_bytes() const { return manifest_bytes_; }
  const std::string& what() const { return what_; }

  // Reads chunk `index` (record header block and payload) into *scratch and checks the record
  // header against the manifest and the payload against its xxh3. On failure fills *problem.
  Status CheckChunk(uint32_t index, std::vector<uint8_t>* scratch, ChunkProblem* problem) const;

  // Checks chunk `index`'s record already in memory: `record` holds its header block and
  // payload (RecordBytes of the payload may follow, the padding is not read). Demotion checks
  // each record this way between reading it from one tier and writing it to the next.
  // `payload_xxh3`: the xxh3 of exactly these payload bytes, where the caller computed it already
  // (a replica hashes each record as it lands, while the rest is still on the wire, and its
  // bytes are never written again); hashed here when absent.
  Status CheckRecord(uint32_t index, const uint8_t* record, ChunkProblem* problem,
                     std::optional<uint64_t> payload_xxh3 = std::nullopt) const;

 private:
  // Chunk `index` of the manifest, *problem filled with what it should be, *at naming it.
  Status Locate(uint32_t index, const fb::Chunk** chunk, ChunkProblem* problem,
                std::string* at) const;

  std::string what_;
  ReadAtFn read_;
  SegmentHeader header_;
  SegmentFooter footer_;
  std::vector<uint8_t> manifest_bytes_;
  ManifestView manifest_;
};

// Framing-only scan, for verify without a manifest and for torn segments: walks the records
// from the first block, checking each record header and payload checksum. Calls on_record for
// every record it can frame; stops at the first record it cannot frame and returns Corrupt
// naming the offset (a torn tail), or Ok when it reaches a valid footer exactly.
struct ScannedRecord {
  uint64_t offset = 0;
  RecordHeader header;
  uint64_t actual_xxh3 = 0;  // of the payload as read
};
Status ScanSegment(const std::string& what, uint64_t file_bytes, const ReadAtFn& read,
                   const std::function<void(const ScannedRecord&)>& on_record,
                   std::vector<uint8_t>* scratch);

}  // namespace ckpt::format
