// Holdings reports (engine/holdings.h): what a rank tells the coordinator it holds, over the
// network. Round trips, the bounds, and every malformed report refused without a crash; the
// seed inputs of fuzz/fuzz_holdings.cc come from here.
#include "engine/holdings.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "test_util.h"
#include "transport/wire.h"

namespace ckpt::engine {
namespace {

using ::testing::HasSubstr;

HoldingsReport Full() {
  HoldingsReport r;
  r.local = {9, 8, 7};
  r.replicas = {{1, 9}, {2, 8}};
  r.parity = {{0, 7}, {0, 8}, {1, 9}};
  r.voted_through = 10;
  r.memory = {10, 9};
  r.arc = {ArcReport{9, 3, true, {0, 2, 5, 7}, 2}, ArcReport{8, 3, false, {1, 4}},
           ArcReport{7, 3, true, {0, 2, 5}, 3}};
  return r;
}

Status Parse(const std::vector<uint8_t>& bytes, HoldingsReport* out) {
  *out = HoldingsReport{};
  return ParseHoldings(bytes, "holdings of rank 3", out);
}

TEST(HoldingsTest, AReportReadsBackAsWritten) {
  for (const HoldingsReport& r : {HoldingsReport{}, Full()}) {
    HoldingsReport back;
    ASSERT_TRUE(Parse(EncodeHoldings(r), &back).ok());
    EXPECT_EQ(back, r);
  }
}

TEST(HoldingsTest, ListsAreCutToTheirBoundsTheParityKeepingTheNewest) {
  HoldingsReport r;
  for (uint64_t v = 0; v < kMaxLocalVersions + 5; ++v) r.local.push_back(v);
  for (uint32_t g = 0; g < kMaxHeldParity + 3; ++g) r.parity.emplace_back(g, 1);
  for (uint64_t v = 0; v < kMaxArcReports + 2; ++v) r.arc.push_back({v, 0, false, {0, 1}});
  HoldingsReport back;
  ASSERT_TRUE(Parse(EncodeHoldings(r), &back).ok());
  EXPECT_EQ(back.local.size(), kMaxLocalVersions);
  EXPECT_EQ(back.local.front(), 0u);
  ASSERT_EQ(back.parity.size(), kMaxHeldParity);
  EXPECT_EQ(back.parity.front().first, 3u);  // the 3 oldest went
  EXPECT_EQ(back.arc.size(), kMaxArcReports);
}

TEST(HoldingsTest, AnythingTheWriterCannotWriteIsRefused) {
  auto refused = [](const std::vector<uint8_t>& bytes, const std::string& why) {
    HoldingsReport out;
    Status st = Parse(bytes, &out);
    EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << why;
    EXPECT_THAT(st.message(), HasSubstr("holdings of rank 3")) << why;
    return st.message();
  };
  const std::vector<uint8_t> good = EncodeHoldings(Full());
  // Every truncation, and a byte too many.
  for (size_t n = 0; n < good.size(); ++n) {
    refused(std::vector<uint8_t>(good.begin(), good.begin() + n), "cut at " + std::to_string(n));
  }
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  refused(longer, "a trailing byte");
  // Counts past their bounds, before anything is allocated for them.
  transport::WireWriter w;
  w.U32(kMaxLocalVersions + 1);
  EXPECT_THAT(refused(w.Take(), "too many local versions"), HasSubstr("257 local versions"));
  // An arc report: members not ascending, too few, a flag that is neither 0 nor 1.
  auto with_arc = [](ArcReport a, uint8_t flag) {
    HoldingsReport r;
    r.arc = {std::move(a)};
    std::vector<uint8_t> b = EncodeHoldings(r);
    // The flag's offset: three empty lists' counts, voted_through, the memory and arc counts,
    // then the report's version and group.
    b[3 * 4 + 8 + 2 * 4 + 8 + 4] = flag;
    return b;
  };
  EXPECT_THAT(refused(with_arc({1, 0, false, {2, 1}}, 0), "descending"),
              HasSubstr("not ascending"));
  EXPECT_THAT(refused(with_arc({1, 0, false, {2, 2}}, 0), "a rank twice"),
              HasSubstr("not ascending"));
  EXPECT_THAT(refused(with_arc({1, 0, false, {2}}, 0), "one member"),
              HasSubstr("an arc group of 1 members"));
  EXPECT_THAT(refused(with_arc({1, 0, false, {0, 1}}, 2), "flag 2"),
              HasSubstr("replicated_only is 2"));
  // Its protection (the report's last byte): Arc 1, Aec 2 or ArcAec 3, AEC with 3 or more, each
  // with or without bit 4 (REFT's AOR), which is never alone.
  auto with_protection = [](ArcReport a, uint8_t protection) {
    HoldingsReport r;
    r.arc = {std::move(a)};
    std::vector<uint8_t> b = EncodeHoldings(r);
    b.back() = protection;
    return b;
  };
  for (uint8_t p : {0, 4, 8, 255}) {
    EXPECT_THAT(refused(with_protection({1, 0, false, {0, 1, 2}}, p), "protection"),
                HasSubstr("with protection " + std::to_string(p)));
  }
  EXPECT_THAT(refused(with_protection({1, 0, false, {0, 1}}, 2), "aec of 2"),
              HasSubstr("an arc group of 2 members with protection 2"));
  EXPECT_THAT(refused(with_protection({1, 0, false, {0, 1}}, 6), "aec+aor of 2"),
              HasSubstr("an arc group of 2 members with protection 6"));
  for (uint8_t p : {5, 6, 7}) {
    HoldingsReport out;
    EXPECT_TRUE(Parse(with_protection({1, 0, true, {0, 1, 2}}, p), &out).ok()) << +p;
    ASSERT_EQ(out.arc.size(), 1u);
    EXPECT_EQ(out.arc[0].protection, p);
  }
}

// The fuzzer's seeds (fuzz/corpus/holdings/). They pin nothing: regenerate freely.
TEST(HoldingsTest, DISABLED_RegenerateSeeds) {
  const std::string dir = std::string(CKPTDB_TEST_DATA_DIR) + "/../../fuzz/corpus/holdings";
  auto write = [&](const std::string& name, const HoldingsReport& r) {
    std::vector<uint8_t> b = EncodeHoldings(r);
    test::WriteWholeFile(dir + "/" + name, std::string(b.begin(), b.end()));
  };
  write("empty", HoldingsReport{});
  write("full", Full());
  HoldingsReport arc;
  arc.memory = {4};
  arc.arc = {ArcReport{4, 0, true, {0, 1, 2, 3, 4, 5, 6, 7}}};
  write("arc-only", arc);
  arc.arc = {ArcReport{4, 0, true, {0, 1, 2, 3}, 3}};
  write("arc-aec", arc);
  arc.arc = {ArcReport{4, 0, true, {0, 1, 2, 3}, 5}};
  write("arc-aor", arc);
}

}  // namespace
}  // namespace ckpt::engine
