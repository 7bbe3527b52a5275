#include "engine/parity_store.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <set>

#include "format/checksum.h"
#include "format/manifest.h"
#include "format/segment_format.h"
#include "format/segment_writer.h"
#include "util/assert.h"
#include "util/clock.h"

namespace ckpt::engine {
using redundancy::CodeScheme;
using redundancy::CodeSpec;
using redundancy::ErasureCode;
using redundancy::StripeLayout;
namespace {

constexpr uint64_t kMaxSegmentBytes = uint64_t{1} << 40;
// Claims (pieces) of one parity build at most: beyond, a sender is refused rather than let grow
// the holder's bookkeeping without bound. Cluster sends a unit in one piece per arena extent
// (encoded at the senders, per 4 MiB of one).
constexpr size_t kMaxClaims = size_t{1} << 22;
constexpr size_t kMaxStripeLocks = 64;

}  // namespace

std::string ParitySegmentName(uint32_t group, uint64_t version) {
  char name[64];
  std::snprintf(name, sizeof name, "g%05" PRIu32 "-v%020" PRIu64 ".par", group, version);
  return name;
}

std::string ParityBlockName(uint64_t stripe, uint32_t row) {
  char name[64];
  std::snprintf(name, sizeof name, "parity/s%020" PRIu64 "r%02" PRIu32, stripe, row);
  return name;
}

struct ParityStore::Building {
  enum class Stage : uint8_t { kAnnouncing, kAllocating, kAccumulating, kSealing };
  Stage stage = Stage::kAnnouncing;
  bool allocating = false;  // a Layout call is allocating its memory now
  CodingGroup shape;
  uint64_t version = 0;
  uint32_t position = 0;  // this holder's, in shape.members
  std::vector<uint64_t> member_bytes;
  std::vector<bool> announced;
  std::unique_ptr<ErasureCode> code;
  std::unique_ptr<StripeLayout> layout;
  std::shared_ptr<MappedFile> map;
  // The stripes this holder keeps parity for (those with any data), in order.
  std::vector<uint64_t> stripes;
  std::vector<uint32_t> rows;
  std::vector<uint64_t> stripe_bytes;
  std::vector<uint64_t> record_offsets;
  std::map<uint64_t, size_t> index;  // stripe -> position in the vectors above
  uint64_t tail_offset = 0;
  uint64_t manifest_bytes = 0;
  uint64_t file_bytes = 0;
  uint64_t created_unix_ns = 0;
  std::vector<uint64_t> expected;  // bytes each member owes this holder
  std::vector<uint64_t> received;
  std::vector<bool> done;
  std::map<std::pair<uint32_t, uint64_t>, std::map<uint64_t, uint64_t>> claims;  // (member, unit)
  size_t claim_count = 0;
  std::vector<std::mutex> stripe_locks;  // two pieces of one stripe never add at once
  Status refused;

