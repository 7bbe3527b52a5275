// The restore planner's state for one tensor (Db::Restore, read.cc; peer_restore.cc;
// DESIGN.md section 7). Sources are tried fastest first (local ram, a peer's memory, then the
// slower tiers); each reads only the chunks still pending and keeps those that fail its checks
// pending for the next.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "format/manifest.h"
#include "format/segment_format.h"
#include "util/status.h"

namespace ckpt::engine {

struct RestorePlan {
  std::string what;
  bool laid_out = false;  // first/count/chunk sizes known, from the first readable manifest
  uint32_t first = 0;
  uint32_t count = 0;
  std::vector<uint64_t> chunk_bytes;  // chunk first + i's payload bytes
  std::vector<uint64_t> dst_offset;   // where chunk first + i goes in the caller's buffer
  std::vector<uint32_t> pending;      // chunk indexes not yet read and verified, sorted
  std::vector<std::pair<std::string, uint64_t>> served;  // bytes by source, in order tried
  std::string errors;
  uint64_t chunk_failures = 0;
  // A deduplicated replicated shard (REFT's ARC and AEC): the segment's chunks are the pieces
  // its member keeps; the others are gathered from the replica group's members, or decoded from
  // the parity units they keep (GatherSlices).
  struct Dedup {
    uint64_t full_bytes = 0;
    uint64_t piece_bytes = 0;
    std::vector<uint64_t> piece_xxh3;  // every piece's, from this rank's manifest
    std::vector<uint32_t> members;
    uint32_t position = 0;
    bool arc = true;         // member q keeps slice q + 1 too
    bool aec = false;        // members keep parity units (format::AecPlaceOf)
    std::vector<bool> have;  // by piece: in the caller's buffer and verified
  };
  std::optional<Dedup> dedup;
  // What of a chunk the plan reads: its whole payload, or a packed shard's part of it (the
  // shard's own offset, length and xxh3; docs/format.md, "Packed shards").
  struct ChunkPart {
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint64_t xxh3 = 0;
  };
  std::optional<ChunkPart> packed;
  ChunkPart PartOf(const fb::Chunk& c) const {
    return packed ? *packed : ChunkPart{0, c.payload_bytes(), c.xxh3()};
  }
  // restore_slice's ranges, [begin, end); a deduplicated shard ignores them.
  const std::vector<std::pair<uint64_t, uint64_t>>* wanted = nullptr;
  void Note(const std::string& error) { errors += (errors.empty() ? "" : "; ") + error; }
  // A source's fetches of the pending chunks (ranges[i] and results[i] of pending[i]), each
  // checked against xxh3s[i] as "chunk chunks[i] of SRC": those that fail stay pending (a
  // checksum failure counted, the first such message in *problem when it is empty). Returns
  // the bytes of the rest.
  template <typename Range>
  uint64_t KeepVerified(const std::vector<Range>& ranges, const std::vector<Status>& results,
                        const std::vector<uint64_t>& xxh3s, const std::vector<uint32_t>& chunks,
                        const std::string& src, std::string* problem) {
    std::vector<uint32_t> failed;
    uint64_t served = 0;
    for (size_t i = 0; i < ranges.size(); ++i) {
      Status cs = results[i];
      if (cs.ok()) {
        cs = format::CheckXxh3(ranges[i].dst, ranges[i].bytes, xxh3s[i],
                               "chunk " + std::to_string(chunks[i]) + " of " + src);
      }
      if (cs.ok()) {
        served += ranges[i].bytes;
        continue;
      }
      failed.push_back(pending[i]);
      if (cs.code() == CKPTDB_ECORRUPT) {
        chunk_failures++;
        if (problem->empty()) *problem = cs.message();
      }
    }
    pending = std::move(failed);
    return served;
  }
  void Served(const std::string& source, uint64_t bytes) {
    if (bytes > 0) served.emplace_back(source, bytes);
  }
};

// A peer's replica of this rank's segment, its chunk records fetched whole at the first restore
// from it (Db::RestoreFromPeers): one pipelined transfer instead of a round trip a tensor, which
// on a loaded node cost 0.1-27 ms each (a 4 MiB rank of the 32-rank demo took 100 ms from a
// peer, slower than its disk). Each chunk is still checked against its xxh3 as it is copied out.
// Released once every byte was served.
class PeerPrefetch {
 public:
  // Not above this: a larger segment is fetched a tensor at a time (no second copy of a rank's
  // state in memory).
  static constexpr uint64_t kMaxBytes = uint64_t{1} << 30;

  PeerPrefetch() = default;
  PeerPrefetch(const PeerPrefetch&) = delete;
  PeerPrefetch& operator=(const PeerPrefetch&) = delete;
  ~PeerPrefetch() { Release(); }

  // Memory for `bytes` of records (huge pages where the kernel gives them: first touch of new
  // memory is slow on a paravirtualized guest, shared/LIMITS.md). False when it cannot be had.
  bool Allocate(uint64_t bytes);
  void Release();
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  bool holds(uint64_t offset, uint64_t length) const {
    return data_ != nullptr && offset <= bytes_ && length <= bytes_ - offset;
  }
  // `length` bytes were copied out; the memory goes once as many as it holds were.
  void Served(uint64_t length) {
    served_ += length;
    if (served_ >= payload_bytes_) Release();
  }
  void set_payload_bytes(uint64_t b) { payload_bytes_ = b; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t payload_bytes_ = 0;  // what the restores will take out: every chunk's payload
  uint64_t served_ = 0;
};

}  // namespace ckpt::engine
