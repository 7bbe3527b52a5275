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

}  // namespace
}  // namespace ckpt::engine
