#include "engine/replica_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "format/segment_format.h"
#include "format/segment_reader.h"
#include "util/assert.h"

namespace ckpt::engine {
namespace {

constexpr uint64_t kMaxReplicaBytes = uint64_t{1} << 40;

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

}  // namespace

// ---- MappedFile ------------------------------------------------------------------------------

Status MappedFile::Open(const std::string& path, bool create, uint64_t bytes,
                        std::shared_ptr<MappedFile>* out) {
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->fd_ = open(path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0), 0600);
  if (m->fd_ < 0) return Status::FromErrno(errno, path);
  CKPTDB_RETURN_IF_ERROR(m->Resize(bytes, path));
  *out = std::move(m);
  return Status::Ok();
}

Status MappedFile::OpenReadOnly(const std::string& path, std::shared_ptr<MappedFile>* out) {
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->writable_ = false;
  m->fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (m->fd_ < 0) return Status::FromErrno(errno, path);
  struct stat sb {};
  if (fstat(m->fd_, &sb) != 0) return Status::FromErrno(errno, path);
  if (sb.st_size > 0) {
    void* p = mmap(nullptr, static_cast<size_t>(sb.st_size), PROT_READ, MAP_SHARED, m->fd_, 0);
    if (p == MAP_FAILED) return Status::FromErrno(errno, path + ": mmap");
    m->data_ = static_cast<uint8_t*>(p);
    m->bytes_ = static_cast<uint64_t>(sb.st_size);
  }
  *out = std::move(m);
  return Status::Ok();
}

void MappedFile::Populate(uint64_t offset, uint64_t bytes) const {
  if (data_ == nullptr || offset >= bytes_) return;
  const uint64_t page = 4096;
  uint64_t first = offset & ~(page - 1);
  uint64_t end = std::min(bytes_, offset + std::min(bytes, bytes_ - offset));
  // Best effort: a kernel without MADV_POPULATE_* (EINVAL) leaves the pages to fault in.
  if (madvise(data_ + first, end - first, writable_ ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) ==
          0 &&
      first == 0 && end == bytes_) {
    populated_ = true;
  }
}

void MappedFile::PopulateOnce() const {
  if (!populated_) Populate(0, bytes_);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(data_, bytes_);
  if (fd_ >= 0) close(fd_);
}

Status MappedFile::Resize(uint64_t bytes, const std::string& what) {
  if (bytes == bytes_ && (data_ != nullptr || bytes == 0)) return Status::Ok();
  if (data_ != nullptr) munmap(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
  populated_ = false;
  if (ftruncate(fd_, static_cast<off_t>(bytes)) != 0) return Status::FromErrno(errno, what);
  if (bytes == 0) return Status::Ok();
  // Not populated here, under the store's lock: Begin and Find populate after letting it go, so
  // that Place (the transport's progress thread) never waits for new pages (LIMITS.md: first
  // touch 0.3 GB/s).
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) return Status::FromErrno(errno, what + ": mmap");
  data_ = static_cast<uint8_t*>(p);
  bytes_ = bytes;
  return Status::Ok();
}

// ---- ReplicaStore ----------------------------------------------------------------------------

