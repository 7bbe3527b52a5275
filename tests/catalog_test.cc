// The catalog's per-version figures (s/ records): they add up per tier within their bound, and a
// damaged one never keeps a store from opening (figures affect nothing restorable).
#include "engine/catalog.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "tests/test_util.h"

namespace ckpt::engine {
namespace {

TEST(VersionStatsRecord, AddTierAddsUpPerTierAndStaysWithinTheBound) {
  VersionStatsRecord r;
  r.AddTier("ram", 100, 10);
  r.AddTier("disk:/a", 200, 20);
  r.AddTier("disk:/a", 200, 30);  // written to the same tier again
  ASSERT_EQ(r.tiers.size(), 2u);
  EXPECT_EQ(r.tiers[1].bytes_written, 400u);
  EXPECT_EQ(r.tiers[1].write_ns, 50u);
  for (int i = 0; i < 2 * CKPTDB_MAX_TIERS; ++i) r.AddTier("disk:/t" + std::to_string(i), 1, 1);
  ASSERT_EQ(r.tiers.size(), static_cast<size_t>(CKPTDB_MAX_TIERS));
  EXPECT_EQ(r.tiers.back().name, "disk:/t" + std::to_string(2 * CKPTDB_MAX_TIERS - 1));
  // What AddTier keeps always decodes.
  VersionStatsRecord back;
  ASSERT_TRUE(Catalog::DecodeStats(Catalog::EncodeStats(r), "s/1", &back).ok());
  EXPECT_EQ(back.tiers.size(), r.tiers.size());
}

TEST(Catalog, FiguresThatDoNotDecodeAreSkippedNotFatal) {
  test::TempDir dir;
  std::unique_ptr<Catalog> catalog;
  ASSERT_TRUE(Catalog::Open(dir.Sub("catalog"), false, true, &catalog).ok());
  VersionRecord v;
  v.version = 7;
  v.state = CKPTDB_STATE_COMMITTED;
  VersionStatsRecord figures;
  figures.bytes = 42;
  for (int i = 0; i <= CKPTDB_MAX_TIERS; ++i) {  // one more than any decoder accepts
    figures.tiers.push_back({"disk:/t" + std::to_string(i), 1, 1});
  }
  CatalogBatch batch;
  batch.put_versions.push_back(v);
  batch.put_stats.emplace_back(7, figures);
  ASSERT_TRUE(catalog->Apply(batch, /*sync=*/true).ok());
  std::map<uint64_t, VersionEntry> versions;
  Status st = catalog->LoadAll(&versions);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(versions.count(7), 1u);
  EXPECT_TRUE(versions[7].has_record);
  EXPECT_FALSE(versions[7].has_stats);
  EXPECT_EQ(versions[7].stats.bytes, 0u);
}

// The seeds of fuzz/fuzz_catalog_record.cc (fuzz/corpus/catalog_record/): one value of each
// kind. They pin nothing: regenerate freely.
TEST(Catalog, DISABLED_RegenerateFuzzSeeds) {
  const std::string dir = std::string(CKPTDB_TEST_DATA_DIR) + "/../../fuzz/corpus/catalog_record";
  VersionRecord v;
  v.version = 42;
  v.state = CKPTDB_STATE_COMMITTED;
  v.rank = 3;
  v.data_bytes = 1 << 20;
  v.tensor_count = 2;
  v.chunk_count = 5;
  v.created_unix_ns = 1700000000000000000ull;
  v.committed_unix_ns = 1700000000100000000ull;
  v.manifest_xxh3 = 0x0123456789abcdefull;
  test::WriteWholeFile(dir + "/version", Catalog::EncodeVersion(v));
  ResidencyRecord r;
  r.tier = "ram";
  r.state = CKPTDB_RESIDENT_DURABLE;
  r.path = "/dev/shm/ckptdb-0000000000000001-r00003.ram";
  r.file_bytes = 1 << 21;
  r.ram_generation = 7;
  r.ram_index_offset = 1 << 22;
  r.ram_index_bytes = 4096;
  test::WriteWholeFile(dir + "/residency-ram", Catalog::EncodeResidency(r));
  r = ResidencyRecord{};
  r.tier = "disk:/var/tmp/ck";
  r.state = CKPTDB_RESIDENT_EVICTED;
  r.path = "/var/tmp/ck/v00000000000000000042-r00003.seg";
  test::WriteWholeFile(dir + "/residency-disk", Catalog::EncodeResidency(r));
  VersionStatsRecord st;
  st.bytes = 1 << 20;
  st.put_calls = 2;
  st.commit_ns = 12345;
  st.AddTier("ram", 1 << 20, 999);
  st.AddTier("disk:/var/tmp/ck", 1 << 20, 5555);
  test::WriteWholeFile(dir + "/stats", Catalog::EncodeStats(st));
}

}  // namespace
}  // namespace ckpt::engine
