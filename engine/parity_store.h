// ParityStore: the parity a rank holds for its coding group (DESIGN.md section 7; ECHECK), one
// parity segment per (group, version) in a directory on its node's memory file system, so that
// it outlives the process as replicas do (engine/replica_store.h).
//
// A version's parity is built by every member of the group at once (redundancy/stripe_layout.h):
//   1. Announce: each member says how long its segment is. Once all K + M have, the holder
//      knows the stripes and which it holds parity for, lays out its parity segment, and
//      allocates and maps all of its memory (Layout answers Busy until then; a sender that
//      sends data before it is answered is refused).
//   2. Accumulate: each member sends its data units to the M holders of their stripes; the holder
//      adds each, as it lands, into its parity block of that stripe (ErasureCode::Update: parity
//      += coefficient x unit), in any order, with no buffer for them. Each byte range of a unit
//      is taken once. With the group's code encoded at the senders (ec:K+M,encode=sender) a
//      member sends instead its unit's partial product for the holder's row (ErasureCode::
//      Partial), and the holder XORs it in: the same parity, the multiply moved to the sender.
//   3. Done: a member says it sent everything; the holder checks it received exactly what that
//      member's segment length implies. When every member is done the holder seals: each parity
//      block's xxh3 into its record header, the manifest (one tensor per parity block, the
//      group's layout and every member's length), the footer, and a rename into place. Sealed
//      answers Busy until then, and the error once a member's part was refused.
// The parity segment is an ordinary segment (format/segment_format.h, docs/format.md): verify,
// inspect and a fetcher read it as one. Retention keeps the newest `keep` sealed versions per
// group; the one it drops becomes the group's spare, whose pages the next version's parity is
// built in. Memory is bounded by the budget (the ram tier's replicas=) and the file system.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/replica_store.h"
#include "redundancy/erasure_code.h"
#include "redundancy/stripe_layout.h"
#include "util/status.h"

namespace ckpt::engine {

// What every member of a coding group agrees on for a version.
struct CodingGroup {
  redundancy::CodeSpec code;
  uint32_t group = 0;
  uint64_t unit_bytes = 0;
  std::vector<uint32_t> members;  // ranks, in position order (K + M of them)
  bool operator==(const CodingGroup& o) const {
    return code == o.code && group == o.group && unit_bytes == o.unit_bytes && members == o.members;
  }
};

// A parity segment's file name in a holder's directory ("g00000-v00000000000000000003.par"), and
// the tensor name of parity block `row` of stripe `stripe` in it ("parity/s<20 digits>r<2>").
std::string ParitySegmentName(uint32_t group, uint64_t version);
std::string ParityBlockName(uint64_t stripe, uint32_t row);

class ParityStore {
 public:
  // Who writes the parity segments (their header and provenance).
  struct Writer {
    uint64_t job_id = 0;
    uint32_t rank = 0;
    uint32_t world_size = 1;
    std::string node_id;
  };
  // `dir` is created if missing. keep >= 1. budget_bytes: 0 = the file system's. Every file
  // call goes through `io` (nullptr: the store's own POSIX Io), which must outlive the store.
  static Status Open(io::Io* io, const std::string& dir, Writer writer, uint32_t keep,
                     uint64_t budget_bytes, std::unique_ptr<ParityStore>* out);

  // Member `position` of shape.group announces its segment of `version`, segment_bytes long.
  // Every member must announce the same shape, in which this store's rank is a member. Parity of
  // (group, version) sealed already is refused (ESTATE) unless replace_sealed (the version is
  // above this rank's newest commit, so it never committed: Cluster::Hooks::committed); then it
  // is dropped, its pages the group's spare, with the group's parity of newer versions (sealed,
  // or built but not being sealed: none of them committed either), and the version's parity is
  // built again.
  Status Announce(const CodingGroup& shape, uint64_t version, uint32_t position,
                  uint64_t segment_bytes, const std::string& what, bool replace_sealed = false);
  // Ok once every member announced and the parity's memory is allocated (the caller that finds
  // the last announcement allocates, on its service thread); Busy before; the refusal after.
  Status Layout(uint32_t group, uint64_t version, const std::string& what);
  // Bytes [offset, offset + data.size()) of member `position`'s unit `unit` (or, encoded at the
  // senders, of its partial product for this holder's row), added into the parity of its stripe
  // this store holds.
  Status Accumulate(uint32_t group, uint64_t version, uint32_t position, uint64_t unit,
                    uint64_t offset, std::span<const uint8_t> data, const std::string& what);
  // Member `position` sent everything; when it is the last, the parity is sealed.
  Status Done(uint32_t group, uint64_t version, uint32_t position, const std::string& what);
  // Ok once sealed; Busy while members are still sending; the refusal when one's part failed.
  Status Sealed(uint32_t group, uint64_t version, const std::string& what);

  // A sealed parity segment, mapped and populated (nullptr: not held).
  std::shared_ptr<MappedFile> Find(uint32_t group, uint64_t version);
  // Sealed parity, (group, version), sorted.
  std::vector<std::pair<uint32_t, uint64_t>> Held() const;
  uint64_t held_bytes() const;
  std::string SealedPath(uint32_t group, uint64_t version) const;

  ~ParityStore();

 private:
  using Key = std::pair<uint32_t, uint64_t>;
  struct Building;
  struct SealedParity {
    uint64_t file_bytes = 0;
    std::shared_ptr<MappedFile> map;  // mapped on first use
  };
  ParityStore(io::Io* io, std::string dir, Writer writer, uint32_t keep, uint64_t budget_bytes);
  std::string TemporaryPath(uint32_t group, uint64_t version) const;
  std::string SparePath(uint32_t group) const;
  // Lays out and allocates b's parity segment (every member announced). Called without mu_.
  Status Allocate(Building* b, const std::string& what);
  Status Seal(Key key, Building* b, const std::string& what);
  void RetireLocked(uint32_t group, const std::string& path, std::shared_ptr<MappedFile> map);
  void DropLocked(Key key);
  uint64_t HeldBytesLocked() const;

  const std::unique_ptr<io::Io> owned_io_;
  io::Io* const io_;
  const std::string dir_;
  std::unique_ptr<io::DirLock> dir_lock_;  // a shared flock on dir_ (io/shared_memory.h)
  const Writer writer_;
  const uint32_t keep_;
  const uint64_t budget_bytes_;
  mutable std::mutex mu_;
  std::map<Key, std::shared_ptr<Building>> building_;
  std::map<Key, SealedParity> sealed_;
  std::map<uint32_t, std::shared_ptr<MappedFile>> spares_;  // by group; nullptr: not mapped yet
};

}  // namespace ckpt::engine