Status ReplicaStore::Open(const std::string& dir, uint32_t keep,
                          std::unique_ptr<ReplicaStore>* out) {
  CKPTDB_ASSERT(keep >= 1);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("creating the replica directory " + dir + ": " + ec.message());
  std::unique_ptr<ReplicaStore> store(new ReplicaStore(dir, keep));
  std::vector<std::pair<uint32_t, std::string>> stale;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    unsigned owner = 0;
    unsigned long long version = 0;
    int used = 0;
    if (std::sscanf(name.c_str(), "r%5u-v%20llu.seg%n", &owner, &version, &used) == 2 &&
        name.size() == std::strlen("r00000-v00000000000000000000.seg") &&
        static_cast<size_t>(used) == name.size()) {
      store->sealed_[{owner, version}].file_bytes = entry.file_size(ec);
    } else if (std::sscanf(name.c_str(), "r%5u-v%20llu.seg.tmp%n", &owner, &version, &used) == 2 &&
               static_cast<size_t>(used) == name.size()) {
      stale.emplace_back(owner, entry.path().string());  // a dead process's partial replica
    } else if (std::sscanf(name.c_str(), "r%5u.spare%n", &owner, &used) == 1 &&
               static_cast<size_t>(used) == name.size()) {
      store->spares_[owner] = nullptr;
    }
  }
  if (ec) return Status::IoError("listing the replica directory " + dir + ": " + ec.message());
  for (auto& [owner, path] : stale) {
    if (store->spares_.count(owner) == 0 &&
        rename(path.c_str(), store->SparePath(owner).c_str()) == 0) {
      store->spares_[owner] = nullptr;
    } else {
      std::filesystem::remove(path, ec);
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
                           const std::string& what) {
  if (file_bytes == 0 || file_bytes > kMaxReplicaBytes) {
    return Status::Invalid(what + ": a replica of " + std::to_string(file_bytes) +
                           " bytes (1 byte to 1 TiB)");
  }
  std::shared_ptr<MappedFile> map;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Key key{owner, version};
    if (sealed_.count(key)) return Status::State(what + ": already sealed");
    auto it = incoming_.find(key);
    if (it != incoming_.end()) {
      if (it->second.file_bytes != file_bytes) {
        return Status::Invalid(what + ": begun as " + std::to_string(it->second.file_bytes) +
                               " bytes, now " + std::to_string(file_bytes));
      }
      map = it->second.map;
    } else {
      AbandonOlderLocked(owner, version);
      Incoming in;
      in.file_bytes = file_bytes;
      const std::string tmp = TemporaryPath(owner, version);
      auto spare = spares_.find(owner);
      if (spare != spares_.end() && rename(SparePath(owner).c_str(), tmp.c_str()) == 0) {
        in.map = std::move(spare->second);
        spares_.erase(spare);
        Status st = in.map != nullptr ? in.map->Resize(file_bytes, tmp)
                                      : MappedFile::Open(tmp, false, file_bytes, &in.map);
        if (!st.ok()) {
          in.map.reset();
          std::error_code ec;
          std::filesystem::remove(tmp, ec);
          return st.WithContext(what);
        }
      } else {
        if (spare != spares_.end()) spares_.erase(spare);  // its file is gone
        std::error_code ec;
        std::filesystem::remove(tmp, ec);
        CKPTDB_RETURN_IF_ERROR(MappedFile::Open(tmp, true, file_bytes, &in.map).WithContext(what));
      }
      map = in.map;
      incoming_.emplace(key, std::move(in));
    }
  }
  map->PopulateOnce();  // off the lock: new pages may take seconds here
  return Status::Ok();
}

