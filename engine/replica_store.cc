#include "engine/replica_store.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <thread>

#include "format/checksum.h"
#include "format/segment_format.h"
#include "format/segment_reader.h"
#include "util/assert.h"

namespace ckpt::engine {
namespace {

constexpr uint64_t kMaxReplicaBytes = uint64_t{1} << 40;
// Pieces (claims) of one replica at most: a sender that cuts a replica into more is refused
// rather than let it grow the receiver's bookkeeping without bound. Cluster::Replicate sends
// pieces of up to 64 MiB, one or a few arena records each.
constexpr size_t kMaxPiecesPerReplica = format::kMaxChunksPerSegment + 16;

#ifndef MADV_POPULATE_READ  // Linux 5.14; older C library headers lack them
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif

std::string Name(uint32_t owner, uint64_t version) {
  char name[64];
  std::snprintf(name, sizeof name, "r%05" PRIu32 "-v%020" PRIu64 ".seg", owner, version);
  return name;
}

std::string Of(uint32_t owner, uint64_t version) {
  return "replica of v" + std::to_string(version) + " of rank " + std::to_string(owner);
}

Status CheckPieceRange(uint64_t file_bytes, uint64_t offset, uint64_t bytes,
                       const std::string& what) {
  if (file_bytes == 0 || file_bytes > kMaxReplicaBytes || offset > file_bytes ||
      bytes > file_bytes - offset) {
    return Status::Invalid(what + ": the range [" + std::to_string(offset) + ", +" +
                           std::to_string(bytes) + ") lies outside its " +
                           std::to_string(file_bytes) + " bytes");
  }
  return Status::Ok();
}

// Claims [offset, offset + bytes) in `claimed` (ranges by their first byte) unless it overlaps a
// range claimed already.
Status Claim(std::map<uint64_t, uint64_t>* claimed, uint64_t offset, uint64_t bytes,
             const std::string& what) {
  if (bytes == 0) return Status::Ok();
  const uint64_t end = offset + bytes;
  auto next = claimed->upper_bound(offset);
  if ((next != claimed->end() && next->first < end) ||
      (next != claimed->begin() && std::prev(next)->second > offset)) {
    return Status::Invalid(what + ": bytes [" + std::to_string(offset) + ", " +
                           std::to_string(end) + ") arrive a second time (pieces overlap)");
  }
  if (claimed->size() >= kMaxPiecesPerReplica) {
    return Status::Invalid(what + ": more than " + std::to_string(kMaxPiecesPerReplica) +
                           " pieces");
  }
  claimed->emplace_hint(next, offset, end);
  return Status::Ok();
}

}  // namespace

// ---- ReplicaStore ----------------------------------------------------------------------------

Status ReplicaStore::Open(io::Io* io, const std::string& dir, uint32_t keep, uint64_t budget_bytes,
                          std::unique_ptr<ReplicaStore>* out) {
  CKPTDB_ASSERT(keep >= 1);
  std::unique_ptr<ReplicaStore> store(new ReplicaStore(io, dir, keep, budget_bytes));
  io = store->io_;
  CKPTDB_RETURN_IF_ERROR(io->CreateDirs(dir).WithContext("creating the replica directory"));
  // Held while the store lives: ckptdb gc removes nothing in the directory meanwhile.
  CKPTDB_RETURN_IF_ERROR(io::DirLock::Take(dir, &store->dir_lock_));
  std::vector<std::string> names;
  CKPTDB_RETURN_IF_ERROR(io->ListDir(dir, &names).WithContext("listing the replica directory"));
  std::vector<std::pair<uint32_t, std::string>> stale;
  for (const std::string& name : names) {
    unsigned owner = 0;
    unsigned long long version = 0;
    int used = 0;
    if (std::sscanf(name.c_str(), "r%5u-v%20llu.seg%n", &owner, &version, &used) == 2 &&
        name.size() == std::strlen("r00000-v00000000000000000000.seg") &&
        static_cast<size_t>(used) == name.size()) {
      uint64_t bytes = 0;
      if (io->PathSize(dir + "/" + name, &bytes).ok())
        store->sealed_[{owner, version}].file_bytes = bytes;
    } else if (std::sscanf(name.c_str(), "r%5u-v%20llu.seg.tmp%n", &owner, &version, &used) == 2 &&
               static_cast<size_t>(used) == name.size()) {
      stale.emplace_back(owner, dir + "/" + name);  // a dead process's partial replica
    } else if (std::sscanf(name.c_str(), "r%5u.spare%n", &owner, &used) == 1 &&
               static_cast<size_t>(used) == name.size()) {
      store->spares_[owner] = nullptr;
    }
  }
  for (auto& [owner, path] : stale) {
    if (store->spares_.count(owner) == 0 && io->Rename(path, store->SparePath(owner)).ok()) {
      store->spares_[owner] = nullptr;
    } else {
      (void)io->Remove(path);
    }
  }
  *out = std::move(store);
  return Status::Ok();
}

std::string ReplicaStore::SealedPath(uint32_t owner, uint64_t version) const {
  return dir_ + "/" + Name(owner, version);
}
std::string ReplicaStore::TemporaryPath(uint32_t owner, uint64_t version) const {
  return SealedPath(owner, version) + ".tmp";
}
std::string ReplicaStore::SparePath(uint32_t owner) const {
  char name[32];
  std::snprintf(name, sizeof name, "/r%05" PRIu32 ".spare", owner);
  return dir_ + name;
}

Status ReplicaStore::Begin(uint32_t owner, uint64_t version, uint64_t file_bytes,
                           const std::string& what, bool replace_sealed) {
  if (file_bytes == 0 || file_bytes > kMaxReplicaBytes) {
    return Status::Invalid(what + ": a replica of " + std::to_string(file_bytes) +
                           " bytes (1 byte to 1 TiB)");
  }
  Dropped dropped(io_);  // let go after the lock (declared first, destroyed last)
  std::shared_ptr<MappedFile> map;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Key key{owner, version};
    auto stale = sealed_.find(key);
    if (stale != sealed_.end() && !replace_sealed) {
      return Status::State(what + ": already sealed, and v" + std::to_string(version) +
                           " committed");
    }
    auto it = incoming_.find(key);
    if (it != incoming_.end() && it->second.stage == Stage::kSealing) {
      return Status::State(what + ": being sealed");
    }
    if (stale != sealed_.end()) {
      std::shared_ptr<MappedFile> old = std::move(stale->second.map);
      sealed_.erase(stale);
      RetireLocked(owner, SealedPath(owner, version), std::move(old));
    }
    if (it != incoming_.end()) {
      if (it->second.file_bytes != file_bytes) {
        return Status::Invalid(what + ": begun as " + std::to_string(it->second.file_bytes) +
                               " bytes, now " + std::to_string(file_bytes));
      }
      map = it->second.map;
    } else {
      AbandonOlderLocked(owner, version);
      CKPTDB_RETURN_IF_ERROR(FitLocked(owner, file_bytes, what, &dropped));
      Incoming in;
      in.file_bytes = file_bytes;
      const std::string tmp = TemporaryPath(owner, version);
      auto spare = spares_.find(owner);
      if (spare != spares_.end() && io_->Rename(SparePath(owner), tmp).ok()) {
        in.map = std::move(spare->second);
        spares_.erase(spare);
        Status st =
            in.map != nullptr
                ? in.map->Resize(file_bytes, tmp)
                : io_->OpenMappedFile(tmp, io::MappedFileOptions::Existing(file_bytes), &in.map);
        if (!st.ok()) {
          in.map.reset();
          (void)io_->Remove(tmp);
          return st.WithContext(what);
        }
      } else {
        if (spare != spares_.end()) spares_.erase(spare);  // its file is gone
        (void)io_->Remove(tmp);
        Status st = io_->OpenMappedFile(tmp, io::MappedFileOptions::New(file_bytes), &in.map);
        if (!st.ok()) {
          // A file the open made but could not size or map goes again: nothing is held.
          in.map.reset();
          (void)io_->Remove(tmp);
          return st.WithContext(what);
        }
      }
      map = in.map;
      incoming_.emplace(key, std::move(in));
    }
  }
  // Off the lock: new pages may take seconds here.
  Status st = map->Reserve(what);
  std::lock_guard<std::mutex> lock(mu_);
  Incoming* in = FindIncomingLocked({owner, version}, map.get());
  if (in == nullptr) {
    return Status::State(what + ": dropped while its memory was allocated (a newer version of " +
                         "its owner began)");
  }
  if (!st.ok()) {
    // Dropped with its file: pages the file system could not give are no spare.
    incoming_.erase({owner, version});
    (void)io_->Remove(TemporaryPath(owner, version));
    return st;
  }
  if (in->stage == Stage::kReserving) in->stage = Stage::kReceiving;
  return Status::Ok();
}

