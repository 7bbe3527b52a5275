// The on-disk format, byte by byte (docs/format.md): the 64-byte header, record header and footer
// codecs, the manifest's FlatBuffers and semantic checks, whole segments assembled in memory
// exactly as engine/db.cc writes them, torn and damaged files, and the golden v1 segment that
// pins the format (tests/data/README.md).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "format/checksum.h"
#include "format/manifest.h"
#include "format/segment_format.h"
#include "format/segment_reader.h"
#include "format/segment_writer.h"
#include "tests/test_util.h"

namespace ckpt::format {
namespace {

using test::RandomBytes;
using ::testing::AnyOf;
using ::testing::HasSubstr;

// ---- helpers --------------------------------------------------------------------------------

using Block64 = std::span<uint8_t, 64>;
using ConstBlock64 = std::span<const uint8_t, 64>;

uint64_t GetU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Reads from a file image in memory; a read past its end is an error, as a short pread is.
ReadAtFn MemoryRead(const std::vector<uint8_t>* file) {
  return [file](uint64_t offset, void* buffer, size_t length) -> Status {
    if (offset > file->size() || length > file->size() - offset) {
      return Status::IoError("read of " + std::to_string(length) + " bytes at offset " +
                             std::to_string(offset) + " runs past the end of the " +
                             std::to_string(file->size()) + "-byte file");
    }
    if (length > 0) std::memcpy(buffer, file->data() + offset, length);
    return Status::Ok();
  };
}

// One tensor to put: its bytes are test::RandomBytes(bytes, seed).
struct TensorSpec {
  std::string name;
  fb::DType dtype = fb::DType::U8;
  std::vector<uint64_t> shape;
  std::vector<uint64_t> global_shape;
  std::vector<uint64_t> global_offset;
  uint64_t bytes = 0;
  uint64_t seed = 0;
};

struct SegmentSpec {
  uint64_t job_id = 7;
  uint64_t version = 3;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint64_t chunk_bytes = 4096;
  uint64_t created_unix_ns = 1;
  std::string node_id = "node-a";
  std::string writer = "ckptdb 0.1.0";
  std::vector<TensorSpec> tensors;  // in put order, which is file order
};

struct BuiltSegment {
  std::vector<uint8_t> file;
  std::vector<uint8_t> manifest;      // the manifest record's payload
  std::vector<ChunkEntry> chunks;     // in file order
  std::vector<uint64_t> record_ends;  // offset just past each record (chunks, then manifest)
  uint64_t manifest_offset = 0;
};

// The segment header a spec describes.
SegmentHeader HeaderFor(const SegmentSpec& s) {
  SegmentHeader h;
  h.job_id = s.job_id;
  h.version = s.version;
  h.rank = s.rank;
  h.world_size = s.world_size;
  h.chunk_bytes = s.chunk_bytes;
  h.created_unix_ns = s.created_unix_ns;
  return h;
}

// Assembles a segment exactly as Db::OpenVersionFor, Db::WriteChunk and Db::FinishSegments write
// one: header block, one record per chunk of at most chunk_bytes (header block, payload, zeros to
// the next 4096), the manifest record, the footer block. Kept independent of engine/ so that the
// format tests need no I/O.
BuiltSegment BuildSegment(const SegmentSpec& s) {
  BuiltSegment out;
  std::vector<uint8_t>& f = out.file;
  f.assign(kBlockBytes, 0);
  EncodeSegmentHeader(HeaderFor(s), Block64(f.data(), 64));

  ManifestContents mc;
  mc.job_id = s.job_id;
  mc.rank = s.rank;
  mc.world_size = s.world_size;
  mc.version = s.version;
  mc.node_id = s.node_id;
  mc.created_unix_ns = s.created_unix_ns;
  mc.writer = s.writer;
  for (const TensorSpec& t : s.tensors) {
    std::vector<uint8_t> data = RandomBytes(t.bytes, t.seed);
    TensorEntry e;
    e.name = t.name;
    e.dtype = static_cast<uint8_t>(t.dtype);
    e.shape = t.shape;
    e.global_shape = t.global_shape;
    e.global_offset = t.global_offset;
    e.bytes = t.bytes;
    e.first_chunk = static_cast<uint32_t>(out.chunks.size());
    for (uint64_t off = 0; off < t.bytes; off += s.chunk_bytes) {
      uint64_t n = std::min(s.chunk_bytes, t.bytes - off);
      uint64_t at = f.size();
      RecordHeader rh;
      rh.type = RecordType::kChunk;
      rh.payload_bytes = n;
      rh.payload_xxh3 = Xxh3(data.data() + off, n);
      rh.record_offset = at;
      rh.version = s.version;
      rh.rank = s.rank;
      rh.sequence = static_cast<uint32_t>(out.chunks.size());
      f.resize(at + RecordBytes(n), 0);
      EncodeRecordHeader(rh, Block64(f.data() + at, 64));
      std::memcpy(f.data() + at + kBlockBytes, data.data() + off, n);
      out.chunks.push_back({at, n, rh.payload_xxh3});
      out.record_ends.push_back(f.size());
    }
    e.chunk_count = static_cast<uint32_t>(out.chunks.size()) - e.first_chunk;
    mc.tensors.push_back(std::move(e));
  }
  mc.chunks = out.chunks;
  out.manifest = BuildManifest(std::move(mc));

  out.manifest_offset = f.size();
  RecordHeader rh;
  rh.type = RecordType::kManifest;
  rh.payload_bytes = out.manifest.size();
  rh.payload_xxh3 = Xxh3(out.manifest.data(), out.manifest.size());
  rh.record_offset = out.manifest_offset;
  rh.version = s.version;
  rh.rank = s.rank;
  rh.sequence = static_cast<uint32_t>(out.chunks.size());
  f.resize(out.manifest_offset + RecordBytes(out.manifest.size()) + kBlockBytes, 0);
  EncodeRecordHeader(rh, Block64(f.data() + out.manifest_offset, 64));
  std::memcpy(f.data() + out.manifest_offset + kBlockBytes, out.manifest.data(),
              out.manifest.size());
  out.record_ends.push_back(out.manifest_offset + RecordBytes(out.manifest.size()));

  SegmentFooter ft;
  ft.manifest_offset = out.manifest_offset;
  ft.manifest_bytes = out.manifest.size();
  ft.manifest_xxh3 = rh.payload_xxh3;
  ft.version = s.version;
  ft.rank = s.rank;
  ft.chunk_count = static_cast<uint32_t>(out.chunks.size());
  ft.file_bytes = f.size();
  EncodeFooter(ft, Block64(f.data() + f.size() - 64, 64));
  return out;
}

// A small segment with a multi-chunk tensor, an exact-multiple tensor, a 1-byte tensor and an
// empty one, in an order that differs from name order.
SegmentSpec SmallSpec() {
  SegmentSpec s;
  s.tensors.push_back({"w", fb::DType::F32, {3, 1000}, {}, {}, 12000, 11});
  s.tensors.push_back({"b", fb::DType::U8, {8192}, {}, {}, 8192, 12});
  s.tensors.push_back({"a", fb::DType::Bool, {1}, {}, {}, 1, 13});
  s.tensors.push_back({"z", fb::DType::F64, {0}, {}, {}, 0, 14});
  return s;
}

std::unique_ptr<SegmentReader> OpenOk(const std::vector<uint8_t>& file) {
  std::unique_ptr<SegmentReader> r;
  Status st = SegmentReader::Open("seg-test", file.size(), MemoryRead(&file), &r);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return r;
}

Status OpenStatus(const std::vector<uint8_t>& file) {
  std::unique_ptr<SegmentReader> r;
  return SegmentReader::Open("seg-test", file.size(), MemoryRead(&file), &r);
}

Status Scan(const std::vector<uint8_t>& file, std::vector<ScannedRecord>* records) {
  std::vector<uint8_t> scratch;
  return ScanSegment(
      "seg-test", file.size(), MemoryRead(&file),
      [records](const ScannedRecord& r) { records->push_back(r); }, &scratch);
}

// Rewrites the footer (or header) of a built file with one field changed and a valid checksum,
// to reach the checks that come after the checksum.
template <typename Edit>
void EditFooter(std::vector<uint8_t>* file, Edit edit) {
  SegmentFooter f;
  uint8_t* p = file->data() + file->size() - 64;
  ASSERT_TRUE(DecodeFooter(ConstBlock64(p, 64), "edit", &f).ok());
  edit(&f);
  EncodeFooter(f, Block64(p, 64));
}
template <typename Edit>
void EditHeader(std::vector<uint8_t>* file, Edit edit) {
  SegmentHeader h;
  ASSERT_TRUE(DecodeSegmentHeader(ConstBlock64(file->data(), 64), "edit", &h).ok());
  edit(&h);
  EncodeSegmentHeader(h, Block64(file->data(), 64));
}
template <typename Edit>
void EditRecord(std::vector<uint8_t>* file, uint64_t offset, Edit edit) {
  RecordHeader rh;
  ASSERT_TRUE(DecodeRecordHeader(ConstBlock64(file->data() + offset, 64), "edit", &rh).ok());
  edit(&rh);
  EncodeRecordHeader(rh, Block64(file->data() + offset, 64));
}

// ---- checksum -------------------------------------------------------------------------------

TEST(Checksum, IsXxh3SeedZero) {
  // The published XXH3_64bits("") (seed 0): a different seed or variant changes this value.
  EXPECT_EQ(Xxh3("", 0), 0x2D06800538D394C2ull);
  EXPECT_EQ(Hex64(0x2D06800538D394C2ull), "0x2d06800538d394c2");
}

TEST(Checksum, StreamMatchesOneShotForAnySplit) {
  std::vector<uint8_t> data = RandomBytes(10000, 5);
  uint64_t whole = Xxh3(data.data(), data.size());
  for (size_t piece : {1, 7, 64, 240, 241, 4096, 9999, 10000}) {
    Xxh3Stream s;
    for (size_t off = 0; off < data.size(); off += piece) {
      s.Update(data.data() + off, std::min(piece, data.size() - off));
    }
    EXPECT_EQ(s.Digest(), whole) << "piece " << piece;
    s.Reset();
    EXPECT_EQ(s.Digest(), Xxh3("", 0));
  }
}

// ---- segment header -------------------------------------------------------------------------

SegmentHeader SampleHeader() {
  SegmentHeader h;
  h.job_id = 0x0123456789ABCDEFull;
  h.version = 0xFEDCBA9876543210ull;
  h.rank = 6;
  h.world_size = 7;
  h.chunk_bytes = 64 << 20;
  h.created_unix_ns = 1700000000123456789ull;
  return h;
}

TEST(SegmentHeaderCodec, RoundTrip) {
  SegmentHeader h = SampleHeader();
  uint8_t b[64];
  EncodeSegmentHeader(h, b);
  EXPECT_EQ(std::memcmp(b, "CKPTSEG1", 8), 0);
  EXPECT_EQ(GetU64(b + 56), Xxh3(b, 56));
  SegmentHeader d;
  ASSERT_TRUE(DecodeSegmentHeader(b, "seg", &d).ok());
  EXPECT_EQ(d.format_version, kFormatVersion);
  EXPECT_EQ(d.job_id, h.job_id);
  EXPECT_EQ(d.version, h.version);
  EXPECT_EQ(d.rank, h.rank);
  EXPECT_EQ(d.world_size, h.world_size);
  EXPECT_EQ(d.chunk_bytes, h.chunk_bytes);
  EXPECT_EQ(d.created_unix_ns, h.created_unix_ns);
}

TEST(SegmentHeaderCodec, RejectsEveryFlippedBit) {
  uint8_t good[64];
  EncodeSegmentHeader(SampleHeader(), good);
  for (size_t i = 0; i < 64; ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      uint8_t b[64];
      std::memcpy(b, good, 64);
      b[i] ^= static_cast<uint8_t>(1u << bit);
      SegmentHeader d;
      Status st = DecodeSegmentHeader(b, "seg-x", &d);
      ASSERT_EQ(st.code(), CKPTDB_ECORRUPT) << "byte " << i << " bit " << bit;
      // Bytes 0-7 are the magic, 8-55 the checksummed fields, 56-63 the checksum itself.
      EXPECT_THAT(st.message(), HasSubstr(i < 8 ? "seg-x: not a ckptdb segment (bad magic"
                                                : "seg-x: segment header at offset 0 fails xxh3"))
          << "byte " << i;
    }
  }
}

TEST(SegmentHeaderCodec, RejectsBadMagicAndBadChecksum) {
  uint8_t b[64];
  EncodeSegmentHeader(SampleHeader(), b);
  uint64_t stored = GetU64(b + 56);
  b[56] ^= 0xFF;
  SegmentHeader d;
  Status st = DecodeSegmentHeader(b, "seg-x", &d);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(),
              HasSubstr("expected " + Hex64(GetU64(b + 56)) + ", got " + Hex64(stored) + ")"));
  std::memcpy(b, "CKPTSEG2", 8);
  st = DecodeSegmentHeader(b, "seg-x", &d);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(), HasSubstr("bad magic at offset 0"));
}

TEST(SegmentHeaderCodec, RefusesOtherFormatVersions) {
  for (uint32_t v : {0u, 2u, 0xFFFFFFFFu}) {
    SegmentHeader h = SampleHeader();
    h.format_version = v;
    uint8_t b[64];
    EncodeSegmentHeader(h, b);  // a valid checksum: only the version is wrong
    SegmentHeader d;
    Status st = DecodeSegmentHeader(b, "seg-x", &d);
    EXPECT_EQ(st.code(), CKPTDB_ENOTSUP);
    EXPECT_THAT(st.message(), HasSubstr("seg-x: segment format version " + std::to_string(v) +
                                        ", this build reads 1"));
  }
}

TEST(SegmentHeaderCodec, RejectsBadBlockSizeWithValidChecksum) {
  uint8_t b[64];
  EncodeSegmentHeader(SampleHeader(), b);
  uint32_t block = 8192;
  std::memcpy(b + 12, &block, 4);
  uint64_t sum = Xxh3(b, 56);
  std::memcpy(b + 56, &sum, 8);
  SegmentHeader d;
  Status st = DecodeSegmentHeader(b, "seg-x", &d);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(), HasSubstr("segment block size 8192, expected 4096"));
}