Status ReplicaStore::Place(uint32_t owner, uint64_t version, uint64_t file_bytes, uint64_t offset,
                           uint64_t bytes, uint8_t** at, std::shared_ptr<MappedFile>* keep) {
  const std::string what = Of(owner, version) + " in " + dir_;
  if (file_bytes == 0 || file_bytes > kMaxReplicaBytes || offset > file_bytes ||
      bytes > file_bytes - offset) {
    return Status::Invalid(what + ": the range [" + std::to_string(offset) + ", +" +
                           std::to_string(bytes) + ") lies outside its " +
                           std::to_string(file_bytes) + " bytes");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = incoming_.find({owner, version});
  if (it == incoming_.end()) {
    return Status::State(what + ": a piece for a replica that was not begun (or was abandoned)");
  }
  if (it->second.file_bytes != file_bytes) {
    return Status::Invalid(what + ": a piece says the replica is " + std::to_string(file_bytes) +
                           " bytes, it was begun as " + std::to_string(it->second.file_bytes));
  }
  *at = it->second.map->data() + offset;
  *keep = it->second.map;
  return Status::Ok();
}

Status ReplicaStore::Received(uint32_t owner, uint64_t version, uint64_t file_bytes,
                              uint64_t offset, std::span<const uint8_t> data,
                              const std::string& what) {
  uint8_t* at = nullptr;
  std::shared_ptr<MappedFile> map;
  CKPTDB_RETURN_IF_ERROR(Place(owner, version, file_bytes, offset, data.size(), &at, &map));
  if (at != data.data() && !data.empty()) std::memcpy(at, data.data(), data.size());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = incoming_.find({owner, version});
  if (it == incoming_.end() || it->second.map != map) {
    return Status::State(what + ": the replica was abandoned while this piece arrived");
  }
  it->second.received_bytes += data.size();
  return Status::Ok();
}

void ReplicaStore::AbandonOlderLocked(uint32_t owner, uint64_t version) {
  for (auto it = incoming_.lower_bound({owner, 0});
       it != incoming_.end() && it->first.first == owner;) {
    if (it->first.second >= version) {
      ++it;
      continue;
    }
    RetireLocked(owner, TemporaryPath(owner, it->first.second), std::move(it->second.map));
    it = incoming_.erase(it);
  }
}

void ReplicaStore::RetireLocked(uint32_t owner, const std::string& path,
                                std::shared_ptr<MappedFile> map) {
  std::error_code ec;
  // A mapping still held elsewhere (a fetch being sent, a piece still landing) must not be
  // written again: only an unshared one becomes the spare.
  if (spares_.count(owner) == 0 && (map == nullptr || map.use_count() == 1) &&
      rename(path.c_str(), SparePath(owner).c_str()) == 0) {
    spares_[owner] = std::move(map);
    return;
  }
  std::filesystem::remove(path, ec);
}

Status ReplicaStore::Seal(uint32_t owner, uint64_t version, uint64_t file_bytes,
                          const std::string& what) {
  Incoming in;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = incoming_.find({owner, version});
    if (it == incoming_.end()) {
      return Status::State(what + ": nothing of it arrived (or it was abandoned)");
    }
    in = std::move(it->second);
    incoming_.erase(it);
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
    // Every chunk, from the mapping, on two threads: the replica's acknowledgement (and so the
    // owner's vote) waits for this, and the cores are otherwise idle at this point.
    const uint32_t chunks = reader->footer().chunk_count;
    Status half[2];
    auto check = [&](uint32_t first, uint32_t end, Status* out) {
      for (uint32_t i = first; i < end; ++i) {
        const auto& c = reader->manifest().chunk(i);
        format::ChunkProblem problem;
        if (c.record_offset() > file_bytes ||
            format::kBlockBytes + c.payload_bytes() > file_bytes - c.record_offset()) {
          *out = Status::Corrupt(what + ": chunk " + std::to_string(i) + " lies past the end");
          return;
        }
        Status s = reader->CheckRecord(i, image + c.record_offset(), &problem);
        if (!s.ok()) {
          *out = s;
          return;
        }
      }
    };
    const uint32_t mid = chunks / 2;
    if (chunks >= 4) {
      std::thread other(check, mid, chunks, &half[1]);
      check(0, mid, &half[0]);
      other.join();
    } else {
      check(0, chunks, &half[0]);
    }
    st = !half[0].ok() ? half[0] : half[1];
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!st.ok()) {
    RetireLocked(owner, tmp, std::move(in.map));
    return st;
  }
  if (rename(tmp.c_str(), SealedPath(owner, version).c_str()) != 0) {
    st = Status::FromErrno(errno, tmp);
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
    struct stat sb {};
    if (stat(path.c_str(), &sb) != 0 ||
        !MappedFile::Open(path, false, static_cast<uint64_t>(sb.st_size), &map).ok()) {
      sealed_.erase(it);  // gone (someone removed the file): no longer held
      return nullptr;
    }
    it->second.file_bytes = static_cast<uint64_t>(sb.st_size);
    it->second.map = map;
  }
  // Fetches send from it next. Off the lock, as in Begin: Place, on the progress thread, never
  // waits for a populate.
  map->PopulateOnce();
  return map;
}

std::vector<std::pair<uint32_t, uint64_t>> ReplicaStore::Held() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uint32_t, uint64_t>> out;
  out.reserve(sealed_.size());
  for (const auto& [key, s] : sealed_) out.push_back(key);
  return out;
}

uint64_t ReplicaStore::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t total = 0;
  for (const auto& [key, s] : sealed_) total += s.file_bytes;
  for (const auto& [key, in] : incoming_) total += in.file_bytes;
  for (const auto& [owner, map] : spares_) total += map != nullptr ? map->bytes() : 0;
  return total;
}

}  // namespace ckpt::engine
