// The put path (DESIGN.md section 5; docs/api.md, ckptdb_put_shard and ckptdb_put_shards): each
// shard checked without the lock, then under it against the version (names, limits, its state),
// laid out in the segment and its chunks queued for the capture workers (capture.cc), or
// captured by the caller with CKPTDB_PUT_COPY_NOW. A batched put checks every shard before it
// changes anything.
#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/db.h"
#include "engine/internal.h"
#include "format/segment_format.h"
#include "util/text.h"

namespace ckpt::engine {
namespace {

using format::kBlockBytes;

// `what()` names the put: built only for a refusal (a batched put checks every shard).
template <typename What>
Status ValidateTensorInfo(const ckptdb_tensor_info* info, const What& what, size_t nbytes,
                          format::TensorEntry* t) {
  if (info == nullptr) return Status::Ok();
  if (info->dtype < 0 || info->dtype >= CKPTDB_DTYPE_COUNT_) {
    return Status::Invalid(what() + ": unknown dtype " + std::to_string(info->dtype));
  }
  if (info->ndim > CKPTDB_MAX_DIMS) {
    return Status::Invalid(what() + ": ndim " + std::to_string(info->ndim) + " exceeds " +
                           std::to_string(CKPTDB_MAX_DIMS));
  }
  size_t element_bytes = format::DTypeBytes(static_cast<uint32_t>(info->dtype));
  uint64_t elements = 1;
  for (uint32_t d = 0; d < info->ndim; ++d) {
    if (__builtin_mul_overflow(elements, info->shape[d], &elements)) {
      return Status::Invalid(what() + ": shape overflows 64 bits");
    }
  }
  bool scalar_or_shaped = info->ndim > 0 || info->dtype != CKPTDB_DTYPE_UNKNOWN;
  uint64_t expected = 0;
  if (scalar_or_shaped &&
      (__builtin_mul_overflow(elements, element_bytes, &expected) || expected != nbytes)) {
    std::string shape;
    for (uint32_t d = 0; d < info->ndim; ++d)
      shape += (d ? "x" : "") + std::to_string(info->shape[d]);
    return Status::Invalid(what() + ": shape [" + shape + "] of " + ckptdb_dtype_name(info->dtype) +
                           " is " + std::to_string(expected) + " bytes, but nbytes is " +
                           std::to_string(nbytes));
  }
  bool global = false;
  for (uint32_t d = 0; d < info->ndim; ++d) global |= info->global_shape[d] != 0;
  for (uint32_t d = 0; d < info->ndim; ++d) {
    if (!global && info->global_offset[d] != 0) {
      return Status::Invalid(what() + ": global_offset given without global_shape");
    }
    uint64_t end;
    if (global && (__builtin_add_overflow(info->global_offset[d], info->shape[d], &end) ||
                   end > info->global_shape[d])) {
      return Status::Invalid(what() + ": in dimension " + std::to_string(d) + " the shard [" +
                             std::to_string(info->global_offset[d]) + ", +" +
                             std::to_string(info->shape[d]) + ") lies outside global size " +
                             std::to_string(info->global_shape[d]));
    }
  }
  t->dtype = static_cast<uint8_t>(info->dtype);
  t->shape.assign(info->shape, info->shape + info->ndim);
  if (global) {
    t->global_shape.assign(info->global_shape, info->global_shape + info->ndim);
    t->global_offset.assign(info->global_offset, info->global_offset + info->ndim);
  }
  return Status::Ok();
}

}  // namespace

Status Db::ValidatePut(uint64_t version, const char* name, const void* data, size_t nbytes,
                       const ckptdb_tensor_info* info, unsigned flags, format::TensorEntry* t) {
  CKPTDB_RETURN_IF_ERROR(ValidateName(name, "put_shard"));
  auto what = [&] { return "put_shard " + QuoteName(name) + " into " + V(version); };
  if (options_.read_only) return Status::State(what() + ": the store is open read-only");
  if (version == CKPTDB_ALL_VERSIONS) return Status::Invalid(what() + ": that value is reserved");
  if (flags &
      ~(CKPTDB_PUT_COPY_NOW | CKPTDB_PUT_DEVICE | CKPTDB_PUT_REPLICATED | CKPTDB_PUT_RECOMPUTED)) {
    return Status::Invalid(what() + ": unknown flags " + std::to_string(flags));
  }
  if ((flags & CKPTDB_PUT_REPLICATED) && (flags & CKPTDB_PUT_RECOMPUTED)) {
    return Status::Invalid(what() +
                           ": CKPTDB_PUT_REPLICATED and CKPTDB_PUT_RECOMPUTED at once (a shard "
                           "is either every member's or the next member's)");
  }
  if (std::string_view(name).starts_with(format::kRecomputedPrefix)) {
    return Status::Invalid(what() + ": names beginning with '" +
                           std::string(format::kRecomputedPrefix) +
                           "' are reserved for recomputed replicas (CKPTDB_PUT_RECOMPUTED)");
  }
  if ((flags & CKPTDB_PUT_DEVICE) && !DeviceConfigured()) {
    return Status::NotSupported(what() +
                                ": device memory needs a CUDA or HIP build, or the simulated "
                                "device (device \"sim\")");
  }
  if (data == nullptr && nbytes > 0) return Status::Invalid(what() + ": data is NULL");
  t->name = name;
  if (flags & CKPTDB_PUT_RECOMPUTED) {
    // Stored beside this rank's own shard of the same name (docs/format.md, "Recomputed
    // replicas"): under the reserved prefix, which must leave the name within the limit.
    if (t->name.size() + format::kRecomputedPrefix.size() > CKPTDB_MAX_NAME_BYTES) {
      return Status::Invalid(what() + ": a recomputed replica's name is stored with the prefix '" +
                             std::string(format::kRecomputedPrefix) + "' and must then fit " +
                             std::to_string(CKPTDB_MAX_NAME_BYTES) + " bytes");
    }
    t->name.insert(0, format::kRecomputedPrefix);
    t->recomputed = true;
  }
  t->bytes = nbytes;
  return ValidateTensorInfo(info, what, nbytes, t);
}

// The live version `version`, created when this is its first put. Checks what a put into it
// must satisfy; changes nothing when it fails.
Status Db::LiveVersionFor(uint64_t version, LiveVersion** out) {
  auto it = live_.find(version);
  if (it != live_.end()) {
    LiveVersion& v = it->second;
    if (!v.error.ok()) return FailureFor(v.error, V(version) + " failed and is being aborted");
    if (v.abort_requested) return Status::State(V(version) + " is being aborted");
    if (v.commit_requested) {
      return Status::State(V(version) + " is being committed; put shards into a new version");
    }
    *out = &v;
    return Status::Ok();
  }
  auto known = versions_.find(version);
  if (known != versions_.end()) {
    int s = known->second.record.state;
    if (s == CKPTDB_STATE_COMMITTED || s == CKPTDB_STATE_RETIRED) {
      return Status::State(V(version) + " is already committed; put shards into a new version");
    }
  }
  std::optional<uint64_t> last = LastCommitted();
  if (last && version <= *last) {
    return Status::State(V(version) + " is not above the last committed version " +
                         std::to_string(*last) + "; versions must increase");
  }
  if (live_.size() >= kMaxLiveVersions) {
    return Status::State(V(version) + ": " + std::to_string(live_.size()) +
                         " versions are already open (the most at once); commit or abort some");
  }
  if (auto failed = outcomes_.find(version);
      failed != outcomes_.end() && !failed->second.may_put_again) {
    return FailureFor(failed->second.status,
                      V(version) + " failed; put its shards into a new version");
  }
  LiveVersion& v = live_[version];
  v.tensors = spare_entries_.Take();
  v.version = version;
  v.generation = next_generation_++;
  v.created_unix_ns = WallNs();
  v.first_put_mono_ns = MonoNs();
  v.ram = tiers_[0].is_ram();
  v.next_offset = kBlockBytes;  // after the segment header block
  outcomes_.erase(version);     // an earlier, aborted attempt at this number
  *out = &v;
  return Status::Ok();
}

// A shard's checks that need no lock (docs/api.md, ckptdb_put_shard, errors 1-7).
Status Db::PrepareShard(uint64_t version, const char* name, const void* data, size_t nbytes,
                        const ckptdb_tensor_info* info, unsigned flags, PreparedShard* out) {
  CKPTDB_RETURN_IF_ERROR(ValidatePut(version, name, data, nbytes, info, flags, &out->t));
  out->data = static_cast<const uint8_t*>(data);
  out->nbytes = nbytes;
  out->flags = flags;
  out->device = -1;
  // GPU memory: named by CKPTDB_PUT_DEVICE, or recognized once the device is open. Its chunks are
  // copied by the device's copy engine into staging (pinned), then hashed there. A host build
  // without the simulated device refused the flag above and has no device memory to recognize.
  if (nbytes == 0 || !DeviceConfigured()) return Status::Ok();
  const std::string what = "put_shard " + QuoteName(out->t.name) + " into " + V(version);
  CKPTDB_RETURN_IF_ERROR(LocateDevice(data, (flags & CKPTDB_PUT_DEVICE) != 0, what, &out->device));
  if (out->device >= 0 && (flags & CKPTDB_PUT_REPLICATED)) {
    return Status::NotSupported(what +
                                ": a replicated shard in device memory (the replica "
                                "group hashes pieces it does not keep in place)");
  }
  return Status::Ok();
}

Status Db::PutShard(uint64_t version, const char* name, const void* data, size_t nbytes,
                    const ckptdb_tensor_info* info, unsigned flags) {
  const uint64_t start = MonoNs();
  std::vector<PreparedShard> one(1);
  CKPTDB_RETURN_IF_ERROR(PrepareShard(version, name, data, nbytes, info, flags, &one[0]));
  return PutPrepared(version, &one, nullptr, start);
}

Status Db::PutShards(uint64_t version, const ckptdb_shard* shards, size_t count) {
  const uint64_t start = MonoNs();
  const std::string call = "put_shards into " + V(version);
  if (shards == nullptr && count > 0) return Status::Invalid(call + ": shards is NULL");
  if (count > format::kMaxTensorsPerSegment) {
    return Status::Invalid(call + ": " + std::to_string(count) +
                           " shards; a version holds at most " +
                           std::to_string(format::kMaxTensorsPerSegment) + " tensors");
  }
  if (options_.read_only) return Status::State(call + ": the store is open read-only");
  if (version == CKPTDB_ALL_VERSIONS) return Status::Invalid(call + ": that value is reserved");
  if (count == 0) return Status::Ok();
  auto context = [&](size_t i) {
    return "put_shards: shard " + std::to_string(i) + " of " + std::to_string(count);
  };
  std::vector<PreparedShard> batch = spare_batch_.Take();
  struct GiveBack {  // on every way out: the shards' memory serves the next call
    SpareVector<PreparedShard>& spare;
    std::vector<PreparedShard>& batch;
    ~GiveBack() { spare.Give(std::move(batch)); }
  } give_back{spare_batch_, batch};
  batch.resize(count);
  for (size_t i = 0; i < count; ++i) {
    const ckptdb_shard& s = shards[i];
    Status st = PrepareShard(version, s.name, s.data, s.nbytes, s.info, s.flags, &batch[i]);
    if (!st.ok()) return st.WithContext(context(i));  // (the context is built for a refusal only)
  }
  // Names differ within the call as across calls: the first shard that repeats an earlier one.
  std::unordered_map<std::string_view, uint32_t> first_named;
  first_named.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const auto [at, fresh] = first_named.emplace(batch[i].t.name, static_cast<uint32_t>(i));
    if (!fresh) {
      return Status::Exists(context(i) + ": put_shard " + QuoteName(batch[i].t.name) + " into " +
                            V(version) + ": shard " + std::to_string(at->second) +
                            " has the same name");
    }
  }
  return PutPrepared(version, &batch, context, start);
}