ReplicaStore::Dropped::~Dropped() {
  maps.clear();  // unmapped first: the pages go with the last of mapping and name
  for (const std::string& path : paths) (void)io->Remove(path);
}

uint64_t ReplicaStore::HeldBytesLocked() const {
  uint64_t total = 0;
  for (const auto& [key, s] : sealed_) total += s.file_bytes;
  for (const auto& [key, in] : incoming_) total += in.file_bytes;
  for (const auto& [owner, map] : spares_) {
    uint64_t bytes = 0;
    if (map != nullptr) {
      total += map->bytes();
    } else if (io_->PathSize(SparePath(owner), &bytes).ok()) {  // an earlier process's, unmapped
      total += bytes;
    }
  }
  return total;
}

Status ReplicaStore::FitLocked(uint32_t owner, uint64_t file_bytes, const std::string& what,
                               Dropped* dropped) {
  if (budget_bytes_ == 0) return Status::Ok();
  auto spare_bytes = [this](uint32_t o, const std::shared_ptr<MappedFile>& map) -> uint64_t {
    uint64_t bytes = 0;
    if (map != nullptr) return map->bytes();
    return io_->PathSize(SparePath(o), &bytes).ok() ? bytes : 0;
  };
  uint64_t held = HeldBytesLocked();
  uint64_t others = 0;  // other owners' spares: only a cache of pages, dropped before refusing
  for (const auto& [o, map] : spares_) {
    const uint64_t bytes = spare_bytes(o, map);
    if (o == owner) {
      held -= std::min(held, bytes);  // reused for this replica: its pages are not extra
    } else {
      others += bytes;
    }
  }
  const uint64_t after = held + file_bytes;
  if (after - std::min(after, others) > budget_bytes_) {
    return Status::NoSpace(what + ": holding it (" + std::to_string(file_bytes) +
                           " bytes) would take the replicas in " + dir_ + " to " +
                           std::to_string(after) + " bytes, over their budget of " +
                           std::to_string(budget_bytes_) + " (the ram tier's replicas=)");
  }
  uint64_t need = after;
  for (auto it = spares_.begin(); need > budget_bytes_ && it != spares_.end();) {
    if (it->first == owner) {
      ++it;
      continue;
    }
    need -= std::min(need, spare_bytes(it->first, it->second));
    const std::string doomed = dir_ + "/dropped-" + std::to_string(dropped_spares_++) + ".spare";
    if (io_->Rename(SparePath(it->first), doomed).ok()) dropped->paths.push_back(doomed);
    if (it->second != nullptr) dropped->maps.push_back(std::move(it->second));
    it = spares_.erase(it);
  }
  return Status::Ok();
}