  explicit Building(size_t locks) : stripe_locks(locks) {}
  uint32_t members() const { return static_cast<uint32_t>(shape.members.size()); }
  // The manifest of the parity segment, with the blocks' xxh3 (zero until sealed).
  format::ManifestContents Manifest(const ParityStore::Writer& w,
                                    const std::vector<uint64_t>& xxh3) const {
    format::ManifestContents c;
    c.job_id = w.job_id;
    c.rank = w.rank;
    c.world_size = w.world_size;
    c.version = version;
    c.node_id = w.node_id;
    c.created_unix_ns = created_unix_ns;
    c.writer = "ckptdb parity";
    for (size_t i = 0; i < stripes.size(); ++i) {
      c.chunks.push_back({record_offsets[i], stripe_bytes[i], xxh3[i]});
      format::TensorEntry t;
      t.name = ParityBlockName(stripes[i], rows[i]);
      t.dtype = 2;  // U8
      t.shape = {stripe_bytes[i]};
      t.bytes = stripe_bytes[i];
      t.first_chunk = static_cast<uint32_t>(i);
      t.chunk_count = 1;
      c.tensors.push_back(std::move(t));
    }
    format::RedundancyEntry& r = c.redundancy;
    r.scheme = static_cast<uint8_t>(shape.code.scheme == CodeScheme::kXor
                                        ? fb::RedundancyScheme::Xor
                                        : fb::RedundancyScheme::ReedSolomon);
    r.group = shape.group;
    r.k = shape.code.k;
    r.m = shape.code.m;
    r.stripe_bytes = shape.unit_bytes;
    r.member_ranks = shape.members;
    r.member_bytes = member_bytes;
    r.parity = true;
    r.position = position;
    return c;
  }
};

ParityStore::ParityStore(io::Io* io, std::string dir, Writer writer, uint32_t keep,
                         uint64_t budget_bytes)
    : owned_io_(io == nullptr ? io::NewPosixIo() : nullptr),
      io_(io != nullptr ? io : owned_io_.get()),
      dir_(std::move(dir)),
      writer_(std::move(writer)),
      keep_(keep),
      budget_bytes_(budget_bytes) {}

ParityStore::~ParityStore() = default;

Status ParityStore::Open(io::Io* io, const std::string& dir, Writer writer, uint32_t keep,
                         uint64_t budget_bytes, std::unique_ptr<ParityStore>* out) {
  CKPTDB_ASSERT(keep >= 1 && writer.rank < writer.world_size);
  std::unique_ptr<ParityStore> store(
      new ParityStore(io, dir, std::move(writer), keep, budget_bytes));
  io = store->io_;
  CKPTDB_RETURN_IF_ERROR(io->CreateDirs(dir).WithContext("creating the parity directory"));
  // Held while the store lives: ckptdb gc removes nothing in the directory meanwhile.
  CKPTDB_RETURN_IF_ERROR(io::DirLock::Take(dir, &store->dir_lock_));
  std::vector<std::string> names;
  CKPTDB_RETURN_IF_ERROR(io->ListDir(dir, &names).WithContext("listing the parity directory"));
  std::vector<std::pair<uint32_t, std::string>> stale;
  for (const std::string& name : names) {
    unsigned group = 0;
    unsigned long long version = 0;
    int used = 0;
    if (std::sscanf(name.c_str(), "g%5u-v%20llu.par%n", &group, &version, &used) == 2 &&
        static_cast<size_t>(used) == name.size() && name == ParitySegmentName(group, version)) {
      uint64_t bytes = 0;
      if (io->PathSize(dir + "/" + name, &bytes).ok())
        store->sealed_[{group, version}].file_bytes = bytes;
    } else if (std::sscanf(name.c_str(), "g%5u-v%20llu.par.tmp%n", &group, &version, &used) == 2 &&
               static_cast<size_t>(used) == name.size()) {
      stale.emplace_back(group, dir + "/" + name);  // a dead process's unfinished parity
    } else if (std::sscanf(name.c_str(), "g%5u.spare%n", &group, &used) == 1 &&
               static_cast<size_t>(used) == name.size()) {
      store->spares_[group] = nullptr;
    }
  }
  for (auto& [group, path] : stale) {
    if (store->spares_.count(group) == 0 && io->Rename(path, store->SparePath(group)).ok()) {
      store->spares_[group] = nullptr;
    } else {
      (void)io->Remove(path);
    }
  }
  *out = std::move(store);
  return Status::Ok();
}

std::string ParityStore::SealedPath(uint32_t group, uint64_t version) const {
  return dir_ + "/" + ParitySegmentName(group, version);
}
std::string ParityStore::TemporaryPath(uint32_t group, uint64_t version) const {
  return SealedPath(group, version) + ".tmp";
}
std::string ParityStore::SparePath(uint32_t group) const {
  char name[32];
  std::snprintf(name, sizeof name, "/g%05" PRIu32 ".spare", group);
  return dir_ + name;
}

Status ParityStore::Announce(const CodingGroup& shape, uint64_t version, uint32_t position,
                             uint64_t segment_bytes, const std::string& what, bool replace_sealed) {
  const uint32_t g = shape.code.k + shape.code.m;
  std::unique_ptr<ErasureCode> code;
  Status st = ErasureCode::Make(shape.code, &code);
  if (st.ok() && shape.members.size() != g) {
    st = Status::Invalid(what + ": " + std::to_string(shape.members.size()) + " members for " +
                         shape.code.Name());
  }
  if (st.ok() && std::set<uint32_t>(shape.members.begin(), shape.members.end()).size() != g) {
    st = Status::Invalid(what + ": a rank twice among the group's members");
  }
  auto me = std::find(shape.members.begin(), shape.members.end(), writer_.rank);
  if (st.ok() && me == shape.members.end()) {
    st = Status::Invalid(what + ": rank " + std::to_string(writer_.rank) +
                         " is not a member of that group");
  }
  if (st.ok() && (position >= g || shape.unit_bytes < format::kBlockBytes ||
                  !format::IsAligned(shape.unit_bytes) ||
                  shape.unit_bytes > format::kMaxChunkBytes || segment_bytes > kMaxSegmentBytes)) {
    st = Status::Invalid(what + ": position, unit size or segment size out of range");
  }
  if (!st.ok()) return st;
  const Key key{shape.group, version};
  std::lock_guard<std::mutex> lock(mu_);
  if (sealed_.count(key)) {
    if (!replace_sealed) {
      return Status::State(what + ": its parity is sealed already, and v" +
                           std::to_string(version) + " may have committed");
    }
    // What a killed incarnation of the group left of a version never committed: the restarted
    // job puts that version number again, with other bytes. Its parity goes (its pages the
    // spare), and so does whatever that incarnation built of newer versions (pipelined commits):
    // above a version never committed, none committed either.
    for (auto old = sealed_.lower_bound(key);
         old != sealed_.end() && old->first.first == shape.group;) {
      std::shared_ptr<MappedFile> map = std::move(old->second.map);
      const uint64_t v = old->first.second;
      old = sealed_.erase(old);
      RetireLocked(shape.group, SealedPath(shape.group, v), std::move(map));
    }
    for (auto newer = building_.upper_bound(key);
         newer != building_.end() && newer->first.first == shape.group;) {
      auto next = std::next(newer);
      if (newer->second->stage != Building::Stage::kSealing && !newer->second->allocating) {
        DropLocked(newer->first);
      }
      newer = next;
    }
  }
  auto it = building_.find(key);
  if (it == building_.end()) {
    // A member late for a version the group moved past: refused at once, not left waiting.
    auto newer_build = building_.upper_bound({shape.group, version});
    auto newer_seal = sealed_.upper_bound({shape.group, version});
    if ((newer_build != building_.end() && newer_build->first.first == shape.group) ||
        (newer_seal != sealed_.end() && newer_seal->first.first == shape.group)) {
      return Status::State(what + ": the group has moved on to a newer version");
    }
    // A newer version of the group begins: builds of older ones can no longer finish.
    for (auto old = building_.lower_bound({shape.group, 0}); old != building_.end() &&
                                                             old->first.first == shape.group &&
                                                             old->first.second < version;) {
      if (old->second->stage == Building::Stage::kSealing || old->second->allocating) {
        ++old;
        continue;
      }
      auto next = std::next(old);
      DropLocked(old->first);
      old = next;
    }
    auto b = std::make_shared<Building>(kMaxStripeLocks);
    b->shape = shape;
    b->version = version;
    b->position = static_cast<uint32_t>(me - shape.members.begin());
    b->member_bytes.assign(g, 0);
    b->announced.assign(g, false);
    b->code = std::move(code);
    it = building_.emplace(key, std::move(b)).first;
  }
  Building* b = it->second.get();
  if (!(b->shape == shape)) {
    return Status::Invalid(what +
                           ": announced with another layout than the group's other "
                           "members announced (" +
                           b->shape.code.Spelling() + ", unit " +
                           std::to_string(b->shape.unit_bytes) + ")");
  }
  if (!b->refused.ok()) return b->refused;
  if (b->announced[position]) {
    if (b->member_bytes[position] != segment_bytes) {
      return Status::Invalid(what + ": announced " + std::to_string(segment_bytes) +
                             " bytes, earlier " + std::to_string(b->member_bytes[position]));
    }
    return Status::Ok();
  }
  if (b->stage != Building::Stage::kAnnouncing) {
    return Status::State(what + ": announced after the layout was made");
  }
  b->announced[position] = true;
  b->member_bytes[position] = segment_bytes;
  if (std::all_of(b->announced.begin(), b->announced.end(), [](bool a) { return a; })) {
    b->stage = Building::Stage::kAllocating;
  }
  return Status::Ok();
}

Status ParityStore::Layout(uint32_t group, uint64_t version, const std::string& what) {
  const Key key{group, version};
  std::shared_ptr<Building> b;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sealed_.count(key)) return Status::Ok();
    auto it = building_.find(key);
    if (it == building_.end()) return Status::NotFound(what + ": nothing of it was announced");
    b = it->second;
    if (!b->refused.ok()) return b->refused;
    if (b->stage == Building::Stage::kAnnouncing) {
      const auto n = std::count(b->announced.begin(), b->announced.end(), true);
      return Status::Busy(what + ": " + std::to_string(n) + " of " + std::to_string(b->members()) +
                          " members announced");
    }
    if (b->stage != Building::Stage::kAllocating) return Status::Ok();
    if (b->allocating) return Status::Busy(what + ": its memory is being allocated");
    b->allocating = true;
  }
  // Off the lock: new pages may take seconds here (LIMITS.md, first touch).
  Status st = Allocate(b.get(), what);
  std::lock_guard<std::mutex> lock(mu_);
  b->allocating = false;
  auto it = building_.find(key);
  if (it == building_.end() || it->second != b) {
    return Status::State(what + ": dropped while its memory was allocated");
  }
  if (!st.ok()) {
    b->refused = st;
    return st;
  }
  b->stage = Building::Stage::kAccumulating;
  return Status::Ok();
}