Status Db::PutPrepared(uint64_t version, std::vector<PreparedShard>* shards,
                       const std::function<std::string(size_t)>& context, uint64_t start) {
  auto in_context = [&](Status st, size_t i) { return context ? st.WithContext(context(i)) : st; };
  std::unique_lock<std::mutex> lock(mu_);
  CKPTDB_RETURN_IF_ERROR(CheckNotClosed());
  const uint64_t chunk_bytes = options_.chunk_bytes;
  uint64_t batch_chunks = 0;
  for (size_t i = 0; i < shards->size(); ++i) {
    const PreparedShard& s = (*shards)[i];
    Status st = CheckPutLocked(version, s, batch_chunks, i);
    if (!st.ok()) return in_context(st, i);
    batch_chunks += (s.nbytes + chunk_bytes - 1) / chunk_bytes;
  }
  LiveVersion* v = nullptr;
  Status st = LiveVersionFor(version, &v);
  if (!st.ok()) {
    const std::string what =
        context ? "put_shards into " + V(version)
                : "put_shard " + QuoteName((*shards)[0].t.name) + " into " + V(version);
    return st.WithContext(what);
  }
  if (shards->size() > 1) {  // a batch: room for it at once (one shard: the usual growth)
    v->names.reserve(v->names.size() + shards->size());
    const size_t need = v->tensors.size() + shards->size();
    if (need > v->tensors.capacity()) {
      v->tensors.reserve(std::max(need, 2 * v->tensors.capacity()));
    }
  }
  std::vector<uint32_t> own_chunks;  // COPY_NOW: captured by this thread
  std::vector<uint32_t> own_pieces;
  uint64_t bytes = 0;
  const size_t queued_before = tasks_.size();
  // Small host shards share chunks when the call has several (docs/format.md, "Packed shards").
  std::vector<uint32_t> packable;
  for (size_t i = 0; i < shards->size(); ++i) {
    const PreparedShard& s = (*shards)[i];
    // Never a recomputed replica (REFT's AOR): its owner's restore reads its chunks whole. The
    // owner's packed private shard is compared with it by its own hash.
    if (s.nbytes > 0 && s.nbytes <= std::min(kPackShardBytes, PackLimit()) && s.device < 0 &&
        !(s.flags & (CKPTDB_PUT_REPLICATED | CKPTDB_PUT_RECOMPUTED))) {
      packable.push_back(static_cast<uint32_t>(i));
    }
  }
  if (packable.size() < 2) packable.clear();
  size_t next_packable = 0;
  for (size_t i = 0; i < shards->size(); ++i) {
    PreparedShard& s = (*shards)[i];
    bytes += s.nbytes;
    if (next_packable < packable.size() && packable[next_packable] == i) {
      ++next_packable;
      continue;
    }
    AddShardLocked(v, std::move(s), &own_chunks, &own_pieces);
  }
  AddPacksLocked(v, shards, packable, &own_chunks);
  v->stats.put_calls += shards->size();
  v->stats.bytes += bytes;
  figures_.put_calls += shards->size();
  figures_.put_bytes += bytes;
  if (!v->opened) WakeManager();
  // The workers take the queued chunks while this thread captures its own (COPY_NOW).
  if (tasks_.size() != queued_before) work_cv_.notify_all();
  Status result;
  if (!own_chunks.empty() || !own_pieces.empty()) {
    result = CaptureOnCallerLocked(lock, version, v->generation, own_pieces, own_chunks);
  }
  const uint64_t blocked = MonoNs() - start;
  figures_.put_blocked_ns += blocked;
  if (auto live = live_.find(version); live != live_.end()) {
    live->second.stats.put_blocked_ns += blocked;
  }
  return result;
}

