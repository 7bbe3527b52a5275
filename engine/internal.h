// Helpers shared by the engine's source files. Not part of any interface.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "engine/db.h"
#include "util/clock.h"
#include "util/status.h"

namespace ckpt::engine {

inline std::string V(uint64_t version) { return "version " + std::to_string(version); }
inline std::string R(uint32_t rank) { return "rank " + std::to_string(rank); }

// Requests the tier manager may still put in flight: the wake read keeps one slot, and the
// manager never lets Submit wait for a slot (it would wait with completions unhandled).
inline size_t FreeRequestSlots(size_t in_flight, uint32_t queue_depth) {
  return in_flight + 1 >= queue_depth ? 0 : queue_depth - 1 - in_flight;
}

// "0, 2, 5": ranks as messages list them.
inline std::string JoinRanks(const std::vector<uint32_t>& ranks) {
  std::string out;
  for (uint32_t r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// The catalog name of the ram tier; directory tiers are "kind:path".
inline bool IsRamName(const std::string& tier) { return tier == "ram"; }

// Calls the test hook (SetCrashHookForTesting) at a named point.
void CrashPoint(const char* point);

// Copies `bytes` from src to dst in pieces that stay in L1/L2 between the copy and the hash,
// hashing each piece right after copying it (DESIGN.md section 5); returns the XXH3-64 of the
// bytes. docs/performance.md has the piece size sweep.
uint64_t CopyAndHash(uint8_t* dst, const uint8_t* src, uint64_t bytes);

// A tensor name as every call takes it: not NULL, not empty, at most CKPTDB_MAX_NAME_BYTES.
// capture.cc.
Status ValidateName(const char* name, const std::string& call);

// A version's failure as a call reports it: a skip exactly as the skip said it (the caller
// checks for CKPTDB_ESKIPPED and reads why), anything else in the words of the call.
inline Status FailureFor(const Status& st, const std::string& what) {
  return st.code() == CKPTDB_ESKIPPED ? st : st.WithContext(what);
}

inline constexpr uint32_t kMaxCaptureThreads = 64;
// The kernel refuses to register a fixed buffer larger than 1 GiB.
inline constexpr uint64_t kMaxFixedBufferBytes = uint64_t{1} << 30;
// Versions put and not yet committed or aborted, at most (each holds a file and bookkeeping).
inline constexpr size_t kMaxLiveVersions = 64;
// Failed, skipped and aborted versions whose outcome waiters can still ask for.
inline constexpr size_t kMaxOutcomes = 64;
// Bounds on the in-memory history of retired and aborted versions kept for inspect.
inline constexpr size_t kMaxHistoryRecords = 64;
// Packs (docs/format.md, "Packed shards"): the host shards of one put call of at most
// kPackShardBytes share chunks of at most kPackBytes (or chunk_bytes, if smaller), each shard at
// a kPackAlign-aligned offset. A 256-byte shard alone would take a record of 8 KiB.
inline constexpr uint64_t kPackShardBytes = 64 << 10;
inline constexpr uint64_t kPackBytes = 1 << 20;
inline constexpr uint64_t kPackAlign = 64;
// Cached open segments for restore.
inline constexpr size_t kMaxOpenSegments = 16;
// Records a demotion keeps in flight (reads and writes): enough to keep a disk busy while the
// manager checks the next record's checksum.
inline constexpr uint32_t kDemotionRecordsInFlight = 8;
// An nfs tier's retries (engine/db.h, TierState::offline): the first after half a second,
// doubling to at most 16 s; a version's demotion to it is tried at most three times while the
// server answers (a server that restarted between WRITE and COMMIT costs one).
inline constexpr uint64_t kTierRetryFirstNs = 500'000'000;
inline constexpr uint64_t kTierRetryMaxNs = 16'000'000'000;
inline constexpr uint32_t kNfsDemotionTries = 3;

// A reader's pin on a ram copy (taken by ReadSegment or Verify, with mu_), given back when it
// goes out of scope or at Release, so every way out of a read unpins. Inert for a directory
// copy. mu_ must not be held when it is released.
class Db::RamPin {
 public:
  RamPin(Db* db, uint64_t version, bool pinned) : db_(db), version_(version), pinned_(pinned) {}
  RamPin(const RamPin&) = delete;
  RamPin& operator=(const RamPin&) = delete;
  ~RamPin() { Release(); }
  void Release() {
    if (!pinned_) return;
    pinned_ = false;
    std::lock_guard<std::mutex> lock(db_->mu_);
    db_->Unpin(version_);
  }

 private:
  Db* db_;
  uint64_t version_;
  bool pinned_;
};

}  // namespace ckpt::engine
