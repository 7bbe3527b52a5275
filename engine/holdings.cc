#include "engine/holdings.h"

#include "format/manifest.h"
#include "transport/wire.h"

namespace ckpt::engine {

using transport::WireReader;
using transport::WireWriter;

std::vector<uint8_t> EncodeHoldings(HoldingsReport r) {
  if (r.local.size() > kMaxLocalVersions) r.local.resize(kMaxLocalVersions);
  if (r.replicas.size() > kMaxHeldReplicas) r.replicas.resize(kMaxHeldReplicas);
  if (r.parity.size() > kMaxHeldParity) {
    r.parity.erase(r.parity.begin(), r.parity.end() - kMaxHeldParity);  // the newest
  }
  if (r.memory.size() > kMaxMemoryVersions) r.memory.resize(kMaxMemoryVersions);
  if (r.arc.size() > kMaxArcReports) r.arc.resize(kMaxArcReports);
  WireWriter w;
  w.U32(static_cast<uint32_t>(r.local.size()));
  for (uint64_t v : r.local) w.U64(v);
  w.U32(static_cast<uint32_t>(r.replicas.size()));
  for (auto [owner, v] : r.replicas) {
    w.U32(owner);
    w.U64(v);
  }
  w.U32(static_cast<uint32_t>(r.parity.size()));
  for (auto [group, v] : r.parity) {
    w.U32(group);
    w.U64(v);
  }
  w.U64(r.voted_through);
  w.U32(static_cast<uint32_t>(r.memory.size()));
  for (uint64_t v : r.memory) w.U64(v);
  w.U32(static_cast<uint32_t>(r.arc.size()));
  for (const ArcReport& a : r.arc) {
    w.U64(a.version);
    w.U32(a.group);
    w.U8(a.replicated_only ? 1 : 0);
    w.U32(static_cast<uint32_t>(a.members.size()));
    for (uint32_t rank : a.members) w.U32(rank);
    w.U8(a.protection);
  }
  return w.Take();
}

Status ParseHoldings(std::span<const uint8_t> in, const std::string& what, HoldingsReport* out) {
  WireReader h(in, what);
  auto count = [&](const char* field, size_t most, uint32_t* n) {
    *n = h.U32(field);
    if (*n <= most) return Status::Ok();
    return Status::Corrupt(what + ": " + std::to_string(*n) + " " + field + ", at most " +
                           std::to_string(most));
  };
  uint32_t n = 0;
  CKPTDB_RETURN_IF_ERROR(count("local versions", kMaxLocalVersions, &n));
  for (uint32_t i = 0; i < n && h.ok(); ++i) out->local.push_back(h.U64("version"));
  CKPTDB_RETURN_IF_ERROR(count("replicas", kMaxHeldReplicas, &n));
  for (uint32_t i = 0; i < n && h.ok(); ++i) {
    const uint32_t owner = h.U32("owner");
    out->replicas.emplace_back(owner, h.U64("version"));
  }
  CKPTDB_RETURN_IF_ERROR(count("parity segments", kMaxHeldParity, &n));
  for (uint32_t i = 0; i < n && h.ok(); ++i) {
    const uint32_t group = h.U32("group");
    out->parity.emplace_back(group, h.U64("version"));
  }
  out->voted_through = h.U64("voted through");
  CKPTDB_RETURN_IF_ERROR(count("versions in memory", kMaxMemoryVersions, &n));
  for (uint32_t i = 0; i < n && h.ok(); ++i) out->memory.push_back(h.U64("version"));
  CKPTDB_RETURN_IF_ERROR(count("arc versions", kMaxArcReports, &n));
  for (uint32_t i = 0; i < n && h.ok(); ++i) {
    ArcReport a;
    a.version = h.U64("version");
    a.group = h.U32("group");
    const uint8_t replicated_only = h.U8("replicated only");
    if (replicated_only > 1) {
      return Status::Corrupt(what + ": an arc version's replicated_only is " +
                             std::to_string(replicated_only));
    }
    a.replicated_only = replicated_only == 1;
    const uint32_t members = h.U32("members");
    if (h.ok() && (members < 2 || members > format::kMaxReplicaMembers)) {
      return Status::Corrupt(what + ": an arc group of " + std::to_string(members) + " members");
    }
    for (uint32_t j = 0; j < members && h.ok(); ++j) a.members.push_back(h.U32("member"));
    for (size_t j = 1; j < a.members.size(); ++j) {
      if (a.members[j - 1] >= a.members[j]) {
        return Status::Corrupt(what + ": an arc group's members are not ascending");
      }
    }
    a.protection = h.U8("protection");  // bits: 1 arc, 2 aec, 4 aor (with arc or aec)
    const uint8_t kept = a.protection & 3;
    if (h.ok() && (kept < 1 || a.protection > 7 || (kept >= 2 && a.members.size() < 3))) {
      return Status::Corrupt(what + ": an arc group of " + std::to_string(a.members.size()) +
                             " members with protection " + std::to_string(a.protection));
    }
    out->arc.push_back(std::move(a));
  }
  return h.Finish();
}

}  // namespace ckpt::engine