Status ParityStore::Allocate(Building* b, const std::string& what) {
  // Computed into a Building of its own and published under the lock below: Sealed and
  // HeldBytesLocked read these fields under it meanwhile. shape, version, position and
  // member_bytes are fixed once every member announced.
  const CodeSpec& code = b->shape.code;
  Building x(0);
  x.layout = std::make_unique<StripeLayout>(code.k, code.m, b->shape.unit_bytes, b->version);
  const StripeLayout& layout = *x.layout;
  const uint64_t stripes = layout.Stripes(b->member_bytes);
  // Bounded before anything is allocated: the blocks this holder keeps are M of every K + M.
  if (stripes / b->members() * code.m > format::kMaxChunksPerSegment) {
    return Status::Invalid(what + ": " + std::to_string(stripes) +
                           " stripes, more parity blocks than a segment holds (" +
                           std::to_string(format::kMaxChunksPerSegment) +
                           "): a larger CKPTDB_EC_UNIT_BYTES");
  }
  uint64_t offset = format::kBlockBytes;
  x.expected.assign(b->members(), 0);
  x.received.assign(b->members(), 0);
  x.done.assign(b->members(), false);
  for (uint64_t s : layout.ParityStripes(b->position, stripes)) {
    const uint64_t bytes = layout.StripeBytes(b->member_bytes, s);
    if (bytes == 0) continue;  // no data in it: its parity is nothing
    x.index[s] = x.stripes.size();
    x.stripes.push_back(s);
    x.rows.push_back(*layout.ParityRow(s, b->position));
    x.stripe_bytes.push_back(bytes);
    x.record_offsets.push_back(offset);
    offset += format::RecordBytes(bytes);
    for (uint32_t i = 0; i < code.k; ++i) {
      const uint32_t p = layout.DataMember(s, i);
      x.expected[p] += layout.UnitBytes(b->member_bytes[p], layout.DataUnit(s, i));
    }
  }
  if (x.stripes.size() > format::kMaxChunksPerSegment) {
    return Status::Invalid(what + ": " + std::to_string(x.stripes.size()) +
                           " parity blocks (at most " +
                           std::to_string(format::kMaxChunksPerSegment) + ")");
  }
  x.shape = b->shape;
  x.version = b->version;
  x.position = b->position;
  x.member_bytes = b->member_bytes;
  x.created_unix_ns = WallNs();
  x.tail_offset = offset;
  x.manifest_bytes =
      format::BuildManifest(x.Manifest(writer_, std::vector<uint64_t>(x.stripes.size(), 0))).size();
  x.file_bytes = offset + format::TailBytes(x.manifest_bytes);
  const std::string tmp = TemporaryPath(b->shape.group, b->version);
  bool fresh = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<MappedFile> spare;
    uint64_t spare_bytes = 0;
    auto it = spares_.find(b->shape.group);
    if (it != spares_.end()) {
      uint64_t on_disk = 0;
      spare_bytes = it->second != nullptr                                     ? it->second->bytes()
                    : io_->PathSize(SparePath(b->shape.group), &on_disk).ok() ? on_disk
                                                                              : 0;
    }
    const uint64_t all = HeldBytesLocked();  // b's file_bytes are not published yet: 0
    const uint64_t held = all - std::min(all, spare_bytes);  // the spare is reused
    if (budget_bytes_ != 0 && held + x.file_bytes > budget_bytes_) {
      return Status::NoSpace(what + ": its parity (" + std::to_string(x.file_bytes) +
                             " bytes) would take the parity held in " + dir_ + " to " +
                             std::to_string(held + x.file_bytes) + " bytes, over their budget of " +
                             std::to_string(budget_bytes_) + " (the ram tier's replicas=)");
    }
    b->layout = std::move(x.layout);
    b->expected = std::move(x.expected);
    b->received = std::move(x.received);
    b->done = std::move(x.done);
    b->index = std::move(x.index);
    b->stripes = std::move(x.stripes);
    b->rows = std::move(x.rows);
    b->stripe_bytes = std::move(x.stripe_bytes);
    b->record_offsets = std::move(x.record_offsets);
    b->created_unix_ns = x.created_unix_ns;
    b->tail_offset = x.tail_offset;
    b->manifest_bytes = x.manifest_bytes;
    b->file_bytes = x.file_bytes;
    if (it != spares_.end() && io_->Rename(SparePath(b->shape.group), tmp).ok()) {
      spare = std::move(it->second);
      spares_.erase(it);
      Status st =
          spare != nullptr
              ? spare->Resize(b->file_bytes, tmp)
              : io_->OpenMappedFile(tmp, io::MappedFileOptions::Existing(b->file_bytes), &spare);
      if (!st.ok()) {
        (void)io_->Remove(tmp);
        return st.WithContext(what);
      }
      b->map = std::move(spare);
    } else {
      if (it != spares_.end()) spares_.erase(it);  // its file is gone
      (void)io_->Remove(tmp);
      Status st = io_->OpenMappedFile(tmp, io::MappedFileOptions::New(b->file_bytes), &b->map);
      if (!st.ok()) {
        // A file the open made but could not size or map goes again: nothing is held.
        b->map.reset();
        (void)io_->Remove(tmp);
        return st.WithContext(what);
      }
      fresh = true;
    }
  }
  Status st = b->map->Reserve(what);
  if (st.ok() && !fresh) {
    // A spare's pages hold an older version's parity: the blocks start from zero.
    std::memset(b->map->data(), 0, b->file_bytes);
  }
  if (!st.ok()) {
    (void)io_->Remove(tmp);
    b->map.reset();
  }
  return st;
}

