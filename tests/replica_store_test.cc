// The memory a rank keeps its peers' replicas in (engine/replica_store.h): pieces in any order,
// the seal's checks, recycling of dropped replicas' memory, and what a restarted process finds.
// The segment images are real ones, written by a one-rank store through the C API.
#include "engine/replica_store.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "ckptdb/ckptdb.h"
#include "format/segment_reader.h"
#include "io/fault_io.h"
#include "tests/test_util.h"

namespace ckpt::engine {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// Real segment images of versions 1..n of rank 0 (a one-rank store's), each with a 200 KiB tensor
// in 64 KiB chunks (so several records), read back from a tmpfs tier. Another `seed` gives other
// bytes for the same versions.
std::vector<std::string> SegmentImages(const TempDir& dir, int n, uint64_t seed = 1000) {
  const std::string root = dir.Sub("store");
  const std::string tiers = "tmpfs:" + dir.Sub("tier");
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root.c_str();
  o.tiers = tiers.c_str();
  o.chunk_bytes = 64 << 10;
  o.staging_bytes = 1 << 20;
  ckptdb* db = nullptr;
  EXPECT_EQ(ckptdb_open(&o, &db), CKPTDB_OK) << ckptdb_last_error();
  std::vector<std::string> images;
  for (int v = 1; v <= n && db != nullptr; ++v) {
    auto data = test::RandomBytes(200 << 10, seed * v);
    EXPECT_EQ(ckptdb_put_shard(db, v, "w", data.data(), data.size(), nullptr, CKPTDB_PUT_COPY_NOW),
              CKPTDB_OK);
    EXPECT_EQ(ckptdb_commit(db, v, 0), CKPTDB_OK) << ckptdb_last_error();
  }
  if (db != nullptr) {
    EXPECT_EQ(ckptdb_close(db), CKPTDB_OK);
  }
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir.Sub("tier"))) {
    if (e.path().extension() == ".seg") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());  // v00..01 before v00..02
  for (const std::string& f : files) images.push_back(test::ReadWholeFile(f));
  EXPECT_EQ(images.size(), static_cast<size_t>(n));
  return images;
}

// Sends `image` as owner's `version` as Cluster::Replicate does: the begin, then pieces of `piece`
// bytes in a shuffled order, each placed the way the transport's Placer does (received straight
// into the returned address), then the seal.
Status Send(ReplicaStore* store, uint32_t owner, uint64_t version, const std::string& image,
            size_t piece, uint64_t seed, bool replace_sealed = false) {
  std::vector<uint64_t> offsets;
  for (uint64_t off = 0; off < image.size(); off += piece) offsets.push_back(off);
  std::shuffle(offsets.begin(), offsets.end(), std::mt19937_64(seed));
  CKPTDB_RETURN_IF_ERROR(
      store->Begin(owner, version, image.size(), "test replica", replace_sealed));
  for (uint64_t off : offsets) {
    size_t n = std::min<size_t>(piece, image.size() - off);
    uint8_t* at = nullptr;
    std::shared_ptr<MappedFile> keep;
    CKPTDB_RETURN_IF_ERROR(store->Place(owner, version, image.size(), off, n, &at, &keep));
    std::memcpy(at, image.data() + off, n);  // what UCX does
    CKPTDB_RETURN_IF_ERROR(store->Received(owner, version, image.size(), off, {at, n}, "piece"));
  }
  return store->Seal(owner, version, image.size(), "test replica");
}

// Pieces as Cluster::Replicate cuts them: whole records (the arena's extents), runs of up to
// `records` adjacent ones, then the manifest's record and the footer.
std::vector<std::pair<uint64_t, uint64_t>> RecordPieces(const std::string& image, int records) {
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  std::vector<uint8_t> scratch;
  uint64_t run_start = format::kBlockBytes;
  int in_run = 0;
  uint64_t data_end = format::kBlockBytes;
  Status st = format::ScanSegment(
      "image", image.size(),
      [&](uint64_t off, void* buf, size_t len) {
        std::memcpy(buf, image.data() + off, len);
        return Status::Ok();
      },
      [&](const format::ScannedRecord& r) {
        if (r.header.type != format::RecordType::kChunk) return;
        data_end = r.offset + format::RecordBytes(r.header.payload_bytes);
        if (++in_run == records) {
          pieces.emplace_back(run_start, data_end - run_start);
          run_start = data_end;
          in_run = 0;
        }
      },
      &scratch);
  EXPECT_TRUE(st.ok()) << st.message();
  if (in_run > 0) pieces.emplace_back(run_start, data_end - run_start);
  pieces.emplace_back(0, format::kBlockBytes);
  pieces.emplace_back(data_end, image.size() - data_end);
  return pieces;
}