Status ReplicaStore::Place(uint32_t owner, uint64_t version, uint64_t file_bytes, uint64_t offset,
                           uint64_t bytes, uint8_t** at, std::shared_ptr<MappedFile>* keep) {
  const std::string what = Of(owner, version) + " in " + dir_;
  CKPTDB_RETURN_IF_ERROR(CheckPieceRange(file_bytes, offset, bytes, what));
  std::lock_guard<std::mutex> lock(mu_);
  Status why;
  Incoming* in = ReceivingLocked({owner, version}, nullptr, what, &why);
  if (in == nullptr) return why;
  if (in->file_bytes != file_bytes) {
    return Status::Invalid(what + ": a piece says the replica is " + std::to_string(file_bytes) +
                           " bytes, it was begun as " + std::to_string(in->file_bytes));
  }
  CKPTDB_RETURN_IF_ERROR(Claim(&in->claimed, offset, bytes, what));
  *at = in->map->data() + offset;
  *keep = in->map;
  return Status::Ok();
}

Status ReplicaStore::Received(uint32_t owner, uint64_t version, uint64_t file_bytes,
                              uint64_t offset, std::span<const uint8_t> data,
                              const std::string& what) {
  CKPTDB_RETURN_IF_ERROR(CheckPieceRange(file_bytes, offset, data.size(), what));
  const Key key{owner, version};
  std::shared_ptr<MappedFile> map;
  uint8_t* at = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status why;
    Incoming* in = ReceivingLocked(key, nullptr, what, &why);
    if (in == nullptr) return why;
    if (in->file_bytes != file_bytes) {
      return RefuseLocked(key, Status::Invalid(what + ": a piece says the replica is " +
                                               std::to_string(file_bytes) + " bytes, it was " +
                                               "begun as " + std::to_string(in->file_bytes)));
    }
    at = in->map->data() + offset;
    if (data.data() != at) {
      // Received into the transport's buffer (the Placer did not place it): claimed now.
      Status st = Claim(&in->claimed, offset, data.size(), what);
      if (!st.ok()) return RefuseLocked(key, st);
    } else if (auto claim = in->claimed.find(offset);
               claim == in->claimed.end() || claim->second != offset + data.size()) {
      return RefuseLocked(key, Status::Invalid(what + ": a piece in place that was not placed"));
    }
    map = in->map;
  }
  if (data.data() != at && !data.empty()) std::memcpy(at, data.data(), data.size());
  // Off the lock, on this piece's service thread, while later pieces are still on the wire.
  std::vector<std::pair<uint64_t, LandedRecord>> hashed;
  Status st = HashRecords(owner, version, at, offset, data.size(), what, &hashed);
  std::lock_guard<std::mutex> lock(mu_);
  Status why;
  Incoming* in = ReceivingLocked(key, map.get(), what, &why);
  if (in == nullptr) return why;  // dropped, or its seal began (and fails: this was not counted)
  if (!st.ok()) return RefuseLocked(key, st);
  in->received_bytes += data.size();
  for (const auto& [record_offset, record] : hashed) {
    in->landed.emplace(record_offset, record);
    hashed_.on_arrival += record.payload_bytes;
  }
  return Status::Ok();
}