Status ParityStore::Accumulate(uint32_t group, uint64_t version, uint32_t position, uint64_t unit,
                               uint64_t offset, std::span<const uint8_t> data,
                               const std::string& what) {
  const Key key{group, version};
  std::shared_ptr<Building> b;
  std::shared_ptr<MappedFile> map;
  uint8_t* parity = nullptr;
  size_t index = 0;
  uint32_t slot = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = building_.find(key);
    if (it == building_.end()) {
      return Status::State(what + ": data for parity that was not announced (or was dropped)");
    }
    b = it->second;
    if (!b->refused.ok()) return b->refused;
    if (b->stage != Building::Stage::kAccumulating) {
      return Status::State(what + (b->stage == Building::Stage::kSealing
                                       ? ": data after every member said it was done"
                                       : ": data before the layout was answered"));
    }
    auto refuse = [&](Status why) {
      b->refused = why;
      return why;
    };
    if (position >= b->members() || b->done[position]) {
      return refuse(
          Status::Invalid(what + ": data from member " + std::to_string(position) +
                          (position >= b->members() ? ", not a member" : " after its done")));
    }
    const StripeLayout::Slot where = b->layout->DataSlot(position, unit);
    auto at = b->index.find(where.stripe);
    const uint64_t unit_bytes = b->layout->UnitBytes(b->member_bytes[position], unit);
    if (at == b->index.end() || data.empty() || offset > unit_bytes ||
        data.size() > unit_bytes - offset) {
      return refuse(Status::Invalid(
          what + ": bytes [" + std::to_string(offset) + ", +" + std::to_string(data.size()) +
          ") of unit " + std::to_string(unit) + " of member " + std::to_string(position) +
          (at == b->index.end() ? " belong to a stripe whose parity this rank does not hold"
                                : " lie outside that unit")));
    }
    auto& ranges = b->claims[{position, unit}];
    const uint64_t end = offset + data.size();
    auto next = ranges.upper_bound(offset);
    if ((next != ranges.end() && next->first < end) ||
        (next != ranges.begin() && std::prev(next)->second > offset)) {
      return refuse(Status::Invalid(what + ": bytes [" + std::to_string(offset) + ", " +
                                    std::to_string(end) + ") of unit " + std::to_string(unit) +
                                    " of member " + std::to_string(position) +
                                    " arrive a second time"));
    }
    if (++b->claim_count > kMaxClaims) {
      return refuse(
          Status::Invalid(what + ": more than " + std::to_string(kMaxClaims) + " pieces"));
    }
    ranges.emplace_hint(next, offset, end);
    index = at->second;
    slot = where.index;
    map = b->map;  // held across the update: a newer version may drop this build meanwhile
    parity = map->data() + b->record_offsets[index] + format::kBlockBytes + offset;
  }
  {
    // Off the store's lock; one stripe's blocks are added one at a time.
    std::lock_guard<std::mutex> stripe(b->stripe_locks[index % b->stripe_locks.size()]);
    const uint32_t row = b->rows[index];
    if (b->shape.code.encoding == redundancy::Encoding::kSender) {
      // The sender multiplied (ErasureCode::Partial): the reduction's target only adds.
      redundancy::XorInto(parity, data.data(), data.size());
    } else {
      b->code->Update(data.size(), slot, data.data(), std::span<const uint32_t>(&row, 1), &parity);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!b->refused.ok()) return b->refused;
  b->received[position] += data.size();
  return Status::Ok();
}