Status SendPieces(ReplicaStore* store, uint32_t owner, uint64_t version, const std::string& image,
                  const std::vector<std::pair<uint64_t, uint64_t>>& pieces) {
  CKPTDB_RETURN_IF_ERROR(store->Begin(owner, version, image.size(), "test replica"));
  for (auto [off, n] : pieces) {
    uint8_t* at = nullptr;
    std::shared_ptr<MappedFile> keep;
    CKPTDB_RETURN_IF_ERROR(store->Place(owner, version, image.size(), off, n, &at, &keep));
    std::memcpy(at, image.data() + off, n);
    CKPTDB_RETURN_IF_ERROR(store->Received(owner, version, image.size(), off, {at, n}, "piece"));
  }
  return store->Seal(owner, version, image.size(), "test replica");
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ReplicaStoreTest, PiecesInAnyOrderSealIntoAVerifiedReplicaServedFromItsMapping) {
  TempDir dir;
  auto images = SegmentImages(dir, 1);
  std::unique_ptr<ReplicaStore> store;
  ASSERT_TRUE(ReplicaStore::Open(nullptr, dir.Sub("replicas"), 2, 0, &store).ok());
  Status st = Send(store.get(), 0, 1, images[0], 12345, 7);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(store->Held(), (std::vector<std::pair<uint32_t, uint64_t>>{{0, 1}}));
  auto map = store->Find(0, 1);
  ASSERT_NE(map, nullptr);
  ASSERT_EQ(map->bytes(), images[0].size());
  EXPECT_EQ(std::memcmp(map->data(), images[0].data(), images[0].size()), 0);
  EXPECT_EQ(test::ReadWholeFile(store->SealedPath(0, 1)), images[0]);
  EXPECT_EQ(store->Find(0, 2), nullptr);
}

TEST(ReplicaStoreTest, RetentionRecyclesTheDroppedReplicasMemoryForTheNext) {
  TempDir dir;
  auto images = SegmentImages(dir, 5);
  std::unique_ptr<ReplicaStore> store;
  ASSERT_TRUE(ReplicaStore::Open(nullptr, dir.Sub("replicas"), 2, 0, &store).ok());
  uint8_t* v1_memory = nullptr;
  for (uint64_t v = 1; v <= 5; ++v) {
    if (v == 4) {
      // v1 was dropped when v3 sealed: its pages are the spare, and v4 lands in them.
      uint8_t* at = nullptr;
      std::shared_ptr<MappedFile> keep;
      ASSERT_TRUE(store->Begin(0, 4, images[3].size(), "v4").ok());
      ASSERT_TRUE(store->Place(0, 4, images[3].size(), 0, 0, &at, &keep).ok());
      EXPECT_TRUE(fs::exists(dir.Sub("replicas") + "/r00000-v00000000000000000004.seg.tmp"));
      EXPECT_FALSE(fs::exists(dir.Sub("replicas") + "/r00000.spare"));
      EXPECT_EQ(at, v1_memory) << "the spare's mapping is reused as it is";
    }
    Status st = Send(store.get(), 0, v, images[v - 1], 64 << 10, v);
    ASSERT_TRUE(st.ok()) << "v" << v << ": " << st.message();
    if (v == 1) v1_memory = store->Find(0, 1)->data();
  }
  EXPECT_EQ(store->Held(), (std::vector<std::pair<uint32_t, uint64_t>>{{0, 4}, {0, 5}}));
  EXPECT_EQ(Names(dir.Sub("replicas")),
            (std::vector<std::string>{"r00000-v00000000000000000004.seg",
                                      "r00000-v00000000000000000005.seg", "r00000.spare"}));
  EXPECT_EQ(test::ReadWholeFile(store->SealedPath(0, 5)), images[4]);
}