// Records are framed from the piece's first byte (the first piece's from its second block, past
// the segment header), as Cluster::Replicate cuts pieces at record boundaries. Framing stops at
// anything that is not a chunk record of this replica (owner, version, its own offset) starting
// right there (the manifest, the footer, a record the piece's end cuts, the tail of a record
// larger than a piece, a sender that cut elsewhere): the seal hashes what this did not. A record
// that frames but whose payload fails the xxh3 in its own header is corrupt, whatever the
// manifest will say.
Status ReplicaStore::HashRecords(uint32_t owner, uint64_t version, const uint8_t* piece,
                                 uint64_t offset, uint64_t bytes, const std::string& what,
                                 std::vector<std::pair<uint64_t, LandedRecord>>* out) {
  const uint64_t end = offset + bytes;
  for (uint64_t at = offset == 0 ? format::kBlockBytes : offset;
       format::IsAligned(at) && at < end && end - at >= format::kBlockBytes;) {
    const uint8_t* block = piece + (at - offset);
    format::RecordHeader h;
    if (!format::DecodeRecordHeader(std::span<const uint8_t, 64>(block, 64), what, &h).ok() ||
        h.type != format::RecordType::kChunk || h.record_offset != at || h.rank != owner ||
        h.version != version || h.payload_bytes > end - at - format::kBlockBytes) {
      break;
    }
    const uint64_t xxh3 = format::Xxh3(block + format::kBlockBytes, h.payload_bytes);
    if (xxh3 != h.payload_xxh3) {
      return format::Xxh3Corrupt(
          what + ": chunk " + std::to_string(h.sequence) + " at offset " + std::to_string(at),
          h.payload_xxh3, xxh3);
    }
    out->emplace_back(at, LandedRecord{h.payload_bytes, xxh3});
    // Bounded: each step advances at least one block.
    at += std::min(format::RecordBytes(h.payload_bytes), end - at);
  }
  return Status::Ok();
}

ReplicaStore::Incoming* ReplicaStore::FindIncomingLocked(Key key, const MappedFile* map) {
  auto it = incoming_.find(key);
  if (it == incoming_.end() || (map != nullptr && it->second.map.get() != map)) return nullptr;
  return &it->second;
}