TEST(SegmentHeaderCodec, RejectsOutOfRangeFields) {
  struct Case {
    uint32_t rank, world_size;
    uint64_t chunk_bytes;
    const char* needle;
  };
  const Case cases[] = {
      {0, 0, 4096, "names rank 0 of world size 0"},
      {4, 4, 4096, "names rank 4 of world size 4"},
      {0, 1, 0, "chunk size 0 is not a multiple of 4096"},
      {0, 1, 4095, "chunk size 4095 is not"},
      {0, 1, 4097, "chunk size 4097 is not"},
      {0, 1, kMaxChunkBytes + 4096, "in [4096, 1 GiB]"},
  };
  for (const Case& c : cases) {
    SegmentHeader h = SampleHeader();
    h.rank = c.rank;
    h.world_size = c.world_size;
    h.chunk_bytes = c.chunk_bytes;
    uint8_t b[64];
    EncodeSegmentHeader(h, b);
    SegmentHeader d;
    Status st = DecodeSegmentHeader(b, "seg-x", &d);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << c.needle;
    EXPECT_THAT(st.message(), HasSubstr(c.needle));
  }
  // The bounds themselves are accepted.
  SegmentHeader h = SampleHeader();
  h.chunk_bytes = kMaxChunkBytes;
  h.rank = h.world_size - 1;
  uint8_t b[64];
  EncodeSegmentHeader(h, b);
  SegmentHeader d;
  EXPECT_TRUE(DecodeSegmentHeader(b, "seg-x", &d).ok());
}

// ---- record header --------------------------------------------------------------------------

RecordHeader SampleRecord(RecordType type) {
  RecordHeader r;
  r.type = type;
  r.payload_bytes = 123457;
  r.payload_xxh3 = 0x1122334455667788ull;
  r.record_offset = 4096 * 77;
  r.version = 0x8000000000000001ull;
  r.rank = 0xABCDEF;
  r.sequence = 0x10203;
  return r;
}

TEST(RecordHeaderCodec, RoundTripBothTypes) {
  for (RecordType type : {RecordType::kChunk, RecordType::kManifest}) {
    RecordHeader r = SampleRecord(type);
    uint8_t b[64];
    EncodeRecordHeader(r, b);
    EXPECT_EQ(std::memcmp(b, "CKRC", 4), 0);
    EXPECT_EQ(GetU64(b + 48), 0u);  // reserved
    EXPECT_EQ(GetU64(b + 56), Xxh3(b, 56));
    RecordHeader d;
    ASSERT_TRUE(DecodeRecordHeader(b, "rec", &d).ok());
    EXPECT_EQ(d.type, r.type);
    EXPECT_EQ(d.payload_bytes, r.payload_bytes);
    EXPECT_EQ(d.payload_xxh3, r.payload_xxh3);
    EXPECT_EQ(d.record_offset, r.record_offset);
    EXPECT_EQ(d.version, r.version);
    EXPECT_EQ(d.rank, r.rank);
    EXPECT_EQ(d.sequence, r.sequence);
  }
}

TEST(RecordHeaderCodec, RejectsEveryFlippedBit) {
  uint8_t good[64];
  EncodeRecordHeader(SampleRecord(RecordType::kChunk), good);
  for (size_t i = 0; i < 64; ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      uint8_t b[64];
      std::memcpy(b, good, 64);
      b[i] ^= static_cast<uint8_t>(1u << bit);
      RecordHeader d;
      Status st = DecodeRecordHeader(b, "seg-x: record at offset 315392", &d);
      ASSERT_EQ(st.code(), CKPTDB_ECORRUPT) << "byte " << i << " bit " << bit;
      EXPECT_THAT(st.message(), HasSubstr(i < 4 ? "record at offset 315392: no record header"
                                                : "record at offset 315392: record header fails"))
          << "byte " << i;
    }
  }
}

TEST(RecordHeaderCodec, RejectsBadChecksumWithBothValues) {
  uint8_t b[64];
  EncodeRecordHeader(SampleRecord(RecordType::kChunk), b);
  uint64_t good = GetU64(b + 56);
  uint64_t bad = good ^ 1;
  std::memcpy(b + 56, &bad, 8);
  RecordHeader d;
  Status st = DecodeRecordHeader(b, "rec", &d);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(),
              HasSubstr("fails xxh3 (expected " + Hex64(bad) + ", got " + Hex64(good) + ")"));
}

TEST(RecordHeaderCodec, RejectsUnknownTypeAndOutOfRangeFields) {
  for (uint16_t type : {0, 3, 0xFFFF}) {
    RecordHeader r = SampleRecord(RecordType::kChunk);
    r.type = static_cast<RecordType>(type);
    uint8_t b[64];
    EncodeRecordHeader(r, b);
    RecordHeader d;
    Status st = DecodeRecordHeader(b, "rec", &d);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
    EXPECT_THAT(st.message(), HasSubstr("unknown record type " + std::to_string(type)));
  }
  for (RecordType type : {RecordType::kChunk, RecordType::kManifest}) {
    RecordHeader r = SampleRecord(type);
    r.payload_bytes = uint64_t{1} << 30;  // the limit itself is fine
    uint8_t b[64];
    EncodeRecordHeader(r, b);
    RecordHeader d;
    EXPECT_TRUE(DecodeRecordHeader(b, "rec", &d).ok());
    r.payload_bytes += 1;
    EncodeRecordHeader(r, b);
    Status st = DecodeRecordHeader(b, "rec", &d);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
    EXPECT_THAT(st.message(), HasSubstr("record payload of 1073741825 bytes exceeds the limit"));
  }
  RecordHeader r = SampleRecord(RecordType::kChunk);
  r.record_offset = 4096 * 3 + 512;
  uint8_t b[64];
  EncodeRecordHeader(r, b);
  RecordHeader d;
  Status st = DecodeRecordHeader(b, "rec", &d);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(), HasSubstr("record offset 12800 is not 4096-aligned"));
}

// ---- footer ---------------------------------------------------------------------------------

SegmentFooter SampleFooter() {
  SegmentFooter f;
  f.manifest_offset = 4096 * 10;
  f.manifest_bytes = 5000;  // two blocks of payload
  f.manifest_xxh3 = 0x0102030405060708ull;
  f.version = 99;
  f.rank = 3;
  f.chunk_count = 4;
  f.file_bytes = 4096 * 10 + 4096 + 8192 + 4096;
  return f;
}

// The writer (segment_writer.h) against the segment built field by field above: the same bytes,
// and SegmentReader opens them and passes every record.
TEST(SegmentWriter, WritesTheBytesTheFormatSpecifiesAndTheReaderAccepts) {
  const SegmentSpec s = SmallSpec();
  const BuiltSegment expected = BuildSegment(s);
  std::vector<uint8_t> f(kBlockBytes, 0xee);  // the writer zeroes the block's rest
  EncodeSegmentHeaderBlock(HeaderFor(s), f.data());
  uint32_t sequence = 0;
  for (const TensorSpec& t : s.tensors) {
    const std::vector<uint8_t> data = RandomBytes(t.bytes, t.seed);
    for (uint64_t off = 0; off < t.bytes; off += s.chunk_bytes) {
      const uint64_t n = std::min(s.chunk_bytes, t.bytes - off);
      const uint64_t at = f.size();
      RecordHeader rh = ChunkRecordHeader(s.version, s.rank, sequence++, n, at);
      rh.payload_xxh3 = Xxh3(data.data() + off, n);
      f.resize(at + RecordBytes(n), 0xee);  // the writer zeroes the header block's rest
      EncodeRecordHeaderBlock(rh, f.data() + at);
      std::memcpy(f.data() + at + kBlockBytes, data.data() + off, n);
      std::memset(f.data() + at + kBlockBytes + n, 0, RecordBytes(n) - kBlockBytes - n);
    }
  }
  const uint64_t manifest_offset = f.size();
  ASSERT_EQ(manifest_offset, expected.manifest_offset);
  const uint64_t tail = TailBytes(expected.manifest.size());
  f.resize(manifest_offset + tail, 0);
  EncodeSegmentTail(f.data() + manifest_offset, tail, expected.manifest,
                    Xxh3(expected.manifest.data(), expected.manifest.size()), manifest_offset,
                    s.version, s.rank, sequence);
  EXPECT_EQ(f, expected.file);
  std::unique_ptr<SegmentReader> r = OpenOk(f);
  ASSERT_NE(r, nullptr);
  for (uint32_t i = 0; i < r->manifest().chunk_count(); ++i) {
    ChunkProblem problem;
    const auto& c = r->manifest().chunk(i);
    EXPECT_TRUE(r->CheckRecord(i, f.data() + c.record_offset(), &problem).ok()) << i;
  }
}

TEST(FooterCodec, RoundTrip) {
  SegmentFooter f = SampleFooter();
  uint8_t b[64];
  EncodeFooter(f, b);
  EXPECT_EQ(std::memcmp(b + 56, "CKPTEND1", 8), 0);
  EXPECT_EQ(GetU64(b + 48), Xxh3(b, 48));
  SegmentFooter d;
  Status st = DecodeFooter(b, "foot", &d);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(d.manifest_offset, f.manifest_offset);
  EXPECT_EQ(d.manifest_bytes, f.manifest_bytes);
  EXPECT_EQ(d.manifest_xxh3, f.manifest_xxh3);
  EXPECT_EQ(d.version, f.version);
  EXPECT_EQ(d.rank, f.rank);
  EXPECT_EQ(d.chunk_count, f.chunk_count);
  EXPECT_EQ(d.file_bytes, f.file_bytes);
}

TEST(FooterCodec, RejectsEveryFlippedBit) {
  uint8_t good[64];
  EncodeFooter(SampleFooter(), good);
  for (size_t i = 0; i < 64; ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      uint8_t b[64];
      std::memcpy(b, good, 64);
      b[i] ^= static_cast<uint8_t>(1u << bit);
      SegmentFooter d;
      Status st = DecodeFooter(b, "seg-x", &d);
      ASSERT_EQ(st.code(), CKPTDB_ECORRUPT) << "byte " << i << " bit " << bit;
      // Bytes 0-47 are checksummed fields, 48-55 the checksum, 56-63 the magic.
      EXPECT_THAT(st.message(), HasSubstr(i >= 56 ? "seg-x: no segment footer (bad magic"
                                                  : "seg-x: segment footer fails xxh3"))
          << "byte " << i;
    }
  }
}

TEST(FooterCodec, RejectsBadMagicAndChecksum) {
  uint8_t b[64];
  EncodeFooter(SampleFooter(), b);
  uint64_t good = GetU64(b + 48);
  b[48] ^= 0x80;
  SegmentFooter d;
  Status st = DecodeFooter(b, "seg-x", &d);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(),
              HasSubstr("(expected " + Hex64(GetU64(b + 48)) + ", got " + Hex64(good) + ")"));
  std::memset(b, 0, 64);  // a torn file often ends in zeros
  st = DecodeFooter(b, "seg-x", &d);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(), HasSubstr("truncated or was never finished"));
}

TEST(FooterCodec, RejectsInconsistentFields) {
  struct Case {
    const char* name;
    void (*edit)(SegmentFooter*);
  };
  const Case cases[] = {
      {"manifest bytes over 1 GiB", [](SegmentFooter* f) { f->manifest_bytes = (1ull << 30) + 1; }},
      {"too many chunks", [](SegmentFooter* f) { f->chunk_count = (1u << 24) + 1; }},
      {"unaligned manifest offset", [](SegmentFooter* f) { f->manifest_offset += 8; }},
      {"unaligned file size", [](SegmentFooter* f) { f->file_bytes += 1; }},
      {"file under 3 blocks",
       [](SegmentFooter* f) {
         f->manifest_offset = 0;
         f->manifest_bytes = 0;
         f->file_bytes = 8192;
       }},
      {"file over 2^62 bytes",
       [](SegmentFooter* f) {
         f->file_bytes = (1ull << 62) + 8192;
         f->manifest_offset = (1ull << 62);
         f->manifest_bytes = 1;
       }},
      {"manifest in the header block",
       [](SegmentFooter* f) {
         f->manifest_offset = 0;
         f->file_bytes = 4096 + 8192 + 4096;
       }},
      {"manifest past the file",
       [](SegmentFooter* f) { f->manifest_offset = f->file_bytes + 4096; }},
      {"manifest does not end at the footer", [](SegmentFooter* f) { f->file_bytes += 4096; }},
      {"manifest longer than its record", [](SegmentFooter* f) { f->manifest_bytes = 8193; }},
      {"manifest shorter than its record", [](SegmentFooter* f) { f->manifest_bytes = 4096; }},
  };
  for (const Case& c : cases) {
    SegmentFooter f = SampleFooter();
    c.edit(&f);
    uint8_t b[64];
    EncodeFooter(f, b);
    SegmentFooter d;
    Status st = DecodeFooter(b, "seg-x", &d);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << c.name;
    EXPECT_THAT(st.message(), HasSubstr("seg-x: segment footer is inconsistent (manifest at "))
        << c.name;
  }
  // An empty manifest is consistent framing; ManifestView::Open rejects it later (no CKMF).
  SegmentFooter f = SampleFooter();
  f.manifest_bytes = 0;
  f.file_bytes = f.manifest_offset + 4096 + 4096;
  uint8_t b[64];
  EncodeFooter(f, b);
  SegmentFooter d;
  EXPECT_TRUE(DecodeFooter(b, "seg-x", &d).ok());
}

// ---- manifest: BuildManifest + ManifestView -------------------------------------------------

TEST(Manifest, RoundTripSortsAndFinds) {
  ManifestContents c;
  c.job_id = 0xAB;
  c.rank = 2;
  c.world_size = 8;
  c.version = 1234;
  c.node_id = "node-17";
  c.created_unix_ns = 1700000000000000000ull;
  c.writer = "ckptdb 0.1.0";
  // Chunks in file order: 0-1 belong to "w", 2 to "emb", 3 to "b".
  uint64_t at = kBlockBytes;
  for (uint64_t bytes : {4096ull, 904ull, 512ull, 8ull}) {
    c.chunks.push_back({at, bytes, 0x1000 + bytes});
    at += RecordBytes(bytes);
  }
  TensorEntry w{"w", 12, {10, 125}, {}, {}, 5000, 0, 2};
  TensorEntry emb{"emb", 11, {16, 16}, {64, 32}, {16, 16}, 512, 2, 1};
  TensorEntry bias{"b", 9, {1}, {}, {}, 8, 3, 1};
  TensorEntry empty{"empty", 2, {0}, {}, {}, 0, 4, 0};
  c.tensors = {w, emb, empty, bias};
  std::vector<uint8_t> bytes = BuildManifest(c);

  ManifestView v;
  Status st = ManifestView::Open(bytes, at, "seg", &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(v.root().format_version(), kFormatVersion);
  EXPECT_EQ(v.root().data_bytes(), 5000u + 512 + 8);
  const fb::Provenance* p = v.root().provenance();
  EXPECT_EQ(p->job_id(), 0xABu);
  EXPECT_EQ(p->rank(), 2u);
  EXPECT_EQ(p->world_size(), 8u);
  EXPECT_EQ(p->version(), 1234u);
  EXPECT_EQ(p->node_id()->str(), "node-17");
  EXPECT_EQ(p->created_unix_ns(), 1700000000000000000ull);
  EXPECT_EQ(p->writer()->str(), "ckptdb 0.1.0");
  ASSERT_NE(v.root().redundancy(), nullptr);
  EXPECT_EQ(v.root().redundancy()->scheme(), fb::RedundancyScheme::None);

  ASSERT_EQ(v.tensor_count(), 4u);
  std::vector<TensorEntry> sorted = {bias, emb, empty, w};
  for (uint32_t i = 0; i < 4; ++i) {
    const TensorEntry& e = sorted[i];
    const fb::Tensor& t = v.tensor(i);
    EXPECT_EQ(t.name()->str(), e.name);
    EXPECT_EQ(static_cast<uint8_t>(t.dtype()), e.dtype);
    EXPECT_EQ(std::vector<uint64_t>(t.shape()->begin(), t.shape()->end()), e.shape);
    EXPECT_EQ(std::vector<uint64_t>(t.global_shape()->begin(), t.global_shape()->end()),
              e.global_shape);
    EXPECT_EQ(std::vector<uint64_t>(t.global_offset()->begin(), t.global_offset()->end()),
              e.global_offset);
    EXPECT_EQ(t.bytes(), e.bytes);
    EXPECT_EQ(t.first_chunk(), e.first_chunk);
    EXPECT_EQ(t.chunk_count(), e.chunk_count);
    EXPECT_EQ(v.Find(e.name), &t);
  }
  EXPECT_EQ(v.Find(""), nullptr);
  EXPECT_EQ(v.Find("a"), nullptr);
  EXPECT_EQ(v.Find("emb "), nullptr);
  EXPECT_EQ(v.Find("zzz"), nullptr);
  ASSERT_EQ(v.chunk_count(), 4u);
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(v.chunk(i).record_offset(), c.chunks[i].record_offset);
    EXPECT_EQ(v.chunk(i).payload_bytes(), c.chunks[i].payload_bytes);
    EXPECT_EQ(v.chunk(i).xxh3(), c.chunks[i].xxh3);
  }
}

