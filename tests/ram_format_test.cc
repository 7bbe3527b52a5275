// The ram tier's on-memory format (format/ram_format.h, docs/format.md section 15): the arena
// header and a copy's index round-trip, and every flipped bit, short region or oversized entry
// count is refused with a clear Corrupt (or NotSupported for another format version) instead of
// being believed.
#include "format/ram_format.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "format/segment_format.h"
#include "tests/test_util.h"

namespace ckpt::format {
namespace {

ArenaHeader SampleHeader() {
  ArenaHeader h;
  h.rank = 3;
  h.job_id = 0x0123456789abcdefull;
  h.capacity_bytes = 64ull << 20;
  h.generation = 0xfeedfacecafebeefull;
  h.created_unix_ns = 1700000000000000000ull;
  return h;
}

RamIndex SampleIndex(uint32_t records) {
  RamIndex index;
  index.version = 42;
  index.rank = 3;
  index.generation = 0xfeedfacecafebeefull;
  index.job_id = 0x0123456789abcdefull;
  uint64_t logical = 0;
  for (uint32_t i = 0; i < records; ++i) {
    uint64_t bytes = 4096 * (1 + i % 5);
    index.entries.push_back({logical, 4096 + 8192 * uint64_t{i}, bytes});
    logical += bytes;
  }
  index.file_bytes = logical;
  return index;
}

TEST(RamFormat, ArenaHeaderRoundTripsAndEveryFlippedBitIsCaught) {
  uint8_t block[kArenaHeaderBytes];
  EncodeArenaHeader(SampleHeader(), std::span<uint8_t, kArenaHeaderBytes>(block));
  ArenaHeader got;
  ASSERT_TRUE(
      DecodeArenaHeader(std::span<const uint8_t, kArenaHeaderBytes>(block), "a", &got).ok());
  EXPECT_EQ(got.rank, 3u);
  EXPECT_EQ(got.job_id, 0x0123456789abcdefull);
  EXPECT_EQ(got.capacity_bytes, 64ull << 20);
  EXPECT_EQ(got.generation, 0xfeedfacecafebeefull);
  EXPECT_EQ(got.created_unix_ns, 1700000000000000000ull);
  for (size_t bit = 0; bit < kArenaHeaderBytes * 8; ++bit) {
    uint8_t bad[kArenaHeaderBytes];
    std::copy(block, block + kArenaHeaderBytes, bad);
    bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    Status st =
        DecodeArenaHeader(std::span<const uint8_t, kArenaHeaderBytes>(bad), "arena x", &got);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << "bit " << bit;
    EXPECT_NE(st.message().find("arena x"), std::string::npos) << st.message();
  }
}

TEST(RamFormat, AnotherArenaFormatVersionIsNotSupported) {
  ArenaHeader h = SampleHeader();
  h.format_version = 2;
  uint8_t block[kArenaHeaderBytes];
  EncodeArenaHeader(h, std::span<uint8_t, kArenaHeaderBytes>(block));
  ArenaHeader got;
  Status st = DecodeArenaHeader(std::span<const uint8_t, kArenaHeaderBytes>(block), "a", &got);
  EXPECT_EQ(st.code(), CKPTDB_ENOTSUP);
  EXPECT_NE(st.message().find("format version 2"), std::string::npos) << st.message();
}

TEST(RamFormat, IndexRoundTripsAndEveryFlippedBitIsCaught) {
  const RamIndex index = SampleIndex(7);
  std::vector<uint8_t> region(AlignUp(RamIndexBytes(index.entries.size())), 0);
  EncodeRamIndex(index, region);
  RamIndex got;
  ASSERT_TRUE(DecodeRamIndex(region, 100, "i", &got).ok());
  EXPECT_EQ(got.version, 42u);
  EXPECT_EQ(got.rank, 3u);
  EXPECT_EQ(got.file_bytes, index.file_bytes);
  EXPECT_EQ(got.generation, index.generation);
  EXPECT_EQ(got.job_id, index.job_id);
  ASSERT_EQ(got.entries.size(), 7u);
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_EQ(got.entries[i].logical_offset, index.entries[i].logical_offset);
    EXPECT_EQ(got.entries[i].arena_offset, index.entries[i].arena_offset);
    EXPECT_EQ(got.entries[i].bytes, index.entries[i].bytes);
  }
  const size_t used = RamIndexBytes(index.entries.size());
  for (size_t bit = 0; bit < used * 8; ++bit) {
    std::vector<uint8_t> bad = region;
    bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    Status st = DecodeRamIndex(bad, 100, "index y", &got);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << "bit " << bit;
    EXPECT_NE(st.message().find("index y"), std::string::npos) << st.message();
  }
}

TEST(RamFormat, IndexBoundsAreChecked) {
  const RamIndex index = SampleIndex(7);
  std::vector<uint8_t> region(AlignUp(RamIndexBytes(index.entries.size())), 0);
  EncodeRamIndex(index, region);
  RamIndex got;
  // More entries than the caller allows, or than the region holds.
  Status st = DecodeRamIndex(region, 6, "i", &got);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_NE(st.message().find("lists 7 records"), std::string::npos) << st.message();
  st = DecodeRamIndex(std::span<const uint8_t>(region.data(), RamIndexBytes(6)), 100, "i", &got);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  st = DecodeRamIndex(std::span<const uint8_t>(region.data(), 10), 100, "i", &got);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT);
  EXPECT_NE(st.message().find("shorter than its 64-byte header"), std::string::npos);
  // Zeroed memory (a region never written) is no index.
  std::vector<uint8_t> zeros(4096, 0);
  EXPECT_EQ(DecodeRamIndex(zeros, 100, "i", &got).code(), CKPTDB_ECORRUPT);
}

