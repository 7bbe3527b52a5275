// Resharding restores (ckptdb_restore_slice; docs/api.md "Resharding"): the box geometry against
// an element-by-element model, and a tensor saved as 4 ranks' shards read back as other boxes,
// reading only the chunks those boxes lie in.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "engine/box.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using engine::Box;
using test::TempDir;

// Row-major element index of `at` (global coordinates) in box b.
uint64_t IndexIn(const Box& b, const std::vector<uint64_t>& at) {
  uint64_t i = 0;
  for (size_t d = 0; d < b.ndim(); ++d) i = i * b.shape[d] + (at[d] - b.offset[d]);
  return i;
}

Box RandomBox(std::mt19937_64& rng, const std::vector<uint64_t>& global) {
  Box b;
  for (uint64_t g : global) {
    const uint64_t lo = rng() % g;
    b.offset.push_back(lo);
    b.shape.push_back(1 + rng() % (g - lo));
  }
  return b;
}

TEST(BoxTest, RunsCopyExactlyTheIntersectionAsAnElementModelDoes) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 3000; ++round) {
    const size_t ndim = 1 + rng() % 4;
    std::vector<uint64_t> global;
    for (size_t d = 0; d < ndim; ++d) global.push_back(1 + rng() % 6);
    const Box from = RandomBox(rng, global), to = RandomBox(rng, global);
    Box part;
    if (!engine::Intersect(from, to, &part)) continue;
    uint64_t from_n = 0, to_n = 0, part_n = 0;
    ASSERT_TRUE(from.Volume(&from_n) && to.Volume(&to_n) && part.Volume(&part_n));
    // Elements are numbered by their from-index; the model places each one by hand.
    std::vector<uint16_t> src(from_n), got(to_n, 0xffff), want(to_n, 0xffff);
    for (uint64_t i = 0; i < from_n; ++i) src[i] = static_cast<uint16_t>(i);
    std::vector<uint64_t> at(ndim);
    for (uint64_t i = 0; i < part_n; ++i) {
      uint64_t rest = i;
      for (size_t d = ndim; d-- > 0;) {
        at[d] = part.offset[d] + rest % part.shape[d];
        rest /= part.shape[d];
      }
      want[IndexIn(to, at)] = src[IndexIn(from, at)];
    }
    uint64_t last_from = 0, last_to = 0, copied = 0;
    bool first = true;
    engine::ForEachRun(part, from, to, sizeof(uint16_t), [&](uint64_t f, uint64_t t, uint64_t n) {
      ASSERT_TRUE(first || (f >= last_from && t >= last_to)) << "runs out of order";
      first = false;
      last_from = f + n;
      last_to = t + n;
      copied += n;
      std::memcpy(reinterpret_cast<uint8_t*>(got.data()) + t,
                  reinterpret_cast<const uint8_t*>(src.data()) + f, n);
    });
    ASSERT_EQ(copied, part_n * sizeof(uint16_t)) << part.ToString();
    ASSERT_EQ(got, want) << "from " << from.ToString() << " to " << to.ToString();
  }
}

TEST(BoxTest, WholeTrailingDimensionsMergeIntoOneRun) {
  const Box shard{{0, 8, 0}, {4, 8, 32}}, want{{1, 8, 0}, {2, 8, 32}};
  Box part;
  ASSERT_TRUE(engine::Intersect(shard, want, &part));
  int runs = 0;
  engine::ForEachRun(part, shard, want, 4, [&](uint64_t f, uint64_t t, uint64_t n) {
    ++runs;
    EXPECT_EQ(f, 8u * 32 * 4);
    EXPECT_EQ(t, 0u);
    EXPECT_EQ(n, 2u * 8 * 32 * 4);
  });
  EXPECT_EQ(runs, 1);
}