TEST(Manifest, EmptyManifestOpens) {
  ManifestContents c;
  std::vector<uint8_t> bytes = BuildManifest(c);
  ManifestView v;
  Status st = ManifestView::Open(bytes, kBlockBytes, "seg", &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(v.tensor_count(), 0u);
  EXPECT_EQ(v.chunk_count(), 0u);
  EXPECT_EQ(v.Find("x"), nullptr);
}

// A coding group's layout (ec:K+M, xor:K) round-trips; one out of range or inconsistent is
// refused.
TEST(Manifest, CodingLayoutRoundTripsAndIsChecked) {
  ManifestContents c;
  c.redundancy.scheme = static_cast<uint8_t>(fb::RedundancyScheme::ReedSolomon);
  c.redundancy.group = 3;
  c.redundancy.k = 2;
  c.redundancy.m = 1;
  c.redundancy.stripe_bytes = 1 << 20;
  c.redundancy.member_ranks = {4, 9, 2};
  c.redundancy.position = 1;
  std::vector<uint8_t> bytes = BuildManifest(c);
  ManifestView v;
  Status st = ManifestView::Open(bytes, kBlockBytes, "seg", &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const fb::Redundancy* r = v.root().redundancy();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->scheme(), fb::RedundancyScheme::ReedSolomon);
  EXPECT_EQ(r->group(), 3u);
  EXPECT_EQ(r->k(), 2u);
  EXPECT_EQ(r->m(), 1u);
  EXPECT_EQ(r->stripe_bytes(), 1u << 20);
  ASSERT_EQ(r->member_ranks()->size(), 3u);
  EXPECT_EQ(r->member_ranks()->Get(1), 9u);
  EXPECT_FALSE(r->parity());
  EXPECT_EQ(r->position(), 1u);
  EXPECT_EQ(r->member_bytes(), nullptr);

  ManifestContents p = c;  // a parity segment: it knows every member's bytes
  p.redundancy.parity = true;
  p.redundancy.member_bytes = {8192, 0, 12288};
  bytes = BuildManifest(p);
  st = ManifestView::Open(bytes, kBlockBytes, "seg", &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(v.root().redundancy()->parity());
  EXPECT_EQ(v.root().redundancy()->member_bytes()->Get(2), 12288u);

  auto refused = [](ManifestContents bad, const char* why) {
    std::vector<uint8_t> b = BuildManifest(std::move(bad));
    ManifestView view;
    Status s = ManifestView::Open(b, kBlockBytes, "seg", &view);
    EXPECT_EQ(s.code(), CKPTDB_ECORRUPT) << why;
    EXPECT_THAT(s.message(), HasSubstr("redundancy layout")) << why;
  };
  ManifestContents bad = c;
  bad.redundancy.member_ranks = {4, 9};
  refused(bad, "fewer members than K + M");
  bad = c;
  bad.redundancy.position = 3;
  refused(bad, "position past the members");
  bad = c;
  bad.redundancy.stripe_bytes = 1000;
  refused(bad, "unaligned stripe");
  bad = c;
  bad.redundancy.k = 0;
  bad.redundancy.member_ranks = {4};
  refused(bad, "k = 0");
  bad = p;
  bad.redundancy.member_bytes = {1, 2};
  refused(bad, "member_bytes of the wrong length");
  bad = c;
  bad.redundancy.member_bytes = {1, 2, 3};
  refused(bad, "member_bytes in a data segment");
  bad = c;
  bad.redundancy.scheme = static_cast<uint8_t>(fb::RedundancyScheme::Replica);
  refused(bad, "replica is not a coding layout");
  bad = c;
  bad.redundancy.scheme = 9;
  refused(bad, "unknown scheme");
  bad = c;  // 2 + 1 members
  bad.redundancy.scheme = static_cast<uint8_t>(fb::RedundancyScheme::Xor);
  bad.redundancy.k = 1;
  bad.redundancy.m = 2;
  refused(bad, "xor with two parity blocks");
}

// A segment of member 1 of an "arc" replica group of 4 (REFT's ARC): of a shard of 5 pieces
// (slices [0,1) [1,2) [2,3) [3,5)) it keeps pieces 1 and 2, its own slice and the next one's.
ManifestContents ArcContents() {
  ManifestContents c;
  c.replicas.present = true;
  c.replicas.group = 6;
  c.replicas.members = {2, 5, 7, 9};
  c.replicas.position = 1;
  c.replicas.piece_bytes = 4096;
  const std::vector<uint64_t> pieces = {0x10, 0x11, 0x12, 0x13, 0x14};
  c.chunks.push_back({kBlockBytes, 4096, pieces[1]});
  c.chunks.push_back({kBlockBytes + RecordBytes(4096), 4096, pieces[2]});
  c.chunks.push_back({kBlockBytes + 2 * RecordBytes(4096), 8, 0x99});
  TensorEntry w{"w", 2, {4 * 4096 + 100}, {}, {}, 8192, 0, 2};
  w.full_bytes = 4 * 4096 + 100;
  w.slices = {{4096, 8192}};
  w.piece_xxh3 = pieces;
  TensorEntry rng{"rng", 8, {1}, {}, {}, 8, 2, 1};  // kept whole
  c.tensors = {w, rng};
  return c;
}

TEST(Manifest, DeduplicatedShardsRoundTripAndAreChecked) {
  ManifestContents c = ArcContents();
  std::vector<uint8_t> bytes = BuildManifest(c);
  const uint64_t data_end = kBlockBytes + 2 * RecordBytes(4096) + RecordBytes(8);
  ManifestView v;
  Status st = ManifestView::Open(bytes, data_end, "seg", &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(v.root().format_version(), kManifestVersionDedup);
  const fb::Replicas* g = v.root().replicas();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->protection(), fb::ReplicaProtection::Arc);
  EXPECT_EQ(g->group(), 6u);
  EXPECT_EQ(g->position(), 1u);
  EXPECT_EQ(g->piece_bytes(), 4096u);
  ASSERT_EQ(g->members()->size(), 4u);
  EXPECT_EQ(g->members()->Get(3), 9u);
  const fb::Tensor* w = v.Find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->bytes(), 8192u);
  EXPECT_EQ(ShardBytes(*w), 4 * 4096u + 100);
  ASSERT_EQ(w->slices()->size(), 1u);
  EXPECT_EQ(w->slices()->Get(0)->offset(), 4096u);
  EXPECT_EQ(w->slices()->Get(0)->bytes(), 8192u);
  EXPECT_EQ(w->piece_xxh3()->size(), 5u);
  EXPECT_EQ(ShardBytes(*v.Find("rng")), 8u);
  EXPECT_EQ(v.root().data_bytes(), 8200u);
  // A manifest of no arc group stays version 1, readable by the readers before it.
  ManifestContents plain;
  bytes = BuildManifest(plain);
  ASSERT_TRUE(ManifestView::Open(bytes, kBlockBytes, "seg", &v).ok());
  EXPECT_EQ(v.root().format_version(), kFormatVersion);

  auto refused = [&](ManifestContents bad, const char* needle) {
    std::vector<uint8_t> b = BuildManifest(std::move(bad));
    ManifestView view;
    Status s = ManifestView::Open(b, data_end, "seg", &view);
    EXPECT_EQ(s.code(), CKPTDB_ECORRUPT) << needle;
    EXPECT_THAT(s.message(), HasSubstr(needle));
  };
  ManifestContents bad = c;
  bad.tensors[0].slices = {{0, 8192}};  // member 0's slices
  refused(bad, "holds slices other than member 1 of 4 keeps");
  bad = c;
  bad.replicas.position = 2;  // member 2 keeps pieces 2..4
  refused(bad, "holds slices other than member 2 of 4 keeps");
  bad = c;
  bad.tensors[0].piece_xxh3[2] = 0x77;
  refused(bad, "piece 2 disagrees with its chunk");
  bad = c;
  bad.tensors[0].piece_xxh3.pop_back();
  refused(bad, "does not list its slices and the xxh3 of each of its 5 pieces");
  bad = c;
  bad.tensors[0].shape = {8192};  // the kept bytes, not the shard's
  refused(bad, "shape does not match its 16484 bytes");
  bad = c;
  bad.replicas.members = {2, 7, 5, 9};
  refused(bad, "replica group is out of range");
  bad = c;
  bad.replicas.position = 4;
  refused(bad, "replica group is out of range");
  bad = c;
  bad.replicas.piece_bytes = 1000;
  refused(bad, "replica group is out of range");
  bad = c;
  bad.replicas.members = {2};
  bad.replicas.position = 0;
  refused(bad, "replica group is out of range");
}

// A manifest written field by field with the generated Create* functions, nothing sorted or
// checked, to reach each semantic check of ManifestView::Open.
struct RawTensor {
  std::string name;
  fb::DType dtype = fb::DType::U8;
  std::vector<uint64_t> shape;
  std::vector<uint64_t> global_shape;
  std::vector<uint64_t> global_offset;
  uint64_t bytes = 0;
  uint32_t first_chunk = 0;
  uint32_t chunk_count = 0;
  uint64_t full_bytes = 0;
  std::optional<std::vector<fb::Slice>> slices;  // unset: not written at all
  std::vector<uint64_t> piece_xxh3;
  bool packed = false;
  uint64_t pack_offset = 0;
  uint64_t pack_xxh3 = 0;
  bool replicated = false;
  bool recomputed = false;
};

struct RawManifest {
  uint32_t format_version = kFormatVersion;
  std::vector<RawTensor> tensors;
  std::vector<fb::Chunk> chunks;
  std::optional<uint64_t> data_bytes;  // the sum of the tensors' bytes when unset
  std::optional<ReplicasEntry> replicas;

  // Where the data records end when the chunks are laid out back to back from block 1.
  uint64_t DataEnd() const {
    uint64_t end = kBlockBytes;
    for (const fb::Chunk& c : chunks) end += RecordBytes(c.payload_bytes());
    return end;
  }

  std::vector<uint8_t> Build() const {
    flatbuffers::FlatBufferBuilder b;
    std::vector<flatbuffers::Offset<fb::Tensor>> ts;
    uint64_t sum = 0;
    for (const RawTensor& t : tensors) {
      auto slices = t.slices ? b.CreateVectorOfStructs(*t.slices) : 0;
      auto pieces = t.piece_xxh3.empty() ? 0 : b.CreateVector(t.piece_xxh3);
      ts.push_back(fb::CreateTensor(b, b.CreateString(t.name), t.dtype, b.CreateVector(t.shape),
                                    b.CreateVector(t.global_shape), b.CreateVector(t.global_offset),
                                    t.bytes, t.first_chunk, t.chunk_count, t.full_bytes, slices,
                                    pieces, t.packed, t.pack_offset, t.pack_xxh3, 0, t.replicated,
                                    t.recomputed));
      sum += t.bytes;
    }
    auto tv = b.CreateVector(ts);
    auto cv = b.CreateVectorOfStructs(chunks);
    auto prov = fb::CreateProvenance(b, 1, 0, 1, 1, b.CreateString("n"), 1, b.CreateString("w"));
    flatbuffers::Offset<fb::Replicas> group;
    if (replicas) {
      group = fb::CreateReplicas(b, fb::ReplicaProtection::Arc, replicas->group,
                                 b.CreateVector(replicas->members), replicas->position,
                                 replicas->piece_bytes, replicas->replicated_only, replicas->aor);
    }
    auto root =
        fb::CreateManifest(b, format_version, prov, tv, cv, 0, data_bytes.value_or(sum), group);
    b.Finish(root, fb::ManifestIdentifier());
    return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  }
};

// Two tensors over three chunks laid out back to back: "a" = chunks 0-1, "b" = chunk 2.
RawManifest ValidRaw() {
  RawManifest m;
  m.chunks.emplace_back(4096, 4096, 1);
  m.chunks.emplace_back(4096 + 8192, 100, 2);
  m.chunks.emplace_back(4096 + 8192 + 8192, 16, 3);
  m.tensors.push_back({"a", fb::DType::U8, {4196}, {}, {}, 4196, 0, 2});
  m.tensors.push_back({"b", fb::DType::F32, {2, 2}, {4, 2}, {2, 0}, 16, 2, 1});
  return m;
}

Status OpenRaw(const RawManifest& m, uint64_t data_end) {
  std::vector<uint8_t> bytes = m.Build();
  ManifestView v;
  return ManifestView::Open(bytes, data_end, "seg-x", &v);
}

void ExpectRejected(const RawManifest& m, const std::string& needle) {
  Status st = OpenRaw(m, m.DataEnd());
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << needle;
  EXPECT_THAT(st.message(), HasSubstr("seg-x: manifest "));
  EXPECT_THAT(st.message(), HasSubstr(needle));
}

TEST(ManifestSemantics, BaselineIsValid) {
  RawManifest m = ValidRaw();
  Status st = OpenRaw(m, m.DataEnd());
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// REFT's AEC layout, for every group of 3 to 7 members, with and without ARC, and every shard of
// 0 to 60 pieces: each piece is protected exactly once, by a member that keeps no copy of it (not
// its slice's owner, nor with ARC the owner's predecessor), in a unit whose pieces come from
// distinct slices and each map back to that unit; a member keeps at most
// ceil(longest slice / spread) units.
TEST(AecLayout, EveryPieceIsProtectedOnceByAMemberThatKeepsNoCopyOfIt) {
  for (uint32_t count = 3; count <= 7; ++count) {
    for (bool arc : {false, true}) {
      const uint32_t spread = AecSpread(count, arc);
      for (uint64_t n = 0; n <= 60; ++n) {
        SCOPED_TRACE("count " + std::to_string(count) + (arc ? " arc+aec" : " aec") + " n " +
                     std::to_string(n));
        std::vector<int> protected_by(n, 0);
        uint64_t longest = 0;
        for (uint32_t s = 0; s < count; ++s) {
          const auto [first, end] = SlicePieces(n, count, s);
          longest = std::max(longest, end - first);
          for (uint64_t p = first; p < end; ++p) ASSERT_EQ(SliceOf(n, count, p), s);
        }
        for (uint32_t h = 0; h < count; ++h) {
          const uint64_t units = AecUnits(n, count, arc, h);
          EXPECT_LE(units, (longest + spread - 1) / spread);
          for (uint64_t u = 0; u < units; ++u) {
            const std::vector<uint64_t> pieces = AecUnitPieces(n, count, arc, h, u);
            ASSERT_FALSE(pieces.empty()) << "unit " << u << " of member " << h;
            std::set<uint32_t> slices;
            for (uint64_t p : pieces) {
              const uint32_t s = SliceOf(n, count, p);
              EXPECT_TRUE(slices.insert(s).second) << "two pieces of slice " << s;
              EXPECT_NE(s, h) << "member " << h << " protects its own slice";
              if (arc) EXPECT_NE((s + count - 1) % count, h) << "member " << h << " keeps a copy";
              const AecPlace place = AecPlaceOf(n, count, arc, p);
              EXPECT_EQ(place.holder, h);
              EXPECT_EQ(place.unit, u);
              ++protected_by[p];
            }
          }
        }
        for (uint64_t p = 0; p < n; ++p) EXPECT_EQ(protected_by[p], 1) << "piece " << p;
      }
    }
  }
}

// GroupRestores against a restore simulated piece by piece (read whole where a live member keeps
// it, else decoded when its unit's holder is alive and the unit's other pieces were read whole),
// for every set of live members of groups of 3 to 6: never yes where the simulation fails; the
// same answer for shards whose every slice gives every protecting member a piece; "aec" survives
// every single loss and "arc+aec" every double one; ARC alone needs a keeper of every slice.
TEST(AecLayout, GroupRestoresAgreesWithAPieceByPieceRestore) {
  auto simulate = [](uint64_t n, uint32_t count, bool arc, bool aec,
                     const std::vector<bool>& alive) {
    std::vector<bool> have(n);
    for (uint64_t p = 0; p < n; ++p) {
      const uint32_t s = SliceOf(n, count, p);
      have[p] = alive[s] || (arc && alive[(s + count - 1) % count]);
    }
    for (uint64_t p = 0; p < n; ++p) {
      if (have[p]) continue;
      if (!aec) return false;
      const AecPlace place = AecPlaceOf(n, count, arc, p);
      if (!alive[place.holder]) return false;
      for (uint64_t q : AecUnitPieces(n, count, arc, place.holder, place.unit)) {
        if (q != p && !have[q]) return false;
      }
    }
    return true;
  };
  for (uint32_t count = 3; count <= 6; ++count) {
    for (int scheme = 0; scheme < 3; ++scheme) {
      const bool arc = scheme != 1, aec = scheme != 0;
      const uint64_t large = uint64_t{count} * count * 3;
      for (uint32_t mask = 0; mask < (1u << count); ++mask) {
        std::vector<bool> alive(count);
        uint32_t lost = 0;
        for (uint32_t q = 0; q < count; ++q) {
          alive[q] = (mask >> q) & 1;
          lost += !alive[q];
        }
        const bool says = GroupRestores(count, arc, aec, alive);
        SCOPED_TRACE("count " + std::to_string(count) + " scheme " + std::to_string(scheme) +
                     " alive mask " + std::to_string(mask));
        EXPECT_EQ(says, simulate(large, count, arc, aec, alive));
        for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{count}, uint64_t{count + 1}}) {
          if (says) EXPECT_TRUE(simulate(n, count, arc, aec, alive)) << "n " << n;
        }
        if (scheme == 1 && lost <= 1) EXPECT_TRUE(says);
        if (scheme == 2 && lost <= 2) EXPECT_TRUE(says);
      }
    }
  }
}

