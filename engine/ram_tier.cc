#include "engine/ram_tier.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

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

Status RamTier::Open(uint64_t job_id, uint32_t rank, bool read_only) {
  CKPTDB_ASSERT(spec_.kind == io::TierKind::kRam);
  read_only_ = read_only;
  path_ = ArenaPath(spec_.path, job_id, rank);
  std::string what = "ram tier arena " + path_;
  io::SharedMemoryOptions o;
  o.read_only = read_only;
  o.create_bytes = spec_.capacity_bytes;
  o.lock = !read_only;  // read-only tools touch only the copies they read
  if (!read_only) CKPTDB_RETURN_IF_ERROR(io_->CreateDirs(spec_.path).WithContext("ram tier"));
  Status st = io_->OpenSharedMemory(path_, o, &memory_);
  if (!st.ok()) {
    if (read_only && st.code() == CKPTDB_ENOTFOUND) return Status::Ok();  // nothing there
    return st.WithContext("ram tier");
  }
  if (memory_->created()) return CreateArena(job_id, rank);
  format::ArenaHeader h;
  st = memory_->bytes() < kHeaderBytes
           ? Status::Corrupt(what + " is shorter than its header")
           : format::DecodeArenaHeader(std::span<const uint8_t, format::kArenaHeaderBytes>(
                                           memory_->data(), format::kArenaHeaderBytes),
                                       what, &h);
  if (st.ok() && (h.job_id != job_id || h.rank != rank)) {
    st = Status::Invalid(what + " belongs to another store (job id " + format::Hex64(h.job_id) +
                         ", rank " + std::to_string(h.rank) + ")");
  }
  // capacity_bytes may differ from the file's size after a crash inside ResizeToSpec: the
  // file's size is the arena's, and ResizeToSpec rewrites the header.
  if (!st.ok()) {
    if (read_only) {
      memory_.reset();  // not this store's arena: every copy there reads as missing
      return Status::Ok();
    }
    // The name is this store's alone (job id and rank), so whatever lies there is a damaged or
    // stale arena of ours: its copies cannot be trusted. Start a new one; the catalog's records
    // of the old generation then read as missing.
    std::fprintf(stderr, "ckptdb: %s; replacing it with a new arena\n", st.message().c_str());
    memory_.reset();
    CKPTDB_RETURN_IF_ERROR(io_->Remove(path_));
    CKPTDB_RETURN_IF_ERROR(io_->OpenSharedMemory(path_, o, &memory_).WithContext("ram tier"));
    return CreateArena(job_id, rank);
  }
  generation_ = h.generation;
  header_ = h;
  if (!read_only) {
    allocator_ = std::make_unique<StagingRing>(memory_->bytes() - kHeaderBytes, kBlockBytes);
  }
  return Status::Ok();
}

Status RamTier::CreateArena(uint64_t job_id, uint32_t rank) {
  created_ = true;
  if (getrandom(&generation_, sizeof generation_, 0) != sizeof generation_) {
    return Status::FromErrno(errno, "getrandom for the ram arena's generation");
  }
  header_ = format::ArenaHeader{};
  header_.rank = rank;
  header_.job_id = job_id;
  header_.generation = generation_;
  header_.created_unix_ns = NowNs();
  std::memset(memory_->data(), 0, kHeaderBytes);
  WriteHeader(memory_->bytes());
  allocator_ = std::make_unique<StagingRing>(memory_->bytes() - kHeaderBytes, kBlockBytes);
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
  if (image.index_bytes != 0) Free({image.index_offset, image.index_bytes});
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

void RamTier::WriteHeader(uint64_t capacity_bytes) {
  header_.capacity_bytes = capacity_bytes;
  format::EncodeArenaHeader(header_, std::span<uint8_t, format::kArenaHeaderBytes>(
                                         memory_->data(), format::kArenaHeaderBytes));
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

Status RamTier::LoadImage(uint64_t job_id, uint32_t rank, uint64_t version, uint64_t file_bytes,
                          uint64_t index_offset, uint64_t index_bytes, RamImage* out) const {
  std::string what = "ram tier arena " + path_ + ", version " + std::to_string(version);
  CKPTDB_ASSERT(memory_ != nullptr);
  const uint64_t capacity = memory_->bytes();
  auto in_arena = [&](uint64_t offset, uint64_t bytes) {
    return offset >= kHeaderBytes && offset <= capacity && bytes <= capacity - offset &&
           format::IsAligned(offset) && format::IsAligned(bytes) && bytes > 0;
  };
  if (!in_arena(index_offset, index_bytes)) {
    return Status::Corrupt(what + ": the catalog places its index at [" +
                           std::to_string(index_offset) + ", +" + std::to_string(index_bytes) +
                           "), outside the arena of " + std::to_string(capacity) + " bytes");
  }
  format::RamIndex index;
  CKPTDB_RETURN_IF_ERROR(
      format::DecodeRamIndex(std::span<const uint8_t>(memory_->data() + index_offset, index_bytes),
                             kMaxIndexEntries, what, &index));
  if (index.version != version || index.rank != rank || index.job_id != job_id ||
      index.generation != generation_ || index.file_bytes != file_bytes) {
    return Status::Corrupt(what + ": the index describes version " + std::to_string(index.version) +
                           " of rank " + std::to_string(index.rank) + " (" +
                           std::to_string(index.file_bytes) +
                           " bytes), not the copy the catalog recorded");
  }
  if (index.entries.size() < 2) {
    return Status::Corrupt(what + ": the index lists " + std::to_string(index.entries.size()) +
                           " records; a segment has at least a header and a tail");
  }
  RamImage image;
  image.version = version;
  image.file_bytes = file_bytes;
  image.index_offset = index_offset;
  image.index_bytes = index_bytes;
  uint64_t expect = 0;
  for (const format::RamIndexEntry& e : index.entries) {
    if (e.logical_offset != expect || !in_arena(e.arena_offset, e.bytes) ||
        e.bytes > file_bytes - expect) {
      return Status::Corrupt(what + ": index entry for segment offset " +
                             std::to_string(e.logical_offset) + " (arena [" +
                             std::to_string(e.arena_offset) + ", +" + std::to_string(e.bytes) +
                             ")) is out of order or out of bounds");
    }
    expect += e.bytes;
    image.extents.push_back({e.logical_offset, e.arena_offset, e.bytes});
  }
  if (expect != file_bytes) {
    return Status::Corrupt(what + ": the index covers " + std::to_string(expect) + " of " +
                           std::to_string(file_bytes) + " bytes");
  }
  *out = std::move(image);
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