void Db::AddShardLocked(LiveVersion* v, PreparedShard&& s, std::vector<uint32_t>* own_chunks,
                        std::vector<uint32_t>* own_pieces) {
  const uint64_t version = v->version;
  format::TensorEntry& t = s.t;
  const size_t nbytes = s.nbytes;
  const unsigned flags = s.flags;
  const uint64_t chunk_bytes = options_.chunk_bytes;
  const uint64_t chunks_needed = (nbytes + chunk_bytes - 1) / chunk_bytes;
  // REFT's ARC and AEC: a replicated shard of an "arc", "aec" or "arc+aec" replica group is cut
  // into chunk-sized pieces and this member keeps only its own slice of them and, with ARC, the
  // next member's; the rest is only hashed. With AEC it also keeps parity units of the others'.
  std::vector<std::pair<uint64_t, uint64_t>> held{{0, chunks_needed}};
  const bool sliced = (flags & CKPTDB_PUT_REPLICATED) && replica_group_->dedup() && chunks_needed;
  uint32_t count = 0;
  uint32_t position = 0;
  if (sliced) {
    const std::vector<uint32_t>& members = replica_group_->members;
    count = static_cast<uint32_t>(members.size());
    position = static_cast<uint32_t>(std::find(members.begin(), members.end(), identity_.rank) -
                                     members.begin());
    held = format::HeldPieces(chunks_needed, count, position, replica_group_->arc);
  }
  const bool dedup = held.size() != 1 || held[0] != std::make_pair(uint64_t{0}, chunks_needed);
  // The layout is fixed now, so chunks can be captured by any thread in any order: chunk k's
  // record lies at a known offset of the segment.
  t.first_chunk = static_cast<uint32_t>(v->chunks.size());
  const uint8_t* src = s.data;
  const bool copy_now = (flags & CKPTDB_PUT_COPY_NOW) != 0;
  std::vector<int64_t> sources;
  uint64_t stored = 0;
  size_t next_held = 0;
  for (uint64_t piece = 0; piece < chunks_needed; ++piece) {
    const uint64_t off = piece * chunk_bytes;
    const uint64_t bytes = std::min<uint64_t>(chunk_bytes, nbytes - off);
    while (next_held < held.size() && held[next_held].second <= piece) ++next_held;
    const bool keep = next_held < held.size() && held[next_held].first <= piece;
    if (!keep) {
      v->hash_pieces.push_back({src + off, bytes, 0});
      const auto index = static_cast<uint32_t>(v->hash_pieces.size() - 1);
      sources.push_back(-1 - int64_t{index});
      if (copy_now) {
        own_pieces->push_back(index);
      } else {
        tasks_.push_back(Task{version, 0, index, nullptr});
      }
      continue;
    }
    ChunkSlot c;
    c.record_offset = v->next_offset;
    c.payload_bytes = bytes;
    c.src = src + off;
    c.device = s.device;
    v->next_offset += format::RecordBytes(c.payload_bytes);
    v->chunks.push_back(c);
    stored += bytes;
    const auto index = static_cast<uint32_t>(v->chunks.size() - 1);
    sources.push_back(index);
    // COPY_NOW: the caller's thread captures its chunks itself, not waiting behind the queue.
    if (copy_now) {
      own_chunks->push_back(index);
    } else {
      tasks_.push_back(Task{version, index, kNoPiece, nullptr});
    }
  }
  t.chunk_count = static_cast<uint32_t>(v->chunks.size() - t.first_chunk);
  if (sliced && replica_group_->aec && dedup)
    AddParityLocked(v, s, count, position, &t, own_chunks);
  if (dedup) {
    t.full_bytes = nbytes;
    t.bytes = stored;
    for (const auto& [first, end] : held) {
      const uint64_t from = first * chunk_bytes;
      t.slices.emplace_back(from, std::min<uint64_t>(end * chunk_bytes, nbytes) - from);
    }
    v->piece_sources[t.name] = std::move(sources);
  }
  v->uncaptured += chunks_needed;
  if (!v->ram) v->unwritten += t.chunk_count;
  v->data_bytes += t.bytes;
  v->names.insert(t.name);
  if (flags & CKPTDB_PUT_REPLICATED) v->replicated_names.insert(t.name);
  v->tensors.push_back(std::move(t));
}