// A segment of member 1 of an "aec" group of 4: of a shard of 5 pieces (slices [0,1) [1,2) [2,3)
// [3,5)) it keeps piece 1 and one parity unit, of piece 0 (slice 0) and piece 4 (slice 3, 100
// bytes), 4096 bytes long.
ManifestContents AecContents() {
  ManifestContents c;
  c.replicas.present = true;
  c.replicas.group = 6;
  c.replicas.members = {2, 5, 7, 9};
  c.replicas.position = 1;
  c.replicas.piece_bytes = 4096;
  c.replicas.arc = false;
  c.replicas.aec = true;
  const std::vector<uint64_t> pieces = {0x10, 0x11, 0x12, 0x13, 0x14};
  c.chunks.push_back({kBlockBytes, 4096, pieces[1]});
  c.chunks.push_back({kBlockBytes + RecordBytes(4096), 4096, 0x77});  // the parity unit
  c.chunks.push_back({kBlockBytes + 2 * RecordBytes(4096), 8, 0x99});
  TensorEntry w{"w", 2, {4 * 4096 + 100}, {}, {}, 4096, 0, 1};
  w.full_bytes = 4 * 4096 + 100;
  w.slices = {{4096, 4096}};
  w.piece_xxh3 = pieces;
  w.parity_chunks = 1;
  TensorEntry rng{"rng", 8, {1}, {}, {}, 8, 2, 1};
  c.tensors = {w, rng};
  return c;
}
constexpr uint64_t kAecDataEnd = kBlockBytes + 2 * RecordBytes(4096) + RecordBytes(8);

TEST(Manifest, AecParityUnitsRoundTripAndAreChecked) {
  ASSERT_EQ(AecUnits(5, 4, false, 1), 1u);
  ASSERT_EQ(AecUnitPieces(5, 4, false, 1, 0), (std::vector<uint64_t>{0, 4}));
  ManifestContents c = AecContents();
  const std::vector<uint64_t> pieces = {0x10, 0x11, 0x12, 0x13, 0x14};
  const uint64_t data_end = kAecDataEnd;
  std::vector<uint8_t> bytes = BuildManifest(c);
  ManifestView v;
  Status st = ManifestView::Open(bytes, data_end, "seg", &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(v.root().format_version(), kManifestVersionParity);
  EXPECT_EQ(v.root().replicas()->protection(), fb::ReplicaProtection::Aec);
  EXPECT_EQ(v.Find("w")->parity_chunks(), 1u);
  EXPECT_EQ(v.Find("w")->bytes(), 4096u);  // its slices', without the parity
  EXPECT_EQ(v.root().data_bytes(), 4096u + 8);
  c.replicas.arc = true;  // "arc+aec": then it keeps slices 1 and 2, and protects slices 0, 3
  c.chunks[1].xxh3 = pieces[2];
  c.chunks.insert(c.chunks.begin() + 2, {kBlockBytes + 2 * RecordBytes(4096), 4096, 0x78});
  c.chunks[3].record_offset = kBlockBytes + 3 * RecordBytes(4096);
  c.tensors[0].slices = {{4096, 8192}};
  c.tensors[0].bytes = 8192;
  c.tensors[0].chunk_count = 2;
  c.tensors[1].first_chunk = 3;
  ASSERT_EQ(AecUnits(5, 4, true, 1), 1u);
  ASSERT_EQ(AecUnitPieces(5, 4, true, 1, 0), (std::vector<uint64_t>{0, 4}));
  const uint64_t arc_end = data_end + RecordBytes(4096);
  bytes = BuildManifest(c);
  st = ManifestView::Open(bytes, arc_end, "seg", &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(v.root().replicas()->protection(), fb::ReplicaProtection::ArcAec);

  auto refused = [&](ManifestContents bad, uint64_t end, const char* needle) {
    std::vector<uint8_t> b = BuildManifest(std::move(bad));
    ManifestView view;
    Status s = ManifestView::Open(b, end, "seg", &view);
    EXPECT_EQ(s.code(), CKPTDB_ECORRUPT) << needle;
    EXPECT_THAT(s.message(), HasSubstr(needle));
  };
  ManifestContents bad = c;
  bad.tensors[0].parity_chunks = 0;  // its unit becomes a chunk of no tensor
  refused(bad, arc_end, "has 0 parity units; member 1 of 4 keeps 1");
  bad = c;
  bad.chunks[2].payload_bytes = 100;
  bad.chunks[3].record_offset = kBlockBytes + 2 * RecordBytes(4096) + RecordBytes(100);
  refused(bad, kBlockBytes + 2 * RecordBytes(4096) + RecordBytes(100) + RecordBytes(8),
          "parity unit 0 is not 4096 bytes");
  bad = c;
  bad.tensors[0].parity_chunks = 2;  // the unit and rng's chunk
  refused(bad, arc_end, "has 2 parity units; member 1 of 4 keeps 1");
  bad = c;
  bad.replicas.members = {2, 5};
  bad.replicas.position = 1;
  refused(bad, arc_end, "replica group is out of range");
}

// A version 2 manifest of member 0 of an "arc" group of 2 (pieces of 4096): of shard "a" (2
// pieces) it keeps both, which a writer stores whole but a reader must also accept written as
// slices; each rule of a deduplicated tensor broken in turn.
TEST(ManifestSemantics, RejectsDeduplicatedTensorsThatBreakTheirRules) {
  auto arc = [] {
    RawManifest m = ValidRaw();
    m.format_version = kManifestVersionDedup;
    m.replicas = ReplicasEntry{true, 1, {3, 8}, 0, 4096};
    m.chunks[1] = fb::Chunk(4096 + 8192, 4096, 2);  // "a" is pieces 0 and 1, 8192 bytes
    m.chunks[2] = fb::Chunk(4096 + 2 * 8192, 16, 3);
    RawTensor& a = m.tensors[0];
    a.shape = {8192};
    a.bytes = 8192;
    a.full_bytes = 8192;
    a.slices = std::vector<fb::Slice>{fb::Slice(0, 8192)};
    a.piece_xxh3 = {1, 2};
    return m;
  };
  RawManifest m = arc();
  Status st = OpenRaw(m, m.DataEnd());
  ASSERT_TRUE(st.ok()) << st.ToString();
  m = arc();
  m.tensors[0].slices.reset();
  ExpectRejected(m, "tensor 'a' does not list its slices and the xxh3 of each of its 2 pieces");
  m = arc();
  m.tensors[0].piece_xxh3 = {1, 2, 3};
  ExpectRejected(m, "does not list its slices and the xxh3 of each of its 2 pieces");
  m = arc();
  m.replicas.reset();
  ExpectRejected(m, "has format version 2 and no replica group");
  m = arc();
  m.format_version = kFormatVersion;
  ExpectRejected(m, "has format version 1 and a replica group");
  m = arc();
  m.format_version = kFormatVersion;
  m.replicas.reset();
  ExpectRejected(m, "tensor 'a' is deduplicated without a replica group");
  m = arc();
  m.tensors[1].slices = std::vector<fb::Slice>{fb::Slice(0, 16)};
  ExpectRejected(m, "tensor 'b' lists slices but is not deduplicated");
  m = arc();
  m.tensors[0].slices = std::vector<fb::Slice>{fb::Slice(0, 4096)};  // only piece 0
  ExpectRejected(m, "tensor 'a' holds slices other than member 0 of 2 keeps");
  m = arc();
  m.tensors[0].piece_xxh3 = {1, 9};
  ExpectRejected(m, "tensor 'a' piece 1 disagrees with its chunk");
  m = arc();  // a third chunk for "a", taken from "b"
  m.tensors[0].chunk_count = 3;
  m.tensors[0].bytes = 8192 + 16;
  m.tensors[1].chunk_count = 0;
  m.tensors[1].bytes = 0;
  m.tensors[1].shape = {};
  ExpectRejected(m, "tensor 'a' has chunks past its slices");
  m = arc();
  m.replicas->members = {8, 3};
  ExpectRejected(m, "replica group is out of range or inconsistent");
}

TEST(ManifestSemantics, RejectsUnsortedAndDuplicateNames) {
  RawManifest m = ValidRaw();
  std::swap(m.tensors[0].name, m.tensors[1].name);
  ExpectRejected(m, "tensor 'a' is out of order or duplicated");
  m = ValidRaw();
  m.tensors[1].name = "a";
  ExpectRejected(m, "tensor 'a' is out of order or duplicated");
}

TEST(ManifestSemantics, RejectsBadNames) {
  RawManifest m = ValidRaw();
  m.tensors[0].name = "";
  ExpectRejected(m, "tensor 0 has an empty, overlong or NUL-containing name");
  m = ValidRaw();
  m.tensors[0].name = std::string("a\0b", 3);
  ExpectRejected(m, "tensor 0 has an empty, overlong or NUL-containing name");
  m = ValidRaw();
  m.tensors[0].name = std::string(1025, 'a');
  ExpectRejected(m, "tensor 0 has an empty, overlong or NUL-containing name");
  m.tensors[0].name = std::string(1024, 'a');  // the limit itself
  EXPECT_TRUE(OpenRaw(m, m.DataEnd()).ok());
}

TEST(ManifestSemantics, RejectsChunksOutOfPlace) {
  RawManifest m = ValidRaw();
  m.chunks[1] = fb::Chunk(4096 + 4096, 100, 2);  // overlaps chunk 0's payload
  ExpectRejected(m, "chunk 1 at offset 8192 (100 bytes) is out of place; expected offset 12288");
  m = ValidRaw();
  m.chunks[0] = fb::Chunk(0, 4096, 1);  // in the header block
  ExpectRejected(m, "chunk 0 at offset 0 (4096 bytes) is out of place");
  m = ValidRaw();
  m.chunks[2] = fb::Chunk(4096 + 8192 + 8192, kMaxChunkBytes + 1, 3);
  ExpectRejected(m, "chunk 2 at offset 20480 (1073741825 bytes) is out of place");
  // Past the data records, and short of them.
  m = ValidRaw();
  Status st = OpenRaw(m, m.DataEnd() - 4096);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(), HasSubstr("chunk 2 runs past the data records"));
  st = OpenRaw(m, m.DataEnd() + 4096);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(), HasSubstr("chunks end at 28672, records at 32768"));
}

TEST(ManifestSemantics, RejectsTensorBytesThatDisagreeWithChunks) {
  RawManifest m = ValidRaw();
  m.tensors[0].bytes = 4195;
  m.tensors[0].shape = {4195};
  ExpectRejected(m, "tensor 'a' has 4195 bytes but its chunks hold 4196");
  m = ValidRaw();
  m.data_bytes = 1;
  ExpectRejected(m, "data_bytes disagrees with its tensors");
}

