// libFuzzer target: any bytes as a whole segment file (docs/format.md), read through an in-memory
// ReadAtFn the way the engine reads through io_uring. Every read path (SegmentReader::Open,
// CheckChunk for each chunk, ScanSegment) must answer with a status, never crash, and never read
// outside the file: the reader checks each offset before it reads there, so a short read (the
// memory reader's IoError) is itself a finding. What an opened reader reports is checked against
// the bytes it came from.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "format/checksum.h"
#include "format/segment_format.h"
#include "format/segment_reader.h"

namespace ckpt::format {
namespace {

void Check(bool invariant) {
  if (!invariant) __builtin_trap();
}

// A damaged file may be Corrupt or, for a header naming a newer format, NotSupported.
bool IsRefusal(const Status& st) {
  return (st.code() == CKPTDB_ECORRUPT || st.code() == CKPTDB_ENOTSUP) &&
         st.message().starts_with("fuzz");
}

void FuzzSegmentReader(const uint8_t* data, size_t size) {
  ReadAtFn read = [data, size](uint64_t offset, void* buffer, size_t length) -> Status {
    if (offset > size || length > size - offset) {
      return Status::IoError("read past the end of the file");
    }
    if (length > 0) std::memcpy(buffer, data + offset, length);
    return Status::Ok();
  };

  std::vector<uint8_t> scratch;
  std::unique_ptr<SegmentReader> reader;
  Status st = SegmentReader::Open("fuzz", size, read, &reader);
  bool every_chunk_ok = st.ok();
  if (st.ok()) {
    const SegmentFooter& f = reader->footer();
    Check(f.file_bytes == size && IsAligned(size));
    Check(f.manifest_offset + RecordBytes(f.manifest_bytes) + kBlockBytes == size);
    Check(Xxh3(data + f.manifest_offset + kBlockBytes, f.manifest_bytes) == f.manifest_xxh3);
    Check(reader->manifest().chunk_count() == f.chunk_count);
    for (uint32_t i = 0; i < reader->manifest().chunk_count(); ++i) {
      const fb::Chunk& c = reader->manifest().chunk(i);
      Check(c.record_offset() + RecordBytes(c.payload_bytes()) <= f.manifest_offset);
      Check(c.payload_bytes() <= reader->header().chunk_bytes);
      ChunkProblem problem;
      Status cs = reader->CheckChunk(i, &scratch, &problem);
      Check(problem.chunk_index == int64_t{i} && problem.file_offset == c.record_offset());
      every_chunk_ok = every_chunk_ok && cs.ok();
      if (cs.ok()) {
        Check(scratch.size() == kBlockBytes + c.payload_bytes());
        Check(std::memcmp(scratch.data(), data + c.record_offset(), scratch.size()) == 0);
        Check(Xxh3(data + c.record_offset() + kBlockBytes, c.payload_bytes()) == c.xxh3());
      } else {
        Check(cs.code() == CKPTDB_ECORRUPT && cs.message().starts_with("fuzz: chunk "));
      }
    }
    ChunkProblem problem;
    Check(reader->CheckChunk(reader->manifest().chunk_count(), &scratch, &problem).code() ==
          CKPTDB_ENOTFOUND);
  } else {
    Check(IsRefusal(st));
  }

  uint64_t last_end = kBlockBytes;
  Status scan = ScanSegment(
      "fuzz", size, read,
      [&](const ScannedRecord& r) {
        // Records come in file order, back to back, each wholly inside the file before the
        // footer block.
        Check(r.offset == last_end && r.header.record_offset == r.offset);
        last_end = r.offset + RecordBytes(r.header.payload_bytes);
        Check(last_end + kBlockBytes <= size);
        Check(r.actual_xxh3 == Xxh3(data + r.offset + kBlockBytes, r.header.payload_bytes));
      },
      &scratch);
  Check(scan.ok() || IsRefusal(scan));
  // Open checks the header, footer and manifest record and CheckChunk every chunk record, which
  // together frame the file end to end: the scan must then reach the footer too.
  if (every_chunk_ok) Check(scan.ok());
}

}  // namespace
}  // namespace ckpt::format

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckpt::format::FuzzSegmentReader(data, size);
  return 0;
}
