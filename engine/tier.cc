#include "engine/tier.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>

#include "format/segment_format.h"

namespace ckpt::engine {
namespace {

std::string Marker(uint64_t job_id) {
  char b[96];
  std::snprintf(b, sizeof b, "ckptdb tier\njob_id=%016" PRIx64 "\n", job_id);
  return b;
}

// The job id a marker names, when it is exactly what Marker writes.
bool ParseMarker(const std::string& marker, uint64_t* job_id) {
  static const std::string kPrefix = "ckptdb tier\njob_id=";
  if (marker.size() != kPrefix.size() + 17 || marker.compare(0, kPrefix.size(), kPrefix) != 0 ||
      marker.back() != '\n') {
    return false;
  }
  uint64_t v = 0;
  for (size_t i = kPrefix.size(); i < kPrefix.size() + 16; ++i) {
    const char c = marker[i];
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return false;
    v = (v << 4) | static_cast<uint64_t>(digit);
  }
  *job_id = v;
  return true;
}

}  // namespace

Status Tier::HoldsSegmentsOf(uint64_t job_id, std::string* example) const {
  std::vector<std::string> names;
  Status st = io_->ListDir(spec_.path, &names);
  if (st.code() == CKPTDB_ENOTFOUND) return Status::NotFound("no directory");
  CKPTDB_RETURN_IF_ERROR(st.WithContext("tier " + spec_.name));
  for (const std::string& n : names) {
    SegmentFileName f;
    if (!ParseSegmentFileName(n, &f) || f.temporary) continue;
    std::string bytes;
    const std::string path = spec_.path + "/" + n;
    int fd = -1;
    bool direct = false;
    if (!io_->Open(path, io::OpenOptions{}, &fd, &direct).ok()) continue;
    uint8_t header[format::kBlockBytes];
    ssize_t got = ::pread(fd, header, sizeof header, 0);
    (void)io_->Close(fd);
    format::SegmentHeader h;
    if (got >= 64 &&
        format::DecodeSegmentHeader(std::span<const uint8_t, 64>(header, 64), path, &h).ok() &&
        h.job_id == job_id) {
      *example = path;
      return Status::Ok();
    }
  }
  return Status::NotFound("no segment of job id " + format::Hex64(job_id));
}

Status Tier::RepairMarker(uint64_t job_id, bool* rewrote) {
  *rewrote = false;
  const std::string marker_path = spec_.path + "/" + kMarkerName;
  std::string marker;
  Status st = io_->ReadFile(marker_path, &marker);
  if (st.ok() && marker == Marker(job_id)) return Status::Ok();
  if (!st.ok() && st.code() != CKPTDB_ENOTFOUND) return st.WithContext("tier " + spec_.name);
  std::string ours;
  if (!HoldsSegmentsOf(job_id, &ours).ok()) return Status::Ok();  // not provably this store's
  CKPTDB_RETURN_IF_ERROR(
      io_->WriteFileDurably(marker_path, Marker(job_id)).WithContext("tier " + spec_.name));
  *rewrote = true;
  return Status::Ok();
}

// The ranks of a job may share a tier's directory (a shared disk, an nfs export) and open it at
// once: each writes the marker durably under a name of its own, then renames it into place. The
// bytes are the same whichever rename lands last, and no rank renames another's file away from
// under it (as a shared CKPTDB-TIER.tmp did: "stat CKPTDB-TIER.tmp: No such file"). An nfs
// rename checks that the new name holds the renamed file, which another rank's rename landing
// just after can fail: a marker that then reads as this job's is the one wanted.
Status Tier::WriteMarker(uint64_t job_id) {
  std::random_device random;
  char suffix[40];
  std::snprintf(suffix, sizeof suffix, ".%d-%08x%08x.new", static_cast<int>(::getpid()), random(),
                random());
  const std::string marker_path = spec_.path + "/" + kMarkerName;
  const std::string mine = marker_path + suffix;
  Status st = io_->WriteFileDurably(mine, Marker(job_id));
  if (!st.ok()) {
    (void)io_->Remove(mine);  // best effort: a stray .new file is harmless
    return st;
  }
  st = io_->Rename(mine, marker_path);
  if (!st.ok()) {
    std::string marker;
    if (!io_->ReadFile(marker_path, &marker).ok() || marker != Marker(job_id)) return st;
    (void)io_->Remove(mine);  // another writer's marker of this job stands; ours may remain
  }
  return io_->SyncDir(spec_.path);
}

Status Tier::Open(uint64_t job_id, bool read_only) {
  std::string marker_path = spec_.path + "/" + kMarkerName;
  std::string marker;
  Status st = io_->ReadFile(marker_path, &marker);
  uint64_t named = 0;
  std::string ours;
  if (st.ok()) {
    if (marker != Marker(job_id)) {
      // Another store's directory, or this store's with a damaged marker: the segments tell
      // (their headers carry the job id), and only the second is ECORRUPT.
      if (!ParseMarker(marker, &named) || HoldsSegmentsOf(job_id, &ours).ok()) {
        return Status::Corrupt("tier " + spec_.name + ": its marker " + marker_path +
                               " is damaged (it reads \"" + marker.substr(0, 64) + "\"" +
                               (ours.empty() ? "" : ", and " + ours + " is this store's") +
                               "); nothing was changed (ckptdb repair rewrites it)");
      }
      return Status::Invalid("tier " + spec_.name + " belongs to another store (its " +
                             kMarkerName + " reads \"" + marker.substr(0, 64) +
                             "\"); give this store its own directory");
    }
  } else if (st.code() != CKPTDB_ENOTFOUND) {
    return st.WithContext("tier " + spec_.name);
  } else if (read_only) {
    if (HoldsSegmentsOf(job_id, &ours).ok()) {
      return Status::Corrupt("tier " + spec_.name + ": its marker " + marker_path +
                             " is missing, but " + ours +
                             " is this store's (ckptdb repair rewrites it)");
    }
  } else {
    CKPTDB_RETURN_IF_ERROR(io_->CreateDirs(spec_.path).WithContext("tier " + spec_.name));
    if (HoldsSegmentsOf(job_id, &ours).ok()) {
      return Status::Corrupt("tier " + spec_.name + ": its marker " + marker_path +
                             " is missing, but " + ours +
                             " is this store's; nothing was changed (ckptdb repair rewrites it)");
    }
    std::vector<std::string> names;
    CKPTDB_RETURN_IF_ERROR(io_->ListDir(spec_.path, &names).WithContext("tier " + spec_.name));
    for (const std::string& n : names) {
      SegmentFileName f;
      if (ParseSegmentFileName(n, &f)) {
        return Status::Invalid("tier " + spec_.name + " holds segment " + n +
                               " but no marker: it is not this store's directory");
      }
    }
    CKPTDB_RETURN_IF_ERROR(WriteMarker(job_id).WithContext("tier " + spec_.name));
    wrote_marker_ = true;
  }
  if (read_only) return Status::Ok();
  // Probe O_DIRECT once, on disk tiers only: a memory file system has no page cache to bypass
  // (tmpfs accepts O_DIRECT since Linux 6.6 but gains nothing). Where a disk tier's file system
  // refuses it, the tier falls back to buffered writes; fsync still makes them durable.
  std::string probe = spec_.path + "/.direct-probe";
  int fd = -1;
  io::OpenOptions o;
  o.mode = io::OpenOptions::Mode::kCreateWrite;
  o.direct = spec_.kind == io::TierKind::kDisk;
  CKPTDB_RETURN_IF_ERROR(io_->Open(probe, o, &fd, &direct_).WithContext("tier " + spec_.name));
  CKPTDB_RETURN_IF_ERROR(io_->Close(fd));
  return io_->Remove(probe);
}

std::string Tier::SegmentPath(uint64_t version, uint32_t rank) const {
  char b[64];
  std::snprintf(b, sizeof b, "/v%020" PRIu64 "-r%05" PRIu32 ".seg", version, rank);
  return spec_.path + b;
}

std::string Tier::TempPath(uint64_t version, uint32_t rank) const {
  return SegmentPath(version, rank) + ".tmp";
}

Status Tier::CreateTemp(uint64_t version, uint32_t rank, int* fd) {
  io::OpenOptions o;
  o.mode = io::OpenOptions::Mode::kCreateWrite;
  o.direct = direct_;
  bool direct = false;
  CKPTDB_RETURN_IF_ERROR(io_->Open(TempPath(version, rank), o, fd, &direct));
  return Status::Ok();
}

Status Tier::Publish(uint64_t version, uint32_t rank, int fd) {
  CKPTDB_RETURN_IF_ERROR(io_->Close(fd));
  CKPTDB_RETURN_IF_ERROR(io_->Rename(TempPath(version, rank), SegmentPath(version, rank)));
  return io_->SyncDir(spec_.path);
}

Status Tier::RemoveSegment(uint64_t version, uint32_t rank) {
  CKPTDB_RETURN_IF_ERROR(io_->Remove(TempPath(version, rank)));
  CKPTDB_RETURN_IF_ERROR(io_->Remove(SegmentPath(version, rank)));
  return io_->SyncDir(spec_.path);
}

Status Tier::ListSegments(std::vector<SegmentFileName>* out) const {
  std::vector<std::string> names;
  CKPTDB_RETURN_IF_ERROR(io_->ListDir(spec_.path, &names).WithContext("tier " + spec_.name));
  out->clear();
  for (const std::string& n : names) {
    SegmentFileName f;
    if (ParseSegmentFileName(n, &f)) out->push_back(std::move(f));
  }
  return Status::Ok();
}

bool Tier::ParseSegmentFileName(const std::string& name, SegmentFileName* out) {
  // v<20 digits>-r<5 digits>.seg[.tmp]
  constexpr size_t kBase = 1 + 20 + 2 + 5 + 4;
  if (name.size() != kBase && name.size() != kBase + 4) return false;
  if (name[0] != 'v' || name.compare(21, 2, "-r") != 0 || name.compare(28, 4, ".seg") != 0) {
    return false;
  }
  bool temporary = name.size() == kBase + 4;
  if (temporary && name.compare(kBase, 4, ".tmp") != 0) return false;
  uint64_t version = 0;
  for (size_t i = 1; i < 21; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    if (__builtin_mul_overflow(version, 10, &version) ||
        __builtin_add_overflow(version, static_cast<uint64_t>(name[i] - '0'), &version)) {
      return false;
    }
  }
  uint32_t rank = 0;
  for (size_t i = 23; i < 28; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    rank = rank * 10 + static_cast<uint32_t>(name[i] - '0');
  }
  out->version = version;
  out->rank = rank;
  out->temporary = temporary;
  out->name = name;
  return true;
}

}  // namespace ckpt::engine
