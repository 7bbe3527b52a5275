// ReplicaStore: the replicas a rank keeps in its node's memory for its placement peers (DESIGN.md
// section 7, GEMINI), one segment file per (owner rank, version) in a directory on a tmpfs, so
// that they outlive this process and `ckptdb serve` can serve them after it died.
//
// Why it is more than "write a file": replication must run near the network's rate, and on these
// machines a new tmpfs page costs far more than the copy into it (LIMITS.md: first touch 0.3 GB/s,
// tmpfs writes 2-6 GB/s because page allocation dominates). So the store
//   - maps all of a replica's memory when the sender begins it, on a service thread (Begin), so
//     the transport's progress thread, which receives the bytes, never faults in a page;
//   - receives each piece straight into the replica's mapped memory (the transport's Placer
//     hands UCX that address before it fetches the payload: one copy, tcp's or shm's, no
//     receive buffer, no pwrite);
//   - recycles: the replica that retention drops becomes its owner's spare, pages and mapping
//     kept, and the next replica of that owner is received into it; after the first versions a
//     replica costs no page allocation, no page fault and no unlink;
//   - hashes each chunk record as its piece lands (on the service thread that handles the piece,
//     while later pieces are still on the wire), so the seal, which the owner's vote waits for,
//     checks framing, manifest and every record header from the mapping and hashes only the
//     records no piece held whole; a byte range is received once (a piece overlapping another is
//     refused), so a record's bytes never change after they were hashed;
//   - serves fetches from the mapping (the reply's payload is sent from it).
// Memory: per owner, `keep` sealed replicas plus one spare (or the replica being received).
//
// Files in the directory: r{owner}-v{version}.seg (sealed, verified), .seg.tmp (being received),
// r{owner}.spare (a dropped replica's pages, waiting to be reused). A .tmp left by a dead
// process is turned into its owner's spare when the store opens.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "io/io.h"
#include "io/mapped_file.h"
#include "io/shared_memory.h"
#include "util/status.h"

namespace ckpt::engine {

using io::MappedFile;

class ReplicaStore {
 public:
  // `dir` is created if missing. keep >= 1: sealed replicas kept per owner (newest first).
  // budget_bytes: the most memory its replicas (sealed, spare and incoming) may take; 0: as much
  // as the file system under `dir` has. Every file call goes through `io` (nullptr: the store's
  // own POSIX Io), which must outlive the store.
  static Status Open(io::Io* io, const std::string& dir, uint32_t keep, uint64_t budget_bytes,
                     std::unique_ptr<ReplicaStore>* out);

  // Makes room for owner's replica of `version` (file_bytes long) before any piece is sent: the
  // owner's spare when it has one (its pages and mapping reused), else a new file, and maps every
  // page of it now. ENOSPC when the budget (after dropping other owners' spares, which are only
  // a cache of pages) or the file system has no room: nothing is held for it then. On these VMs a
  // new page costs 5-10 times its copy (LIMITS.md); paid here, on a service thread, it never stalls
  // the transport's progress thread (whose receive would otherwise fault the pages in one by one,
  // for seconds, with heartbeats waiting behind it). Idempotent for the same size. A sealed
  // replica of the same (owner, version) is refused (ESTATE) unless replace_sealed: then it is
  // dropped first (its memory becomes the spare the new one is received into; a fetch being
  // served from it keeps its mapping).
  Status Begin(uint32_t owner, uint64_t version, uint64_t file_bytes, const std::string& what,
               bool replace_sealed = false);
  // Where bytes [offset, offset + bytes) of owner's replica of `version` (file_bytes long) go,
  // in the replica Begin made room for; the range is claimed for that piece (a range overlapping
  // a claimed one is refused: no byte is received twice). The transport's Placer calls it on its
  // progress thread: a lookup, it never blocks on more than the store's lock.
  Status Place(uint32_t owner, uint64_t version, uint64_t file_bytes, uint64_t offset,
               uint64_t bytes, uint8_t** at, std::shared_ptr<MappedFile>* keep);
  // Records that a piece landed (`data` is where it is: copied into place, its range claimed
  // now, unless Place had it received there) and hashes the chunk records it holds whole. A
  // record that fails its xxh3 or a range received twice refuses the replica at once: it is
  // dropped (its memory becomes the spare) and the error names what failed.
  Status Received(uint32_t owner, uint64_t version, uint64_t file_bytes, uint64_t offset,
                  std::span<const uint8_t> data, const std::string& what);
  // The last call of a replica: every byte must have arrived; the image is checked (framing,
  // footer naming owner and version, manifest, every chunk's record header against the manifest
  // and its payload's xxh3, hashed when it landed or now) and only then becomes visible.
  // Retention then turns the owner's replicas beyond `keep` into its spare. A replica that fails
  // is dropped (its memory becomes the spare) and the error names what failed.
  Status Seal(uint32_t owner, uint64_t version, uint64_t file_bytes, const std::string& what);
  // A sealed replica, mapped (nullptr: not held).
  std::shared_ptr<MappedFile> Find(uint32_t owner, uint64_t version);
  // Sealed replicas, (owner, version), sorted.
  std::vector<std::pair<uint32_t, uint64_t>> Held() const;
  uint64_t held_bytes() const;  // sealed, spare and incoming replicas' memory
  // Chunk payload bytes hashed as their pieces landed, and by seals (records no piece held whole).
  struct HashedBytes {
    uint64_t on_arrival = 0;
    uint64_t at_seal = 0;
  };
  HashedBytes hashed_bytes() const;