// A global f32 tensor of kGlobal, saved by 4 "ranks" (4 stores) split along dimension `split_dim`
// at uneven points, beside a whole (unsharded) tensor and raw bytes.
class ReshardTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kGlobal[3] = {16, 24, 32};
  static constexpr uint32_t kRanks = 4;

  void SetUp() override {
    const uint64_t n = kGlobal[0] * kGlobal[1] * kGlobal[2];
    global_.resize(n);
    for (uint64_t i = 0; i < n; ++i) global_[i] = static_cast<float>(i) * 0.5f + 1.0f;
    for (uint32_t r = 0; r < kRanks; ++r) {
      roots_.push_back(dir_.Sub("rank" + std::to_string(r)));
      ckptdb_options o;
      ckptdb_options_init(&o);
      o.root = roots_.back().c_str();
      o.chunk_bytes = 4096;  // a shard spans several chunks
      o.staging_bytes = 1 << 20;
      ckptdb* db = nullptr;
      ASSERT_EQ(ckptdb_open(&o, &db), CKPTDB_OK) << ckptdb_last_error();
      dbs_.push_back(db);
    }
    for (int split = 0; split < 3; ++split) {
      for (uint32_t r = 0; r < kRanks; ++r) Put(r, split);
    }
    for (uint32_t r = 0; r < kRanks; ++r) {
      const char raw[] = "not a tensor";
      ASSERT_EQ(ckptdb_put_shard(dbs_[r], 1, "raw", raw, sizeof raw, nullptr, CKPTDB_PUT_COPY_NOW),
                CKPTDB_OK);
      ASSERT_EQ(ckptdb_commit(dbs_[r], 1, 0), CKPTDB_OK) << ckptdb_last_error();
    }
  }
  void TearDown() override {
    for (ckptdb* db : dbs_) ckptdb_close(db);
  }

  // Rank r's piece of dimension `dim`: cuts at 0, 5, 6, 13, end (uneven, one piece of 1).
  static Box ShardOf(uint32_t r, int dim) {
    const uint64_t cuts[kRanks + 1] = {0, 5, 6, 13, kGlobal[dim]};
    Box b{{0, 0, 0}, {kGlobal[0], kGlobal[1], kGlobal[2]}};
    b.offset[dim] = cuts[r];
    b.shape[dim] = cuts[r + 1] - cuts[r];
    return b;
  }
  static std::string Name(int split) { return "w.split" + std::to_string(split); }
  const Box& Whole() const { return whole_; }

  std::vector<float> Cut(const Box& b) const {
    uint64_t n = 0;
    EXPECT_TRUE(b.Volume(&n));
    std::vector<float> out(n);
    Box part;
    if (engine::Intersect(b, whole_, &part)) {
      engine::ForEachRun(part, whole_, b, sizeof(float), [&](uint64_t f, uint64_t t, uint64_t k) {
        std::memcpy(reinterpret_cast<uint8_t*>(out.data()) + t,
                    reinterpret_cast<const uint8_t*>(global_.data()) + f, k);
      });
    }
    return out;
  }

  void Put(uint32_t r, int split) {
    const Box b = ShardOf(r, split);
    std::vector<float> data = Cut(b);
    ckptdb_tensor_info info{};
    info.dtype = CKPTDB_DTYPE_F32;
    info.ndim = 3;
    for (int d = 0; d < 3; ++d) {
      info.shape[d] = b.shape[d];
      info.global_shape[d] = kGlobal[d];
      info.global_offset[d] = b.offset[d];
    }
    ASSERT_EQ(ckptdb_put_shard(dbs_[r], 1, Name(split).c_str(), data.data(),
                               data.size() * sizeof(float), &info, CKPTDB_PUT_COPY_NOW),
              CKPTDB_OK)
        << ckptdb_last_error();
  }

  static ckptdb_box ToC(const Box& b) {
    ckptdb_box c{};
    c.ndim = static_cast<uint32_t>(b.ndim());
    for (size_t d = 0; d < b.ndim(); ++d) {
      c.offset[d] = b.offset[d];
      c.shape[d] = b.shape[d];
    }
    return c;
  }

  // The box read from every rank's shard; the elements covered, summed.
  uint64_t ReadBox(int split, const Box& b, std::vector<float>* out) {
    uint64_t n = 0;
    EXPECT_TRUE(b.Volume(&n));
    out->assign(n, -1.0f);
    const ckptdb_box c = ToC(b);
    uint64_t total = 0;
    for (ckptdb* db : dbs_) {
      uint64_t covered = ~0ull;
      EXPECT_EQ(ckptdb_restore_slice(db, 1, Name(split).c_str(), &c, out->data(), n * sizeof(float),
                                     0, &covered),
                CKPTDB_OK)
          << ckptdb_last_error();
      total += covered;
    }
    return total;
  }

  uint64_t BytesRead(uint32_t r) {
    ckptdb_stats_t s{};
    EXPECT_EQ(ckptdb_stats(dbs_[r], &s), CKPTDB_OK);
    return s.tiers[0].bytes_read;
  }

  TempDir dir_{"/dev/shm"};
  std::vector<std::string> roots_;
  std::vector<ckptdb*> dbs_;
  std::vector<float> global_;
  Box whole_{{0, 0, 0}, {kGlobal[0], kGlobal[1], kGlobal[2]}};
};