// A killed owner's restarted job puts the same version number again (it was aborted, or never
// decided) with other bytes: the holder replaces its sealed replica when told the version did not
// commit, and refuses otherwise. Found by the kill campaign (`ckptdb demo --kill-rounds`): a job
// restarted after a kill during replication could never commit that version again.
TEST(ReplicaStoreTest, ASealedReplicaIsReplacedOnlyWhenItsVersionDidNotCommit) {
  TempDir dir, other;
  const std::string first = SegmentImages(dir, 1)[0];
  const std::string again = SegmentImages(other, 1, 7777)[0];
  ASSERT_NE(first, again);
  std::unique_ptr<ReplicaStore> store;
  ASSERT_TRUE(ReplicaStore::Open(nullptr, dir.Sub("replicas"), 2, 0, &store).ok());
  ASSERT_TRUE(Send(store.get(), 0, 1, first, 64 << 10, 1).ok());
  std::shared_ptr<MappedFile> serving = store->Find(0, 1);  // a fetch being served from it
  ASSERT_NE(serving, nullptr);

  Status st = store->Begin(0, 1, again.size(), "v1 again");
  EXPECT_EQ(st.code(), CKPTDB_ESTATE) << st.message();
  EXPECT_EQ(test::ReadWholeFile(store->SealedPath(0, 1)), first) << "a refusal changes nothing";

  st = Send(store.get(), 0, 1, again, 64 << 10, 2, /*replace_sealed=*/true);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(store->Held(), (std::vector<std::pair<uint32_t, uint64_t>>{{0, 1}}));
  EXPECT_EQ(test::ReadWholeFile(store->SealedPath(0, 1)), again);
  auto now = store->Find(0, 1);
  ASSERT_NE(now, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(now->data()), now->bytes()), again);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(serving->data()), serving->bytes()), first)
      << "the fetch under way still reads the old replica";
  EXPECT_EQ(Names(dir.Sub("replicas")),
            (std::vector<std::string>{"r00000-v00000000000000000001.seg"}));
}

TEST(ReplicaStoreTest, AReplicaThatFailsItsChecksIsRefusedAndNeverHeld) {
  TempDir dir;
  auto images = SegmentImages(dir, 2);
  std::unique_ptr<ReplicaStore> store;
  ASSERT_TRUE(ReplicaStore::Open(nullptr, dir.Sub("replicas"), 2, 0, &store).ok());
  // A flipped byte in a chunk's payload.
  std::string bad = images[0];
  bad[2 * 4096 + 100] ^= 1;  // the first record: header block at 4096, payload at 8192
  Status st = Send(store.get(), 0, 1, bad, 1 << 20, 1);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << st.message();
  EXPECT_NE(st.message().find("xxh3"), std::string::npos) << st.message();
  EXPECT_TRUE(store->Held().empty());
  // It was refused at the piece that held the record, and dropped there: there is nothing to seal.
  EXPECT_EQ(store->Seal(0, 1, bad.size(), "replica").code(), CKPTDB_ESTATE);
  // A flipped byte in a record no piece holds whole (pieces cut across records): the seal hashes
  // it and refuses.
  st = Send(store.get(), 0, 1, bad, 12345, 1);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << st.message();
  EXPECT_NE(st.message().find("chunk 0 at offset 4096 fails xxh3"), std::string::npos)
      << st.message();
  EXPECT_TRUE(store->Held().empty());
  // An image of another version (or another rank) under this name.
  st = Send(store.get(), 0, 7, images[1], 1 << 20, 1);
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << st.message();
  EXPECT_NE(st.message().find("the segment is v2"), std::string::npos) << st.message();
  // A piece missing: the seal refuses before looking at the bytes.
  uint8_t* at = nullptr;
  std::shared_ptr<MappedFile> keep;
  ASSERT_TRUE(store->Begin(0, 1, images[0].size(), "replica").ok());
  ASSERT_TRUE(store->Place(0, 1, images[0].size(), 0, 4096, &at, &keep).ok());
  std::memcpy(at, images[0].data(), 4096);
  ASSERT_TRUE(store->Received(0, 1, images[0].size(), 0, {at, 4096}, "piece").ok());
  st = store->Seal(0, 1, images[0].size(), "replica");
  EXPECT_EQ(st.code(), CKPTDB_ECORRUPT) << st.message();
  EXPECT_NE(st.message().find("4096 bytes arrived of"), std::string::npos) << st.message();
  EXPECT_TRUE(store->Held().empty());
  // And the good one still goes through afterwards.
  st = Send(store.get(), 0, 1, images[0], 1 << 20, 2);
  EXPECT_TRUE(st.ok()) << st.message();
}