Status ParityStore::Done(uint32_t group, uint64_t version, uint32_t position,
                         const std::string& what) {
  const Key key{group, version};
  std::shared_ptr<Building> b;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sealed_.count(key)) return Status::Ok();
    auto it = building_.find(key);
    if (it == building_.end()) return Status::State(what + ": done with parity never announced");
    b = it->second;
    if (!b->refused.ok()) return b->refused;
    if (b->stage != Building::Stage::kAccumulating || position >= b->members()) {
      return Status::State(what + ": done before the layout was answered");
    }
    if (b->done[position]) return Status::Ok();
    if (b->received[position] != b->expected[position]) {
      b->refused = Status::Corrupt(what + ": member " + std::to_string(position) + " (rank " +
                                   std::to_string(b->shape.members[position]) + ") sent " +
                                   std::to_string(b->received[position]) + " of the " +
                                   std::to_string(b->expected[position]) +
                                   " bytes its segment owes this holder's parity");
      return b->refused;
    }
    b->done[position] = true;
    if (!std::all_of(b->done.begin(), b->done.end(), [](bool d) { return d; })) {
      return Status::Ok();
    }
    b->stage = Building::Stage::kSealing;
  }
  Status st = Seal(key, b.get(), what);
  if (!st.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    b->refused = st;
    b->stage = Building::Stage::kAccumulating;  // no longer sealing: a newer version drops it
  }
  return st;
}

