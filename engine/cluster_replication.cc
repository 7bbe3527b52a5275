// Replicas in peers' memory (Cluster, cluster.h): pushing a version's segment to its placement
// peers (socket or UCX messages, or one-sided windows: cluster_rma.h), receiving pieces in
// place, serving fetches, and fetching a lost rank's segment back.
#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <utility>

#include "engine/cluster.h"
#include "engine/cluster_internal.h"
#include "engine/cluster_rma.h"
#include "engine/cluster_wire.h"
#include "engine/internal.h"
#include "format/checksum.h"
#include "format/manifest.h"
#include "format/segment_format.h"
#include "format/segment_reader.h"
#include "transport/rma.h"
#include "transport/wire.h"
#include "util/assert.h"
#include "util/thread_name.h"

namespace ckpt::engine {

using namespace cluster_internal;

// ---- Replication ----------------------------------------------------------------------------

std::vector<std::string> Cluster::ReplicaDirs() const {
  std::vector<std::string> dirs;
  if (options_.replica_dir.empty()) return dirs;
  if (!options_.serve_only) return {options_.replica_dir};
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(options_.replica_dir, ec)) {
    if (entry.path().filename().string().rfind("ckptdb-replicas-r", 0) == 0 &&
        entry.is_directory(ec)) {
      dirs.push_back(entry.path().string());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::string Cluster::FindReplica(uint32_t owner, uint64_t version) const {
  char name[96];
  std::snprintf(name, sizeof name, "/r%05" PRIu32 "-v%020" PRIu64 ".seg", owner, version);
  for (const std::string& dir : ReplicaDirs()) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(dir + name, ec)) return dir + name;
  }
  return {};
}

std::vector<std::pair<uint32_t, uint64_t>> Cluster::HeldReplicas() const {
  if (replicas_ != nullptr) return replicas_->Held();
  std::vector<std::pair<uint32_t, uint64_t>> out;
  for (const std::string& dir : ReplicaDirs()) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      unsigned owner = 0;
      unsigned long long version = 0;
      char tail[8] = {};
      std::string name = entry.path().filename().string();
      if (std::sscanf(name.c_str(), "r%5u-v%20llu.se%1s", &owner, &version, tail) == 3 &&
          name.size() == std::strlen("r00000-v00000000000000000000.seg") && tail[0] == 'g') {
        out.emplace_back(owner, version);
      }
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// `ckptdb serve`: tells the coordinator (whichever incarnation listens at the address now) what
// this node's memory holds, every heartbeat, for as long as the daemon runs.
void Cluster::ServeLoop() {
  SetThreadName("ckpt-serve");
  std::string last_error;
  while (!stop_) {
    Status st;
    {
      transport::PeerId coord = 0;
      st = PeerFor(coordinator_address_, &coord);
      if (st.ok()) {
        WireWriter w;
        w.Str(options_.node_id);
        w.Str(transport_->address());
        w.U32(g_protocol);
        auto holdings = Holdings();
        std::vector<uint8_t> reply;
        st = transport_->CallSync(coord, kServe, w.Take(), holdings.data(), holdings.size(),
                                  options_.call_timeout_ms, &reply);
      }
      DropIfGone(st, coordinator_address_);
    }
    if (!st.ok() && st.message() != last_error && st.code() != CKPTDB_EPEER) {
      std::fprintf(stderr, "ckptdb[serve:%s]: %s\n", options_.node_id.c_str(),
                   st.message().c_str());
    }
    last_error = st.ok() ? "" : st.message();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(options_.heartbeat_ms),
                 [this] { return stop_.load(); });
  }
}

Status Cluster::Protect(uint64_t version, uint64_t file_bytes,
                        const std::vector<SendExtent>& extents) {
  if (options_.code) return BuildParity(version, file_bytes, extents);
  return Replicate(version, file_bytes, extents);
}

void Cluster::Pace(uint64_t sent, int64_t start_ms) {
  // A replication not planned into the trainer's idle spans (no profile yet, or interleaving
  // off) pauses while the trainer says its network is busy, and keeps to the bandwidth cap.
  for (int waited = 0; interleaver_.busy() && !stop_ && waited < 2000; waited += 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (options_.bandwidth_bytes_per_s > 0 && sent > 0) {
    double due_ms = 1000.0 * static_cast<double>(sent) / options_.bandwidth_bytes_per_s;
    int64_t ahead = static_cast<int64_t>(due_ms) - (MonoMs() - start_ms);
    if (ahead > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ahead));
  }
}

namespace {

// A piece of a replica on its way: where it goes in the segment, its bytes in the arena.
struct SendPiece {
  uint64_t offset;
  const uint8_t* data;
  uint64_t bytes;
};

// A replica's extents cut into pieces of at most `limit` bytes. An extent is one record of the
// arena (a chunk's, about chunk_bytes); records the capture laid out next to each other, in the
// image and in the arena, travel together, so a version of 4 MiB chunks crosses in a few large
// calls, not one per chunk. A piece holds whole records (only a record larger than a piece is
// cut): the receiver hashes the records of each piece as it lands, while later pieces are on the
// wire, and leaves only records cut across pieces to the seal, which the vote waits for.
std::vector<SendPiece> CutPieces(const std::vector<SendExtent>& extents, uint64_t limit) {
  std::vector<SendPiece> pieces;
  bool mergeable = false;  // the last piece starts at a record (not inside a record cut up)
  for (const SendExtent& e : extents) {
    SendPiece* last = pieces.empty() ? nullptr : &pieces.back();
    if (mergeable && last->offset + last->bytes == e.logical_offset &&
        last->data + last->bytes == e.data && last->bytes + e.bytes <= limit) {
      last->bytes += e.bytes;
      continue;
    }
    for (uint64_t off = 0; off < e.bytes; off += limit) {
      pieces.push_back({e.logical_offset + off, e.data + off, std::min(limit, e.bytes - off)});
    }
    mergeable = e.bytes <= limit;
  }
  return pieces;
}

// The pieces of [begin, end) of the image, at most `limit` bytes each, cut from `extents` (in
// image order): one planned partition's.
std::vector<SendPiece> CutRange(const std::vector<SendExtent>& extents, uint64_t begin,
                                uint64_t end, uint64_t limit) {
  std::vector<SendPiece> pieces;
  for (const SendExtent& e : extents) {
    const uint64_t lo = std::max(begin, e.logical_offset);
    const uint64_t hi = std::min(end, e.logical_offset + e.bytes);
    for (uint64_t off = lo; off < hi; off += limit) {
      pieces.push_back({off, e.data + (off - e.logical_offset), std::min(limit, hi - off)});
    }
  }
  return pieces;
}

// A replica call not yet returned, and the window slot its piece is in.
struct InFlightPiece {
  std::unique_ptr<transport::Call> call;
  uint32_t slot;  // kNoSlot: none
};

// A piece as the replication sends it: with interleaving, the trainer's idle span it waits for
// first (GEMINI section 5).
struct PlannedPiece {
  SendPiece piece;
  bool new_span = false;   // the first piece of its span: wait for the span before it
  uint64_t span_seq = 0;   // the trainer's idle span (TrafficInterleaver's numbering)
  bool unbounded = false;  // the plan's last span: sent once it begins, busy or not
};

// One copy's pieces: in the plan's order, `limit` cutting a partition further (a window's
// slots); with no plan, the extents cut into pieces of `limit`.
std::vector<PlannedPiece> CopyPieces(const std::vector<SendExtent>& extents,
                                     const std::optional<TrafficInterleaver::Schedule>& schedule,
                                     uint32_t copy, uint64_t limit) {
  std::vector<PlannedPiece> out;
  if (!schedule) {
    for (const SendPiece& piece : CutPieces(extents, limit)) out.push_back({piece});
    return out;
  }
  // A span's first piece waits for it (a partition that lies in no extent has none).
  int64_t last_span = -1;
  for (const redundancy::Partition& p : schedule->plan.partitions) {
    if (p.copy != copy) continue;
    for (const SendPiece& piece : CutRange(extents, p.offset, p.offset + p.bytes, limit)) {
      const bool first = static_cast<int64_t>(p.span) != last_span;
      last_span = p.span;
      out.push_back({piece, first, schedule->first_seq + p.span, p.span + 1 == schedule->spans});
    }
  }
  return out;
}

// The body of a kReplica call (DecodeReplicaPiece reads it); `epoch` is the sender's.
std::vector<uint8_t> ReplicaCallBody(const ReplicaPiece& p, uint64_t epoch) {
  WireWriter w;
  w.U32(p.owner);
  w.U64(p.version);
  w.U64(epoch);
  w.U64(p.file_bytes);
  w.U64(p.offset);
  w.U8(p.phase);
  if (p.phase == kPhaseLanded) {
    w.U64(p.window);
    w.U32(p.slot);
    w.U64(p.bytes);
  }
  return w.Take();
}

}  // namespace

Status Cluster::BeginReplica(transport::PeerId peer, std::vector<uint8_t> body,
                             uint64_t file_bytes) {
  // The receiver maps the replica's memory first (on a new node, every page new: seconds on a
  // VM), so allow for that beyond the call timeout: 16 MiB/s at the least.
  std::vector<uint8_t> ignored;
  const int timeout_ms = static_cast<int>(
      std::min<uint64_t>(options_.call_timeout_ms + file_bytes / (16 << 10), 24ull * 3600 * 1000));
  return transport_->CallSync(peer, kReplica, std::move(body), nullptr, 0, timeout_ms, &ignored);
}

Status Cluster::Replicate(uint64_t version, uint64_t file_bytes,
                          const std::vector<SendExtent>& extents) {
  std::vector<uint32_t> targets = ReplicaTargets();
  if (targets.empty()) return Status::Ok();
  const int64_t start = MonoMs();
  const auto start_clock = std::chrono::steady_clock::now();
  std::vector<MemberAddress> table;
  {
    std::lock_guard<std::mutex> lock(mu_);
    table = table_;
  }
  // GEMINI's interleaving: once the trainer's idle spans are profiled, each copy is sent in the
  // partitions Algorithm 2 fits into the spans ahead (engine/traffic_interleaver.h).
  const std::optional<TrafficInterleaver::Schedule> schedule = interleaver_.Plan(
      file_bytes, static_cast<uint32_t>(targets.size()), kMaxPieceBytes, MonoNs());
  bool unplanned = !schedule;  // sending at once (a wait for a span ran out: the rest too)
  uint64_t sent = 0;
  for (size_t copy = 0; copy < targets.size(); ++copy) {
    const uint32_t target = targets[copy];
    const std::string what = "replicating v" + std::to_string(version) + " of " + R(options_.rank) +
                             " to " + R(target) + " (node " + table[target].node_id + ")";
    transport::PeerId peer = 0;
    Status st = PeerFor(table[target].address, &peer);
    if (!st.ok()) return st.WithContext(what);
    // One-sided where the target's window attaches (engine/cluster_rma.h): each piece is put
    // into a slot of it, in slot-sized pieces, and a call names the slot; else the pieces travel
    // as the calls' payloads.
    const std::shared_ptr<PeerWindow> window = WindowFor(table[target].address, peer, target);
    const uint64_t limit = window != nullptr ? kWindowSlotBytes : kMaxPieceBytes;
    const std::vector<PlannedPiece> pieces =
        CopyPieces(extents, schedule, static_cast<uint32_t>(copy), limit);
    auto header = [&](uint64_t offset, uint8_t phase, uint32_t slot = 0, uint64_t bytes = 0) {
      return ReplicaCallBody({options_.rank, version, file_bytes, offset, phase,
                              window != nullptr ? window->window->id() : 0, slot, bytes},
                             epoch());
    };
    if (st = BeginReplica(peer, header(0, kPhaseBegin), file_bytes); !st.ok()) {
      DropIfGone(st, table[target].address);
      return st.WithContext(what);
    }
    std::deque<InFlightPiece> in_flight;
    // Waits for the oldest call; its slot is free again once it has returned.
    auto drain_one = [&]() -> Status {
      Status s = in_flight.front().call->Wait(options_.call_timeout_ms);
      if (in_flight.front().slot != kNoSlot) window->Release(in_flight.front().slot);
      in_flight.pop_front();
      return s;
    };
    auto fail = [&](Status s) {
      while (!in_flight.empty()) (void)drain_one();
      // The holder may have dropped the window (or restarted): the next version asks again.
      if (window != nullptr && s.code() == CKPTDB_ESTATE) DropWindow(table[target].address);
      DropIfGone(s, table[target].address);
      return s.WithContext(what);
    };
    // A burst: the pieces sent back to back (a span's, or the whole copy's when not planned),
    // timed from its first piece to its last one's return, for the transfer model's B.
    uint64_t burst_bytes = 0;
    uint64_t burst_start_ns = MonoNs();
    for (size_t i = 0; i <= pieces.size(); ++i) {
      bool last = i == pieces.size();  // the last call carries no bytes: it seals the replica
      if (unplanned) Pace(sent, start);
      if (last || pieces[i].new_span) {
        while (!in_flight.empty()) {
          if (Status s = drain_one(); !s.ok()) return fail(s);
        }
        interleaver_.RecordBurst(std::exchange(burst_bytes, 0), MonoNs() - burst_start_ns);
        // A wait that runs out (the trainer stopped hinting, the store is closing): at once.
        if (!last && !unplanned) {
          unplanned = !interleaver_.WaitForSpan(pieces[i].span_seq, pieces[i].unbounded);
        }
        burst_start_ns = MonoNs();
      }
      uint32_t slot = kNoSlot;
      if (!last && window != nullptr) {
        // A slot: this version's own oldest call gives one back, else another thread's will.
        while ((slot = window->TryAcquire()) == kNoSlot && !in_flight.empty()) {
          if (Status s = drain_one(); !s.ok()) return fail(s);
        }
        if (slot == kNoSlot) slot = window->Acquire();
        st = window->window->Put(uint64_t{slot} * kWindowSlotBytes, pieces[i].piece.data,
                                 pieces[i].piece.bytes);
        if (!st.ok()) {
          window->Release(slot);
          return fail(st);
        }
      }
      std::vector<uint8_t> body = last                ? header(file_bytes, kPhaseSeal)
                                  : window != nullptr ? header(pieces[i].piece.offset, kPhaseLanded,
                                                               slot, pieces[i].piece.bytes)
                                                      : header(pieces[i].piece.offset, kPhasePiece);
      const bool with_payload = !last && window == nullptr;
      std::unique_ptr<transport::Call> call;
      st = transport_->Start(peer, kReplica, std::move(body),
                             with_payload ? pieces[i].piece.data : nullptr,
                             with_payload ? pieces[i].piece.bytes : 0, nullptr, 0, &call);
      if (!st.ok()) {
        if (slot != kNoSlot) window->Release(slot);
        while (!in_flight.empty()) (void)drain_one();
        DropPeer(table[target].address);
        return st.WithContext(what);
      }
      in_flight.push_back({std::move(call), slot});
      if (!last) {
        sent += pieces[i].piece.bytes;
        burst_bytes += pieces[i].piece.bytes;
        if (!unplanned) interleaver_.RecordSent(pieces[i].piece.bytes, pieces[i].unbounded);
      }
      while (in_flight.size() >= kPiecesInFlight || (last && !in_flight.empty())) {
        if (Status s = drain_one(); !s.ok()) return fail(s);
      }
      // The seal carries no bytes: its round trip is the model's alpha.
      if (last) interleaver_.RecordStartup(MonoNs() - burst_start_ns);
    }
  }
  RecordRedundancyTraffic(sent, start_clock);
  return Status::Ok();
}

// Where a replica piece's payload goes: straight into the replica's mapped memory (ReplicaStore),
// so that the bytes cross once. Anything odd is left to HandleReplica, which says what is wrong.
transport::PayloadPlace Cluster::PlaceReplicaPiece(uint16_t type, std::span<const uint8_t> body,
                                                   size_t payload_bytes) {
  transport::PayloadPlace place;
  if (type != kReplica || replicas_ == nullptr) return place;
  ReplicaPiece piece;
  if (!DecodeReplicaPiece(body, "replica piece", &piece).ok() || piece.phase != kPhasePiece ||
      piece.owner >= options_.world_size || piece.owner == options_.rank) {
    return place;
  }
  std::shared_ptr<MappedFile> keep;
  if (!replicas_
           ->Place(piece.owner, piece.version, piece.file_bytes, piece.offset, payload_bytes,
                   &place.data, &keep)
           .ok()) {
    return {};
  }
  place.keep = std::move(keep);
  return place;
}

// A range of a peer's segment image, received into the replica's memory (see PlaceReplicaPiece);
// the sealing call checks the whole image (framing, manifest, every chunk's xxh3) before it
// becomes visible.
void Cluster::HandleReplica(const Request& request, Reply* reply) {
  ReplicaPiece piece;
  Status st = DecodeReplicaPiece(request.body, "replica piece from " + request.peer, &piece);
  const auto [owner, version, file_bytes, offset, phase, window, slot, landed_bytes] = piece;
  std::span<const uint8_t> payload = request.Payload();
  const std::string what =
      "replica of v" + std::to_string(version) + " of " + R(owner) + " from " + request.peer;
  std::shared_ptr<transport::RmaWindow> keep;  // a landed piece's window, while it is copied
  if (st.ok() && phase == kPhaseLanded) {
    uint8_t* at = nullptr;
    st = payload.empty() ? WindowSlot(request.from, window, slot, landed_bytes, what, &at, &keep)
                         : Status::Invalid(what + ": a landed piece with a payload");
    if (st.ok()) payload = std::span<const uint8_t>(at, landed_bytes);
  }
  if (st.ok() && replicas_ == nullptr) {
    st = Status::State(options_.serve_only ? "ckptdb serve on node " + options_.node_id +
                                                 " only serves replicas, it takes none"
                                           : R(options_.rank) + " keeps no replicas");
  }
  if (st.ok() && (owner >= options_.world_size || owner == options_.rank)) {
    st = Status::Invalid(what + ": bad owner rank");
  }
  if (st.ok() && (file_bytes > (uint64_t{1} << 40) || offset > file_bytes ||
                  payload.size() > file_bytes - offset)) {
    st = Status::Invalid(what + ": range [" + std::to_string(offset) + ", +" +
                         std::to_string(payload.size()) + ") outside its " +
                         std::to_string(file_bytes) + " bytes");
  }
  if (st.ok() && (phase == kPhaseBegin || phase == kPhaseSeal) && !payload.empty()) {
    st = Status::Invalid(what + ": a begin or seal call with a payload");
  }
  if (st.ok() && phase == kPhaseBegin) {
    // Without the hook (it is always set for a rank), a sealed replica stands.
    const bool replace_sealed = hooks_.committed && !hooks_.committed(version);
    st = replicas_->Begin(owner, version, file_bytes, what, replace_sealed);
  } else if (st.ok() && (phase == kPhasePiece || phase == kPhaseLanded)) {
    st = replicas_->Received(owner, version, file_bytes, offset, payload, what);
    if (!st.ok() && st.code() != CKPTDB_ESTATE) {  // ESTATE: after the replica was refused
      std::fprintf(stderr, "ckptdb[%s]: refused %s\n", R(options_.rank).c_str(),
                   st.message().c_str());
    }
    if (st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.replica_bytes_received += payload.size();
    }
  } else if (st.ok()) {
    st = replicas_->Seal(owner, version, file_bytes, what);
    if (!st.ok()) {
      std::fprintf(stderr, "ckptdb[%s]: refused %s\n", R(options_.rank).c_str(),
                   st.message().c_str());
    }
  }
  if (!st.ok()) Fail(reply, st);
}

void Cluster::HandleFetch(const Request& request, Reply* reply) {
  WireReader r(request.body, "fetch from " + request.peer);
  uint32_t owner = r.U32("owner");
  uint64_t version = r.U64("version");
  uint64_t offset = r.U64("offset");
  uint64_t bytes = r.U64("bytes");
  const bool any_tier = r.U8("any tier") != 0;
  // Optional: the slot of this rank's window the asker wants the bytes in (engine/cluster_rma.h),
  // the reply then carrying none.
  uint64_t window = 0;
  uint32_t slot = kNoSlot;
  if (r.ok() && r.remaining() != 0) {
    window = r.U64("window");
    slot = r.U32("slot");
  }
  Status st = r.Finish();
  if (st.ok() && bytes > kMaxFetchBytes) st = Status::Invalid("a fetch of more than 8 MiB");
  uint8_t* in_window = nullptr;
  std::shared_ptr<transport::RmaWindow> keep;
  if (st.ok() && slot != kNoSlot) {
    st = WindowSlot(request.from, window, slot, bytes, "a fetch from " + request.peer, &in_window,
                    &keep);
  }
  if (!st.ok()) return Fail(reply, st);
  if (owner == options_.rank && !options_.serve_only) {
    // This rank's own segment: a member of its coding group rebuilding a lost member reads its
    // units from memory; a member of its replica group gathering slices reads any tier. Copied
    // out of the arena (its extents need not lie next to each other), or sent from a file's
    // mapping.
    if (!hooks_.read_own || !hooks_.own_bytes || !hooks_.own_file) {
      return Fail(reply, Status::Invalid(R(options_.rank) + " serves no segment of its own"));
    }
    const std::string mine = R(options_.rank) + "'s own segment";
    // Its memory first; a file copy when the asker takes any tier and memory has none (or
    // dropped it between the size and the read).
    auto from_file = [&](std::shared_ptr<MappedFile>* map, uint64_t* size) {
      std::string path;
      Status fs = hooks_.own_file(version, &path);
      if (fs.ok()) fs = io_->OpenMappedFile(path, io::MappedFileOptions::ReadOnly(), map);
      if (fs.ok()) *size = (*map)->bytes();
      return fs;
    };
    std::shared_ptr<MappedFile> map;
    uint64_t size = 0;
    st = hooks_.own_bytes(version, &size);
    if (st.code() == CKPTDB_ENOTFOUND && any_tier) st = from_file(&map, &size);
    auto in_range = [&] {
      return offset > size || bytes > size - offset
                 ? Status::Invalid(V(version) + ": the range [" + std::to_string(offset) + ", +" +
                                   std::to_string(bytes) + ") is past its " + std::to_string(size) +
                                   " bytes")
                 : Status::Ok();
    };
    if (st.ok()) st = in_range();
    if (!st.ok()) return Fail(reply, st.WithContext(mine));
    if (bytes == 0) {  // its size (a member of its replica group opening it)
      WireWriter w;
      w.U64(size);
      reply->body = w.Take();
      return;
    }
    if (map == nullptr) {
      std::shared_ptr<std::vector<uint8_t>> out;
      if (in_window == nullptr) out = std::make_shared<std::vector<uint8_t>>(bytes);
      st = hooks_.read_own(version, offset, bytes, in_window != nullptr ? in_window : out->data());
      if (st.ok()) {
        if (in_window == nullptr) {
          reply->payload = out->data();
          reply->payload_bytes = bytes;
          reply->keep = std::move(out);
        }
        std::lock_guard<std::mutex> lock(mu_);
        stats_.served_bytes += bytes;
        return;
      }
      if (st.code() != CKPTDB_ENOTFOUND || !any_tier) return Fail(reply, st.WithContext(mine));
      st = from_file(&map, &size);
      if (st.ok()) st = in_range();
      if (!st.ok()) return Fail(reply, st.WithContext(mine));
    }
    return ServeMapped(std::move(map), offset, bytes, in_window, request.from, reply);
  }
  // From the replica's mapping: the reply's payload is sent from it, nothing is copied.
  std::shared_ptr<MappedFile> map;
  if (replicas_ != nullptr) {
    map = replicas_->Find(owner, version);
  } else if (std::string path = FindReplica(owner, version); !path.empty()) {
    // Mapped per request (a daemon's replicas are few and read rarely), only the range populated.
    if (!io_->OpenMappedFile(path, io::MappedFileOptions::ReadOnly(), &map).ok()) {
      map.reset();  // gone
    }
  }
  if (map == nullptr) {
    return Fail(reply, Status::NotFound(
                           (options_.serve_only ? "ckptdb serve on node " + options_.node_id
                                                : R(options_.rank)) +
                           " holds no replica of v" + std::to_string(version) + " of " + R(owner)));
  }
  if (offset > map->bytes() || bytes > map->bytes() - offset) {
    return Fail(reply, Status::Invalid("the replica of v" + std::to_string(version) + " of " +
                                       R(owner) + ": the range [" + std::to_string(offset) + ", +" +
                                       std::to_string(bytes) + ") is past its end"));
  }
  if (bytes == 0) {  // the replica's size
    WireWriter w;
    w.U64(map->bytes());
    reply->body = w.Take();
    return;
  }
  ServeMapped(std::move(map), offset, bytes, in_window, request.from, reply);
}

void Cluster::ServeMapped(std::shared_ptr<MappedFile> map, uint64_t offset, uint64_t bytes,
                          uint8_t* in_window, transport::PeerId to, Reply* reply) {
  if (in_window != nullptr) {
    // The asker gets it from there. Read, not copied from the mapping: a replica mapped since
    // this process opened would fault at each page (0.9 GB/s on these VMs, LIMITS.md).
    Status st = map->ReadAt(offset, in_window, bytes, "a fetch into a window");
    if (!st.ok()) return Fail(reply, st);
  } else {
    // On the socket the bytes go from the file (sendfile: no page of the mapping is touched);
    // UCX sends from the mapping, whose range is mapped first so that it walks mapped pages.
    if (transport_->PathName(to) == "socket") {
      reply->payload_fd = map->fd();
      reply->payload_file_offset = offset;
    } else {
      map->Populate(offset, bytes);
    }
    reply->payload = map->data() + offset;
    reply->payload_bytes = bytes;
    reply->keep = std::move(map);
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.served_bytes += bytes;
}

Status Cluster::ReplicaBytes(const ReplicaHolder& holder, uint32_t owner, uint64_t version,
                             uint64_t* bytes, bool any_tier) {
  transport::PeerId peer = 0;
  CKPTDB_RETURN_IF_ERROR(PeerFor(holder.address, &peer));
  WireWriter w;
  w.U32(owner);
  w.U64(version);
  w.U64(0);
  w.U64(0);
  w.U8(any_tier ? 1 : 0);
  std::vector<uint8_t> reply;
  Status st =
      transport_->CallSync(peer, kFetch, w.Take(), nullptr, 0, options_.call_timeout_ms, &reply);
  DropIfGone(st, holder.address);
  CKPTDB_RETURN_IF_ERROR(st);
  WireReader r(reply, "replica size from " + R(holder.rank));
  *bytes = r.U64("bytes");
  return r.Finish();
}

Status Cluster::Fetch(const ReplicaHolder& holder, uint32_t owner, uint64_t version,
                      uint64_t offset, void* dst, uint64_t bytes, bool any_tier) {
  std::vector<Status> results;
  Status st = FetchRanges(holder, owner, version, {{offset, static_cast<uint8_t*>(dst), bytes}},
                          &results, any_tier);
  return st.ok() ? results[0] : st;
}

Status Cluster::FetchRanges(const ReplicaHolder& holder, uint32_t owner, uint64_t version,
                            const std::vector<FetchRange>& ranges, std::vector<Status>* results,
                            bool any_tier) {
  const std::string what =
      "fetching v" + std::to_string(version) + " of " + R(owner) + " from " +
      (holder.rank == kServeRank ? std::string("ckptdb serve") : R(holder.rank)) + " (node " +
      holder.node_id + ")";
  results->assign(ranges.size(), Status::Ok());
  transport::PeerId peer = 0;
  Status gone = PeerFor(holder.address, &peer);
  if (!gone.ok()) {
    gone = gone.WithContext(what);
    results->assign(ranges.size(), gone);
    return gone;
  }
  // One-sided where the holder's window attaches: the holder copies each piece into a slot the
  // call names, and it is got from there (engine/cluster_rma.h).
  const std::shared_ptr<PeerWindow> window = WindowFor(holder.address, peer, holder.rank);
  struct Piece {
    std::unique_ptr<transport::Call> call;
    size_t range;
    uint64_t bytes;
    uint8_t* dst;
    uint32_t slot;  // kNoSlot: the reply's payload went straight to dst
  };
  std::deque<Piece> in_flight;
  uint64_t fetched = 0;
  size_t range = 0;
  uint64_t off = 0;  // within ranges[range]
  // Bounded: each turn starts a piece or waits for one; pieces are at most kMaxFetchBytes.
  while (true) {
    while (range < ranges.size() && off >= ranges[range].bytes) {
      ++range;
      off = 0;
    }
    if (gone.ok() && range < ranges.size() && in_flight.size() < kPiecesInFlight) {
      // A slot: one this call holds none of waits for another thread's to come back.
      uint32_t slot = kNoSlot;
      if (window != nullptr) {
        slot = window->TryAcquire();
        if (slot == kNoSlot && in_flight.empty()) slot = window->Acquire();
      }
      if (window == nullptr || slot != kNoSlot) {
        const FetchRange& r = ranges[range];
        uint64_t n = std::min(kMaxFetchBytes, r.bytes - off);
        WireWriter w;
        w.U32(owner);
        w.U64(version);
        w.U64(r.offset + off);
        w.U64(n);
        w.U8(any_tier ? 1 : 0);
        if (slot != kNoSlot) {
          w.U64(window->window->id());
          w.U32(slot);
        }
        std::unique_ptr<transport::Call> call;
        gone = slot != kNoSlot
                   ? transport_->Start(peer, kFetch, w.Take(), nullptr, 0, nullptr, 0, &call)
                   : transport_->Start(peer, kFetch, w.Take(), nullptr, 0, r.dst + off, n, &call);
        if (gone.ok()) {
          in_flight.push_back({std::move(call), range, n, r.dst + off, slot});
          off += n;
          continue;
        }
        if (slot != kNoSlot) window->Release(slot);
      }
    }
    if (in_flight.empty()) break;
    Piece& p = in_flight.front();
    Status s = p.call->Wait(options_.call_timeout_ms);
    if (p.slot != kNoSlot) {
      if (s.ok() && p.call->payload_bytes() != 0) s = Status::Corrupt("a payload for a window");
      if (s.ok()) s = window->window->Get(uint64_t{p.slot} * kWindowSlotBytes, p.dst, p.bytes);
      window->Release(p.slot);
      if (s.code() == CKPTDB_ESTATE) DropWindow(holder.address);  // asked again next time
    } else if (s.ok() && p.call->payload_bytes() != p.bytes) {
      s = Status::Corrupt("a short reply");
    }
    if (s.ok()) fetched += p.bytes;
    if (!s.ok() && (*results)[p.range].ok()) (*results)[p.range] = s.WithContext(what);
    if (!s.ok() && (s.code() == CKPTDB_EPEER || s.code() == CKPTDB_ETIMEDOUT) && gone.ok()) {
      gone = s;  // start nothing more
    }
    in_flight.pop_front();
  }
  if (!gone.ok()) {
    gone = gone.WithContext(what);
    for (size_t i = range; i < ranges.size(); ++i) {
      if ((*results)[i].ok()) (*results)[i] = gone;
    }
  }
  DropIfGone(gone, holder.address);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.fetch_bytes += fetched;
  return gone;
}

}  // namespace ckpt::engine