TEST_F(ReshardTest, AnyBoxOfAnySplitReadsBackTheGlobalTensor) {
  std::mt19937_64 rng(11);
  const std::vector<uint64_t> g(kGlobal, kGlobal + 3);
  for (int split = 0; split < 3; ++split) {
    // The whole tensor (one rank of a new job), then halves and thirds along every dimension
    // (2 and 3 ranks), then random boxes.
    std::vector<Box> boxes = {Whole()};
    for (int dim = 0; dim < 3; ++dim) {
      for (uint64_t parts : {2, 3}) {
        for (uint64_t p = 0; p < parts; ++p) {
          Box b = Whole();
          b.offset[dim] = kGlobal[dim] * p / parts;
          b.shape[dim] = kGlobal[dim] * (p + 1) / parts - b.offset[dim];
          boxes.push_back(b);
        }
      }
    }
    for (int i = 0; i < 40; ++i) boxes.push_back(RandomBox(rng, g));
    for (const Box& b : boxes) {
      std::vector<float> got;
      uint64_t n = 0;
      ASSERT_TRUE(b.Volume(&n));
      ASSERT_EQ(ReadBox(split, b, &got), n) << "split " << split << " box " << b.ToString();
      ASSERT_EQ(got, Cut(b)) << "split " << split << " box " << b.ToString();
    }
  }
}