Status ParityStore::Seal(Key key, Building* b, const std::string& what) {
  uint8_t* image = b->map->data();
  std::vector<uint64_t> xxh3(b->stripes.size());
  for (size_t i = 0; i < b->stripes.size(); ++i) {
    uint8_t* record = image + b->record_offsets[i];
    xxh3[i] = format::Xxh3(record + format::kBlockBytes, b->stripe_bytes[i]);
    format::RecordHeader rh =
        format::ChunkRecordHeader(b->version, writer_.rank, static_cast<uint32_t>(i),
                                  b->stripe_bytes[i], b->record_offsets[i]);
    rh.payload_xxh3 = xxh3[i];
    format::EncodeRecordHeaderBlock(rh, record);
  }
  format::SegmentHeader h;
  h.job_id = writer_.job_id;
  h.version = b->version;
  h.rank = writer_.rank;
  h.world_size = writer_.world_size;
  h.chunk_bytes = b->shape.unit_bytes;
  h.created_unix_ns = b->created_unix_ns;
  format::EncodeSegmentHeaderBlock(h, image);
  const std::vector<uint8_t> manifest = format::BuildManifest(b->Manifest(writer_, xxh3));
  CKPTDB_ASSERT(manifest.size() == b->manifest_bytes);  // struct fields: the size is fixed
  const uint64_t tail_bytes = b->file_bytes - b->tail_offset;
  std::memset(image + b->tail_offset, 0, tail_bytes);
  format::EncodeSegmentTail(image + b->tail_offset, tail_bytes, manifest,
                            format::Xxh3(manifest.data(), manifest.size()), b->tail_offset,
                            b->version, writer_.rank, static_cast<uint32_t>(b->stripes.size()));
  const std::string tmp = TemporaryPath(key.first, key.second);
  std::lock_guard<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(io_->Rename(tmp, SealedPath(key.first, key.second)).WithContext(what));
  SealedParity& s = sealed_[key];
  s.file_bytes = b->file_bytes;
  s.map = b->map;
  building_.erase(key);
  // Retention: the newest keep_ of the group; the oldest dropped becomes its spare.
  std::vector<uint64_t> versions;
  for (auto it = sealed_.lower_bound({key.first, 0});
       it != sealed_.end() && it->first.first == key.first; ++it) {
    versions.push_back(it->first.second);
  }
  std::sort(versions.rbegin(), versions.rend());
  for (size_t i = keep_; i < versions.size(); ++i) {
    auto it = sealed_.find({key.first, versions[i]});
    RetireLocked(key.first, SealedPath(key.first, versions[i]), std::move(it->second.map));
    sealed_.erase(it);
  }
  return Status::Ok();
}

