#include "engine/ram_tier.h"

#include <sys/random.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <unordered_map>

#include "engine/internal.h"
#include "format/ram_format.h"
#include "format/segment_format.h"
#include "util/assert.h"

namespace ckpt::engine {
namespace {

using format::kBlockBytes;

}  // namespace

std::string RamTier::ArenaPath(const std::string& dir, uint64_t job_id, uint32_t rank) {
  char b[64];
  std::snprintf(b, sizeof b, "/ckptdb-%016" PRIx64 "-r%05" PRIu32 ".ram", job_id, rank);
  return dir + b;
}

Status RamTier::Open(uint64_t job_id, uint32_t rank, const std::string& given_root,
                     bool read_only) {
  CKPTDB_ASSERT(spec_.kind == io::TierKind::kRam);
  // The header names the root absolute, so that `ckptdb gc` run from anywhere can tell whether
  // the root still owns the arena (engine/arena_gc.h).
  std::error_code ec;
  std::string root_path = std::filesystem::absolute(given_root, ec).lexically_normal().string();
  while (root_path.size() > 1 && root_path.back() == '/') root_path.pop_back();
  if (ec || given_root.empty()) root_path = given_root;
  read_only_ = read_only;
  header_unreadable_ = false;
  unreadable_why_.clear();
  replaced_.clear();
  open_root_path_ = root_path;
  path_ = ArenaPath(spec_.path, job_id, rank);
  if (root_path.size() > format::kArenaMaxRootPathBytes ||
      root_path.find('\0') != std::string::npos) {
    return Status::Invalid("ram tier: the store's root path (" + std::to_string(root_path.size()) +
                           " bytes) is longer than " +
                           std::to_string(format::kArenaMaxRootPathBytes) +
                           " bytes or holds a NUL; the arena header cannot record it");
  }
  io::SharedMemoryOptions& o = open_options_;
  o.read_only = read_only;
  o.create_bytes = spec_.capacity_bytes;
  o.lock = !read_only;  // read-only tools touch only the copies they read
  if (!read_only) CKPTDB_RETURN_IF_ERROR(io_->CreateDirs(spec_.path).WithContext("ram tier"));
  Status st = io_->OpenSharedMemory(path_, o, &memory_);
  if (!st.ok()) {
    if (read_only && st.code() == CKPTDB_ENOTFOUND) return Status::Ok();  // nothing there
    return st.WithContext("ram tier");
  }
  if (memory_->created()) return CreateArena(job_id, rank, root_path);
  st = OpenExisting(job_id, rank, root_path);
  if (!st.ok() || read_only || allocator_ != nullptr) return st;  // (a replaced arena has one)
  allocator_ = std::make_unique<StagingRing>(memory_->bytes() - kHeaderBytes, kBlockBytes);
  return Status::Ok();
}

// A read-only open changes nothing and fails on nothing: an arena it cannot trust is one it
// does not have, and every copy the catalog places there reads as missing. Read-write: `why`.
Status RamTier::Unreadable(const Status& why) {
  if (!read_only_) return why;
  unreadable_why_ = why.message();
  std::fprintf(stderr, "ckptdb: %s; read-only, its copies read as missing\n",
               why.message().c_str());
  memory_.reset();
  return Status::Ok();
}

// OpenExisting where neither header copy is a header of this format (h and st: what each copy
// decoded to): another format's arena, one whose creation was cut short, or damage.
Status RamTier::OpenWithoutHeader(uint64_t job_id, uint32_t rank, const std::string& root_path,
                                  const format::ArenaHeader h[2], const Status st[2],
                                  const std::string& what) {
  const format::ArenaHeader& older = st[0].code() == CKPTDB_ENOTSUP ? h[0] : h[1];
  const bool other_format = st[0].code() == CKPTDB_ENOTSUP || st[1].code() == CKPTDB_ENOTSUP;
  if (read_only_ && other_format) {
    memory_.reset();  // not an arena this build reads: every copy there reads as missing
    return Status::Ok();
  }
  if (other_format && older.format_version < format::kRamFormatVersion) {
    // Written by an older ckptdb: this build does not read its layout (docs/format.md).
    return ReplaceArena(job_id, rank, root_path,
                        what + ": arena format version " + std::to_string(older.format_version) +
                            ", written by an older ckptdb, is not read by this one");
  }
  if (other_format) {
    return Status::NotSupported(
        what + ": arena format version " + std::to_string(older.format_version) +
        ", this build reads " + std::to_string(format::kRamFormatVersion) +
        ": open the store with the newer ckptdb, or delete " + path_ + " to drop the copies in it");
  }
  const uint8_t* p = memory_->data();
  if (!read_only_ && std::all_of(p, p + memory_->bytes(), [](uint8_t b) { return b == 0; })) {
    // Zeros from end to end: an arena whose creation was cut short before its header was
    // written (the file is made and touched first). It holds nothing; finish it.
    std::fprintf(stderr,
                 "ckptdb: %s holds only zeros (its creation was cut short); "
                 "writing its header\n",
                 what.c_str());
    return CreateArena(job_id, rank, root_path);
  }
  // Each record in the arena carries its own checksum and each copy's index names it: they
  // may all be intact. Nothing here is removed or rewritten.
  header_unreadable_ = !read_only_;
  return Unreadable(Status::Corrupt(
      what + ": both header copies are damaged (" + st[0].message() + "; " + st[1].message() +
      "); the arena is left as it is: `ckptdb repair " + root_path +
      "` can rebuild its header from its copies' indexes (or delete " + path_ + " to drop them)"));
}

Status RamTier::OpenExisting(uint64_t job_id, uint32_t rank, const std::string& root_path) {
  const std::string what = "ram tier arena " + path_;
  const char* kCopyName[2] = {"A", "B"};
  // What each copy holds: a header of this format (ok), one whose checksum holds but of another
  // format version (NotSupported), or damage (Corrupt). A file too short for both slots is
  // damage in the copy that does not fit.
  format::ArenaHeader h[2];
  Status st[2];
  for (int c = 0; c < 2; ++c) {
    const uint64_t at = format::kArenaHeaderCopyOffsets[c];
    const std::string copy =
        std::string("header copy ") + kCopyName[c] + " at offset " + std::to_string(at);
    st[c] = memory_->bytes() < at + format::kArenaHeaderCopyBytes
                ? Status::Corrupt(copy + " lies past the end of the " +
                                  std::to_string(memory_->bytes()) + "-byte file")
                : format::DecodeArenaHeaderCopy(
                      std::span<const uint8_t, format::kArenaHeaderCopyBytes>(
                          memory_->data() + at, format::kArenaHeaderCopyBytes),
                      copy, &h[c]);
  }
  int use = -1;
  if (st[0].ok() && st[1].ok()) {
    // Copies are only ever written whole from one header_, whose identity never changes: two
    // valid copies that name different arenas, or equal sequences with different contents, are
    // something no ckptdb wrote, and nothing says which is right.
    const format::ArenaHeader& a = h[0];
    const format::ArenaHeader& b = h[1];
    const bool same_arena = a.job_id == b.job_id && a.rank == b.rank &&
                            a.generation == b.generation && a.created_unix_ns == b.created_unix_ns;
    const bool same_write = a.sequence != b.sequence ||
                            (a.capacity_bytes == b.capacity_bytes && a.root_path == b.root_path);
    if (!same_arena || !same_write) {
      header_unreadable_ = !read_only_;
      return Unreadable(Status::Corrupt(
          what + ": header copies A and B both pass their checksums but disagree (generation " +
          format::Hex64(a.generation) + " sequence " + std::to_string(a.sequence) + " vs " +
          format::Hex64(b.generation) + " sequence " + std::to_string(b.sequence) +
          "); the arena is left as it is: `ckptdb repair " + root_path +
          "` can rebuild its header from its copies' indexes"));
    }
    use = a.sequence >= b.sequence ? 0 : 1;  // a torn rewrite left A newer (A is written first)
  } else if (st[0].ok() || st[1].ok()) {
    use = st[0].ok() ? 0 : 1;
  }
  if (use < 0) return OpenWithoutHeader(job_id, rank, root_path, h, st, what);
  const format::ArenaHeader& chosen = h[use];
  if (chosen.job_id != job_id || chosen.rank != rank) {
    // The name is this store's alone (job id and rank), so an arena there that names another
    // store is a stale copy: its copies are not this store's.
    if (read_only_) {
      memory_.reset();  // not this store's arena: every copy there reads as missing
      return Status::Ok();
    }
    return ReplaceArena(job_id, rank, root_path,
                        what + " belongs to another store (job id " + format::Hex64(chosen.job_id) +
                            ", rank " + std::to_string(chosen.rank) + ")");
  }
  if (memory_->bytes() < kHeaderBytes + kBlockBytes) {
    // No ckptdb makes one (Db's options check asks for more): the header is not to be believed.
    return Unreadable(Status::Corrupt(what + " is " + std::to_string(memory_->bytes()) +
                                      " bytes, too short for its header area and a region"));
  }
  // capacity_bytes may differ from the file's size after a crash inside ResizeToSpec: the
  // file's size is the arena's, and ResizeToSpec rewrites the header.
  header_ = chosen;
  generation_ = chosen.generation;
  if (read_only_) return Status::Ok();
  // First make the other copy agree with the chosen one (same sequence), so that from here on
  // two good copies exist before either is overwritten: rewriting the good copy while the other
  // is damaged would leave none if this process died halfway through.
  const int other = 1 - use;
  if (!st[other].ok()) {
    std::fprintf(stderr, "ckptdb: %s: %s; rewritten from copy %s\n", what.c_str(),
                 st[other].message().c_str(), kCopyName[use]);
    WriteHeaderCopy(other);
  } else if (h[other].sequence != chosen.sequence) {
    WriteHeaderCopy(other);  // a rewrite cut short between the copies: finish it
  }
  if (header_.root_path != root_path) {
    header_.root_path = root_path;
    WriteHeader(header_.capacity_bytes);
  }
  return Status::Ok();
}

Status RamTier::ReplaceArena(uint64_t job_id, uint32_t rank, const std::string& root_path,
                             const std::string& why) {
  CKPTDB_ASSERT(!read_only_);
  std::fprintf(stderr, "ckptdb: %s; replacing it with a new arena\n", why.c_str());
  memory_.reset();
  // Set aside, not removed: the store's open may still fail, and then it comes back.
  const std::string aside = path_ + ".replaced";
  CKPTDB_RETURN_IF_ERROR(io_->Remove(aside));
  CKPTDB_RETURN_IF_ERROR(io_->Rename(path_, aside));
  replaced_ = aside;
  CKPTDB_RETURN_IF_ERROR(
      io_->OpenSharedMemory(path_, open_options_, &memory_).WithContext("ram tier"));
  return CreateArena(job_id, rank, root_path);
}

Status RamTier::CreateArena(uint64_t job_id, uint32_t rank, const std::string& root_path) {
  CKPTDB_ASSERT(!read_only_);
  created_ = true;
  if (memory_->bytes() < kHeaderBytes + kBlockBytes) {
    return Status::Invalid("ram tier: the arena " + path_ + " is " +
                           std::to_string(memory_->bytes()) +
                           " bytes, too small for its header area of " +
                           std::to_string(kHeaderBytes) + " bytes and a region");
  }
  if (getrandom(&generation_, sizeof generation_, 0) != sizeof generation_) {
    return Status::FromErrno(errno, "getrandom for the ram arena's generation");
  }
  header_ = format::ArenaHeader{};
  header_.rank = rank;
  header_.job_id = job_id;
  header_.generation = generation_;
  header_.created_unix_ns = WallNs();
  header_.root_path = root_path;
  std::memset(memory_->data(), 0, kHeaderBytes);
  WriteHeader(memory_->bytes());
  allocator_ = std::make_unique<StagingRing>(memory_->bytes() - kHeaderBytes, kBlockBytes);
  return Status::Ok();
}

Status RamTier::RebuildHeader(uint64_t job_id, uint32_t rank, const std::vector<uint64_t>& known) {
  CKPTDB_ASSERT(!read_only_ && header_unreadable_ && memory_ != nullptr);
  const std::string what = "ram tier arena " + path_;
  const uint64_t capacity = memory_->bytes();
  if (capacity < kHeaderBytes + kBlockBytes) {
    return Status::Corrupt(what + " is " + std::to_string(capacity) +
                           " bytes, too short for its header area and a region");
  }
  // Bounded: one step of 4096 bytes per block, as in ScanImages.
  std::map<uint64_t, uint64_t> indexes;  // generation -> indexes of this store that carry it
  for (uint64_t at = kHeaderBytes; at + kBlockBytes <= capacity; at += kBlockBytes) {
    std::span<const uint8_t> rest(memory_->data() + at, capacity - at);
    if (!format::LooksLikeRamIndex(rest)) continue;
    format::RamIndex index;
    if (!format::DecodeRamIndex(rest, kMaxIndexEntries, what, &index).ok()) continue;
    if (index.job_id == job_id && index.rank == rank) ++indexes[index.generation];
  }
  if (indexes.empty()) {
    return Status::Corrupt(what + ": no index of this store's copies is left in it; its header " +
                           "cannot be rebuilt");
  }
  std::optional<uint64_t> chosen;
  for (uint64_t g : known) {
    if (indexes.count(g) > 0) {
      chosen = g;
      break;
    }
  }
  if (!chosen) {
    auto most = std::max_element(indexes.begin(), indexes.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
    const bool tie = std::count_if(indexes.begin(), indexes.end(),
                                   [&](const auto& g) { return g.second == most->second; }) > 1;
    if (tie) {
      return Status::Corrupt(what + ": its indexes carry " + std::to_string(indexes.size()) +
                             " generations equally often and no record names one; its header " +
                             "cannot be rebuilt");
    }
    chosen = most->first;
  }
  generation_ = *chosen;
  header_ = format::ArenaHeader{};
  header_.rank = rank;
  header_.job_id = job_id;
  header_.generation = generation_;
  header_.created_unix_ns = WallNs();  // the old one is lost with both copies
  header_.root_path = open_root_path_;
  WriteHeader(capacity);
  allocator_ = std::make_unique<StagingRing>(capacity - kHeaderBytes, kBlockBytes);
  header_unreadable_ = false;
  return Status::Ok();
}

bool RamTier::Allocate(uint64_t bytes, StagingRing::Region* out) {
  CKPTDB_ASSERT(allocator_ != nullptr);
  if (!allocator_->Allocate(bytes, out)) return false;
  out->offset += kHeaderBytes;
  return true;
}

void RamTier::Free(const StagingRing::Region& region) {
  CKPTDB_ASSERT(allocator_ != nullptr && region.offset >= kHeaderBytes);
  allocator_->Free({region.offset - kHeaderBytes, region.bytes});
  ++frees_;
}

void RamTier::FreeImage(const RamImage& image) {
  for (const RamExtent& e : image.extents) Free({e.arena_offset, e.bytes});
  if (image.index_bytes != 0) {
    // Erased, so that ScanImages does not offer an evicted copy whose regions may since hold
    // other records. The catalog's EVICTED record is synced first (manager.cc): a crash
    // between the two leaves an index nobody names, which a scan finds as it finds an
    // uncommitted one.
    std::memset(memory_->data() + image.index_offset, 0, format::kRamIndexHeaderBytes);
    Free({image.index_offset, image.index_bytes});
  }
}

Status RamTier::Claim(const RamImage& image) {
  CKPTDB_ASSERT(allocator_ != nullptr);
  std::vector<StagingRing::Region> claimed;
  auto claim = [&](uint64_t offset, uint64_t bytes) {
    if (offset < kHeaderBytes || !allocator_->Claim({offset - kHeaderBytes, bytes})) return false;
    claimed.push_back({offset - kHeaderBytes, bytes});
    return true;
  };
  bool ok = claim(image.index_offset, image.index_bytes);
  for (size_t i = 0; ok && i < image.extents.size(); ++i) {
    ok = claim(image.extents[i].arena_offset, image.extents[i].bytes);
  }
  if (ok) return Status::Ok();
  for (const StagingRing::Region& r : claimed) allocator_->Free(r);
  return Status::Corrupt("ram tier arena " + path_ + ": the copy of version " +
                         std::to_string(image.version) +
                         " overlaps another copy or lies outside the arena");
}

void RamTier::WriteHeaderCopy(int copy) {
  CKPTDB_ASSERT(!read_only_ && (copy == 0 || copy == 1));
  format::EncodeArenaHeaderCopy(
      header_,
      std::span<uint8_t, format::kArenaHeaderCopyBytes>(
          memory_->data() + format::kArenaHeaderCopyOffsets[copy], format::kArenaHeaderCopyBytes));
}

void RamTier::WriteHeader(uint64_t capacity_bytes) {
  header_.capacity_bytes = capacity_bytes;
  ++header_.sequence;
  WriteHeaderCopy(0);
  // Copy B only once copy A is whole, even as the compiler sees it: a process killed between
  // the two leaves A new and B old (Open takes the higher sequence), or A torn and B old (Open
  // takes B), never both torn. The arena is memory: nothing reorders the stores but the
  // compiler, and the arena does not outlive a power loss.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  WriteHeaderCopy(1);
}

Status RamTier::ResizeToSpec() {
  CKPTDB_ASSERT(allocator_ != nullptr && !read_only_);
  const uint64_t want = spec_.capacity_bytes;
  const uint64_t have = memory_->bytes();
  if (want == have) {
    if (header_.capacity_bytes != have) WriteHeader(have);  // a resize cut short by a crash
    return Status::Ok();
  }
  if (!allocator_->Resize(want - kHeaderBytes)) {  // only a shrink can fail
    return Status::Invalid("ram tier: the arena " + path_ + " is " + std::to_string(have) +
                           " bytes and holds committed copies past " + std::to_string(want) +
                           " bytes: ram:" + std::to_string(want) +
                           " cannot hold them; ask for the old size until they are demoted "
                           "and evicted, or delete the arena file to drop them");
  }
  // The header records the smaller size first when shrinking, the file grows first when
  // growing: either way a crash in between leaves a file at least as large as every copy in it,
  // which Open accepts.
  if (want < have) WriteHeader(want);
  Status st = memory_->Resize(want).WithContext("ram tier");
  if (!st.ok()) {
    const bool restored = allocator_->Resize(have - kHeaderBytes);
    CKPTDB_ASSERT(restored);  // nothing was allocated meanwhile
    WriteHeader(have);
    return st;
  }
  if (want > have) WriteHeader(want);
  return Status::Ok();
}

bool RamTier::WriteIndex(uint64_t job_id, uint32_t rank, RamImage* image) {
  format::RamIndex index;
  index.version = image->version;
  index.rank = rank;
  index.file_bytes = image->file_bytes;
  index.generation = generation_;
  index.job_id = job_id;
  index.entries.reserve(image->extents.size());
  for (const RamExtent& e : image->extents) {
    index.entries.push_back({e.logical_offset, e.arena_offset, e.bytes});
  }
  const uint64_t bytes = format::AlignUp(format::RamIndexBytes(index.entries.size()));
  StagingRing::Region region;
  if (!Allocate(bytes, &region)) return false;
  uint8_t* p = memory_->data() + region.offset;
  std::memset(p, 0, region.bytes);
  format::EncodeRamIndex(index, std::span<uint8_t>(p, region.bytes));
  image->index_offset = region.offset;
  image->index_bytes = region.bytes;
  return true;
}

bool RamTier::InArena(uint64_t offset, uint64_t bytes) const {
  const uint64_t capacity = memory_->bytes();
  return offset >= kHeaderBytes && offset <= capacity && bytes <= capacity - offset &&
         format::IsAligned(offset) && format::IsAligned(bytes) && bytes > 0;
}

Status RamTier::ImageFromIndex(const format::RamIndex& index, uint64_t job_id, uint32_t rank,
                               uint64_t index_offset, uint64_t index_bytes, const std::string& what,
                               RamImage* out) const {
  if (index.rank != rank || index.job_id != job_id || index.generation != generation_) {
    return Status::Corrupt(what + ": the index belongs to job " + format::Hex64(index.job_id) +
                           " rank " + std::to_string(index.rank) + " generation " +
                           format::Hex64(index.generation) + ", not this arena");
  }
  if (index.entries.size() < 2) {
    return Status::Corrupt(what + ": the index lists " + std::to_string(index.entries.size()) +
                           " records; a segment has at least a header and a tail");
  }
  RamImage image;
  image.version = index.version;
  image.file_bytes = index.file_bytes;
  image.index_offset = index_offset;
  image.index_bytes = index_bytes;
  uint64_t expect = 0;
  for (const format::RamIndexEntry& e : index.entries) {
    if (e.logical_offset != expect || !InArena(e.arena_offset, e.bytes) ||
        e.bytes > index.file_bytes - expect) {
      return Status::Corrupt(what + ": index entry for segment offset " +
                             std::to_string(e.logical_offset) + " (arena [" +
                             std::to_string(e.arena_offset) + ", +" + std::to_string(e.bytes) +
                             ")) is out of order or out of bounds");
    }
    expect += e.bytes;
    image.extents.push_back({e.logical_offset, e.arena_offset, e.bytes});
  }
  if (expect != index.file_bytes) {
    return Status::Corrupt(what + ": the index covers " + std::to_string(expect) + " of " +
                           std::to_string(index.file_bytes) + " bytes");
  }
  *out = std::move(image);
  return Status::Ok();
}

Status RamTier::LoadImage(uint64_t job_id, uint32_t rank, uint64_t version, uint64_t file_bytes,
                          uint64_t index_offset, uint64_t index_bytes, RamImage* out) const {
  std::string what = "ram tier arena " + path_ + ", version " + std::to_string(version);
  CKPTDB_ASSERT(memory_ != nullptr);
  if (!InArena(index_offset, index_bytes)) {
    return Status::Corrupt(what + ": the catalog places its index at [" +
                           std::to_string(index_offset) + ", +" + std::to_string(index_bytes) +
                           "), outside the arena of " + std::to_string(memory_->bytes()) +
                           " bytes");
  }
  format::RamIndex index;
  CKPTDB_RETURN_IF_ERROR(
      format::DecodeRamIndex(std::span<const uint8_t>(memory_->data() + index_offset, index_bytes),
                             kMaxIndexEntries, what, &index));
  if (index.version != version || index.file_bytes != file_bytes) {
    return Status::Corrupt(what + ": the index describes version " + std::to_string(index.version) +
                           " of rank " + std::to_string(index.rank) + " (" +
                           std::to_string(index.file_bytes) +
                           " bytes), not the copy the catalog recorded");
  }
  return ImageFromIndex(index, job_id, rank, index_offset, index_bytes, what, out);
}

namespace {

// How far a scanned image's own records bear it out, to choose between two indexes that name
// the same version (a version captured again after a crash that left an index uncommitted): the
// segment header and the footer decode and name the version, and when the header was written.
struct Framing {
  bool whole = false;
  uint64_t created_unix_ns = 0;
};

}  // namespace

Status RamTier::ScanImages(uint64_t job_id, uint32_t rank, std::vector<RamImage>* out) const {
  out->clear();
  if (memory_ == nullptr) {
    return Status::State("ram tier arena " + path_ + " is not open; nothing to scan");
  }
  const uint64_t capacity = memory_->bytes();
  const uint8_t* base = memory_->data();
  auto framing = [&](const RamImage& image) {
    Framing f;
    const std::string what = "ram tier arena " + path_ + " scan";
    format::SegmentHeader header;
    format::SegmentFooter footer;
    const uint8_t* head = base + image.extents.front().arena_offset;
    const RamExtent& last = image.extents.back();
    const uint8_t* foot = base + last.arena_offset + last.bytes - format::kFooterBytes;
    if (format::DecodeSegmentHeader(std::span<const uint8_t, 64>(head, 64), what, &header).ok() &&
        header.version == image.version && header.job_id == job_id && header.rank == rank) {
      f.created_unix_ns = header.created_unix_ns;
      f.whole = format::DecodeFooter(std::span<const uint8_t, 64>(foot, 64), what, &footer).ok() &&
                footer.version == image.version && footer.rank == rank &&
                footer.file_bytes == image.file_bytes;
    }
    return f;
  };
  std::vector<Framing> framings;                    // of (*out)[i]
  std::unordered_map<uint64_t, size_t> by_version;  // version -> its place in *out
  // Bounded: one step of 4096 bytes per block; an index found is decoded once, at most
  // kMaxIndexEntries entries.
  for (uint64_t at = kHeaderBytes; at + kBlockBytes <= capacity; at += kBlockBytes) {
    std::span<const uint8_t> rest(base + at, capacity - at);
    if (!format::LooksLikeRamIndex(rest)) continue;
    const std::string what = "ram tier arena " + path_ + ", index at offset " + std::to_string(at);
    format::RamIndex index;
    if (!format::DecodeRamIndex(rest, kMaxIndexEntries, what, &index).ok()) continue;
    const uint64_t index_bytes = format::AlignUp(format::RamIndexBytes(index.entries.size()));
    RamImage image;
    if (!ImageFromIndex(index, job_id, rank, at, index_bytes, what, &image).ok()) continue;
    // Two indexes of one version whose extents both pass: keep the one whose segment header and
    // footer decode and name the version, then the one whose header is newer (the capture that
    // ran after the crash, which the catalog committed), then the first found.
    Framing f = framing(image);
    auto [same, fresh] = by_version.emplace(image.version, out->size());
    if (fresh) {
      out->push_back(std::move(image));
      framings.push_back(f);
      continue;
    }
    Framing& g = framings[same->second];
    if (f.whole != g.whole ? f.whole : f.created_unix_ns > g.created_unix_ns) {
      (*out)[same->second] = std::move(image);
      g = f;
    }
  }
  std::sort(out->begin(), out->end(),
            [](const RamImage& a, const RamImage& b) { return a.version < b.version; });
  return Status::Ok();
}

const RamExtent* RamTier::ExtentAt(const RamImage& image, uint64_t offset) const {
  auto it =
      std::lower_bound(image.extents.begin(), image.extents.end(), offset,
                       [](const RamExtent& e, uint64_t off) { return e.logical_offset < off; });
  if (it == image.extents.end() || it->logical_offset != offset) return nullptr;
  return &*it;
}

Status RamTier::ReadAt(const RamImage& image, uint64_t offset, void* dst, size_t bytes,
                       const std::string& what) const {
  if (offset > image.file_bytes || bytes > image.file_bytes - offset) {
    return Status::Corrupt(what + ": read of " + std::to_string(bytes) + " bytes at offset " +
                           std::to_string(offset) + " runs past the copy's " +
                           std::to_string(image.file_bytes) + " bytes");
  }
  // The extent holding `offset`: the last one starting at or before it.
  auto it =
      std::upper_bound(image.extents.begin(), image.extents.end(), offset,
                       [](uint64_t off, const RamExtent& e) { return off < e.logical_offset; });
  if (bytes == 0) return Status::Ok();
  CKPTDB_ASSERT(it != image.extents.begin());
  auto* out = static_cast<uint8_t*>(dst);
  // Bounded: each round copies at least one byte from one extent; LoadImage checked that the
  // extents are contiguous and cover the copy.
  for (auto e = std::prev(it); bytes > 0; ++e) {
    CKPTDB_ASSERT(e != image.extents.end() && offset >= e->logical_offset);
    const uint64_t within = offset - e->logical_offset;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes, e->bytes - within));
    std::memcpy(out, memory_->data() + e->arena_offset + within, n);
    out += n;
    offset += n;
    bytes -= n;
  }
  return Status::Ok();
}

}  // namespace ckpt::engine