TEST_F(ReshardTest, ReadsOnlyTheChunksTheBoxLiesIn) {
  // Split along dimension 1: rank r's shard is 16 x w x 32 floats, each of its 16 rows of w x 32
  // floats contiguous. Row 0 of the global tensor is the first w x 32 x 4 <= 4096 bytes of each
  // shard: its first chunk, of the shards' 1 to 6.
  Box row0 = Whole();
  row0.shape[0] = 1;
  std::vector<uint64_t> before;
  for (uint32_t r = 0; r < kRanks; ++r) before.push_back(BytesRead(r));
  std::vector<float> got;
  ASSERT_EQ(ReadBox(1, row0, &got), kGlobal[1] * kGlobal[2]);
  EXPECT_EQ(got, Cut(row0));
  for (uint32_t r = 0; r < kRanks; ++r) {
    const uint64_t shard_bytes = kGlobal[0] * ShardOf(r, 1).shape[1] * kGlobal[2] * sizeof(float);
    EXPECT_EQ(BytesRead(r) - before[r], std::min<uint64_t>(4096, shard_bytes)) << "rank " << r;
  }
  // A chunk the box does not need may be damaged: the slice is still served, the whole shard not.
  const std::string seg_dir = roots_[2] + "/segments";
  std::string seg;
  for (const auto& e : std::filesystem::directory_iterator(seg_dir)) {
    if (e.path().extension() == ".seg") seg = e.path();
  }
  ASSERT_FALSE(seg.empty());
  struct Last {
    uint64_t offset = 0;
  } last;
  const char* source = nullptr;
  ASSERT_EQ(ckptdb_list_chunks(
                dbs_[2], 1, Name(1).c_str(),
                [](void* arg, const ckptdb_chunk_desc* c) {
                  static_cast<Last*>(arg)->offset = c->record_offset;
                  return 0;
                },
                &last, &source),
            CKPTDB_OK);
  {
    FILE* f = std::fopen(seg.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fseek(f, static_cast<long>(last.offset + 4096 + 8), SEEK_SET), 0);
    std::fputc(0x5a, f);
    std::fclose(f);
  }
  ASSERT_EQ(ReadBox(1, row0, &got), kGlobal[1] * kGlobal[2]);
  EXPECT_EQ(got, Cut(row0));
  std::vector<float> all(ShardOf(2, 1).shape[0] * ShardOf(2, 1).shape[1] * kGlobal[2]);
  EXPECT_EQ(ckptdb_restore(dbs_[2], 1, Name(1).c_str(), all.data(), all.size() * sizeof(float), 0),
            CKPTDB_ECORRUPT);
  // A box that needs the damaged chunk fails and leaves the buffer as it was.
  Box last_row = Whole();
  last_row.offset[0] = kGlobal[0] - 1;
  last_row.shape[0] = 1;
  const ckptdb_box c = ToC(last_row);
  std::vector<float> out(kGlobal[1] * kGlobal[2], 7.0f);
  uint64_t covered = 99;
  EXPECT_EQ(ckptdb_restore_slice(dbs_[2], 1, Name(1).c_str(), &c, out.data(),
                                 out.size() * sizeof(float), 0, &covered),
            CKPTDB_ECORRUPT);
  EXPECT_NE(std::string(ckptdb_last_error()).find("restore_slice 'w.split1'"), std::string::npos)
      << ckptdb_last_error();
  EXPECT_EQ(out, std::vector<float>(out.size(), 7.0f));
  EXPECT_EQ(covered, 99u);
  // The box that is the shard itself is read in place: the failed chunk's bytes are zeroed.
  const ckptdb_box whole_shard = ToC(ShardOf(2, 1));
  std::vector<float> shard(all.size(), 7.0f);
  EXPECT_EQ(ckptdb_restore_slice(dbs_[2], 1, Name(1).c_str(), &whole_shard, shard.data(),
                                 shard.size() * sizeof(float), 0, &covered),
            CKPTDB_ECORRUPT);
  EXPECT_NE(std::string(ckptdb_last_error()).find("restore_slice 'w.split1'"), std::string::npos)
      << ckptdb_last_error();
  EXPECT_EQ(covered, 99u);
  EXPECT_EQ(shard[shard.size() - 1], 0.0f);  // in the last chunk, the damaged one
  EXPECT_EQ(shard[0], Cut(ShardOf(2, 1))[0]);
}