TEST(ManifestSemantics, RejectsShapeThatDisagreesWithBytes) {
  RawManifest m = ValidRaw();
  m.tensors[1].shape = {2, 3};
  m.tensors[1].global_shape = {4, 3};
  m.tensors[1].global_offset = {0, 0};
  ExpectRejected(m, "tensor 'b' shape does not match its 16 bytes");
  m = ValidRaw();
  m.tensors[1].dtype = fb::DType::F64;  // 2x2 of 8 bytes is 32
  ExpectRejected(m, "tensor 'b' shape does not match its 16 bytes");
  m = ValidRaw();
  m.tensors[0].shape = {1ull << 32, 1ull << 32};
  ExpectRejected(m, "tensor 'a' shape overflows");
  m = ValidRaw();
  m.tensors[0].dtype = static_cast<fb::DType>(16);
  ExpectRejected(m, "tensor 'a' has unknown dtype 16");
}

TEST(ManifestSemantics, RejectsInconsistentDimensions) {
  RawManifest m = ValidRaw();
  m.tensors[1].global_offset = {};
  ExpectRejected(m, "tensor 'b' has inconsistent dimensions");
  m = ValidRaw();
  m.tensors[1].global_shape = {4, 2, 1};
  m.tensors[1].global_offset = {0, 0, 0};
  ExpectRejected(m, "tensor 'b' has inconsistent dimensions");
  m = ValidRaw();
  m.tensors[0].shape = {1, 1, 1, 1, 1, 1, 1, 1, 4196};  // 9 > kMaxDims
  ExpectRejected(m, "tensor 'a' has inconsistent dimensions");
  m.tensors[0].shape = {1, 1, 1, 1, 1, 1, 1, 4196};  // 8 is the limit
  EXPECT_TRUE(OpenRaw(m, m.DataEnd()).ok());
}

TEST(ManifestSemantics, RejectsGlobalOffsetOutsideGlobalShape) {
  RawManifest m = ValidRaw();
  m.tensors[1].global_offset = {2, 1};  // [1, 3) in a dimension of 2
  ExpectRejected(m, "tensor 'b' lies outside its global shape in dimension 1");
  m = ValidRaw();
  m.tensors[1].global_offset = {~0ull, 0};  // offset + shape overflows
  ExpectRejected(m, "tensor 'b' lies outside its global shape in dimension 0");
  m = ValidRaw();
  m.tensors[1].global_offset = {3, 0};  // [3, 5) in a dimension of 4
  ExpectRejected(m, "tensor 'b' lies outside its global shape in dimension 0");
}

TEST(ManifestSemantics, RejectsChunkOwnershipErrors) {
  RawManifest m = ValidRaw();
  m.tensors[1].chunk_count = 0;  // chunk 2 owned by nobody
  m.tensors[1].bytes = 0;
  m.tensors[1].shape = {0, 2};
  ExpectRejected(m, "some chunks belong to no tensor");
  m = ValidRaw();
  m.tensors[1].first_chunk = 1;  // a: 0-1, b: 1 -> overlap
  m.tensors[1].bytes = 100;
  m.tensors[1].shape = {25};
  m.tensors[1].global_shape = {};
  m.tensors[1].global_offset = {};
  m.chunks[2] = fb::Chunk(20480, 16, 3);
  ExpectRejected(m, "chunk ranges of tensors overlap or leave gaps");
  m = ValidRaw();
  m.tensors[1].first_chunk = 3;  // beyond the list
  ExpectRejected(m, "tensor 'b' names chunks beyond the chunk list");
  m = ValidRaw();
  m.tensors[1].first_chunk = 0xFFFFFFFFu;  // first + count must not wrap
  ExpectRejected(m, "tensor 'b' names chunks beyond the chunk list");
  m = ValidRaw();
  m.chunks[2] = fb::Chunk(20480, 0, 3);
  m.tensors[1].bytes = 0;
  m.tensors[1].shape = {0, 2};
  ExpectRejected(m, "tensor 'b' has an empty chunk 2");
}

TEST(ManifestSemantics, RejectsOtherVersionsAndNonManifests) {
  RawManifest m = ValidRaw();
  m.format_version = 2;
  ExpectRejected(m, "has format version 2");
  ManifestView v;
  std::vector<uint8_t> junk = RandomBytes(200, 1);
  Status st = ManifestView::Open(junk, 4096, "seg-x", &v);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(), HasSubstr("seg-x: manifest is not a ckptdb manifest (no CKMF"));
  st = ManifestView::Open({}, 4096, "seg-x", &v);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  std::memcpy(junk.data() + 4, "CKMF", 4);
  st = ManifestView::Open(junk, 4096, "seg-x", &v);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(), HasSubstr("fails FlatBuffers verification"));
}

std::string CorpusDir(const std::string& target) {
  return std::string(CKPTDB_TEST_DATA_DIR) + "/../../fuzz/corpus/" + target;
}

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::string raw = test::ReadWholeFile(path);
  return std::vector<uint8_t>(raw.begin(), raw.end());
}

TEST(ManifestSemantics, RejectsMisalignedVectors) {
  // Found by fuzz_manifest: a chunk list whose 4-byte length is aligned but whose 8-byte structs
  // are not. flatbuffers' Verifier accepts it; reading it would be undefined behaviour.
  std::vector<uint8_t> bytes = ReadBytes(CorpusDir("manifest") + "/regress-misaligned-chunks.ckmf");
  ASSERT_FALSE(bytes.empty());
  flatbuffers::Verifier verifier(bytes.data(), bytes.size());
  ASSERT_TRUE(fb::VerifyManifestBuffer(verifier));
  ManifestView v;
  Status st = ManifestView::Open(bytes, kBlockBytes, "seg-x", &v);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(), HasSubstr("seg-x: manifest chunk list is not 8-byte aligned"));
}

TEST(ManifestSemantics, EveryTruncationAndByteFlipFailsCleanly) {
  RawManifest m = ValidRaw();
  std::vector<uint8_t> good = m.Build();
  for (size_t n = 0; n < good.size(); ++n) {
    // Copied so that the sanitizers see reads past a truncated buffer.
    std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<ptrdiff_t>(n));
    ManifestView v;
    Status st = ManifestView::Open(cut, m.DataEnd(), "seg-x", &v);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << "truncated to " << n;
  }
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<uint8_t> bad = good;
    bad[i] ^= 0xFF;
    ManifestView v;
    Status st = ManifestView::Open(bad, m.DataEnd(), "seg-x", &v);
    // Some flips land in padding or in a checksum field and are legal; the rest are Corrupt.
    EXPECT_TRUE(st.ok() || st.code() == CKPTDB_ECORRUPT) << st.ToString();
    if (st.ok()) {
      for (uint32_t t = 0; t < v.tensor_count(); ++t) {
        EXPECT_EQ(v.Find(v.tensor(t).name()->string_view()), &v.tensor(t));
      }
    }
  }
}

// ---- whole segments -------------------------------------------------------------------------

TEST(Segment, ReadsBackEveryChunk) {
  SegmentSpec spec = SmallSpec();
  BuiltSegment seg = BuildSegment(spec);
  auto r = OpenOk(seg.file);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->what(), "seg-test");
  EXPECT_EQ(r->header().job_id, spec.job_id);
  EXPECT_EQ(r->header().version, spec.version);
  EXPECT_EQ(r->footer().file_bytes, seg.file.size());
  EXPECT_EQ(r->footer().manifest_offset, seg.manifest_offset);
  EXPECT_EQ(r->footer().chunk_count, seg.chunks.size());
  // w: 12000 bytes = 4096 + 4096 + 3808; b: 8192 = 2 x 4096; a: 1; z: none.
  ASSERT_EQ(r->manifest().chunk_count(), 6u);
  ASSERT_EQ(r->manifest().tensor_count(), 4u);
  EXPECT_EQ(r->manifest().tensor(0).name()->str(), "a");
  EXPECT_EQ(r->manifest().tensor(3).name()->str(), "z");

  std::vector<uint8_t> scratch;
  for (const TensorSpec& ts : spec.tensors) {
    const fb::Tensor* t = r->manifest().Find(ts.name);
    ASSERT_NE(t, nullptr) << ts.name;
    EXPECT_EQ(t->bytes(), ts.bytes);
    std::vector<uint8_t> want = RandomBytes(ts.bytes, ts.seed);
    std::vector<uint8_t> got;
    for (uint32_t c = t->first_chunk(); c < t->first_chunk() + t->chunk_count(); ++c) {
      ChunkProblem problem;
      Status st = r->CheckChunk(c, &scratch, &problem);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ASSERT_EQ(scratch.size(), kBlockBytes + r->manifest().chunk(c).payload_bytes());
      got.insert(got.end(), scratch.begin() + kBlockBytes, scratch.end());
    }
    EXPECT_EQ(got, want) << ts.name;
  }
  ChunkProblem problem;
  Status st = r->CheckChunk(6, &scratch, &problem);
  EXPECT_EQ(st.code(), CKPTDB_ENOTFOUND);
  EXPECT_THAT(st.message(), HasSubstr("seg-test: no chunk 6"));

  std::vector<ScannedRecord> records;
  st = Scan(seg.file, &records);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(records.size(), 7u);  // six chunks and the manifest
  for (size_t i = 0; i < records.size(); ++i) {
    const ScannedRecord& rec = records[i];
    EXPECT_EQ(rec.offset, rec.header.record_offset);
    EXPECT_EQ(rec.actual_xxh3, rec.header.payload_xxh3);
    EXPECT_EQ(rec.header.sequence, i < 6 ? i : 6u);
    EXPECT_EQ(rec.header.type, i < 6 ? RecordType::kChunk : RecordType::kManifest);
    EXPECT_EQ(rec.offset + RecordBytes(rec.header.payload_bytes), seg.record_ends[i]);
  }
}

TEST(Segment, NoChunksIsThreeBlocksPlusManifest) {
  SegmentSpec spec;
  spec.tensors.push_back({"nothing", fb::DType::F32, {0}, {}, {}, 0, 1});
  BuiltSegment seg = BuildSegment(spec);
  // Header block, manifest record, footer block.
  EXPECT_EQ(seg.file.size(), kBlockBytes + RecordBytes(seg.manifest.size()) + kBlockBytes);
  auto r = OpenOk(seg.file);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->manifest().chunk_count(), 0u);
  EXPECT_EQ(r->footer().manifest_offset, kBlockBytes);
  std::vector<ScannedRecord> records;
  EXPECT_TRUE(Scan(seg.file, &records).ok());
  EXPECT_EQ(records.size(), 1u);
}

TEST(Segment, FlippedPayloadByteNamesChunkOffsetAndChecksums) {
  BuiltSegment seg = BuildSegment(SmallSpec());
  const ChunkEntry& c = seg.chunks[1];
  seg.file[c.record_offset + kBlockBytes + 1234] ^= 0x20;
  auto r = OpenOk(seg.file);  // the manifest does not cover payloads: it still opens
  ASSERT_NE(r, nullptr);
  std::vector<uint8_t> scratch;
  for (uint32_t i = 0; i < r->manifest().chunk_count(); ++i) {
    ChunkProblem problem;
    Status st = r->CheckChunk(i, &scratch, &problem);
    if (i != 1) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      continue;
    }
    uint64_t actual = Xxh3(seg.file.data() + c.record_offset + kBlockBytes, c.payload_bytes);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
    EXPECT_EQ(problem.chunk_index, 1);
    EXPECT_EQ(problem.file_offset, c.record_offset);
    EXPECT_EQ(problem.expected_xxh3, c.xxh3);
    EXPECT_EQ(problem.actual_xxh3, actual);
    EXPECT_NE(actual, c.xxh3);
    EXPECT_EQ(st.message(), "seg-test: chunk 1 at offset " + std::to_string(c.record_offset) +
                                " fails xxh3 (expected " + Hex64(c.xxh3) + ", got " +
                                Hex64(actual) + ")");
  }
  // Framing still holds: the scan reaches the footer and reports the bad payload's checksum.
  std::vector<ScannedRecord> records;
  ASSERT_TRUE(Scan(seg.file, &records).ok());
  ASSERT_EQ(records.size(), seg.chunks.size() + 1);
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(records[i].actual_xxh3 == records[i].header.payload_xxh3, i != 1) << i;
  }
}

TEST(Segment, PaddingIsNotChecksummed) {
  // Writers zero the padding; readers ignore it (docs/format.md), so a flip there is harmless.
  BuiltSegment seg = BuildSegment(SmallSpec());
  seg.file[seg.chunks[2].record_offset + kBlockBytes + seg.chunks[2].payload_bytes] ^= 1;
  seg.file[seg.chunks[2].record_offset + 100] ^= 1;  // record header block, past its 64 bytes
  seg.file[100] ^= 1;                                // file header block, past its 64 bytes
  auto r = OpenOk(seg.file);
  ASSERT_NE(r, nullptr);
  std::vector<uint8_t> scratch;
  ChunkProblem problem;
  EXPECT_TRUE(r->CheckChunk(2, &scratch, &problem).ok());
}

TEST(Segment, DamagedRecordHeaderFailsCheckChunk) {
  BuiltSegment seg = BuildSegment(SmallSpec());
  seg.file[seg.chunks[3].record_offset + 9] ^= 1;  // payload_bytes
  auto r = OpenOk(seg.file);
  ASSERT_NE(r, nullptr);
  std::vector<uint8_t> scratch;
  ChunkProblem problem;
  Status st = r->CheckChunk(3, &scratch, &problem);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(), HasSubstr("seg-test: chunk 3 at offset " +
                                      std::to_string(seg.chunks[3].record_offset) +
                                      ": record header fails xxh3"));
  EXPECT_EQ(problem.chunk_index, 3);
  EXPECT_EQ(problem.actual_xxh3, 0u);  // the payload was never hashed
}

TEST(Segment, MisplacedRecordFailsCheckChunk) {
  // Chunk 0's record copied over chunk 1's: both frame, but the copy names the wrong place.
  BuiltSegment seg = BuildSegment(SmallSpec());
  std::copy_n(seg.file.begin() + static_cast<ptrdiff_t>(seg.chunks[0].record_offset),
              RecordBytes(4096),
              seg.file.begin() + static_cast<ptrdiff_t>(seg.chunks[1].record_offset));
  auto r = OpenOk(seg.file);
  ASSERT_NE(r, nullptr);
  std::vector<uint8_t> scratch;
  ChunkProblem problem;
  Status st = r->CheckChunk(1, &scratch, &problem);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(), HasSubstr("chunk 1 at offset 12288: record header disagrees with the "
                                      "manifest"));
  std::vector<ScannedRecord> records;
  st = Scan(seg.file, &records);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(),
              HasSubstr("offset 12288: record header belongs elsewhere (offset 4096"));
  EXPECT_EQ(records.size(), 1u);
}