std::string CorpusDir() {
  return std::string(CKPTDB_TEST_DATA_DIR) + "/../../fuzz/corpus/ram_index";
}

// Seeds for fuzz/fuzz_ram_index.cc: a valid header followed by a valid index, and an index alone.
TEST(RamFuzzSeeds, DISABLED_Regenerate) {
  std::filesystem::create_directories(CorpusDir());
  std::vector<uint8_t> header(kArenaHeaderBytes);
  EncodeArenaHeader(SampleHeader(), std::span<uint8_t, kArenaHeaderBytes>(header.data(), 64));
  const RamIndex index = SampleIndex(5);
  std::vector<uint8_t> region(RamIndexBytes(index.entries.size()));
  EncodeRamIndex(index, region);
  test::WriteWholeFile(CorpusDir() + "/header.bin", std::string(header.begin(), header.end()));
  test::WriteWholeFile(CorpusDir() + "/index-5.bin", std::string(region.begin(), region.end()));
  const RamIndex empty = SampleIndex(0);
  std::vector<uint8_t> none(RamIndexBytes(0));
  EncodeRamIndex(empty, none);
  test::WriteWholeFile(CorpusDir() + "/index-0.bin", std::string(none.begin(), none.end()));
}

// Every seed and regression input of fuzz_ram_index, in the ordinary build.
TEST(RamFormat, FuzzCorpusDecodesCleanly) {
  size_t seen = 0, decoded = 0;
  for (const auto& e : std::filesystem::directory_iterator(CorpusDir())) {
    std::string raw = test::ReadWholeFile(e.path().string());
    std::vector<uint8_t> bytes(raw.begin(), raw.end());
    RamIndex index;
    Status st = DecodeRamIndex(bytes, 1u << 16, "seed", &index);
    EXPECT_TRUE(st.ok() || st.code() == CKPTDB_ECORRUPT) << e.path() << ": " << st.ToString();
    if (bytes.size() >= kArenaHeaderBytes) {
      ArenaHeader h;
      Status hs = DecodeArenaHeader(
          std::span<const uint8_t, kArenaHeaderBytes>(bytes.data(), kArenaHeaderBytes), "seed", &h);
      EXPECT_TRUE(hs.ok() || hs.code() == CKPTDB_ECORRUPT) << e.path() << ": " << hs.ToString();
      decoded += hs.ok();
    }
    decoded += st.ok();
    ++seen;
  }
  EXPECT_GE(seen, 3u);
  EXPECT_GE(decoded, 3u) << "the seeds must include valid inputs";
}

}  // namespace
}  // namespace ckpt::format