// REFT's AEC: this member's parity units of deduplicated shard t, chunks after its slices'.
// Each is captured like a pack, its parts (pieces of the caller's buffer) XORed.
void Db::AddParityLocked(LiveVersion* v, const PreparedShard& s, uint32_t count, uint32_t position,
                         format::TensorEntry* t, std::vector<uint32_t>* own_chunks) {
  const uint64_t chunk_bytes = options_.chunk_bytes;
  const uint64_t n = (s.nbytes + chunk_bytes - 1) / chunk_bytes;
  const bool arc = replica_group_->arc;
  const uint64_t units = format::AecUnits(n, count, arc, position);
  for (uint64_t u = 0; u < units; ++u) {
    const std::vector<uint64_t> pieces = format::AecUnitPieces(n, count, arc, position, u);
    std::vector<PackPart> parts;
    for (uint64_t p : pieces) {
      const uint64_t off = p * chunk_bytes;
      parts.push_back({s.data + off, 0, std::min(chunk_bytes, s.nbytes - off), 0});
    }
    ChunkSlot c;
    c.record_offset = v->next_offset;
    c.payload_bytes = format::AecUnitBytes(n, chunk_bytes, s.nbytes, pieces);
    c.pack = static_cast<uint32_t>(v->packs.size());
    c.parity = true;
    v->next_offset += format::RecordBytes(c.payload_bytes);
    v->chunks.push_back(c);
    v->packs.push_back(std::move(parts));
    const auto index = static_cast<uint32_t>(v->chunks.size() - 1);
    if (s.flags & CKPTDB_PUT_COPY_NOW) {
      own_chunks->push_back(index);
    } else {
      tasks_.push_back(Task{v->version, index, kNoPiece, nullptr});
    }
  }
  t->parity_chunks = static_cast<uint32_t>(units);
  v->uncaptured += units;
  if (!v->ram) v->unwritten += units;
}