TEST(Segment, OpenRejectsDisagreements) {
  BuiltSegment good = BuildSegment(SmallSpec());
  struct Case {
    std::string needle;
    std::function<void(std::vector<uint8_t>*)> damage;
  };
  uint64_t mo = good.manifest_offset;
  const Case cases[] = {
      {"footer (version 4, rank 0) disagrees with header (version 3, rank 0)",
       [](auto* f) { EditFooter(f, [](SegmentFooter* x) { x->version = 4; }); }},
      {"footer (version 3, rank 1) disagrees",
       [](auto* f) { EditFooter(f, [](SegmentFooter* x) { x->rank = 1; }); }},
      {"manifest record header disagrees with the footer",
       [](auto* f) { EditFooter(f, [](SegmentFooter* x) { x->chunk_count = 5; }); }},
      {"manifest record header disagrees with the footer",
       [](auto* f) { EditFooter(f, [](SegmentFooter* x) { x->manifest_xxh3 ^= 1; }); }},
      {"manifest record header disagrees with the footer",
       [mo](auto* f) { EditRecord(f, mo, [](RecordHeader* x) { x->type = RecordType::kChunk; }); }},
      {"manifest record header disagrees with the footer",
       [mo](auto* f) { EditRecord(f, mo, [](RecordHeader* x) { x->version = 9; }); }},
      {"record at offset " + std::to_string(mo) + ": record header fails xxh3",
       [mo](auto* f) { (*f)[mo + 40] ^= 1; }},
      {"manifest at offset " + std::to_string(mo) + " fails xxh3 (expected ",
       [mo](auto* f) { (*f)[mo + kBlockBytes + 20] ^= 1; }},
      {"manifest provenance or chunk count disagrees with the header",
       [](auto* f) { EditHeader(f, [](SegmentHeader* x) { x->job_id = 8; }); }},
      {"footer (version 3, rank 0) disagrees with header (version 3, rank 2)",
       [](auto* f) {
         EditHeader(f, [](SegmentHeader* x) {
           x->rank = 2;
           x->world_size = 3;
         });
       }},
      {"segment header at offset 0 fails xxh3", [](auto* f) { (*f)[20] ^= 4; }},
      // The footer block repeated at the end: a valid footer for a shorter file.
      {"footer says the file is " + std::to_string(good.file.size()) + " bytes but it is " +
           std::to_string(good.file.size() + kBlockBytes),
       [](auto* f) {
         std::vector<uint8_t> last(f->end() - kBlockBytes, f->end());
         f->insert(f->end(), last.begin(), last.end());
       }},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> file = good.file;
    c.damage(&file);
    Status st = OpenStatus(file);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << c.needle;
    EXPECT_THAT(st.message(), HasSubstr(c.needle));
    EXPECT_THAT(st.message(), HasSubstr("seg-test"));
  }
}

TEST(Segment, ChunkLargerThanHeaderChunkSizeIsRejected) {
  SegmentSpec spec = SmallSpec();
  spec.chunk_bytes = 8192;
  BuiltSegment seg = BuildSegment(spec);
  EditHeader(&seg.file, [](SegmentHeader* h) { h->chunk_bytes = 4096; });
  Status st = OpenStatus(seg.file);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_THAT(st.message(), HasSubstr("chunk 0 is larger than the segment's chunk size"));
}

TEST(Segment, NewerFormatVersionIsNotSupported) {
  BuiltSegment seg = BuildSegment(SmallSpec());
  EditHeader(&seg.file, [](SegmentHeader* h) { h->format_version = 2; });
  Status st = OpenStatus(seg.file);
  EXPECT_EQ(st.code(), CKPTDB_ENOTSUP) << st.ToString();
  std::vector<ScannedRecord> records;
  EXPECT_EQ(Scan(seg.file, &records).code(), CKPTDB_ENOTSUP);
  EXPECT_TRUE(records.empty());
}

// Messages that tell the user the file is torn, truncated or not a segment at all.
auto TornMessage() {
  return AnyOf(HasSubstr("truncated"), HasSubstr("torn"), HasSubstr("never finished"),
               HasSubstr("not a whole number of 4096-byte blocks"));
}

TEST(Segment, TornTailsAreCorruptNeverACrash) {
  BuiltSegment seg = BuildSegment(SmallSpec());
  const uint64_t size = seg.file.size();
  std::vector<uint64_t> cuts;
  for (uint64_t n = 0; n < size; n += kBlockBytes) cuts.push_back(n);
  const uint64_t odd_sizes[] = {1,     63,          64,        65,        4095,     4097,    8191,
                                12289, size - 4095, size - 64, size - 63, size - 8, size - 1};
  cuts.insert(cuts.end(), std::begin(odd_sizes), std::end(odd_sizes));
  for (uint64_t n : cuts) {
    SCOPED_TRACE("truncated to " + std::to_string(n));
    std::vector<uint8_t> cut(seg.file.begin(), seg.file.begin() + static_cast<ptrdiff_t>(n));
    Status st = OpenStatus(cut);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("seg-test"));
    EXPECT_THAT(st.message(), TornMessage());

    std::vector<ScannedRecord> records;
    st = Scan(cut, &records);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << st.ToString();
    EXPECT_THAT(st.message(), TornMessage());
    // At a block boundary the scan reports exactly the records that end a block or more before
    // the cut (the last block of a whole file is its footer).
    if (IsAligned(n) && n >= kBlockBytes) {
      size_t expected = 0;
      while (expected < seg.record_ends.size() && seg.record_ends[expected] + kBlockBytes <= n) {
        ++expected;
      }
      EXPECT_EQ(records.size(), expected);
      for (const ScannedRecord& rec : records) {
        EXPECT_EQ(rec.actual_xxh3, rec.header.payload_xxh3);
      }
    }
  }
}

TEST(Segment, ZeroedTailIsTorn) {
  // A crash after the file was extended but before the tail reached the disk reads as zeros.
  BuiltSegment seg = BuildSegment(SmallSpec());
  for (uint64_t from = kBlockBytes; from < seg.file.size(); from += kBlockBytes) {
    SCOPED_TRACE("zeros from " + std::to_string(from));
    std::vector<uint8_t> file = seg.file;
    std::fill(file.begin() + static_cast<ptrdiff_t>(from), file.end(), 0);
    Status st = OpenStatus(file);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
    EXPECT_THAT(st.message(), HasSubstr("truncated or was never finished"));
    std::vector<ScannedRecord> records;
    st = Scan(file, &records);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  }
}

TEST(Segment, RandomBytesAreCorrupt) {
  for (uint64_t size : {0ull, 100ull, 4096ull, 3 * 4096ull, 5 * 4096ull, 16 * 4096ull}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      std::vector<uint8_t> file = RandomBytes(size, seed * 1000 + size);
      Status st = OpenStatus(file);
      EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << size << ": " << st.ToString();
      EXPECT_THAT(st.message(), HasSubstr("seg-test"));
      std::vector<ScannedRecord> records;
      st = Scan(file, &records);
      EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << size << ": " << st.ToString();
      EXPECT_TRUE(records.empty());
    }
  }
}

TEST(Segment, EveryBlockFlipFailsCleanly) {
  // One flipped byte at the start of every block and in the middle of each header: each read
  // path either succeeds or returns an error; the sanitizers catch anything worse.
  BuiltSegment seg = BuildSegment(SmallSpec());
  std::vector<uint8_t> scratch;
  for (uint64_t at = 0; at < seg.file.size(); at += 512) {
    std::vector<uint8_t> file = seg.file;
    file[at] ^= 0x41;
    std::unique_ptr<SegmentReader> r;
    Status st = SegmentReader::Open("seg-test", file.size(), MemoryRead(&file), &r);
    if (st.ok()) {
      for (uint32_t i = 0; i < r->manifest().chunk_count(); ++i) {
        ChunkProblem problem;
        Status c = r->CheckChunk(i, &scratch, &problem);
        EXPECT_TRUE(c.ok() || c.code() == CKPTDB_ECORRUPT) << c.ToString();
      }
    } else {
      EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << at << ": " << st.ToString();
    }
    std::vector<ScannedRecord> records;
    st = Scan(file, &records);
    EXPECT_TRUE(st.ok() || st.code() == CKPTDB_ECORRUPT) << st.ToString();
  }
}

TEST(Segment, FuzzCorporaReadCleanly) {
  // Every seed and regression input of the fuzzers, in the ordinary build: a reader bug that a
  // fuzzer once found stays found without clang (docs/format.md, "Fuzzing").
  std::vector<uint8_t> scratch;
  size_t manifests = 0, segments = 0, opened = 0;
  for (const auto& e : std::filesystem::directory_iterator(CorpusDir("manifest"))) {
    std::vector<uint8_t> bytes = ReadBytes(e.path());
    for (uint64_t data_end : {kBlockBytes, uint64_t{1} << 20}) {
      ManifestView v;
      Status st = ManifestView::Open(bytes, data_end, "seed", &v);
      EXPECT_TRUE(st.ok() || st.code() == CKPTDB_ECORRUPT) << e.path() << ": " << st.ToString();
    }
    ++manifests;
  }
  for (const auto& e : std::filesystem::directory_iterator(CorpusDir("segment_reader"))) {
    std::vector<uint8_t> file = ReadBytes(e.path());
    std::unique_ptr<SegmentReader> r;
    Status st = SegmentReader::Open("seed", file.size(), MemoryRead(&file), &r);
    EXPECT_TRUE(st.ok() || st.code() == CKPTDB_ECORRUPT || st.code() == CKPTDB_ENOTSUP)
        << e.path() << ": " << st.ToString();
    if (st.ok()) {
      ++opened;
      for (uint32_t i = 0; i < r->manifest().chunk_count(); ++i) {
        ChunkProblem problem;
        Status c = r->CheckChunk(i, &scratch, &problem);
        EXPECT_TRUE(c.ok() || c.code() == CKPTDB_ECORRUPT) << e.path() << ": " << c.ToString();
      }
    }
    std::vector<ScannedRecord> records;
    st = Scan(file, &records);
    EXPECT_TRUE(st.ok() || st.code() == CKPTDB_ECORRUPT || st.code() == CKPTDB_ENOTSUP)
        << e.path() << ": " << st.ToString();
    ++segments;
  }
  EXPECT_GE(manifests, 6u);
  EXPECT_GE(segments, 6u);
  EXPECT_GE(opened, 3u);  // golden-v1, no-tensors, one-chunk, flipped-payload
}

// ---- the golden v1 segment ------------------------------------------------------------------

// What tests/data/golden-v1.seg holds. Changing anything here, in BuildSegment or in the format
// code changes the file: see tests/data/README.md before regenerating it.
SegmentSpec GoldenSpec() {
  SegmentSpec s;
  s.job_id = 0x0123456789ABCDEFull;
  s.version = 42;
  s.rank = 1;
  s.world_size = 4;
  s.chunk_bytes = 4096;
  s.created_unix_ns = 1700000000123456789ull;
  s.node_id = "golden-node";
  s.writer = "ckptdb 0.1.0";
  // Put order (file order): 3 chunks, then 1 chunk, then none; name order differs.
  s.tensors.push_back({"model.layers.0.weight", fb::DType::F16, {48, 100}, {}, {}, 9600, 101});
  s.tensors.push_back({"model.embed.shard", fb::DType::F32, {4, 8}, {16, 8}, {4, 0}, 128, 102});
  s.tensors.push_back({"optimizer.empty", fb::DType::I64, {0}, {}, {}, 0, 103});
  return s;
}

std::string GoldenPath() { return std::string(CKPTDB_TEST_DATA_DIR) + "/golden-v1.seg"; }
// XXH3-64 of the whole golden file; printed by FormatGolden.DISABLED_Regenerate.
constexpr uint64_t kGoldenFileXxh3 = 0xa3473661d5fa12fbull;
constexpr uint64_t kGoldenFileBytes = 49152;
constexpr uint64_t kGoldenManifestOffset = 36864;
constexpr uint64_t kGoldenManifestBytes = 648;

TEST(FormatGolden, DISABLED_Regenerate) {
  BuiltSegment seg = BuildSegment(GoldenSpec());
  test::WriteWholeFile(GoldenPath(), std::string(seg.file.begin(), seg.file.end()));
  std::printf("wrote %s: %zu bytes, manifest %zu bytes at %llu, whole-file xxh3 %s\n",
              GoldenPath().c_str(), seg.file.size(), seg.manifest.size(),
              static_cast<unsigned long long>(seg.manifest_offset),
              Hex64(Xxh3(seg.file.data(), seg.file.size())).c_str());
}