Status ParityStore::Sealed(uint32_t group, uint64_t version, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  const Key key{group, version};
  if (sealed_.count(key)) return Status::Ok();
  auto it = building_.find(key);
  if (it == building_.end()) return Status::NotFound(what + ": no parity of it here");
  const Building& b = *it->second;
  if (!b.refused.ok()) return b.refused;
  const auto n = b.done.empty() ? 0 : std::count(b.done.begin(), b.done.end(), true);
  return Status::Busy(what + ": " + std::to_string(n) + " of " + std::to_string(b.members()) +
                      " members done");
}

void ParityStore::RetireLocked(uint32_t group, const std::string& path,
                               std::shared_ptr<MappedFile> map) {
  // A mapping still held elsewhere (a fetch being sent) is not written again.
  if (spares_.count(group) == 0 && (map == nullptr || map.use_count() == 1) &&
      io_->Rename(path, SparePath(group)).ok()) {
    spares_[group] = std::move(map);
    return;
  }
  (void)io_->Remove(path);
}

void ParityStore::DropLocked(Key key) {
  auto it = building_.find(key);
  if (it == building_.end()) return;
  std::shared_ptr<MappedFile> map = std::move(it->second->map);
  building_.erase(it);
  if (map != nullptr) {
    RetireLocked(key.first, TemporaryPath(key.first, key.second), std::move(map));
  } else {
    (void)io_->Remove(TemporaryPath(key.first, key.second));
  }
}

std::shared_ptr<MappedFile> ParityStore::Find(uint32_t group, uint64_t version) {
  std::shared_ptr<MappedFile> map;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sealed_.find({group, version});
    if (it == sealed_.end()) return nullptr;
    if (it->second.map != nullptr) return it->second.map;
    const std::string path = SealedPath(group, version);
    uint64_t bytes = 0;
    if (!io_->PathSize(path, &bytes).ok() ||
        !io_->OpenMappedFile(path, io::MappedFileOptions::Existing(bytes), &map).ok()) {
      sealed_.erase(it);
      return nullptr;
    }
    it->second.file_bytes = bytes;
    it->second.map = map;
  }
  (void)map->Reserve(SealedPath(group, version));  // pages exist: populates only
  return map;
}

std::vector<std::pair<uint32_t, uint64_t>> ParityStore::Held() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uint32_t, uint64_t>> out;
  for (const auto& [key, s] : sealed_) out.push_back(key);
  return out;
}

uint64_t ParityStore::HeldBytesLocked() const {
  uint64_t total = 0;
  for (const auto& [key, s] : sealed_) total += s.file_bytes;
  for (const auto& [key, b] : building_) total += b->file_bytes;
  for (const auto& [group, map] : spares_) {
    uint64_t bytes = 0;
    if (map != nullptr) {
      total += map->bytes();
    } else if (io_->PathSize(SparePath(group), &bytes).ok()) {
      total += bytes;
    }
  }
  return total;
}

uint64_t ParityStore::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return HeldBytesLocked();
}

}  // namespace ckpt::engine