uint64_t Db::PackLimit() const { return std::min(kPackBytes, options_.chunk_bytes); }

// Packs in payload order, each shard at the next kPackAlign-aligned offset, a pack closed when
// the next shard would pass pack_limit. Lazy and COPY_NOW shards go in separate packs: a pack is
// captured by one thread.
void Db::AddPacksLocked(LiveVersion* v, std::vector<PreparedShard>* shards,
                        const std::vector<uint32_t>& packable, std::vector<uint32_t>* own_chunks) {
  const uint64_t pack_limit = PackLimit();
  for (const bool copy_now : {false, true}) {
    std::vector<PackPart> parts;
    uint64_t end = 0;  // the pack's payload so far
    auto close = [&] {
      if (parts.empty()) return;
      const auto index = static_cast<uint32_t>(v->chunks.size());
      ChunkSlot c;
      c.record_offset = v->next_offset;
      c.payload_bytes = end;
      c.pack = static_cast<uint32_t>(v->packs.size());
      v->next_offset += format::RecordBytes(end);
      v->chunks.push_back(c);
      for (const PackPart& part : parts) v->tensors[part.tensor].first_chunk = index;
      v->packs.push_back(std::move(parts));
      parts.clear();
      end = 0;
      v->uncaptured++;
      if (!v->ram) v->unwritten++;
      if (copy_now) {
        own_chunks->push_back(index);
      } else {
        tasks_.push_back(Task{v->version, index, kNoPiece, nullptr});
      }
    };
    for (uint32_t i : packable) {
      PreparedShard& s = (*shards)[i];
      if (((s.flags & CKPTDB_PUT_COPY_NOW) != 0) != copy_now) continue;
      uint64_t offset = (end + kPackAlign - 1) & ~(kPackAlign - 1);
      if (!parts.empty() && offset + s.nbytes > pack_limit) {
        close();
        offset = 0;
      }
      format::TensorEntry& t = s.t;
      t.packed = true;
      t.pack_offset = offset;
      t.chunk_count = 1;
      parts.push_back({s.data, offset, s.nbytes, static_cast<uint32_t>(v->tensors.size())});
      end = offset + s.nbytes;
      v->data_bytes += t.bytes;
      v->names.insert(t.name);
      v->tensors.push_back(std::move(t));
    }
    close();
  }
}

