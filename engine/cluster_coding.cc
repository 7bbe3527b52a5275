// Cluster's coding groups (DESIGN.md section 7; ECHECK, ../shared/papers/echeck.txt): building a
// version's parity across a group's members (engine/parity_store.h) and rebuilding a lost
// member's segment from the others (redundancy/stripe_layout.h, redundancy/erasure_code.h).
//
// A kParity call's body: op (u8), group (u32), version (u64), then by op:
//   announce  scheme (u8: 0 Reed-Solomon encoded at the holders, 1 XOR, 2 Reed-Solomon encoded at
//             the senders), k (u32), m (u32), unit bytes (u64), members (u32 count, u32 each),
//             position (u32), segment bytes (u64)
//   layout    -                      (Busy until every member announced and memory is ready)
//   data      position (u32), unit (u64), offset in the unit (u64); the payload is the bytes (or,
//             encoded at the senders, their partial product for the receiving holder's row)
//   done      position (u32)
//   sealed    -                      (Busy until every member is done)
//   size      -                      the reply's body: the sealed parity segment's bytes (u64)
//   fetch     offset (u64), bytes (u64): the reply's payload, from the parity segment's mapping
#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <thread>

#include "engine/cluster.h"
#include "engine/cluster_wire.h"
#include "engine/internal.h"
#include "format/checksum.h"
#include "format/segment_format.h"
#include "format/segment_reader.h"
#include "redundancy/placement.h"
#include "transport/wire.h"
#include "util/assert.h"