// Pieces of whole records, as Cluster::Replicate sends them, are hashed as they land, while the
// rest of the replica is on the wire: the seal (which the owner's vote waits for) hashes nothing.
// Pieces cut elsewhere leave the records they cut to the seal.
TEST(ReplicaStoreTest, RecordsArriveHashedSoTheSealHashesOnlyWhatNoPieceHeldWhole) {
  TempDir dir;
  auto images = SegmentImages(dir, 2);
  std::unique_ptr<ReplicaStore> store;
  ASSERT_TRUE(ReplicaStore::Open(nullptr, dir.Sub("replicas"), 2, 0, &store).ok());
  const uint64_t payload_bytes = 200 << 10;
  auto pieces = RecordPieces(images[0], 2);
  ASSERT_EQ(pieces.size(), 2u + 2u) << "4 records in 2 pieces, the header block, the tail";
  Status st = SendPieces(store.get(), 0, 1, images[0], pieces);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(store->hashed_bytes().on_arrival, payload_bytes);
  EXPECT_EQ(store->hashed_bytes().at_seal, 0u);
  // One piece of all of it: the same.
  st = SendPieces(store.get(), 0, 2, images[1], {{0, images[1].size()}});
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(store->hashed_bytes().on_arrival, 2 * payload_bytes);
  EXPECT_EQ(store->hashed_bytes().at_seal, 0u);
  // Cut across records: the second piece starts inside the first record, so everything from
  // there on is the seal's.
  std::unique_ptr<ReplicaStore> other;
  ASSERT_TRUE(ReplicaStore::Open(nullptr, dir.Sub("other"), 2, 0, &other).ok());
  st = SendPieces(other.get(), 0, 1, images[0], {{0, 8192}, {8192, images[0].size() - 8192}});
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(other->hashed_bytes().on_arrival, 0u);
  EXPECT_EQ(other->hashed_bytes().at_seal, payload_bytes);
}

// No byte of a replica is received twice, so a record hashed as it landed keeps the bytes it was
// hashed with: a piece overlapping another is refused, placed (the Placer's lookup) or not (the
// handler's), and a refused replica is dropped at once.
TEST(ReplicaStoreTest, OverlappingPiecesAreRefused) {
  TempDir dir;
  auto images = SegmentImages(dir, 1);
  const std::string& image = images[0];
  std::unique_ptr<ReplicaStore> store;
  ASSERT_TRUE(ReplicaStore::Open(nullptr, dir.Sub("replicas"), 2, 0, &store).ok());
  ASSERT_TRUE(store->Begin(0, 1, image.size(), "replica").ok());
  uint8_t* at = nullptr;
  std::shared_ptr<MappedFile> keep;
  ASSERT_TRUE(store->Place(0, 1, image.size(), 8192, 8192, &at, &keep).ok());
  for (auto [offset, bytes] : std::vector<std::pair<uint64_t, uint64_t>>{
           {8192, 8192}, {4096, 8192}, {12288, 8192}, {8192, 1}, {16383, 1}, {0, image.size()}}) {
    Status st = store->Place(0, 1, image.size(), offset, bytes, &at, &keep);
    EXPECT_EQ(st.code(), CKPTDB_EINVAL) << offset << "+" << bytes;
    EXPECT_NE(st.message().find("arrive a second time"), std::string::npos) << st.message();
  }
  ASSERT_TRUE(store->Place(0, 1, image.size(), 4096, 4096, &at, &keep).ok()) << "adjacent";
  ASSERT_TRUE(store->Place(0, 1, image.size(), 16384, 4096, &at, &keep).ok()) << "adjacent";
  // A piece the Placer refused arrives in a buffer of the transport's: the handler refuses it too,
  // and with it the replica.
  Status st =
      store->Received(0, 1, image.size(), 12288,
                      {reinterpret_cast<const uint8_t*>(image.data()) + 12288, 4096}, "piece");
  EXPECT_EQ(st.code(), CKPTDB_EINVAL) << st.message();
  EXPECT_EQ(store->Place(0, 1, image.size(), 65536, 4096, &at, &keep).code(), CKPTDB_ESTATE)
      << "the replica was dropped";
  EXPECT_EQ(store->Seal(0, 1, image.size(), "replica").code(), CKPTDB_ESTATE);
  keep.reset();
  // Sent again from the start, it goes through.
  st = Send(store.get(), 0, 1, image, 64 << 10, 3);
  EXPECT_TRUE(st.ok()) << st.message();
}