  std::string SealedPath(uint32_t owner, uint64_t version) const;

 private:
  using Key = std::pair<uint32_t, uint64_t>;
  // A chunk record hashed as its piece landed.
  struct LandedRecord {
    uint64_t payload_bytes = 0;
    uint64_t payload_xxh3 = 0;
  };
  // An incoming replica's memory is allocated (Begin) before any piece may land in it, and no
  // piece lands once its seal began: a sender that does not wait for the begin's answer or sends
  // a seal with pieces still on the wire is refused, never written through unallocated pages or
  // into a replica being checked.
  enum class Stage : uint8_t { kReserving, kReceiving, kSealing };
  struct Incoming {
    Stage stage = Stage::kReserving;
    std::shared_ptr<MappedFile> map;
    uint64_t file_bytes = 0;
    uint64_t received_bytes = 0;
    std::map<uint64_t, uint64_t> claimed;     // [offset, end) of every piece placed or received
    std::map<uint64_t, LandedRecord> landed;  // by record offset
  };
  struct Sealed {
    uint64_t file_bytes = 0;
    std::shared_ptr<MappedFile> map;  // mapped on first use
  };
  ReplicaStore(io::Io* io, std::string dir, uint32_t keep, uint64_t budget_bytes)
      : owned_io_(io == nullptr ? io::NewPosixIo() : nullptr),
        io_(io != nullptr ? io : owned_io_.get()),
        dir_(std::move(dir)),
        keep_(keep),
        budget_bytes_(budget_bytes) {}
  uint64_t HeldBytesLocked() const;
  // Spares dropped under the lock and let go after it: unmapping and unlinking GiBs of pages
  // would hold up the transport's progress thread (Place) for as long.
  struct Dropped {
    explicit Dropped(io::Io* io) : io(io) {}
    io::Io* io;
    std::vector<std::shared_ptr<MappedFile>> maps;
    std::vector<std::string> paths;  // renamed out of the way under the lock, unlinked after
    ~Dropped();
  };
  // Checks that `file_bytes` more (less the owner's spare, which it reuses) fit the budget,
  // dropping other owners' spares into *dropped when that makes them fit.
  Status FitLocked(uint32_t owner, uint64_t file_bytes, const std::string& what, Dropped* dropped);
  std::string TemporaryPath(uint32_t owner, uint64_t version) const;
  std::string SparePath(uint32_t owner) const;
  // Makes `map` (the file now at `path`, nobody else holding it) the owner's spare, or removes
  // the file when the owner has one or someone still reads the mapping.
  void RetireLocked(uint32_t owner, const std::string& path, std::shared_ptr<MappedFile> map);
  // Abandons the replicas of `owner` still being received that are older than `version`.
  void AbandonOlderLocked(uint32_t owner, uint64_t version);
  // The replica being received under `key`, if it still is (and still into `map`, when given).
  Incoming* FindIncomingLocked(Key key, const MappedFile* map);
  // The same, in Stage::kReceiving; otherwise nullptr and *why says what it is instead.
  Incoming* ReceivingLocked(Key key, const MappedFile* map, const std::string& what, Status* why);
  // Drops the replica being received under `key` and returns `why`.
  Status RefuseLocked(Key key, Status why);
  // Hashes the chunk records that lie whole in a piece that landed at `piece` (bytes [offset,
  // offset + bytes) of the image) into *out.
  static Status HashRecords(uint32_t owner, uint64_t version, const uint8_t* piece, uint64_t offset,
                            uint64_t bytes, const std::string& what,
                            std::vector<std::pair<uint64_t, LandedRecord>>* out);

  const std::unique_ptr<io::Io> owned_io_;
  io::Io* const io_;
  const std::string dir_;
  std::unique_ptr<io::DirLock> dir_lock_;  // a shared flock on dir_ (io/shared_memory.h)
  const uint32_t keep_;
  const uint64_t budget_bytes_;
  mutable std::mutex mu_;
  std::map<Key, Incoming> incoming_;
  std::map<Key, Sealed> sealed_;
  std::map<uint32_t, std::shared_ptr<MappedFile>> spares_;  // by owner
  HashedBytes hashed_;
  uint64_t dropped_spares_ = 0;  // names the spares FitLocked moves out of the way
};

}  // namespace ckpt::engine