TEST(FormatGolden, ReadsV1) {
  std::string raw = test::ReadWholeFile(GoldenPath());
  ASSERT_EQ(raw.size(), kGoldenFileBytes) << GoldenPath();
  std::vector<uint8_t> file(raw.begin(), raw.end());
  // Any change to the bytes (format, writer, FlatBuffers layout) shows here first.
  EXPECT_EQ(Hex64(Xxh3(file.data(), file.size())), Hex64(kGoldenFileXxh3));
  EXPECT_EQ(std::memcmp(file.data(), "CKPTSEG1", 8), 0);
  EXPECT_EQ(std::memcmp(file.data() + 4096, "CKRC", 4), 0);
  EXPECT_EQ(std::memcmp(file.data() + file.size() - 8, "CKPTEND1", 8), 0);

  std::unique_ptr<SegmentReader> r;
  Status st = SegmentReader::Open("golden-v1.seg", file.size(), MemoryRead(&file), &r);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const SegmentHeader& h = r->header();
  EXPECT_EQ(h.format_version, 1u);
  EXPECT_EQ(h.job_id, 0x0123456789ABCDEFull);
  EXPECT_EQ(h.version, 42u);
  EXPECT_EQ(h.rank, 1u);
  EXPECT_EQ(h.world_size, 4u);
  EXPECT_EQ(h.chunk_bytes, 4096u);
  EXPECT_EQ(h.created_unix_ns, 1700000000123456789ull);
  const SegmentFooter& f = r->footer();
  EXPECT_EQ(f.manifest_offset, kGoldenManifestOffset);
  EXPECT_EQ(f.manifest_bytes, kGoldenManifestBytes);
  EXPECT_EQ(f.manifest_xxh3,
            Xxh3(file.data() + kGoldenManifestOffset + 4096, kGoldenManifestBytes));
  EXPECT_EQ(f.version, 42u);
  EXPECT_EQ(f.rank, 1u);
  EXPECT_EQ(f.chunk_count, 4u);
  EXPECT_EQ(f.file_bytes, kGoldenFileBytes);

  const ManifestView& m = r->manifest();
  EXPECT_EQ(m.root().format_version(), 1u);
  EXPECT_EQ(m.root().data_bytes(), 9600u + 128);
  const fb::Provenance* p = m.root().provenance();
  EXPECT_EQ(p->job_id(), 0x0123456789ABCDEFull);
  EXPECT_EQ(p->rank(), 1u);
  EXPECT_EQ(p->world_size(), 4u);
  EXPECT_EQ(p->version(), 42u);
  EXPECT_EQ(p->node_id()->str(), "golden-node");
  EXPECT_EQ(p->created_unix_ns(), 1700000000123456789ull);
  EXPECT_EQ(p->writer()->str(), "ckptdb 0.1.0");
  ASSERT_NE(m.root().redundancy(), nullptr);
  EXPECT_EQ(m.root().redundancy()->scheme(), fb::RedundancyScheme::None);

  // Chunks in file order: weight (4096, 4096, 1408), then the embedding shard (128).
  const uint64_t offsets[] = {4096, 12288, 20480, 28672};
  const uint64_t sizes[] = {4096, 4096, 1408, 128};
  ASSERT_EQ(m.chunk_count(), 4u);
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(m.chunk(i).record_offset(), offsets[i]);
    EXPECT_EQ(m.chunk(i).payload_bytes(), sizes[i]);
  }

  struct Want {
    const char* name;
    fb::DType dtype;
    std::vector<uint64_t> shape, global_shape, global_offset;
    uint64_t bytes, seed;
    uint32_t first_chunk, chunk_count;
  };
  const Want want[] = {
      {"model.embed.shard", fb::DType::F32, {4, 8}, {16, 8}, {4, 0}, 128, 102, 3, 1},
      {"model.layers.0.weight", fb::DType::F16, {48, 100}, {}, {}, 9600, 101, 0, 3},
      {"optimizer.empty", fb::DType::I64, {0}, {}, {}, 0, 103, 4, 0},
  };
  ASSERT_EQ(m.tensor_count(), 3u);
  std::vector<uint8_t> scratch;
  for (uint32_t i = 0; i < 3; ++i) {
    const Want& w = want[i];
    SCOPED_TRACE(w.name);
    const fb::Tensor& t = m.tensor(i);
    EXPECT_EQ(t.name()->str(), w.name);
    EXPECT_EQ(m.Find(w.name), &t);
    EXPECT_EQ(t.dtype(), w.dtype);
    EXPECT_EQ(std::vector<uint64_t>(t.shape()->begin(), t.shape()->end()), w.shape);
    EXPECT_EQ(std::vector<uint64_t>(t.global_shape()->begin(), t.global_shape()->end()),
              w.global_shape);
    EXPECT_EQ(std::vector<uint64_t>(t.global_offset()->begin(), t.global_offset()->end()),
              w.global_offset);
    EXPECT_EQ(t.bytes(), w.bytes);
    EXPECT_EQ(t.first_chunk(), w.first_chunk);
    EXPECT_EQ(t.chunk_count(), w.chunk_count);
    std::vector<uint8_t> expected = RandomBytes(w.bytes, w.seed);
    std::vector<uint8_t> got;
    for (uint32_t c = t.first_chunk(); c < t.first_chunk() + t.chunk_count(); ++c) {
      ChunkProblem problem;
      Status cs = r->CheckChunk(c, &scratch, &problem);
      ASSERT_TRUE(cs.ok()) << cs.ToString();
      EXPECT_EQ(m.chunk(c).xxh3(), Xxh3(scratch.data() + kBlockBytes, m.chunk(c).payload_bytes()));
      got.insert(got.end(), scratch.begin() + kBlockBytes, scratch.end());
      // Padding after the payload is zero, as the writer leaves it.
      uint64_t end = offsets[c] + RecordBytes(sizes[c]);
      EXPECT_TRUE(std::all_of(file.begin() + static_cast<ptrdiff_t>(offsets[c] + 4096 + sizes[c]),
                              file.begin() + static_cast<ptrdiff_t>(end),
                              [](uint8_t b) { return b == 0; }));
    }
    EXPECT_EQ(got, expected);
  }
  EXPECT_EQ(m.Find("model.embed"), nullptr);

  std::vector<ScannedRecord> records;
  st = Scan(file, &records);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(records.size(), 5u);
  EXPECT_EQ(records[4].header.type, RecordType::kManifest);
  EXPECT_EQ(records[4].offset, kGoldenManifestOffset);
  EXPECT_EQ(records[4].header.sequence, 4u);
}

// A golden manifest file (versions 2 to 4): written from contents by its DISABLED_Regenerate
// test, which prints what its Reads test pins; read back with its XXH3 checked.
void WriteGoldenManifest(const std::string& path, const ManifestContents& contents) {
  std::vector<uint8_t> m = BuildManifest(contents);
  test::WriteWholeFile(path, std::string(m.begin(), m.end()));
  std::printf("wrote %s: %zu bytes, xxh3 %s\n", path.c_str(), m.size(),
              Hex64(Xxh3(m.data(), m.size())).c_str());
}
std::vector<uint8_t> GoldenManifest(const std::string& path, uint64_t xxh3) {
  const std::string raw = test::ReadWholeFile(path);
  std::vector<uint8_t> bytes(raw.begin(), raw.end());
  EXPECT_EQ(Hex64(Xxh3(bytes.data(), bytes.size())), Hex64(xxh3)) << path;
  return bytes;
}

// ---- the golden manifest of format version 2 ------------------------------------------------

// tests/data/golden-arc-v2.ckmf: ArcContents() as BuildManifest writes it. Version 2 changes only
// the manifest (an "arc" replica group and deduplicated shards; the segment framing is version
// 1's), so the golden file is the manifest alone. See tests/data/README.md.
std::string GoldenV2Path() { return std::string(CKPTDB_TEST_DATA_DIR) + "/golden-arc-v2.ckmf"; }
// XXH3-64 and size of the file; printed by FormatGolden.DISABLED_RegenerateV2.
constexpr uint64_t kGoldenV2Xxh3 = 0x66ab1b68808ceb60ull;
constexpr uint64_t kGoldenV2Bytes = 568;

TEST(FormatGolden, DISABLED_RegenerateV2) { WriteGoldenManifest(GoldenV2Path(), ArcContents()); }

TEST(FormatGolden, ReadsV2Manifest) {
  const std::vector<uint8_t> bytes = GoldenManifest(GoldenV2Path(), kGoldenV2Xxh3);
  ASSERT_EQ(bytes.size(), kGoldenV2Bytes) << GoldenV2Path();
  ManifestView v;
  Status st = ManifestView::Open(bytes, kBlockBytes + 2 * RecordBytes(4096) + RecordBytes(8),
                                 "golden-arc-v2", &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(v.root().format_version(), 2u);
  const fb::Replicas* g = v.root().replicas();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->protection(), fb::ReplicaProtection::Arc);
  EXPECT_EQ(g->group(), 6u);
  EXPECT_EQ(std::vector<uint32_t>(g->members()->begin(), g->members()->end()),
            (std::vector<uint32_t>{2, 5, 7, 9}));
  EXPECT_EQ(g->position(), 1u);
  EXPECT_EQ(g->piece_bytes(), 4096u);
  ASSERT_EQ(v.tensor_count(), 2u);
  const fb::Tensor& rng = v.tensor(0);
  EXPECT_EQ(rng.name()->str(), "rng");
  EXPECT_EQ(rng.full_bytes(), 0u);
  EXPECT_EQ(rng.bytes(), 8u);
  const fb::Tensor& w = v.tensor(1);
  EXPECT_EQ(w.name()->str(), "w");
  EXPECT_EQ(w.full_bytes(), 16484u);
  EXPECT_EQ(w.bytes(), 8192u);
  EXPECT_EQ(w.first_chunk(), 0u);
  EXPECT_EQ(w.chunk_count(), 2u);
  ASSERT_EQ(w.slices()->size(), 1u);
  EXPECT_EQ(w.slices()->Get(0)->offset(), 4096u);
  EXPECT_EQ(w.slices()->Get(0)->bytes(), 8192u);
  EXPECT_EQ(std::vector<uint64_t>(w.piece_xxh3()->begin(), w.piece_xxh3()->end()),
            (std::vector<uint64_t>{0x10, 0x11, 0x12, 0x13, 0x14}));
  EXPECT_EQ(v.chunk(1).xxh3(), 0x12u);
  EXPECT_EQ(v.root().data_bytes(), 8200u);
}

// ---- packed shards: the manifest of format version 3 ------------------------------------------

// "big" (5000 bytes) in chunk 0 alone; "a" (10 bytes at 0), "b" (256 at 64) and "c" (4 at 320)
// packed in chunk 1, each at a 64-byte aligned offset, with their own xxh3.
ManifestContents PackedContents() {
  ManifestContents c;
  c.chunks.push_back({kBlockBytes, 5000, 0x51});
  c.chunks.push_back({kBlockBytes + RecordBytes(5000), 324, 0x52});
  TensorEntry big{"big", 2, {5000}, {}, {}, 5000, 0, 1};
  auto packed = [](const char* name, uint8_t dtype, uint64_t elements, uint64_t bytes,
                   uint64_t offset, uint64_t xxh3) {
    TensorEntry t{name, dtype, {elements}, {}, {}, bytes, 1, 1};
    t.packed = true;
    t.pack_offset = offset;
    t.pack_xxh3 = xxh3;
    return t;
  };
  c.tensors = {big, packed("b", 12, 64, 256, 64, 0xb2), packed("a", 2, 10, 10, 0, 0xa1),
               packed("c", 7, 1, 4, 320, 0xc3)};
  return c;
}
constexpr uint64_t kPackedDataEnd = kBlockBytes + RecordBytes(5000) + RecordBytes(324);