// Begin maps every page of a new replica (on the service thread that handles the begin), so that
// the progress thread, which receives the pieces, never faults one in.
TEST(ReplicaStoreTest, BeginMapsEveryPageOfANewReplica) {
  TempDir dir;
  std::unique_ptr<ReplicaStore> store;
  ASSERT_TRUE(ReplicaStore::Open(nullptr, dir.Sub("replicas"), 2, 0, &store).ok());
  const uint64_t bytes = 8 << 20;
  ASSERT_TRUE(store->Begin(3, 9, bytes, "replica").ok());
  uint8_t* at = nullptr;
  std::shared_ptr<MappedFile> keep;
  ASSERT_TRUE(store->Place(3, 9, bytes, 0, bytes, &at, &keep).ok());
  std::vector<unsigned char> resident(bytes / 4096);
  ASSERT_EQ(mincore(at, bytes, resident.data()), 0);
  size_t in = 0;
  for (unsigned char r : resident) in += r & 1;
  EXPECT_EQ(in, resident.size()) << "pages of the new replica left to fault in";
}

size_t ResidentPages(const MappedFile& map) {
  std::vector<unsigned char> resident(map.bytes() / 4096);
  EXPECT_EQ(mincore(map.data(), map.bytes(), resident.data()), 0);
  size_t in = 0;
  for (unsigned char r : resident) in += r & 1;
  return in;
}

// No piece lands before its replica's memory is allocated: a piece that comes before the begin
// is answered (a sender that does not wait for it) is refused, so no byte is ever written through
// a page the file system has not given (on a full one, a SIGBUS). Here a second thread places
// pieces while the begin allocates 64 MiB of new pages; the first one accepted must find them all.
TEST(ReplicaStoreTest, NoPieceLandsBeforeTheBeginHasAllocatedTheMemory) {
  TempDir dir;
  std::unique_ptr<ReplicaStore> store;
  ASSERT_TRUE(ReplicaStore::Open(nullptr, dir.Sub("replicas"), 2, 0, &store).ok());
  const uint64_t bytes = 64 << 20;
  std::atomic<bool> begun{false};
  std::atomic<int> refused_early{0};
  size_t resident_at_first_place = 0;
  std::thread placer([&] {
    // Until the begin is done (however long a loaded machine takes to allocate), then a few
    // more tries: a placement must succeed once it is.
    for (int after = 0; after < 1000;) {
      const bool was_begun = begun;
      uint8_t* at = nullptr;
      std::shared_ptr<MappedFile> keep;
      Status st = store->Place(0, 1, bytes, 0, 4096, &at, &keep);
      if (st.ok()) {
        resident_at_first_place = ResidentPages(*keep);
        return;
      }
      if (st.message().find("being allocated") != std::string::npos) ++refused_early;
      if (was_begun) ++after;
    }
  });
  Status st = store->Begin(0, 1, bytes, "replica");
  begun = true;
  placer.join();
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(resident_at_first_place, bytes / 4096) << "a piece was placed into missing pages";
  std::printf("pieces refused while the begin allocated: %d\n", refused_early.load());
}