// A put's refusals that need the lock (docs/api.md, ckptdb_put_shard): a replicated shard without
// a replica group, a private shard of an "arc" member in a job without redundancy, a name put
// twice, and the limits the reader enforces, so a put that would make the version unreadable is
// refused and changes nothing. Under the same lock as the put itself: a declaration cannot slip
// in between. The messages are built only for a refusal: a batched put checks every shard here.
Status Db::CheckPutLocked(uint64_t version, const PreparedShard& s, uint64_t batch_chunks,
                          uint64_t batch_tensors) {
  const unsigned flags = s.flags;
  auto what = [&] { return "put_shard " + QuoteName(s.t.name) + " into " + V(version); };
  if ((flags & CKPTDB_PUT_REPLICATED) && !replica_group_) {
    return Status::Invalid(what() +
                           ": CKPTDB_PUT_REPLICATED without a replica group "
                           "(ckptdb_declare_replicas)");
  }
  if ((flags & CKPTDB_PUT_RECOMPUTED) && !(replica_group_ && replica_group_->aor)) {
    return Status::Invalid(what() +
                           ": CKPTDB_PUT_RECOMPUTED without a replica group declared with "
                           "REFT's AOR (ckptdb_declare_replicas, \"aor\" or \"...+aor\")");
  }
  if (!(flags & CKPTDB_PUT_REPLICATED) && replica_group_ && replica_group_->dedup() &&
      !replica_group_->aor && cluster_->options().replicas <= 1 && !cluster_->options().code) {
    // A member that loses its node restores from its group alone: nothing of it may exist
    // only on its own node.
    return Status::Invalid(what() + ": a member of an \"" +
                           format::ProtectionName(replica_group_->protection()) +
                           "\" replica group in a job without "
                           "redundancy puts only replicated shards (CKPTDB_PUT_REPLICATED); "
                           "this one would have no copy on another node (use redundancy "
                           "replicate:M to keep private shards)");
  }
  auto existing = live_.find(version);
  if (existing != live_.end() && existing->second.names.count(s.t.name)) {
    return Status::Exists(what() + ": the name was already put in this version");
  }
  const uint64_t chunk_bytes = options_.chunk_bytes;
  const uint64_t chunks_needed = (s.nbytes + chunk_bytes - 1) / chunk_bytes;
  const uint64_t chunks_before =
      batch_chunks + (existing != live_.end() ? existing->second.chunks.size() : 0);
  const uint64_t tensors_before =
      batch_tensors + (existing != live_.end() ? existing->second.tensors.size() : 0);
  if (chunks_before + chunks_needed > format::kMaxChunksPerSegment ||
      tensors_before + 1 > format::kMaxTensorsPerSegment) {
    return Status::Invalid(what() + ": the version would exceed " +
                           std::to_string(format::kMaxChunksPerSegment) + " chunks or " +
                           std::to_string(format::kMaxTensorsPerSegment) +
                           " tensors; use a larger chunk_bytes or fewer shards");
  }
  return Status::Ok();
}

}  // namespace ckpt::engine