TEST(Manifest, PackedShardsRoundTripAndAreChecked) {
  std::vector<uint8_t> bytes = BuildManifest(PackedContents());
  ManifestView v;
  Status st = ManifestView::Open(bytes, kPackedDataEnd, "seg", &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(v.root().format_version(), kManifestVersionPacked);
  EXPECT_EQ(v.root().replicas(), nullptr);
  const fb::Tensor* b = v.Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(b->packed());
  EXPECT_EQ(b->first_chunk(), 1u);
  EXPECT_EQ(b->chunk_count(), 1u);
  EXPECT_EQ(b->pack_offset(), 64u);
  EXPECT_EQ(b->pack_xxh3(), 0xb2u);
  EXPECT_FALSE(v.Find("big")->packed());
  EXPECT_EQ(v.root().data_bytes(), 5000u + 10 + 256 + 4);

  auto refused = [&](ManifestContents bad, const char* needle) {
    std::vector<uint8_t> built = BuildManifest(std::move(bad));
    ManifestView view;
    Status s = ManifestView::Open(built, kPackedDataEnd, "seg", &view);
    EXPECT_EQ(s.code(), CKPTDB_ECORRUPT) << needle;
    EXPECT_THAT(s.message(), HasSubstr(needle));
  };
  ManifestContents bad = PackedContents();
  bad.tensors[1].pack_offset = 8;  // "b" over "a"'s [0, 10)
  refused(bad, "packed tensors overlap in chunk 1");
  bad = PackedContents();
  bad.chunks[1].payload_bytes = 400;  // the same record size, bytes no shard accounts for
  refused(bad, "chunk 1 holds bytes past its packed tensors");
  bad = PackedContents();
  bad.tensors[3].pack_offset = 321;  // "c" past the chunk's 324 bytes
  refused(bad, "tensor 'c' lies outside its chunk 1");
  bad = PackedContents();
  bad.tensors.push_back({"d", 2, {324}, {}, {}, 324, 1, 1});  // an unpacked owner of the pack
  refused(bad, "chunk ranges of tensors overlap");

  // Through raw FlatBuffers, what BuildManifest never writes.
  auto raw = [] {
    RawManifest m;
    m.format_version = kManifestVersionPacked;
    m.chunks.emplace_back(kBlockBytes, 324, 0x52);
    m.tensors.push_back({"a", fb::DType::U8, {10}, {}, {}, 10, 0, 1});
    m.tensors.push_back({"b", fb::DType::U8, {250}, {}, {}, 250, 0, 1});
    m.tensors[0].packed = m.tensors[1].packed = true;
    m.tensors[1].pack_offset = 74;
    return m;
  };
  RawManifest m = raw();
  EXPECT_TRUE(OpenRaw(m, m.DataEnd()).ok()) << OpenRaw(m, m.DataEnd()).ToString();
  for (uint32_t version : {kFormatVersion, kManifestVersionDedup}) {
    m = raw();
    m.format_version = version;  // packed shards in a manifest older readers would misread
    if (version == kManifestVersionDedup) m.replicas = ReplicasEntry{true, 1, {0, 1}, 0, 4096};
    ExpectRejected(m, "tensor 'a' is packed but is not one non-empty shard in one chunk");
  }
  m = raw();
  m.tensors[0].chunk_count = 2;
  m.chunks.emplace_back(kBlockBytes + RecordBytes(324), 1, 0x53);
  ExpectRejected(m, "tensor 'a' is packed but");
  m = raw();
  m.tensors[0].bytes = 0;
  m.tensors[0].shape = {0};
  ExpectRejected(m, "tensor 'a' is packed but");
  m = ValidRaw();
  m.tensors[1].pack_xxh3 = 7;  // a hash on a shard with a chunk of its own
  ExpectRejected(m, "tensor 'b' has a pack offset or hash but is not packed");
  m = ValidRaw();
  m.tensors[0].pack_offset = 64;
  ExpectRejected(m, "tensor 'a' has a pack offset or hash but is not packed");
}

// A segment of an "arc" replica group member whose private shards are packed: version 3 with
// the group.
TEST(Manifest, PackedShardsBesideAReplicaGroup) {
  ManifestContents c = ArcContents();
  c.tensors[1].packed = true;  // "rng", alone in its chunk: a pack of one
  c.tensors[1].pack_xxh3 = 0x98;
  std::vector<uint8_t> bytes = BuildManifest(c);
  ManifestView v;
  Status st =
      ManifestView::Open(bytes, kBlockBytes + 2 * RecordBytes(4096) + RecordBytes(8), "seg", &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(v.root().format_version(), kManifestVersionPacked);
  ASSERT_NE(v.root().replicas(), nullptr);
  EXPECT_TRUE(v.Find("rng")->packed());
}

// A segment of member 1 of an "arc+aor" group of 4 (REFT's AOR): the deduplicated shard `w` as in
// ArcContents, its own private `rng`, and its recomputed replica of member 2's `rng`, kept whole
// under the reserved name.
ManifestContents AorContents() {
  ManifestContents c = ArcContents();
  c.replicas.aor = true;
  c.replicas.replicated_only = true;
  c.tensors[0].replicated = true;
  c.chunks.push_back({kBlockBytes + 2 * RecordBytes(4096) + RecordBytes(8), 8, 0x9a});
  TensorEntry replica{std::string(kRecomputedPrefix) + "rng", 8, {1}, {}, {}, 8, 3, 1};
  replica.recomputed = true;
  c.tensors.insert(c.tensors.begin(), replica);  // '@' sorts before the letters
  return c;
}
constexpr uint64_t kAorDataEnd = kBlockBytes + 2 * RecordBytes(4096) + 2 * RecordBytes(8);

TEST(Manifest, RecomputedReplicasRoundTripInVersion5) {
  std::vector<uint8_t> bytes = BuildManifest(AorContents());
  ManifestView v;
  Status st = ManifestView::Open(bytes, kAorDataEnd, "seg", &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(v.root().format_version(), kManifestVersionRecomputed);
  EXPECT_TRUE(v.root().replicas()->recomputed());
  EXPECT_TRUE(v.root().replicas()->replicated_only());
  EXPECT_TRUE(v.Find("w")->replicated());
  EXPECT_FALSE(v.Find("rng")->replicated() || v.Find("rng")->recomputed());
  EXPECT_TRUE(v.Find("@aor:rng")->recomputed());
  EXPECT_EQ(v.root().data_bytes(), 8192u + 16);
  // The same group without AOR is written as before, with no marks: version 2.
  ManifestContents arc = ArcContents();
  bytes = BuildManifest(arc);
  ASSERT_TRUE(ManifestView::Open(bytes, kAorDataEnd - RecordBytes(8), "seg", &v).ok());
  EXPECT_EQ(v.root().format_version(), kManifestVersionDedup);
  EXPECT_FALSE(v.Find("w")->replicated());
}

// With AOR a lost member also needs the member before it, which keeps its private shards
// recomputed: a loss the slices survive is then survived only when that member is alive.
TEST(AecLayout, GroupRestoresWithAorNeedsEachLostMembersKeeper) {
  for (uint32_t count = 2; count <= 6; ++count) {
    for (uint8_t kept : {1, 2, 3}) {
      if (kept >= 2 && count < 3) continue;
      for (uint32_t mask = 0; mask < (1u << count); ++mask) {
        std::vector<bool> alive(count);
        bool keepers = true;
        for (uint32_t q = 0; q < count; ++q) alive[q] = (mask >> q) & 1;
        for (uint32_t q = 0; q < count; ++q) {
          keepers = keepers && (alive[q] || alive[(q + count - 1) % count]);
        }
        SCOPED_TRACE("count " + std::to_string(count) + " protection " + std::to_string(kept) +
                     " alive mask " + std::to_string(mask));
        const bool slices = GroupRestores(count, kept, alive);
        EXPECT_EQ(slices, GroupRestores(count, (kept & 1) != 0, (kept & 2) != 0, alive));
        EXPECT_EQ(GroupRestores(count, static_cast<uint8_t>(kept | kProtectionAor), alive),
                  slices && keepers);
      }
    }
  }
}

// The marks of version 5 are consistent or the manifest is refused: a recomputed replica is the
// one tensor named by the prefix, never replicated, packed or deduplicated; a deduplicated shard
// is marked replicated; versions 2 to 4 mark nothing and version 5 needs the AOR group.
TEST(ManifestSemantics, RecomputedReplicaMarksAreChecked) {
  auto raw = [] {
    RawManifest m;
    m.format_version = kManifestVersionRecomputed;
    ReplicasEntry g{true, 1, {0, 1}, 0, 4096};
    g.aor = true;
    m.replicas = g;
    m.chunks.emplace_back(4096, 100, 1);
    m.chunks.emplace_back(4096 + 8192, 100, 2);
    m.tensors.push_back({"@aor:a", fb::DType::U8, {100}, {}, {}, 100, 0, 1});
    m.tensors.back().recomputed = true;
    m.tensors.push_back({"a", fb::DType::U8, {100}, {}, {}, 100, 1, 1});
    return m;
  };
  RawManifest m = raw();
  ASSERT_TRUE(OpenRaw(m, m.DataEnd()).ok()) << OpenRaw(m, m.DataEnd()).ToString();
  m = raw();
  m.tensors[0].recomputed = false;  // the reserved name on a shard of the writer's own
  ExpectRejected(m, "tensor '@aor:a' is marked replicated or recomputed inconsistently");
  m = raw();
  m.tensors[1].recomputed = true;  // a replica without the reserved name
  ExpectRejected(m, "tensor 'a' is marked replicated or recomputed inconsistently");
  m = raw();
  m.tensors[0].replicated = true;
  ExpectRejected(m, "tensor '@aor:a' is marked replicated or recomputed inconsistently");
  m = raw();
  m.tensors[0].packed = true;
  m.tensors[0].pack_xxh3 = 1;
  ExpectRejected(m, "tensor '@aor:a' is packed but");
  m = raw();
  m.replicas->aor = false;  // version 5 without AOR
  ExpectRejected(m, "replica group is out of range or inconsistent");
  m = raw();
  m.format_version = kManifestVersionDedup;  // marks in version 2
  m.replicas->aor = false;
  ExpectRejected(m, "tensor '@aor:a' is marked replicated or recomputed inconsistently");
  m = raw();
  m.format_version = kManifestVersionDedup;
  m.replicas->aor = false;
  m.tensors[0].recomputed = false;
  m.tensors[1].replicated = true;
  ExpectRejected(m, "tensor 'a' is marked replicated or recomputed inconsistently");
}

// tests/data/golden-packed-v3.ckmf: PackedContents() as BuildManifest writes it. Version 3
// changes only the manifest (packed shards), so, as for version 2, the golden file is the
// manifest alone. See tests/data/README.md.
std::string GoldenV3Path() { return std::string(CKPTDB_TEST_DATA_DIR) + "/golden-packed-v3.ckmf"; }
// XXH3-64 and size of the file; printed by FormatGolden.DISABLED_RegenerateV3.
constexpr uint64_t kGoldenV3Xxh3 = 0x88057e6fb1ffaf1aull;
constexpr uint64_t kGoldenV3Bytes = 600;

// Manifest version 4 (REFT's AEC): AecContents, as tests/data/golden-aec-v4.ckmf pins it.
std::string GoldenV4Path() { return std::string(CKPTDB_TEST_DATA_DIR) + "/golden-aec-v4.ckmf"; }
// XXH3-64 and size of the file; printed by FormatGolden.DISABLED_RegenerateV4.
constexpr uint64_t kGoldenV4Xxh3 = 0x0c690d040a76a525ull;
constexpr uint64_t kGoldenV4Bytes = 576;

TEST(FormatGolden, DISABLED_RegenerateV4) { WriteGoldenManifest(GoldenV4Path(), AecContents()); }

TEST(FormatGolden, ReadsV4Manifest) {
  const std::vector<uint8_t> bytes = GoldenManifest(GoldenV4Path(), kGoldenV4Xxh3);
  ASSERT_EQ(bytes.size(), kGoldenV4Bytes) << GoldenV4Path();
  ManifestView v;
  Status st = ManifestView::Open(bytes, kAecDataEnd, "golden-aec-v4", &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(v.root().format_version(), 4u);
  const fb::Replicas* g = v.root().replicas();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->protection(), fb::ReplicaProtection::Aec);
  EXPECT_EQ(g->group(), 6u);
  EXPECT_EQ(g->position(), 1u);
  EXPECT_EQ(g->piece_bytes(), 4096u);
  EXPECT_EQ(std::vector<uint32_t>(g->members()->begin(), g->members()->end()),
            (std::vector<uint32_t>{2, 5, 7, 9}));
  ASSERT_EQ(v.chunk_count(), 3u);
  EXPECT_EQ(v.chunk(1).payload_bytes(), 4096u);
  EXPECT_EQ(v.chunk(1).xxh3(), 0x77u);
  const fb::Tensor* w = v.Find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->full_bytes(), 4 * 4096u + 100);
  EXPECT_EQ(w->bytes(), 4096u);
  EXPECT_EQ(w->first_chunk(), 0u);
  EXPECT_EQ(w->chunk_count(), 1u);
  EXPECT_EQ(w->parity_chunks(), 1u);
  EXPECT_EQ(w->piece_xxh3()->size(), 5u);
  EXPECT_EQ(v.Find("rng")->parity_chunks(), 0u);
}

// Manifest version 5 (REFT's AOR): AorContents, as tests/data/golden-aor-v5.ckmf pins it.
std::string GoldenV5Path() { return std::string(CKPTDB_TEST_DATA_DIR) + "/golden-aor-v5.ckmf"; }
// XXH3-64 and size of the file; printed by FormatGolden.DISABLED_RegenerateV5.
constexpr uint64_t kGoldenV5Xxh3 = 0xc995dba459a8ddbbull;
constexpr uint64_t kGoldenV5Bytes = 720;

TEST(FormatGolden, DISABLED_RegenerateV5) { WriteGoldenManifest(GoldenV5Path(), AorContents()); }

TEST(FormatGolden, ReadsV5Manifest) {
  const std::vector<uint8_t> bytes = GoldenManifest(GoldenV5Path(), kGoldenV5Xxh3);
  ASSERT_EQ(bytes.size(), kGoldenV5Bytes) << GoldenV5Path();
  ManifestView v;
  Status st = ManifestView::Open(bytes, kAorDataEnd, "golden-aor-v5", &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(v.root().format_version(), 5u);
  const fb::Replicas* g = v.root().replicas();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->protection(), fb::ReplicaProtection::Arc);
  EXPECT_TRUE(g->recomputed());
  EXPECT_TRUE(g->replicated_only());
  EXPECT_EQ(g->group(), 6u);
  EXPECT_EQ(g->position(), 1u);
  EXPECT_EQ(std::vector<uint32_t>(g->members()->begin(), g->members()->end()),
            (std::vector<uint32_t>{2, 5, 7, 9}));
  ASSERT_EQ(v.tensor_count(), 3u);
  EXPECT_EQ(std::string(v.tensor(0).name()->c_str()), "@aor:rng");
  const fb::Tensor* replica = v.Find("@aor:rng");
  ASSERT_NE(replica, nullptr);
  EXPECT_TRUE(replica->recomputed());
  EXPECT_FALSE(replica->replicated());
  EXPECT_EQ(replica->first_chunk(), 3u);
  EXPECT_EQ(replica->bytes(), 8u);
  EXPECT_TRUE(v.Find("w")->replicated());
  EXPECT_EQ(v.Find("w")->full_bytes(), 4 * 4096u + 100);
  EXPECT_FALSE(v.Find("rng")->recomputed() || v.Find("rng")->replicated());
  ASSERT_EQ(v.chunk_count(), 4u);
  EXPECT_EQ(v.chunk(3).xxh3(), 0x9au);
}

TEST(FormatGolden, DISABLED_RegenerateV3) { WriteGoldenManifest(GoldenV3Path(), PackedContents()); }

TEST(FormatGolden, ReadsV3Manifest) {
  const std::vector<uint8_t> bytes = GoldenManifest(GoldenV3Path(), kGoldenV3Xxh3);
  ASSERT_EQ(bytes.size(), kGoldenV3Bytes) << GoldenV3Path();
  ManifestView v;
  Status st = ManifestView::Open(bytes, kPackedDataEnd, "golden-packed-v3", &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(v.root().format_version(), 3u);
  EXPECT_EQ(v.root().replicas(), nullptr);
  ASSERT_EQ(v.chunk_count(), 2u);
  EXPECT_EQ(v.chunk(0).record_offset(), 4096u);
  EXPECT_EQ(v.chunk(0).payload_bytes(), 5000u);
  EXPECT_EQ(v.chunk(1).record_offset(), 4096u + 4096 + 8192);
  EXPECT_EQ(v.chunk(1).payload_bytes(), 324u);
  EXPECT_EQ(v.chunk(1).xxh3(), 0x52u);
  struct Want {
    const char* name;
    fb::DType dtype;
    uint64_t bytes;
    uint32_t first_chunk;
    bool packed;
    uint64_t pack_offset, pack_xxh3;
  };
  const Want want[] = {{"a", fb::DType::U8, 10, 1, true, 0, 0xa1},
                       {"b", fb::DType::F32, 256, 1, true, 64, 0xb2},
                       {"big", fb::DType::U8, 5000, 0, false, 0, 0},
                       {"c", fb::DType::I32, 4, 1, true, 320, 0xc3}};
  ASSERT_EQ(v.tensor_count(), 4u);
  for (uint32_t i = 0; i < 4; ++i) {
    const Want& w = want[i];
    const fb::Tensor& t = v.tensor(i);
    SCOPED_TRACE(w.name);
    EXPECT_EQ(t.name()->str(), w.name);
    EXPECT_EQ(t.dtype(), w.dtype);
    EXPECT_EQ(t.bytes(), w.bytes);
    EXPECT_EQ(t.first_chunk(), w.first_chunk);
    EXPECT_EQ(t.chunk_count(), 1u);
    EXPECT_EQ(t.packed(), w.packed);
    EXPECT_EQ(t.pack_offset(), w.pack_offset);
    EXPECT_EQ(t.pack_xxh3(), w.pack_xxh3);
  }
  EXPECT_EQ(v.root().data_bytes(), 5270u);
}

// The fuzzers' seed inputs (fuzz/corpus/): valid segments and manifests and a few damaged ones,
// each under 64 KiB. Regenerate them freely; unlike the golden file they pin nothing.
TEST(FuzzSeeds, DISABLED_Regenerate) {
  const std::string root = std::string(CKPTDB_TEST_DATA_DIR) + "/../../fuzz/corpus";
  auto write = [&](const std::string& name, const std::vector<uint8_t>& bytes) {
    ASSERT_LT(bytes.size(), 64u << 10) << name;
    test::WriteWholeFile(root + "/" + name, std::string(bytes.begin(), bytes.end()));
  };
  BuiltSegment golden = BuildSegment(GoldenSpec());
  SegmentSpec empty;
  BuiltSegment none = BuildSegment(empty);
  SegmentSpec one;
  one.tensors.push_back({"x", fb::DType::U8, {}, {}, {}, 100, 1});
  BuiltSegment single = BuildSegment(one);

  write("segment_reader/golden-v1.seg", golden.file);
  write("segment_reader/no-tensors.seg", none.file);
  write("segment_reader/one-chunk.seg", single.file);
  std::vector<uint8_t> bad = golden.file;
  bad[golden.chunks[1].record_offset + kBlockBytes + 7] ^= 1;
  write("segment_reader/flipped-payload.seg", bad);
  bad = golden.file;
  bad.resize(golden.manifest_offset + kBlockBytes);
  write("segment_reader/torn-at-manifest.seg", bad);
  bad = golden.file;
  bad[golden.manifest_offset + kBlockBytes + 40] ^= 0x10;
  write("segment_reader/flipped-manifest.seg", bad);

  write("manifest/golden-v1.ckmf", golden.manifest);
  write("manifest/no-tensors.ckmf", none.manifest);
  write("manifest/one-chunk.ckmf", single.manifest);
  write("manifest/two-tensors.ckmf", ValidRaw().Build());
  write("manifest/arc-slices.ckmf", BuildManifest(ArcContents()));
  write("manifest/packed-v3.ckmf", BuildManifest(PackedContents()));
  write("manifest/aec-v4.ckmf", BuildManifest(AecContents()));
  write("manifest/aor-v5.ckmf", BuildManifest(AorContents()));
  RawManifest unsorted = ValidRaw();
  std::swap(unsorted.tensors[0].name, unsorted.tensors[1].name);
  write("manifest/unsorted.ckmf", unsorted.Build());
  bad = golden.manifest;
  bad.resize(bad.size() / 2);
  write("manifest/truncated.ckmf", bad);
}

}  // namespace
}  // namespace ckpt::format