// A mapping is populated once (a populate walks every page, mapped or not: 35 ms for 512 MiB on
// these VMs), and again after a resize maps it anew: the grown part's pages exist then too.
TEST(ReplicaStoreTest, AMappingIsPopulatedOnceAndAgainAfterAResize) {
  TempDir dir;
  std::shared_ptr<MappedFile> map;
  ASSERT_TRUE(MappedFile::Open(dir.Sub("f"), io::MappedFileOptions::New(1 << 20), &map).ok());
  EXPECT_EQ(ResidentPages(*map), 0u);
  ASSERT_TRUE(map->Reserve("f").ok());
  EXPECT_EQ(ResidentPages(*map), 256u);
  ASSERT_TRUE(map->Resize(4 << 20, "f").ok());
  ASSERT_TRUE(map->Reserve("f").ok());
  EXPECT_EQ(ResidentPages(*map), 1024u) << "the grown mapping's new pages left to fault in";
}

// The ram tier's replicas=SIZE bounds the memory a rank keeps its peers' replicas in: other
// owners' spares are dropped to make room, and past that a replica is refused with ENOSPC before
// any byte of it is sent, holding nothing.
TEST(ReplicaStoreTest, TheBudgetDropsOtherOwnersSparesThenRefusesAReplica) {
  TempDir dir;
  auto images = SegmentImages(dir, 3);
  const uint64_t size = images[0].size();
  ASSERT_EQ(images[2].size(), size);
  std::unique_ptr<ReplicaStore> store;
  const std::string rdir = dir.Sub("replicas");
  ASSERT_TRUE(ReplicaStore::Open(nullptr, rdir, 2, 4 * size, &store).ok());
  for (uint64_t v = 1; v <= 3; ++v) {
    ASSERT_TRUE(Send(store.get(), 0, v, images[v - 1], 64 << 10, v).ok()) << v;
  }
  EXPECT_EQ(store->held_bytes(), 3 * size) << "owner 0: v2, v3 and v1's pages as the spare";
  // Owners 1, 2 and 3 (begun only: the images are owner 0's).
  ASSERT_TRUE(store->Begin(1, 1, size, "owner 1 v1").ok());
  EXPECT_EQ(store->held_bytes(), 4 * size);
  EXPECT_TRUE(fs::exists(rdir + "/r00000.spare"));
  ASSERT_TRUE(store->Begin(2, 1, size, "owner 2 v1").ok());
  EXPECT_FALSE(fs::exists(rdir + "/r00000.spare")) << "owner 0's spare dropped for room";
  EXPECT_EQ(store->held_bytes(), 4 * size);
  // Nothing left to drop: refused, and nothing held for it.
  Status st = store->Begin(3, 1, size, "owner 3 v1");
  EXPECT_EQ(st.code(), CKPTDB_ENOSPC) << st.message();
  EXPECT_NE(st.message().find("over their budget of " + std::to_string(4 * size)),
            std::string::npos)
      << st.message();
  EXPECT_EQ(store->held_bytes(), 4 * size);
  EXPECT_EQ(store->Held(), (std::vector<std::pair<uint32_t, uint64_t>>{{0, 2}, {0, 3}}));
  uint8_t* at = nullptr;
  std::shared_ptr<MappedFile> keep;
  EXPECT_EQ(store->Place(3, 1, size, 0, 4096, &at, &keep).code(), CKPTDB_ESTATE);
}