TEST_F(ReshardTest, BadBoxesAreRefusedAndChangeNothing) {
  std::vector<float> out(8, 3.0f);
  const std::vector<float> untouched = out;
  uint64_t covered = 42;
  auto call = [&](const char* name, const ckptdb_box* box, size_t bytes, uint64_t version = 1,
                  unsigned flags = 0, uint64_t* cov = nullptr) {
    return ckptdb_restore_slice(dbs_[0], version, name, box, out.data(), bytes, flags,
                                cov ? cov : &covered);
  };
  auto mentions = [](const char* needle) {
    return std::string(ckptdb_last_error()).find(needle) != std::string::npos;
  };
  ckptdb_box b = ToC(Box{{0, 0, 0}, {1, 1, 8}});
  EXPECT_EQ(call("w.split0", nullptr, 32), CKPTDB_EINVAL);
  EXPECT_TRUE(mentions("box is NULL"));
  EXPECT_EQ(ckptdb_restore_slice(dbs_[0], 1, "w.split0", &b, out.data(), 32, 0, nullptr),
            CKPTDB_EINVAL);
  EXPECT_EQ(call("w.split0", &b, 32, 1, 4), CKPTDB_EINVAL);
  EXPECT_TRUE(mentions("unknown flags"));
  ckptdb_box outside = ToC(Box{{0, 0, 30}, {1, 1, 8}});
  EXPECT_EQ(call("w.split0", &outside, 32), CKPTDB_EINVAL);
  EXPECT_TRUE(mentions("box [0:1, 0:1, 30:38] lies outside the global shape [16, 24, 32]"))
      << ckptdb_last_error();
  ckptdb_box flat = ToC(Box{{0}, {8}});
  EXPECT_EQ(call("w.split0", &flat, 32), CKPTDB_EINVAL);
  EXPECT_TRUE(mentions("the box has 1 dimensions, the tensor 3"));
  b.ndim = CKPTDB_MAX_DIMS + 1;
  EXPECT_EQ(call("w.split0", &b, 32), CKPTDB_EINVAL);
  b.ndim = 3;
  EXPECT_EQ(call("w.split0", &b, 28), CKPTDB_ESIZE);
  EXPECT_TRUE(mentions("is 8 elements of 4 bytes, the buffer is 28 bytes"));
  EXPECT_EQ(call("raw", &flat, 32), CKPTDB_EINVAL);
  EXPECT_TRUE(mentions("raw bytes"));
  EXPECT_EQ(call("nope", &b, 32), CKPTDB_ENOTFOUND);
  EXPECT_EQ(call("w.split0", &b, 32, 9), CKPTDB_ENOTFOUND);
  EXPECT_EQ(ckptdb_restore_slice(nullptr, 1, "w.split0", &b, out.data(), 32, 0, &covered),
            CKPTDB_EINVAL);
  EXPECT_EQ(out, untouched);
  EXPECT_EQ(covered, 42u);
  // A box this rank's shard misses: nothing copied, and it says so.
  ckptdb_box elsewhere = ToC(Box{{15, 0, 0}, {1, 1, 8}});
  EXPECT_EQ(call("w.split0", &elsewhere, 32), CKPTDB_OK);  // rank 0 holds rows 0..4
  EXPECT_EQ(covered, 0u);
  EXPECT_EQ(out, untouched);
}

TEST_F(ReshardTest, AWholeTensorIsItsOwnShard) {
  std::vector<float> full(16);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
  ckptdb_tensor_info info{};
  info.dtype = CKPTDB_DTYPE_F32;
  info.ndim = 2;
  info.shape[0] = 4;
  info.shape[1] = 4;
  ASSERT_EQ(ckptdb_put_shard(dbs_[0], 2, "bias", full.data(), 64, &info, CKPTDB_PUT_COPY_NOW),
            CKPTDB_OK);
  ASSERT_EQ(ckptdb_commit(dbs_[0], 2, 0), CKPTDB_OK) << ckptdb_last_error();
  const ckptdb_box b = ToC(Box{{1, 2}, {2, 2}});
  std::vector<float> out(4);
  uint64_t covered = 0;
  ASSERT_EQ(ckptdb_restore_slice(dbs_[0], 2, "bias", &b, out.data(), 16, 0, &covered), CKPTDB_OK)
      << ckptdb_last_error();
  EXPECT_EQ(covered, 4u);
  EXPECT_EQ(out, (std::vector<float>{6, 7, 10, 11}));
}

}  // namespace
}  // namespace ckpt