ReplicaStore::Incoming* ReplicaStore::ReceivingLocked(Key key, const MappedFile* map,
                                                      const std::string& what, Status* why) {
  Incoming* in = FindIncomingLocked(key, map);
  if (in == nullptr) {
    *why = Status::State(what + ": a piece for a replica that was not begun (or was dropped)");
  } else if (in->stage == Stage::kReserving) {
    *why = Status::State(what + ": a piece before its begin was answered (its memory is still " +
                         "being allocated)");
    in = nullptr;
  } else if (in->stage == Stage::kSealing) {
    *why = Status::State(what + ": a piece after its seal began");
    in = nullptr;
  }
  return in;
}

Status ReplicaStore::RefuseLocked(Key key, Status why) {
  auto it = incoming_.find(key);
  if (it != incoming_.end()) {
    RetireLocked(key.first, TemporaryPath(key.first, key.second), std::move(it->second.map));
    incoming_.erase(it);
  }
  return why;
}

void ReplicaStore::AbandonOlderLocked(uint32_t owner, uint64_t version) {
  for (auto it = incoming_.lower_bound({owner, 0});
       it != incoming_.end() && it->first.first == owner;) {
    if (it->first.second >= version || it->second.stage == Stage::kSealing) {
      ++it;  // a seal under way finishes (or fails) on its own
      continue;
    }
    RetireLocked(owner, TemporaryPath(owner, it->first.second), std::move(it->second.map));
    it = incoming_.erase(it);
  }
}

void ReplicaStore::RetireLocked(uint32_t owner, const std::string& path,
                                std::shared_ptr<MappedFile> map) {
  // A mapping still held elsewhere (a fetch being sent, a piece still landing) must not be
  // written again: only an unshared one becomes the spare.
  if (spares_.count(owner) == 0 && (map == nullptr || map.use_count() == 1) &&
      io_->Rename(path, SparePath(owner)).ok()) {
    spares_[owner] = std::move(map);
    return;
  }
  (void)io_->Remove(path);
}