// A replica the node's memory file system cannot hold is refused with ENOSPC when it is begun:
// its pages are allocated then, so that no byte of it ever lands in a page the file system
// cannot give (a SIGBUS in the transport's progress thread, the whole rank lost). Needs root to
// mount a small tmpfs in a mount namespace of its own; says SKIPPED otherwise.
TEST(ReplicaStoreTest, AFullMemoryFileSystemRefusesAReplicaAtItsBegin) {
  TempDir dir;
  const std::string small = dir.Sub("small");
  fs::create_directories(small);
  pid_t pid = fork();
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) != 0 || mount("", "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0 ||
        mount("tmpfs", small.c_str(), "tmpfs", 0, "size=2m") != 0) {
      _exit(77);
    }
    std::unique_ptr<ReplicaStore> store;
    if (!ReplicaStore::Open(nullptr, small + "/replicas", 2, 0, &store).ok()) _exit(2);
    Status st = store->Begin(0, 1, 8 << 20, "replica");
    if (st.code() != CKPTDB_ENOSPC) {
      std::fprintf(stderr, "Begin of 8 MiB on a 2 MiB tmpfs: %s\n", st.message().c_str());
      _exit(1);
    }
    if (!store->Held().empty() || store->held_bytes() != 0) _exit(3);
    // And one that fits still goes through.
    if (!store->Begin(0, 2, 1 << 20, "replica").ok()) _exit(4);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "SKIPPED: cannot mount a tmpfs here (not root?)";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(ReplicaStoreTest, OutOfRangePiecesUnbegunReplicasAndSealsOfNothingAreRefused) {
  TempDir dir;
  std::unique_ptr<ReplicaStore> store;
  ASSERT_TRUE(ReplicaStore::Open(nullptr, dir.Sub("replicas"), 2, 0, &store).ok());
  uint8_t* at = nullptr;
  std::shared_ptr<MappedFile> keep;
  EXPECT_EQ(store->Begin(1, 1, 0, "replica").code(), CKPTDB_EINVAL);
  EXPECT_EQ(store->Begin(1, 1, uint64_t{1} << 41, "replica").code(), CKPTDB_EINVAL);
  // A piece of a replica nobody began (the Placer then lets the handler refuse it).
  EXPECT_EQ(store->Place(1, 1, 8192, 0, 4096, &at, &keep).code(), CKPTDB_ESTATE);
  ASSERT_TRUE(store->Begin(1, 1, 8192, "replica").ok());
  ASSERT_TRUE(store->Begin(1, 1, 8192, "replica").ok()) << "begin is idempotent";
  EXPECT_EQ(store->Begin(1, 1, 16384, "replica").code(), CKPTDB_EINVAL);
  EXPECT_EQ(store->Place(1, 1, 8192, 8000, 193, &at, &keep).code(), CKPTDB_EINVAL);
  EXPECT_EQ(store->Place(1, 1, ~uint64_t{0}, ~uint64_t{0}, 2, &at, &keep).code(), CKPTDB_EINVAL);
  ASSERT_TRUE(store->Place(1, 1, 8192, 0, 4096, &at, &keep).ok());
  // The same replica announced with another size.
  EXPECT_EQ(store->Place(1, 1, 16384, 4096, 4096, &at, &keep).code(), CKPTDB_EINVAL);
  EXPECT_EQ(store->Seal(1, 9, 8192, "replica").code(), CKPTDB_ESTATE);
  EXPECT_TRUE(store->Held().empty());
}