namespace ckpt::engine {
using redundancy::CodeScheme;
using redundancy::ComputeCodingGroups;
using redundancy::ErasureCode;
using redundancy::kMaxCodeBlocks;
using redundancy::StripeLayout;
namespace {

using namespace cluster_wire;
using transport::Reply;
using transport::Request;
using transport::WireReader;
using transport::WireWriter;

enum ParityOp : uint8_t {
  kAnnounce = 1,
  kLayoutOp = 2,
  kData = 3,
  kDoneOp = 4,
  kSealedOp = 5,
  kSize = 6,
  kFetchParity = 7,
};

constexpr uint32_t kParityPiecesInFlight = 8;
// Encoded at the senders: the most of a unit multiplied at once, M partials of it in memory per
// piece in flight, so (8 + M) x 4 MiB at most. As large as the holders' pieces (a 4 MiB chunk's
// extent): with 1 MiB pieces the calls in flight held a quarter of the bytes, and ec:4+2 took
// 14% longer to protect a version on a 400 Mbit/s link (bench_encode, docs/performance.md).
constexpr uint64_t kPartialPieceBytes = uint64_t{4} << 20;

std::vector<uint8_t> ParityHeader(uint8_t op, uint32_t group, uint64_t version) {
  WireWriter w;
  w.U8(op);
  w.U32(group);
  w.U64(version);
  return w.Take();
}

void Append(std::vector<uint8_t>* body, const std::vector<uint8_t>& more) {
  body->insert(body->end(), more.begin(), more.end());
}

std::string GroupName(const CodingGroup& g) {
  return "coding group " + std::to_string(g.group) + " (" + g.code.Spelling() + ")";
}

// The announce's scheme byte: how the parity is built, so that every member agrees on it.
enum SchemeByteValue : uint8_t { kRsAtHolders = 0, kXorScheme = 1, kRsAtSenders = 2 };
uint8_t SchemeByte(const redundancy::CodeSpec& code) {
  if (code.scheme == CodeScheme::kXor) return kXorScheme;
  return code.encoding == redundancy::Encoding::kSender ? kRsAtSenders : kRsAtHolders;
}

}  // namespace

Status Cluster::ComputeGroupLocked() {
  std::vector<std::string> node_of_rank;
  for (const MemberAddress& m : table_) node_of_rank.push_back(m.node_id);
  std::vector<std::vector<uint32_t>> groups;
  CKPTDB_RETURN_IF_ERROR(ComputeCodingGroups(node_of_rank, *options_.code, &groups));
  for (uint32_t gi = 0; gi < groups.size(); ++gi) {
    auto at = std::find(groups[gi].begin(), groups[gi].end(), options_.rank);
    if (at == groups[gi].end()) continue;
    group_ = CodingGroup{*options_.code, gi, options_.code_unit_bytes, groups[gi]};
    group_position_ = static_cast<uint32_t>(at - groups[gi].begin());
    return Status::Ok();
  }
  return Status::Internal(R(options_.rank) + " is in no coding group");
}

// ---- Building a version's parity ---------------------------------------------------------------

Status Cluster::CallParity(uint32_t position, const std::vector<uint8_t>& body, const void* payload,
                           size_t payload_bytes, int timeout_ms, std::vector<uint8_t>* reply_body,
                           void* reply_buffer, size_t reply_capacity) {
  const uint32_t rank = group_->members[position];
  const int64_t deadline = MonoMs() + timeout_ms;
  for (int64_t pause_ms = 1;; pause_ms = std::min<int64_t>(pause_ms * 2, 20)) {
    Status st;
    if (rank == options_.rank) {
      Request request;
      request.peer = R(rank) + " (itself)";
      request.type = kParity;
      request.body = body;
      if (payload_bytes > 0) {
        const auto* p = static_cast<const uint8_t*>(payload);
        request.payload.assign(p, p + payload_bytes);
      }
      Reply reply;
      HandleParity(request, &reply);
      st = reply.status == 0 ? Status::Ok() : Status::FromCode(reply.status, reply.message);
      if (st.ok()) {
        if (reply_body != nullptr) *reply_body = reply.body;
        if (reply.payload_bytes > reply_capacity) {
          st = Status::Size("a parity reply of " + std::to_string(reply.payload_bytes) + " bytes");
        } else if (reply.payload_bytes > 0) {
          std::memcpy(reply_buffer, reply.payload, reply.payload_bytes);
        }
      }
    } else {
      std::string address;
      {
        std::lock_guard<std::mutex> lock(mu_);
        address = table_[rank].address;
      }
      transport::PeerId peer = 0;
      st = PeerFor(address, &peer);
      if (st.ok()) {
        st = transport_->CallSync(peer, kParity, body, payload, payload_bytes, timeout_ms,
                                  reply_body, reply_buffer, reply_capacity);
      }
      DropIfGone(st, address);
    }
    if (st.code() != CKPTDB_EBUSY || MonoMs() >= deadline || stop_) {
      return st.WithContext(R(rank) + " (member " + std::to_string(position) + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
}

// The first step of building a version's parity: this member's segment (its size and the
// group's code) announced to every member of the group, itself included.
Status Cluster::AnnounceToGroup(uint64_t version, uint64_t file_bytes, int wait_ms,
                                const std::string& what) {
  const CodingGroup& g = *group_;
  const uint32_t n = g.code.k + g.code.m;
  const uint32_t me = group_position_;
  std::vector<uint8_t> ignored;
  std::vector<uint8_t> body = ParityHeader(kAnnounce, g.group, version);
  WireWriter w;
  w.U8(SchemeByte(g.code));
  w.U32(g.code.k);
  w.U32(g.code.m);
  w.U64(g.unit_bytes);
  w.U32(n);
  for (uint32_t rank : g.members) w.U32(rank);
  w.U32(me);
  w.U64(file_bytes);
  Append(&body, w.Take());
  for (uint32_t q = 0; q < n; ++q) {
    CKPTDB_RETURN_IF_ERROR(CallParity(q, body, nullptr, 0, wait_ms, &ignored)
                               .WithContext(what + ": announcing its segment"));
  }

  return Status::Ok();
}

// Each unit of the segment image to the M holders of its stripe's parity, in pieces that are
// contiguous in the arena (a unit may span records that are not), several calls in flight. Encoded
// at the holders, a piece goes as it is to each of the M; encoded at the senders (ECHECK), a piece
// of at most kPartialPieceBytes is multiplied once into its M partial products (ErasureCode::
// Partial, one pass), each sent to its row's holder, their buffers kept until their calls end.
Status Cluster::SendUnits(uint64_t version, uint64_t file_bytes,
                          const std::vector<SendExtent>& extents, int64_t start, uint64_t* sent) {
  const CodingGroup& g = *group_;
  const uint32_t me = group_position_;
  const uint32_t m = g.code.m;
  const bool at_sender = g.code.encoding == redundancy::Encoding::kSender;
  std::vector<SendExtent> sorted = extents;
  std::sort(sorted.begin(), sorted.end(), [](const SendExtent& a, const SendExtent& b) {
    return a.logical_offset < b.logical_offset;
  });
  const StripeLayout layout(g.code.k, m, g.unit_bytes, version);
  std::unique_ptr<ErasureCode> code;
  if (at_sender) CKPTDB_RETURN_IF_ERROR(ErasureCode::Make(g.code, &code));
  std::vector<uint32_t> rows(m);
  for (uint32_t row = 0; row < m; ++row) rows[row] = row;
  struct InFlight {
    std::unique_ptr<transport::Call> call;
    std::shared_ptr<std::vector<uint8_t>> partials;  // the piece's, shared by its M calls
  };
  std::deque<InFlight> in_flight;
  // Kept from version to version (pages faulted in and filled once, not per version); only the
  // push lane builds parity, one version at a time.
  auto& pool = partial_pool_;
  Status failed;
  auto drain_one = [&] {
    Status s = in_flight.front().call->Wait(options_.call_timeout_ms);
    in_flight.pop_front();
    if (failed.ok() && !s.ok()) failed = s;
  };
  // One call: `bytes` at `data` for row `row` of `stripe`'s parity.
  auto send = [&](uint64_t unit, uint64_t offset, uint64_t stripe, uint32_t row,
                  const uint8_t* data, uint64_t bytes,
                  std::shared_ptr<std::vector<uint8_t>> partials) {
    const uint32_t holder = layout.ParityMember(stripe, row);
    if (g.members[holder] == options_.rank) {
      failed = Status::Internal("a unit's parity held by its own member");
      return;
    }
    std::vector<uint8_t> body = ParityHeader(kData, g.group, version);
    WireWriter w;
    w.U32(me);
    w.U64(unit);
    w.U64(offset);
    Append(&body, w.Take());
    Pace(*sent, start);
    std::string address;
    {
      std::lock_guard<std::mutex> lock(mu_);
      address = table_[g.members[holder]].address;
    }
    transport::PeerId peer = 0;
    Status st = PeerFor(address, &peer);
    std::unique_ptr<transport::Call> call;
    if (st.ok()) st = transport_->Start(peer, kParity, body, data, bytes, nullptr, 0, &call);
    if (!st.ok()) {
      DropIfGone(st, address);
      failed = st.WithContext(R(g.members[holder]));
      return;
    }
    in_flight.push_back({std::move(call), std::move(partials)});
    *sent += bytes;
    while (in_flight.size() >= kParityPiecesInFlight) drain_one();
  };
  size_t first = 0;
  for (uint64_t unit = 0; unit < layout.Units(file_bytes) && failed.ok(); ++unit) {
    const uint64_t begin = unit * g.unit_bytes;
    const uint64_t end = begin + layout.UnitBytes(file_bytes, unit);
    const StripeLayout::Slot slot = layout.DataSlot(me, unit);
    while (first < sorted.size() && sorted[first].logical_offset + sorted[first].bytes <= begin) {
      ++first;
    }
    for (size_t x = first; x < sorted.size() && sorted[x].logical_offset < end && failed.ok();
         ++x) {
      const SendExtent& e = sorted[x];
      const uint64_t a = std::max(begin, e.logical_offset);
      const uint64_t b = std::min(end, e.logical_offset + e.bytes);
      const uint8_t* data = e.data + (a - e.logical_offset);
      if (!at_sender) {
        for (uint32_t row = 0; row < m && failed.ok() && a < b; ++row) {
          send(unit, a - begin, slot.stripe, row, data, b - a, nullptr);
        }
        continue;
      }
      for (uint64_t p = a; p < b && failed.ok(); p += kPartialPieceBytes) {
        const uint64_t bytes = std::min<uint64_t>(kPartialPieceBytes, b - p);
        // Room for the piece's M calls; then a buffer no call holds any more.
        while (!in_flight.empty() && in_flight.size() + m > kParityPiecesInFlight) drain_one();
        std::shared_ptr<std::vector<uint8_t>> partials;
        for (auto& buffer : pool) {
          if (buffer.use_count() == 1) {
            partials = buffer;
            break;
          }
        }
        if (partials == nullptr) {
          CKPTDB_ASSERT(pool.size() <= kParityPiecesInFlight);
          partials = pool.emplace_back(
              std::make_shared<std::vector<uint8_t>>(uint64_t{m} * kPartialPieceBytes));
        }
        std::vector<uint8_t*> out(m);
        for (uint32_t row = 0; row < m; ++row) out[row] = partials->data() + row * bytes;
        code->Partial(bytes, slot.index, data + (p - a), rows, out.data());
        for (uint32_t row = 0; row < m && failed.ok(); ++row) {
          send(unit, p - begin, slot.stripe, row, out[row], bytes, partials);
        }
      }
    }
  }
  while (!in_flight.empty()) drain_one();
  return failed;
}

// Every member at once: announce the segment's length to every member, wait until each has laid
// out its parity, send each unit to the holders of its stripe's parity, say done, wait until
// each has sealed. A member waits here for the slowest of its group: the parity of a stripe
// needs every one of its data members.
Status Cluster::BuildParity(uint64_t version, uint64_t file_bytes,
                            const std::vector<SendExtent>& extents) {
  CKPTDB_ASSERT(group_.has_value());
  const CodingGroup& g = *group_;
  const uint32_t n = g.code.k + g.code.m;
  const uint32_t me = group_position_;
  const std::string what =
      "protecting v" + std::to_string(version) + " of " + R(options_.rank) + " in " + GroupName(g);
  const int64_t start = MonoMs();
  const auto start_clock = std::chrono::steady_clock::now();
  // A member arrives at its commit when its trainer does: allow the slowest one the call timeout.
  const int wait_ms = options_.call_timeout_ms;
  CKPTDB_RETURN_IF_ERROR(AnnounceToGroup(version, file_bytes, wait_ms, what));
  std::vector<uint8_t> ignored;
  // The holder allocates its parity's memory before answering (seconds for new pages on a VM).
  const int layout_ms =
      static_cast<int>(std::min<uint64_t>(wait_ms + file_bytes / (16 << 10), 24ull * 3600 * 1000));
  for (uint32_t q = 0; q < n; ++q) {
    CKPTDB_RETURN_IF_ERROR(
        CallParity(q, ParityHeader(kLayoutOp, g.group, version), nullptr, 0, layout_ms, &ignored)
            .WithContext(what + ": waiting for the group's parity layout"));
  }
  uint64_t sent = 0;
  CKPTDB_RETURN_IF_ERROR(SendUnits(version, file_bytes, extents, start, &sent)
                             .WithContext(what + ": sending its units"));
  {
    std::vector<uint8_t> body = ParityHeader(kDoneOp, g.group, version);
    WireWriter w;
    w.U32(me);
    Append(&body, w.Take());
    for (uint32_t q = 0; q < n; ++q) {
      CKPTDB_RETURN_IF_ERROR(
          CallParity(q, body, nullptr, 0, wait_ms, &ignored).WithContext(what + ": done"));
    }
  }
  for (uint32_t q = 0; q < n; ++q) {
    CKPTDB_RETURN_IF_ERROR(
        CallParity(q, ParityHeader(kSealedOp, g.group, version), nullptr, 0, wait_ms, &ignored)
            .WithContext(what + ": waiting for the group's parity to be sealed"));
  }
  // The coordinator hears of the parity this rank now holds before its vote does: it counts a
  // version rebuildable only from the holdings it has (HandleRecoverable, RebuildableLocked).
  SendHeartbeat();
  RecordRedundancyTraffic(sent, start_clock);
  return Status::Ok();
}

void Cluster::HandleParity(const Request& request, Reply* reply) {
  WireReader r(request.body, "parity call from " + request.peer);
  const uint8_t op = r.U8("op");
  const uint32_t group = r.U32("group");
  const uint64_t version = r.U64("version");
  const std::string what = "parity of v" + std::to_string(version) + " of coding group " +
                           std::to_string(group) + " (from " + request.peer + ")";
  if (parity_ == nullptr) {
    return Fail(reply, Status::State(R(options_.rank) + " keeps no parity (redundancy is not "
                                                        "ec: or xor:)"));
  }
  Status st;
  switch (op) {
    case kAnnounce: {
      CodingGroup shape;
      const uint8_t scheme = r.U8("scheme");
      shape.code.scheme = scheme == kXorScheme ? CodeScheme::kXor : CodeScheme::kReedSolomon;
      shape.code.encoding =
          scheme == kRsAtSenders ? redundancy::Encoding::kSender : redundancy::Encoding::kHolder;
      shape.code.k = r.U32("k");
      shape.code.m = r.U32("m");
      shape.unit_bytes = r.U64("unit bytes");
      const uint32_t n = r.U32("members");
      for (uint32_t i = 0; i < n && i <= kMaxCodeBlocks && r.ok(); ++i) {
        shape.members.push_back(r.U32("member"));
      }
      const uint32_t position = r.U32("position");
      const uint64_t segment_bytes = r.U64("segment bytes");
      st = r.Finish();
      if (st.ok() && (scheme > kRsAtSenders || n > kMaxCodeBlocks)) {
        st = Status::Invalid(what + ": unknown scheme or too many members");
      }
      shape.group = group;
      if (st.ok()) {
        // As a replica's begin (HandleReplicate): parity sealed for a version this rank never
        // committed is what a killed job left, and the restarted one builds it again.
        const bool replace_sealed = hooks_.committed && !hooks_.committed(version);
        st = parity_->Announce(shape, version, position, segment_bytes, what, replace_sealed);
      }
      break;
    }
    case kLayoutOp:
      st = r.Finish();
      if (st.ok()) st = parity_->Layout(group, version, what);
      break;
    case kData: {
      const uint32_t position = r.U32("position");
      const uint64_t unit = r.U64("unit");
      const uint64_t offset = r.U64("offset");
      st = r.Finish();
      if (st.ok()) {
        st = parity_->Accumulate(group, version, position, unit, offset, request.Payload(), what);
      }
      if (st.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.replica_bytes_received += request.Payload().size();
      }
      break;
    }
    case kDoneOp: {
      const uint32_t position = r.U32("position");
      st = r.Finish();
      if (st.ok()) st = parity_->Done(group, version, position, what);
      break;
    }
    case kSealedOp:
      st = r.Finish();
      if (st.ok()) st = parity_->Sealed(group, version, what);
      break;
    case kSize:
    case kFetchParity: {
      const uint64_t offset = op == kFetchParity ? r.U64("offset") : 0;
      const uint64_t bytes = op == kFetchParity ? r.U64("bytes") : 0;
      st = r.Finish();
      if (!st.ok()) break;
      std::shared_ptr<MappedFile> map = parity_->Find(group, version);
      if (map == nullptr) {
        st = Status::NotFound(R(options_.rank) + " holds no parity of v" + std::to_string(version) +
                              " of coding group " + std::to_string(group));
        break;
      }
      if (op == kSize) {
        WireWriter w;
        w.U64(map->bytes());
        reply->body = w.Take();
        break;
      }
      if (bytes == 0 || bytes > kMaxFetchBytes || offset > map->bytes() ||
          bytes > map->bytes() - offset) {
        st = Status::Invalid(what + ": the range [" + std::to_string(offset) + ", +" +
                             std::to_string(bytes) + ") of its " + std::to_string(map->bytes()) +
                             " bytes");
        break;
      }
      ServeMapped(std::move(map), offset, bytes, nullptr, request.from, reply);
      break;
    }
    default:
      st = Status::Invalid(what + ": unknown op " + std::to_string(op));
  }
  if (!st.ok()) {
    if (st.code() != CKPTDB_EBUSY && st.code() != CKPTDB_ENOTFOUND) {
      std::fprintf(stderr, "ckptdb[%s]: parity: %s\n", R(options_.rank).c_str(),
                   st.message().c_str());
    }
    Fail(reply, st);
  }
}

// ---- Rebuilding a lost member ------------------------------------------------------------------

struct Cluster::Rebuild::Impl {
  Cluster* cluster = nullptr;
  uint64_t version = 0;
  CodingGroup group;
  uint32_t me = 0;
  std::vector<uint64_t> member_bytes;
  std::unique_ptr<StripeLayout> layout;
  std::unique_ptr<ErasureCode> code;
  struct Holder {
    bool tried = false;
    bool failed = false;
    std::unique_ptr<format::SegmentReader> reader;
  };
  std::vector<Holder> holders;    // by position: the parity each member holds
  std::vector<bool> data_failed;  // by position: its own segment could not be read
  std::set<std::pair<uint64_t, uint32_t>> bad_blocks;  // (stripe, block index) failing xxh3
  std::map<uint64_t, std::vector<uint8_t>> units;
  std::map<uint64_t, uint32_t> attempts;
  std::string what;

  static constexpr uint32_t kMaxAttempts = 16;
  static constexpr size_t kMaxCachedUnits = 64;  // 256 MiB of 4 MiB units

  // Opens member q's parity segment (its framing and manifest, read through fetches).
  Status OpenHolder(uint32_t q) {
    Holder& h = holders[q];
    if (h.tried) return h.failed ? Status::NotFound("member gone") : Status::Ok();
    h.tried = true;
    std::vector<uint8_t> reply;
    Status st = cluster->CallParity(q, ParityHeader(kSize, group.group, version), nullptr, 0,
                                    cluster->options_.call_timeout_ms, &reply);
    uint64_t bytes = 0;
    if (st.ok()) {
      WireReader r(reply, "parity size");
      bytes = r.U64("bytes");
      st = r.Finish();
    }
    if (st.ok()) {
      st = format::SegmentReader::Open(
          what + ": parity on " + R(group.members[q]), bytes,
          [this, q](uint64_t off, void* buf, size_t len) { return FetchParity(q, off, buf, len); },
          &h.reader);
    }
    if (st.ok()) {
      const fb::Redundancy* r = h.reader->manifest().root().redundancy();
      const auto scheme = group.code.scheme == CodeScheme::kXor ? fb::RedundancyScheme::Xor
                                                                : fb::RedundancyScheme::ReedSolomon;
      const bool same = r != nullptr && r->parity() && r->scheme() == scheme &&
                        r->k() == group.code.k && r->m() == group.code.m &&
                        r->group() == group.group && r->stripe_bytes() == group.unit_bytes &&
                        r->position() == q &&
                        std::equal(group.members.begin(), group.members.end(),
                                   r->member_ranks()->begin(), r->member_ranks()->end());
      if (!same)
        st = Status::Corrupt(what + ": the parity on " + R(group.members[q]) +
                             " is of another layout");
    }
    if (!st.ok()) {
      h.failed = true;
      h.reader.reset();
    }
    return st;
  }

  Status FetchParity(uint32_t q, uint64_t offset, void* out, size_t bytes) {
    auto* dst = static_cast<uint8_t*>(out);
    for (uint64_t done = 0; done < bytes;) {
      const uint64_t n = std::min<uint64_t>(kMaxFetchBytes, bytes - done);
      std::vector<uint8_t> body = ParityHeader(kFetchParity, group.group, version);
      WireWriter w;
      w.U64(offset + done);
      w.U64(n);
      Append(&body, w.Take());
      std::vector<uint8_t> reply;
      CKPTDB_RETURN_IF_ERROR(cluster->CallParity(
          q, body, nullptr, 0, cluster->options_.call_timeout_ms, &reply, dst + done, n));
      done += n;
    }
    return Status::Ok();
  }

  // Member d's own bytes [offset, offset + bytes).
  Status FetchData(uint32_t d, uint64_t offset, uint8_t* out, uint64_t bytes) {
    ReplicaHolder holder;
    holder.rank = group.members[d];
    {
      std::lock_guard<std::mutex> lock(cluster->mu_);
      holder.node_id = cluster->table_[holder.rank].node_id;
      holder.address = cluster->table_[holder.rank].address;
    }
    std::vector<Cluster::FetchRange> ranges;
    for (uint64_t done = 0; done < bytes; done += kMaxFetchBytes) {
      ranges.push_back(
          {offset + done, out + done, std::min<uint64_t>(kMaxFetchBytes, bytes - done)});
    }
    std::vector<Status> results;
    CKPTDB_RETURN_IF_ERROR(cluster->FetchRanges(holder, holder.rank, version, ranges, &results));
    for (const Status& s : results) CKPTDB_RETURN_IF_ERROR(s);
    return Status::Ok();
  }

  // Decodes this member's unit `unit`: K blocks of its stripe from the members that have them.
  Status DecodeUnit(uint64_t unit, std::vector<uint8_t>* out) {
    const StripeLayout::Slot slot = layout->DataSlot(me, unit);
    const uint64_t stripe_bytes = layout->StripeBytes(member_bytes, slot.stripe);
    const uint32_t k = group.code.k;
    // Bounded: every pass marks one more source failed or returns.
    for (int pass = 0; pass < static_cast<int>(2 * (k + group.code.m) + 2); ++pass) {
      struct Block {
        uint32_t index;  // in the code: data 0..K-1, parity K + row
        uint32_t member;
        bool parity;
        uint64_t unit;   // data: the member's unit
        uint64_t bytes;  // data: its bytes
      };
      std::vector<uint32_t> zeros;  // data blocks past their member's segment: zeros, free
      std::vector<Block> candidates;
      for (uint32_t i = 0; i < k; ++i) {
        if (i == slot.index) continue;
        const uint32_t d = layout->DataMember(slot.stripe, i);
        const uint64_t u = layout->DataUnit(slot.stripe, i);
        const uint64_t b = layout->UnitBytes(member_bytes[d], u);
        if (b == 0) {
          zeros.push_back(i);
        } else if (!data_failed[d]) {
          candidates.push_back({i, d, false, u, b});
        }
      }
      for (uint32_t row = 0; row < group.code.m; ++row) {
        const uint32_t h = layout->ParityMember(slot.stripe, row);
        if (h == me || holders[h].failed || bad_blocks.count({slot.stripe, k + row})) continue;
        candidates.push_back({k + row, h, true, 0, 0});
      }
      const size_t need = k - zeros.size();
      if (candidates.size() < need) {
        return Status::NotFound(what + ": unit " + std::to_string(unit) + " (stripe " +
                                std::to_string(slot.stripe) +
                                "): " + std::to_string(candidates.size() + zeros.size()) +
                                " of the " + std::to_string(k) + " blocks needed are left");
      }
      // The attempt-th choice of `need` candidates, in lexicographic order.
      std::vector<size_t> pick(need);
      for (size_t i = 0; i < need; ++i) pick[i] = i;
      for (uint32_t a = 0; a < attempts[unit]; ++a) {
        size_t i = need;
        while (i > 0 && pick[i - 1] == candidates.size() - need + i - 1) --i;
        if (i == 0)
          return Status::Corrupt(what + ": unit " + std::to_string(unit) +
                                 ": every choice of blocks decoded to bytes that fail "
                                 "their checks");
        ++pick[i - 1];
        for (size_t j = i; j < need; ++j) pick[j] = pick[j - 1] + 1;
      }
      std::vector<std::vector<uint8_t>> blocks;
      std::vector<uint32_t> index;
      Status st;
      for (uint32_t z : zeros) {
        blocks.emplace_back(stripe_bytes, 0);
        index.push_back(z);
      }
      for (size_t p : pick) {
        const Block& c = candidates[p];
        std::vector<uint8_t> block(stripe_bytes, 0);
        if (c.parity) {
          st = OpenHolder(c.member);
          const fb::Tensor* t = nullptr;
          if (st.ok()) {
            const std::string name = ParityBlockName(slot.stripe, c.index - k);
            t = holders[c.member].reader->manifest().Find(name);
            if (t == nullptr || t->bytes() != stripe_bytes || t->chunk_count() != 1) {
              st = Status::Corrupt(what + ": the parity on " + R(group.members[c.member]) +
                                   " has no block " + name + " of " + std::to_string(stripe_bytes) +
                                   " bytes");
            }
          }
          if (st.ok()) {
            const auto& chunk = holders[c.member].reader->manifest().chunk(t->first_chunk());
            st = FetchParity(c.member, chunk.record_offset() + format::kBlockBytes, block.data(),
                             stripe_bytes);
            if (st.ok()) {
              st = format::CheckXxh3(block.data(), stripe_bytes, chunk.xxh3(),
                                     what + ": parity block of stripe " +
                                         std::to_string(slot.stripe) + " on " +
                                         R(group.members[c.member]));
            }
          }
          // A block that fails its xxh3 is an erasure of its own; a holder that cannot be
          // reached or read is gone for every stripe.
          if (st.code() == CKPTDB_ECORRUPT && holders[c.member].reader != nullptr) {
            bad_blocks.insert({slot.stripe, c.index});
          } else if (!st.ok()) {
            holders[c.member].failed = true;
          }
        } else {
          st = FetchData(c.member, c.unit * group.unit_bytes, block.data(), c.bytes);
          if (!st.ok()) data_failed[c.member] = true;
        }
        if (!st.ok()) break;
        blocks.push_back(std::move(block));
        index.push_back(c.index);
      }
      if (!st.ok()) continue;  // a source failed: choose again without it
      std::vector<const uint8_t*> present;
      for (const auto& b : blocks) present.push_back(b.data());
      out->assign(stripe_bytes, 0);
      uint8_t* dst = out->data();
      const uint32_t wanted = slot.index;
      CKPTDB_RETURN_IF_ERROR(code->Decode(stripe_bytes, index, present.data(),
                                          std::span<const uint32_t>(&wanted, 1), &dst));
      out->resize(layout->UnitBytes(member_bytes[me], unit));
      return Status::Ok();
    }
    return Status::NotFound(what + ": unit " + std::to_string(unit) + ": its sources failed");
  }
};

Cluster::Rebuild::Rebuild(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Cluster::Rebuild::~Rebuild() = default;

uint64_t Cluster::Rebuild::file_bytes() const { return impl_->member_bytes[impl_->me]; }

Status Cluster::Rebuild::Read(uint64_t offset, void* out, uint64_t bytes) {
  Impl& x = *impl_;
  const uint64_t total = file_bytes();
  if (offset > total || bytes > total - offset) {
    return Status::Corrupt(x.what + ": a read past its " + std::to_string(total) + " bytes");
  }
  auto* dst = static_cast<uint8_t*>(out);
  const uint64_t unit_bytes = x.group.unit_bytes;
  for (uint64_t at = offset; at < offset + bytes;) {
    const uint64_t unit = at / unit_bytes;
    auto it = x.units.find(unit);
    if (it == x.units.end()) {
      std::vector<uint8_t> decoded;
      CKPTDB_RETURN_IF_ERROR(x.DecodeUnit(unit, &decoded));
      // Bounded: restores read forward, so the oldest units decoded go first.
      while (x.units.size() >= Impl::kMaxCachedUnits) x.units.erase(x.units.begin());
      it = x.units.emplace(unit, std::move(decoded)).first;
    }
    const uint64_t in_unit = at - unit * unit_bytes;
    const uint64_t n = std::min<uint64_t>(it->second.size() - in_unit, offset + bytes - at);
    std::memcpy(dst + (at - offset), it->second.data() + in_unit, n);
    at += n;
  }
  return Status::Ok();
}

bool Cluster::Rebuild::Retry(uint64_t offset, uint64_t bytes) {
  Impl& x = *impl_;
  bool left = false;
  const uint64_t unit_bytes = x.group.unit_bytes;
  for (uint64_t unit = offset / unit_bytes;
       unit <= (offset + std::max<uint64_t>(bytes, 1) - 1) / unit_bytes; ++unit) {
    x.units.erase(unit);
    if (++x.attempts[unit] < Impl::kMaxAttempts) left = true;
  }
  return left;
}

void Cluster::Rebuild::Refresh() {
  Impl& x = *impl_;
  for (uint32_t q = 0; q < x.holders.size(); ++q) {
    if (x.holders[q].failed && x.holders[q].reader == nullptr) x.holders[q] = Impl::Holder{};
    x.data_failed[q] = q == x.me;
  }
}

std::string Cluster::Rebuild::Source() const { return "rebuild:" + impl_->group.code.Name(); }

Status Cluster::OpenRebuild(uint64_t version, std::unique_ptr<Rebuild>* out) {
  if (!group_) return Status::NotFound(R(options_.rank) + " is in no coding group");
  auto x = std::make_unique<Rebuild::Impl>();
  x->cluster = this;
  x->version = version;
  x->group = *group_;
  x->me = group_position_;
  x->what = "rebuilding v" + std::to_string(version) + " of " + R(options_.rank) + " from " +
            GroupName(x->group);
  const uint32_t n = x->group.code.k + x->group.code.m;
  x->holders.resize(n);
  x->data_failed.assign(n, false);
  x->data_failed[x->me] = true;  // what is rebuilt
  CKPTDB_RETURN_IF_ERROR(ErasureCode::Make(x->group.code, &x->code));
  x->layout = std::make_unique<StripeLayout>(x->group.code.k, x->group.code.m, x->group.unit_bytes,
                                             version);
  // Every member's length, from the first holder whose parity opens.
  Status last = Status::NotFound(x->what + ": no member holds its parity");
  for (uint32_t q = 0; q < n && x->member_bytes.empty(); ++q) {
    if (q == x->me) continue;
    last = x->OpenHolder(q);
    if (!last.ok()) continue;
    const auto* sizes = x->holders[q].reader->manifest().root().redundancy()->member_bytes();
    x->member_bytes.assign(sizes->begin(), sizes->end());
  }
  if (x->member_bytes.empty()) return last;
  if (x->member_bytes[x->me] == 0) {
    return Status::NotFound(x->what + ": the group's parity says it had no segment");
  }
  *out = std::unique_ptr<Rebuild>(new Rebuild(std::move(x)));
  return Status::Ok();
}

}  // namespace ckpt::engine