Status ReplicaStore::Seal(uint32_t owner, uint64_t version, uint64_t file_bytes,
                          const std::string& what) {
  // The entry stays in incoming_, kSealing, until the seal ends: no begin, piece or abandon
  // touches its file or memory meanwhile.
  Incoming in;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = incoming_.find({owner, version});
    if (it == incoming_.end()) {
      return Status::State(what + ": nothing of it arrived (or it was abandoned)");
    }
    if (it->second.stage != Stage::kReceiving) {
      return Status::State(what + (it->second.stage == Stage::kSealing
                                       ? ": a second seal"
                                       : ": a seal before its begin was answered"));
    }
    it->second.stage = Stage::kSealing;
    in.map = it->second.map;
    in.file_bytes = it->second.file_bytes;
    in.received_bytes = it->second.received_bytes;
    in.landed = std::move(it->second.landed);
  }
  const std::string tmp = TemporaryPath(owner, version);
  Status st;
  if (in.file_bytes != file_bytes || in.received_bytes != file_bytes) {
    st = Status::Corrupt(what + ": " + std::to_string(in.received_bytes) + " bytes arrived of " +
                         std::to_string(file_bytes));
  }
  const uint8_t* image = in.map->data();
  std::unique_ptr<format::SegmentReader> reader;
  if (st.ok()) {
    st = format::SegmentReader::Open(
        what, file_bytes,
        [image, file_bytes, what](uint64_t off, void* buf, size_t len) -> Status {
          if (off > file_bytes || len > file_bytes - off) {
            return Status::Corrupt(what + ": a read past the end at " + std::to_string(off));
          }
          std::memcpy(buf, image + off, len);
          return Status::Ok();
        },
        &reader);
  }
  if (st.ok() && (reader->footer().version != version || reader->footer().rank != owner)) {
    st = Status::Corrupt(what + ": the segment is v" + std::to_string(reader->footer().version) +
                         " of rank " + std::to_string(reader->footer().rank));
  }
  if (st.ok()) {
    // Every chunk's record header against the manifest, from the mapping, and its payload's
    // xxh3: the one taken as the record landed, else taken now, on two threads when there are
    // several (the owner's vote waits for this, and the cores are otherwise idle now).
    const uint32_t chunks = reader->footer().chunk_count;
    std::vector<uint32_t> unhashed;
    for (uint32_t i = 0; i < chunks && st.ok(); ++i) {
      const auto& c = reader->manifest().chunk(i);
      if (c.record_offset() > file_bytes ||
          format::kBlockBytes + c.payload_bytes() > file_bytes - c.record_offset()) {
        st = Status::Corrupt(what + ": chunk " + std::to_string(i) + " lies past the end");
        break;
      }
      auto landed = in.landed.find(c.record_offset());
      if (landed == in.landed.end() || landed->second.payload_bytes != c.payload_bytes()) {
        unhashed.push_back(i);
        continue;
      }
      format::ChunkProblem problem;
      st = reader->CheckRecord(i, image + c.record_offset(), &problem, landed->second.payload_xxh3);
    }
    Status half[2];
    auto check = [&](size_t first, size_t end, Status* out) {
      for (size_t k = first; k < end && out->ok(); ++k) {
        format::ChunkProblem problem;
        *out = reader->CheckRecord(
            unhashed[k], image + reader->manifest().chunk(unhashed[k]).record_offset(), &problem);
      }
    };
    if (st.ok() && unhashed.size() >= 4) {
      std::thread other(check, unhashed.size() / 2, unhashed.size(), &half[1]);
      check(0, unhashed.size() / 2, &half[0]);
      other.join();
    } else if (st.ok()) {
      check(0, unhashed.size(), &half[0]);
    }
    if (st.ok()) st = !half[0].ok() ? half[0] : half[1];
    uint64_t hashed_now = 0;
    for (uint32_t i : unhashed) hashed_now += reader->manifest().chunk(i).payload_bytes();
    std::lock_guard<std::mutex> lock(mu_);
    hashed_.at_seal += hashed_now;
  }
  std::lock_guard<std::mutex> lock(mu_);
  incoming_.erase({owner, version});
  if (!st.ok()) {
    RetireLocked(owner, tmp, std::move(in.map));
    return st;
  }
  if (st = io_->Rename(tmp, SealedPath(owner, version)); !st.ok()) {
    st = st.WithContext(what + ": sealing");
    RetireLocked(owner, tmp, std::move(in.map));
    return st;
  }
  Sealed& s = sealed_[{owner, version}];
  s.file_bytes = file_bytes;
  s.map = std::move(in.map);
  // Retention: the newest keep_ replicas of this owner; the oldest dropped one is the spare.
  std::vector<uint64_t> versions;
  for (auto it = sealed_.lower_bound({owner, 0}); it != sealed_.end() && it->first.first == owner;
       ++it) {
    versions.push_back(it->first.second);
  }
  std::sort(versions.rbegin(), versions.rend());
  for (size_t i = keep_; i < versions.size(); ++i) {
    auto it = sealed_.find({owner, versions[i]});
    RetireLocked(owner, SealedPath(owner, versions[i]), std::move(it->second.map));
    sealed_.erase(it);
  }
  return Status::Ok();
}

std::shared_ptr<MappedFile> ReplicaStore::Find(uint32_t owner, uint64_t version) {
  std::shared_ptr<MappedFile> map;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sealed_.find({owner, version});
    if (it == sealed_.end()) return nullptr;
    if (it->second.map != nullptr) return it->second.map;
    // Sealed by an earlier process: mapped at its size on disk.
    const std::string path = SealedPath(owner, version);
    uint64_t bytes = 0;
    if (!io_->PathSize(path, &bytes).ok() ||
        !io_->OpenMappedFile(path, io::MappedFileOptions::Existing(bytes), &map).ok()) {
      sealed_.erase(it);  // gone (someone removed the file): no longer held
      return nullptr;
    }
    it->second.file_bytes = bytes;
    it->second.map = map;
  }
  // Not populated here: a fetch populates the range it sends from (Cluster::ServeMapped) or
  // reads it with pread (into a one-sided window), so a restarted holder's first answer (often
  // the replica's size) does not wait for every page of it to be mapped (55 ms for 256 MiB).
  return map;
}

std::vector<std::pair<uint32_t, uint64_t>> ReplicaStore::Held() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uint32_t, uint64_t>> out;
  out.reserve(sealed_.size());
  for (const auto& [key, s] : sealed_) out.push_back(key);
  return out;
}

ReplicaStore::HashedBytes ReplicaStore::hashed_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hashed_;
}

uint64_t ReplicaStore::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return HeldBytesLocked();
}

}  // namespace ckpt::engine