TEST(ReplicaStoreTest, ARestartedProcessServesSealedReplicasAndReusesPartialOnesAsSpares) {
  TempDir dir;
  auto images = SegmentImages(dir, 4);
  const std::string rdir = dir.Sub("replicas");
  {
    std::unique_ptr<ReplicaStore> store;
    ASSERT_TRUE(ReplicaStore::Open(nullptr, rdir, 2, 0, &store).ok());
    ASSERT_TRUE(Send(store.get(), 0, 1, images[0], 1 << 20, 1).ok());
    ASSERT_TRUE(Send(store.get(), 0, 2, images[1], 1 << 20, 1).ok());
    // v3 half received when the process dies.
    ASSERT_TRUE(store->Begin(0, 3, images[2].size(), "v3").ok());
  }
  std::unique_ptr<ReplicaStore> store;
  ASSERT_TRUE(ReplicaStore::Open(nullptr, rdir, 2, 0, &store).ok());
  EXPECT_EQ(store->Held(), (std::vector<std::pair<uint32_t, uint64_t>>{{0, 1}, {0, 2}}));
  EXPECT_EQ(Names(rdir),
            (std::vector<std::string>{"r00000-v00000000000000000001.seg",
                                      "r00000-v00000000000000000002.seg", "r00000.spare"}))
      << "a partial replica is never served: its memory became the spare";
  auto map = store->Find(0, 2);
  ASSERT_NE(map, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(map->data()), map->bytes()), images[1]);
  ASSERT_TRUE(Send(store.get(), 0, 3, images[2], 1 << 20, 3).ok());
  EXPECT_EQ(store->Held(), (std::vector<std::pair<uint32_t, uint64_t>>{{0, 2}, {0, 3}}));
  EXPECT_EQ(test::ReadWholeFile(store->SealedPath(0, 3)), images[2]);
  // A fetch still sending from v2's mapping when retention drops v2: the file goes, but the
  // memory under the fetch stays as it was and is not recycled for the next replica.
  ASSERT_TRUE(Send(store.get(), 0, 4, images[3], 1 << 20, 4).ok());
  EXPECT_EQ(store->Held(), (std::vector<std::pair<uint32_t, uint64_t>>{{0, 3}, {0, 4}}));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(map->data()), map->bytes()), images[1]);
  EXPECT_EQ(Names(rdir), (std::vector<std::string>{"r00000-v00000000000000000003.seg",
                                                   "r00000-v00000000000000000004.seg"}));
  EXPECT_EQ(store->Find(0, 2), nullptr);
}

// The store's files go through its Io (io/mapped_file.h), so fault injection reaches them: a
// mapping the file system refuses (ENOSPC) holds nothing and leaves no file, and a seal whose
// rename fails names the replica, keeps nothing half-sealed, and the next replica goes through.
TEST(ReplicaStoreTest, FaultsInItsFilesHoldNothingAndNameTheReplica) {
  TempDir dir;
  const std::vector<std::string> images = SegmentImages(dir, 3);
  ASSERT_EQ(images.size(), 3u);
  auto posix = io::NewPosixIo();
  io::FaultIo faults(posix.get());
  std::unique_ptr<ReplicaStore> store;
  const std::string rdir = dir.Sub("replicas");
  ASSERT_TRUE(ReplicaStore::Open(&faults, rdir, 2, 0, &store).ok());

  faults.Arm(io::FaultIo::Call::kMap, 1, ENOSPC);
  Status st = Send(store.get(), 0, 1, images[0], 64 << 10, 7);
  EXPECT_TRUE(faults.Fired());
  EXPECT_EQ(st.code(), CKPTDB_ENOSPC) << st.ToString();
  EXPECT_NE(st.message().find("test replica"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("(injected)"), std::string::npos) << st.message();
  EXPECT_TRUE(store->Held().empty());
  EXPECT_EQ(store->held_bytes(), 0u);
  EXPECT_TRUE(Names(rdir).empty()) << "a refused mapping left a file";

  faults.Reset();
  faults.Arm(io::FaultIo::Call::kRename, 1, EIO);  // the seal's rename of .tmp to .seg
  st = Send(store.get(), 0, 1, images[0], 64 << 10, 8);
  EXPECT_TRUE(faults.Fired());
  EXPECT_EQ(st.code(), CKPTDB_EIO) << st.ToString();
  EXPECT_NE(st.message().find("sealing"), std::string::npos) << st.message();
  EXPECT_TRUE(store->Held().empty()) << "a replica whose seal failed is held";
  EXPECT_EQ(store->Find(0, 1), nullptr);

  faults.Reset();
  ASSERT_TRUE(Send(store.get(), 0, 2, images[1], 64 << 10, 9).ok());
  EXPECT_EQ(store->Held(), (std::vector<std::pair<uint32_t, uint64_t>>{{0, 2}}));
  auto map = store->Find(0, 2);
  ASSERT_NE(map, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(map->data()), map->bytes()), images[1]);
  EXPECT_GT(faults.Count(io::FaultIo::Call::kMap) + faults.Count(io::FaultIo::Call::kRename), 0u);
}

}  // namespace
}  // namespace ckpt::engine
