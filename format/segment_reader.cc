#include "format/segment_reader.h"

#include "format/checksum.h"

namespace ckpt::format {

Status SegmentReader::Open(const std::string& what, uint64_t file_bytes, ReadAtFn read,
                           std::unique_ptr<SegmentReader>* out) {
  if (file_bytes < 3 * kBlockBytes || !IsAligned(file_bytes)) {
    return Status::Corrupt(what + ": file is " + std::to_string(file_bytes) +
                           " bytes, not a whole number of 4096-byte blocks of at least 3: "
                           "truncated or not a segment");
  }
  auto r = std::unique_ptr<SegmentReader>(new SegmentReader());
  r->what_ = what;
  r->read_ = std::move(read);
  uint8_t block[64];
  CKPTDB_RETURN_IF_ERROR(r->read_(0, block, sizeof block).WithContext(what + ": reading header"));
  CKPTDB_RETURN_IF_ERROR(
      DecodeSegmentHeader(std::span<const uint8_t, 64>(block), what, &r->header_));
  CKPTDB_RETURN_IF_ERROR(r->read_(file_bytes - kFooterBytes, block, sizeof block)
                             .WithContext(what + ": reading footer"));
  CKPTDB_RETURN_IF_ERROR(DecodeFooter(std::span<const uint8_t, 64>(block), what, &r->footer_));
  const SegmentHeader& h = r->header_;
  const SegmentFooter& f = r->footer_;
  if (f.file_bytes != file_bytes) {
    return Status::Corrupt(what + ": footer says the file is " + std::to_string(f.file_bytes) +
                           " bytes but it is " + std::to_string(file_bytes));
  }
  if (f.version != h.version || f.rank != h.rank) {
    return Status::Corrupt(what + ": footer (version " + std::to_string(f.version) + ", rank " +
                           std::to_string(f.rank) + ") disagrees with header (version " +
                           std::to_string(h.version) + ", rank " + std::to_string(h.rank) + ")");
  }
  RecordHeader rh;
  CKPTDB_RETURN_IF_ERROR(r->read_(f.manifest_offset, block, sizeof block)
                             .WithContext(what + ": reading manifest record header"));
  std::string at = what + ": record at offset " + std::to_string(f.manifest_offset);
  CKPTDB_RETURN_IF_ERROR(DecodeRecordHeader(std::span<const uint8_t, 64>(block), at, &rh));
  if (rh.type != RecordType::kManifest || rh.record_offset != f.manifest_offset ||
      rh.payload_bytes != f.manifest_bytes || rh.payload_xxh3 != f.manifest_xxh3 ||
      rh.version != h.version || rh.rank != h.rank || rh.sequence != f.chunk_count) {
    return Status::Corrupt(at + ": manifest record header disagrees with the footer");
  }
  r->manifest_bytes_.resize(f.manifest_bytes);
  CKPTDB_RETURN_IF_ERROR(
      r->read_(f.manifest_offset + kBlockBytes, r->manifest_bytes_.data(), f.manifest_bytes)
          .WithContext(what + ": reading manifest"));
  uint64_t actual = Xxh3(r->manifest_bytes_.data(), r->manifest_bytes_.size());
  if (actual != f.manifest_xxh3) {
    return Xxh3Corrupt(what + ": manifest at offset " + std::to_string(f.manifest_offset),
                       f.manifest_xxh3, actual);
  }
  CKPTDB_RETURN_IF_ERROR(
      ManifestView::Open(r->manifest_bytes_, f.manifest_offset, what, &r->manifest_));
  const fb::Manifest& m = r->manifest_.root();
  const fb::Provenance* p = m.provenance();
  if (p->version() != h.version || p->rank() != h.rank || p->job_id() != h.job_id ||
      p->world_size() != h.world_size || p->created_unix_ns() != h.created_unix_ns ||
      r->manifest_.chunk_count() != f.chunk_count) {
    return Status::Corrupt(what + ": manifest provenance or chunk count disagrees with the header");
  }
  for (uint32_t i = 0; i < r->manifest_.chunk_count(); ++i) {
    if (r->manifest_.chunk(i).payload_bytes() > h.chunk_bytes) {
      return Status::Corrupt(what + ": chunk " + std::to_string(i) +
                             " is larger than the segment's chunk size");
    }
  }
  *out = std::move(r);
  return Status::Ok();
}

Status SegmentReader::Locate(uint32_t index, const fb::Chunk** chunk, ChunkProblem* problem,
                             std::string* at) const {
  if (index >= manifest_.chunk_count()) {
    return Status::NotFound(what_ + ": no chunk " + std::to_string(index));
  }
  const fb::Chunk& c = manifest_.chunk(index);
  problem->chunk_index = index;
  problem->file_offset = c.record_offset();
  problem->expected_xxh3 = c.xxh3();
  problem->actual_xxh3 = 0;
  *at = what_ + ": chunk " + std::to_string(index) + " at offset " +
        std::to_string(c.record_offset());
  *chunk = &c;
  return Status::Ok();
}

Status SegmentReader::CheckChunk(uint32_t index, std::vector<uint8_t>* scratch,
                                 ChunkProblem* problem) const {
  const fb::Chunk* chunk = nullptr;
  std::string at;
  CKPTDB_RETURN_IF_ERROR(Locate(index, &chunk, problem, &at));
  const fb::Chunk& c = *chunk;
  scratch->resize(kBlockBytes + c.payload_bytes());
  CKPTDB_RETURN_IF_ERROR(
      read_(c.record_offset(), scratch->data(), scratch->size()).WithContext(at));
  return CheckRecord(index, scratch->data(), problem);
}

Status SegmentReader::CheckRecord(uint32_t index, const uint8_t* record, ChunkProblem* problem,
                                  std::optional<uint64_t> payload_xxh3) const {
  const fb::Chunk* chunk = nullptr;
  std::string at;
  CKPTDB_RETURN_IF_ERROR(Locate(index, &chunk, problem, &at));
  const fb::Chunk& c = *chunk;
  RecordHeader rh;
  CKPTDB_RETURN_IF_ERROR(DecodeRecordHeader(std::span<const uint8_t, 64>(record, 64), at, &rh));
  if (rh.type != RecordType::kChunk || rh.record_offset != c.record_offset() ||
      rh.payload_bytes != c.payload_bytes() || rh.payload_xxh3 != c.xxh3() ||
      rh.sequence != index || rh.version != header_.version || rh.rank != header_.rank) {
    return Status::Corrupt(at + ": record header disagrees with the manifest");
  }
  problem->actual_xxh3 =
      payload_xxh3 ? *payload_xxh3 : Xxh3(record + kBlockBytes, c.payload_bytes());
  if (problem->actual_xxh3 != c.xxh3()) {
    return Xxh3Corrupt(at, c.xxh3(), problem->actual_xxh3);
  }
  return Status::Ok();
}

Status ScanSegment(const std::string& what, uint64_t file_bytes, const ReadAtFn& read,
                   const std::function<void(const ScannedRecord&)>& on_record,
                   std::vector<uint8_t>* scratch) {
  if (file_bytes < kBlockBytes || !IsAligned(file_bytes)) {
    return Status::Corrupt(what + ": file is " + std::to_string(file_bytes) +
                           " bytes, not a whole number of 4096-byte blocks");
  }
  uint8_t block[64];
  SegmentHeader h;
  CKPTDB_RETURN_IF_ERROR(read(0, block, sizeof block).WithContext(what));
  CKPTDB_RETURN_IF_ERROR(DecodeSegmentHeader(std::span<const uint8_t, 64>(block), what, &h));
  uint64_t offset = kBlockBytes;
  uint32_t chunks_seen = 0;
  uint64_t manifest_offset = 0;
  bool manifest_seen = false;
  // Bounded: each step advances at least one block.
  while (offset + kBlockBytes <= file_bytes) {
    std::string at = what + ": offset " + std::to_string(offset);
    if (offset + kBlockBytes == file_bytes) {
      // The footer is the last 64 bytes of the footer block, not its first.
      CKPTDB_RETURN_IF_ERROR(read(file_bytes - kFooterBytes, block, sizeof block).WithContext(at));
      SegmentFooter f;
      CKPTDB_RETURN_IF_ERROR(DecodeFooter(std::span<const uint8_t, 64>(block), what, &f));
      // The footer must describe what the scan walked: the same chunk count, a manifest record
      // last, right where the footer says.
      if (!manifest_seen || f.manifest_offset != manifest_offset || f.chunk_count != chunks_seen) {
        return Status::Corrupt(
            what + ": the footer (" + std::to_string(f.chunk_count) + " chunks, manifest at " +
            std::to_string(f.manifest_offset) + ") disagrees with the records found (" +
            std::to_string(chunks_seen) + " chunks" +
            (manifest_seen ? ", manifest at " + std::to_string(manifest_offset) : ", no manifest") +
            ")");
      }
      return Status::Ok();
    }
    CKPTDB_RETURN_IF_ERROR(read(offset, block, sizeof block).WithContext(at));
    ScannedRecord rec;
    rec.offset = offset;
    Status st = DecodeRecordHeader(std::span<const uint8_t, 64>(block), at, &rec.header);
    if (!st.ok()) return st;
    if (rec.header.record_offset != offset || rec.header.version != h.version ||
        rec.header.rank != h.rank) {
      return Status::Corrupt(at + ": record header belongs elsewhere (offset " +
                             std::to_string(rec.header.record_offset) + ", version " +
                             std::to_string(rec.header.version) + ")");
    }
    uint64_t next = offset + RecordBytes(rec.header.payload_bytes);
    if (next + kBlockBytes > file_bytes) {
      return Status::Corrupt(at + ": record of " + std::to_string(rec.header.payload_bytes) +
                             " bytes runs past the end of the file: the segment is torn");
    }
    scratch->resize(rec.header.payload_bytes);
    CKPTDB_RETURN_IF_ERROR(
        read(offset + kBlockBytes, scratch->data(), scratch->size()).WithContext(at));
    rec.actual_xxh3 = Xxh3(scratch->data(), scratch->size());
    if (manifest_seen) {
      return Status::Corrupt(at + ": a record follows the manifest record: the segment is damaged");
    }
    if (rec.header.type == RecordType::kChunk) {
      if (rec.header.sequence != chunks_seen) {
        return Status::Corrupt(at + ": chunk record " + std::to_string(rec.header.sequence) +
                               " where chunk " + std::to_string(chunks_seen) + " belongs");
      }
      ++chunks_seen;
    } else {
      manifest_seen = true;
      manifest_offset = offset;
    }
    on_record(rec);
    offset = next;
  }
  return Status::Corrupt(what + ": no footer after the last record at offset " +
                         std::to_string(offset) + ": the segment is torn");
}

}  // namespace ckpt::format
