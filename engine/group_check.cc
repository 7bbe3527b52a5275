#include "engine/group_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "engine/internal.h"
#include "format/manifest.h"
#include "format/segment_format.h"
#include "format/segment_reader.h"
#include "redundancy/erasure_code.h"
#include "redundancy/stripe_layout.h"
#include "util/assert.h"

namespace ckpt::engine {
using redundancy::CodeScheme;
using redundancy::ErasureCode;
using redundancy::StripeLayout;
namespace {

// A member's segment longer than this is a damaged record, not a segment (ParityStore's bound).
constexpr uint64_t kMaxMemberBytes = uint64_t{1} << 40;

// A parity segment read with pread (retention may drop the file while it is read: a mapping would
// fault, a read fails cleanly).
class ParityFile {
 public:
  ~ParityFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  // NotFound when the file does not exist.
  Status Open(const std::string& path) {
    what_ = "parity segment " + path;
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return Status::FromErrno(errno, "open " + path);
    struct stat st {};
    if (::fstat(fd_, &st) != 0) return Status::FromErrno(errno, "fstat " + path);
    return format::SegmentReader::Open(
        what_, static_cast<uint64_t>(st.st_size),
        [this](uint64_t off, void* buf, size_t len) { return Read(off, buf, len); }, &reader_);
  }
  Status Read(uint64_t offset, void* out, size_t bytes) const {
    auto* dst = static_cast<uint8_t*>(out);
    for (size_t done = 0; done < bytes;) {
      ssize_t n = ::pread(fd_, dst + done, bytes - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::FromErrno(errno, "read " + what_);
      if (n == 0)
        return Status::Corrupt(what_ + ": ends before offset " + std::to_string(offset + done));
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  }
  const format::SegmentReader& reader() const { return *reader_; }

 private:
  int fd_ = -1;
  std::string what_;
  std::unique_ptr<format::SegmentReader> reader_;
};

bool Overlaps(const std::vector<std::pair<uint64_t, uint64_t>>& bad, uint64_t begin, uint64_t end) {
  return std::any_of(bad.begin(), bad.end(),
                     [&](const auto& r) { return r.first < end && begin < r.second; });
}

// One member of a group as the check sees it.
struct Member {
  Db* store = nullptr;                   // nullptr: not given
  const Db::CopiesOf* copies = nullptr;  // nullptr: its store has no copy of the version
  std::unique_ptr<ParityFile> parity;    // readable parity segment, else nullptr
  std::string parity_state = "not given";
  std::map<std::string, uint32_t> bad_blocks;  // block names failing xxh3 (value unused)
  const Db::CopyCheck* ram() const {
    if (copies == nullptr) return nullptr;
    for (const Db::CopyCheck& c : copies->copies) {
      if (c.ram && c.readable.ok()) return &c;
    }
    return nullptr;
  }
};

}  // namespace

int SpareMemberLosses(uint32_t k, uint32_t m, std::span<const StripeBlocks> stripes) {
  int spare = static_cast<int>(m);
  for (const StripeBlocks& s : stripes) {
    const uint32_t present = s.zeros + s.data_present + s.parity_present;
    if (s.data_missing > 0 && present < k) return -1;
    // The least number of losses that fails this stripe: take present - k + 1 of its losable
    // blocks, at least one of them a data unit unless one is missing already.
    // With nothing missing the stripe's K data blocks are all there (zeros or present).
    CKPTDB_ASSERT(present >= k);
    const uint32_t need = present - k + 1;
    const uint32_t losable = s.data_present + s.parity_present;
    // Enough losable blocks, and (where nothing is missing yet) a data unit among them: with no
    // data unit present the K data blocks are all zeros and need > losable.
    if (need > losable) continue;
    spare = std::min(spare, static_cast<int>(need) - 1);
  }
  return spare;
}

Status CheckCodingGroups(std::span<Db* const> stores, uint64_t version, bool layout_only,
                         const std::function<void(const GroupCheck&)>& fn) {
  if (stores.empty()) return Status::Invalid("verify of coding groups: no store given");
  for (Db* db : stores) {
    if (db == nullptr) return Status::Invalid("verify of coding groups: a store is NULL");
  }
  // The layouts first, from the manifests alone: a store with nothing coded costs no data reads.
  std::vector<std::vector<Db::CopiesOf>> layouts(stores.size());
  bool any = false;
  for (size_t i = 0; i < stores.size(); ++i) {
    Status st = stores[i]->CheckCopies(version, /*check_chunks=*/false, &layouts[i]);
    if ((st.code() == CKPTDB_ENOTFOUND || st.code() == CKPTDB_ESTATE) &&
        version != CKPTDB_ALL_VERSIONS) {
      continue;  // this store does not hold it
    }
    CKPTDB_RETURN_IF_ERROR(st.WithContext(R(stores[i]->rank())));
    any = true;
  }
  if (!any) {
    return Status::NotFound("verify of coding groups: version " + std::to_string(version) +
                            " is committed in none of the stores given");
  }
  std::set<uint64_t> coded;
  for (const auto& list : layouts) {
    for (const Db::CopiesOf& of : list) {
      if (of.group) coded.insert(of.version);
    }
  }
  if (coded.empty()) return Status::Ok();  // no coding group to check
  // A coding group's members are ranks of one job.
  std::map<uint32_t, Db*> by_rank;
  for (Db* db : stores) {
    if (db->job_id() != stores[0]->job_id()) {
      return Status::Invalid("verify of coding groups: " + R(db->rank()) +
                             "'s store is of another job than " + R(stores[0]->rank()) + "'s");
    }
    if (!by_rank.emplace(db->rank(), db).second) {
      return Status::Invalid("verify of coding groups: two stores of " + R(db->rank()));
    }
  }
  // Every store's copies of the coded versions, now checked chunk by chunk.
  std::map<uint32_t, std::vector<Db::CopiesOf>> copies;
  for (size_t i = 0; i < stores.size(); ++i) {
    std::vector<Db::CopiesOf>& out = copies[stores[i]->rank()];
    for (const Db::CopiesOf& of : layouts[i]) {
      if (!coded.count(of.version)) continue;
      if (layout_only) {
        out.push_back(of);
        continue;
      }
      std::vector<Db::CopiesOf> checked;
      Status st = stores[i]->CheckCopies(of.version, /*check_chunks=*/true, &checked);
      if (st.code() == CKPTDB_ENOTFOUND || st.code() == CKPTDB_ESTATE) continue;  // retired since
      CKPTDB_RETURN_IF_ERROR(st.WithContext(R(stores[i]->rank())));
      for (Db::CopiesOf& c : checked) out.push_back(std::move(c));
    }
  }
  // The groups: (version, group) -> layout, from any member's manifest.
  std::map<std::pair<uint64_t, uint32_t>, CodingGroup> groups;
  std::vector<std::string> disagreements;
  for (const auto& [rank, list] : copies) {
    for (const Db::CopiesOf& of : list) {
      if (!of.group) continue;
      auto [it, inserted] = groups.emplace(std::make_pair(of.version, of.group->group), *of.group);
      if (!inserted && !(it->second == *of.group)) {
        disagreements.push_back("version " + std::to_string(of.version) + ": " + R(rank) +
                                "'s manifest records another layout of group " +
                                std::to_string(of.group->group) + " than its other members'");
      }
    }
  }
  if (layout_only) {
    for (const auto& [key, g] : groups) {
      GroupCheck check;
      check.version = key.first;
      check.group = g;
      check.member_bytes.assign(g.members.size(), 0);
      check.sources.assign(g.members.size(), "unchecked");
      check.parity.assign(g.members.size(), "unchecked");
      check.problems = disagreements;
      fn(check);
    }
    return Status::Ok();
  }
  bool clean = disagreements.empty();
  for (const auto& [key, g] : groups) {
    const auto [v, group_number] = key;
    const uint32_t k = g.code.k;
    const uint32_t n = g.code.k + g.code.m;
    GroupCheck check;
    check.version = v;
    check.group = g;
    check.problems = disagreements;
    const std::string what = "version " + std::to_string(v) + " of group " +
                             std::to_string(group_number) + " (" + g.code.Name() + ")";
    std::vector<Member> members(n);
    for (uint32_t p = 0; p < n; ++p) {
      Member& mem = members[p];
      auto it = by_rank.find(g.members[p]);
      if (it == by_rank.end()) continue;
      mem.store = it->second;
      for (const Db::CopiesOf& of : copies[g.members[p]]) {
        if (of.version == v) mem.copies = &of;
      }
      const std::string dir = mem.store->ParityDir();
      if (dir.empty()) {
        mem.parity_state = "missing";
        continue;
      }
      auto file = std::make_unique<ParityFile>();
      Status st = file->Open(dir + "/" + ParitySegmentName(group_number, v));
      if (st.code() == CKPTDB_ENOTFOUND) {
        mem.parity_state = "missing";
        continue;
      }
      if (st.ok()) {
        const fb::Redundancy* r = file->reader().manifest().root().redundancy();
        const auto scheme = g.code.scheme == CodeScheme::kXor ? fb::RedundancyScheme::Xor
                                                              : fb::RedundancyScheme::ReedSolomon;
        const bool same = r != nullptr && r->parity() && r->scheme() == scheme &&
                          r->k() == g.code.k && r->m() == g.code.m && r->group() == group_number &&
                          r->stripe_bytes() == g.unit_bytes && r->position() == p &&
                          r->member_bytes() != nullptr && r->member_bytes()->size() == n &&
                          r->member_ranks() != nullptr &&
                          std::equal(g.members.begin(), g.members.end(), r->member_ranks()->begin(),
                                     r->member_ranks()->end());
        // A length no segment can have (it would lay out billions of stripes).
        if (same) {
          for (uint64_t bytes : *r->member_bytes()) {
            if (bytes > kMaxMemberBytes) {
              st = Status::Corrupt("parity of " + R(g.members[p]) +
                                   " records a member's segment of " + std::to_string(bytes) +
                                   " bytes");
            }
          }
        }
        if (!same) st = Status::Corrupt("parity of " + R(g.members[p]) + " is of another layout");
      }
      if (!st.ok()) {
        mem.parity_state = "unreadable";
        check.problems.push_back(what + ": " + st.message());
        continue;
      }
      mem.parity = std::move(file);
      mem.parity_state = "ok";
    }
    // Every member's segment length: its own copies, else a parity segment's record of it.
    check.member_bytes.assign(n, 0);
    std::vector<bool> known(n, false);
    for (uint32_t p = 0; p < n; ++p) {
      if (members[p].copies != nullptr && !members[p].copies->copies.empty()) {
        check.member_bytes[p] = members[p].copies->copies.front().file_bytes;
        known[p] = true;
      }
    }
    for (uint32_t h = 0; h < n; ++h) {
      if (members[h].parity == nullptr) continue;
      const auto* recorded =
          members[h].parity->reader().manifest().root().redundancy()->member_bytes();
      for (uint32_t p = 0; p < n; ++p) {
        if (!known[p]) {
          check.member_bytes[p] = recorded->Get(p);
          known[p] = true;
        } else if (recorded->Get(p) != check.member_bytes[p]) {
          check.problems.push_back(what + ": the parity on " + R(g.members[h]) + " records " +
                                   R(g.members[p]) + "'s segment as " +
                                   std::to_string(recorded->Get(p)) + " bytes, its copy is " +
                                   std::to_string(check.member_bytes[p]));
          members[h].parity_state = "bad";
        }
      }
    }
    const bool all_known = std::all_of(known.begin(), known.end(), [](bool b) { return b; });
    std::unique_ptr<ErasureCode> code;
    if (Status st = ErasureCode::Make(g.code, &code); !st.ok()) {
      check.problems.push_back(what +
                               ": its layout is not a code this build makes: " + st.message());
      check.sources.assign(n, "lost");
      check.parity.assign(n, "unchecked");
      check.member_bytes.assign(n, 0);
      clean = false;
      fn(check);
      continue;
    }
    const StripeLayout layout(g.code.k, g.code.m, g.unit_bytes, v);
    check.stripes = all_known ? layout.Stripes(check.member_bytes) : 0;
    check.parity_blocks = check.stripes * g.code.m;
    // Each parity block's xxh3.
    for (uint32_t h = 0; h < n; ++h) {
      if (members[h].parity == nullptr) continue;
      const format::SegmentReader& reader = members[h].parity->reader();
      std::vector<uint8_t> scratch;
      for (uint32_t t = 0; t < reader.manifest().tensor_count(); ++t) {
        const fb::Tensor& tensor = reader.manifest().tensor(t);
        if (tensor.chunk_count() != 1) continue;
        format::ChunkProblem problem;
        Status st = reader.CheckChunk(tensor.first_chunk(), &scratch, &problem);
        if (!st.ok()) {
          members[h].bad_blocks[tensor.name()->str()] = 1;
          check.problems.push_back(what + ": " + st.message());
        }
      }
    }
    // Per stripe: recompute the parity where every data unit reads, and count what is there.
    std::vector<StripeBlocks> counts(check.stripes);
    std::vector<bool> unit_missing;              // scratch
    std::vector<bool> rebuild_needed(n, false);  // a member's ram copy lacks some unit
    std::vector<std::vector<uint64_t>> missing_stripes(n);
    for (uint64_t s = 0; s < check.stripes; ++s) {
      const uint64_t stripe_bytes = layout.StripeBytes(check.member_bytes, s);
      std::vector<std::vector<uint8_t>> data(k);
      bool data_whole = true;
      for (uint32_t i = 0; i < k; ++i) {
        const uint32_t d = layout.DataMember(s, i);
        const uint64_t u = layout.DataUnit(s, i);
        const uint64_t bytes = layout.UnitBytes(check.member_bytes[d], u);
        data[i].assign(stripe_bytes, 0);
        if (bytes == 0) {
          counts[s].zeros++;
          continue;
        }
        const uint64_t begin = u * g.unit_bytes;
        const Db::CopyCheck* ram = members[d].ram();
        if (ram != nullptr && !Overlaps(ram->bad, begin, begin + bytes)) {
          counts[s].data_present++;
        } else {
          counts[s].data_missing++;
          rebuild_needed[d] = true;
          missing_stripes[d].push_back(s);
        }
        // The bytes, from the fastest copy whose records over this unit check out.
        bool read = false;
        if (members[d].copies != nullptr) {
          for (const Db::CopyCheck& c : members[d].copies->copies) {
            if (!c.readable.ok() || Overlaps(c.bad, begin, begin + bytes)) continue;
            if (members[d].store->ReadCopy(v, c.tier, begin, bytes, data[i].data()).ok()) {
              read = true;
              break;
            }
          }
        }
        data_whole &= read;
      }
      std::vector<std::vector<uint8_t>> expected;
      if (data_whole) {
        expected.assign(g.code.m, std::vector<uint8_t>(stripe_bytes));
        std::vector<const uint8_t*> in;
        std::vector<uint8_t*> out;
        for (auto& b : data) in.push_back(b.data());
        for (auto& b : expected) out.push_back(b.data());
        code->Encode(stripe_bytes, in.data(), out.data());
      }
      for (uint32_t row = 0; row < g.code.m; ++row) {
        const uint32_t h = layout.ParityMember(s, row);
        Member& holder = members[h];
        if (holder.parity == nullptr) continue;
        const std::string name = ParityBlockName(s, row);
        const format::ManifestView& manifest = holder.parity->reader().manifest();
        const fb::Tensor* t = manifest.Find(name);
        if (t == nullptr || t->bytes() != stripe_bytes || t->chunk_count() != 1) {
          check.parity_bad++;
          holder.parity_state = "bad";
          check.problems.push_back(what + ": the parity on " + R(g.members[h]) + " has no block " +
                                   name + " of " + std::to_string(stripe_bytes) + " bytes");
          continue;
        }
        if (holder.bad_blocks.count(name)) {
          check.parity_bad++;
          holder.parity_state = "bad";
          continue;
        }
        if (data_whole) {
          std::vector<uint8_t> held(stripe_bytes);
          const fb::Chunk& chunk = manifest.chunk(t->first_chunk());
          Status st = holder.parity->Read(chunk.record_offset() + format::kBlockBytes, held.data(),
                                          stripe_bytes);
          if (!st.ok()) {
            check.parity_bad++;
            holder.parity_state = "bad";
            check.problems.push_back(what + ": " + st.message());
            continue;
          }
          check.parity_checked++;
          if (held != expected[row]) {
            check.parity_bad++;
            holder.parity_state = "bad";
            check.problems.push_back(
                what + ": parity block " + name + " on " + R(g.members[h]) +
                " differs from the parity of its stripe's data (" +
                (g.code.scheme == CodeScheme::kXor ? "XOR syndrome" : "Reed-Solomon re-encode") +
                " nonzero)");
            continue;
          }
        }
        counts[s].parity_present++;
      }
    }
    // Recoverability.
    int spare = -1;
    if (all_known) spare = SpareMemberLosses(k, g.code.m, counts);
    check.from_memory = spare >= 0;
    check.spare = spare;
    check.recoverable = true;
    check.sources.assign(n, "lost");
    for (uint32_t p = 0; p < n; ++p) {
      bool rebuildable = all_known;
      for (uint64_t s : missing_stripes[p]) {
        const StripeBlocks& c = counts[s];
        rebuildable &= c.zeros + c.data_present + c.parity_present >= k;
      }
      const Db::CopyCheck* ram = members[p].ram();
      const bool ram_whole = ram != nullptr && ram->bad.empty() && !rebuild_needed[p];
      std::string clean_slower;
      if (members[p].copies != nullptr) {
        for (const Db::CopyCheck& c : members[p].copies->copies) {
          if (!c.ram && c.readable.ok() && c.bad.empty() && clean_slower.empty()) {
            clean_slower = c.tier;
          }
        }
      }
      if (ram_whole) {
        check.sources[p] = "ram";
      } else if (rebuildable) {
        check.sources[p] = ram != nullptr ? "ram+rebuild" : "rebuild";
      } else if (!clean_slower.empty()) {
        check.sources[p] = clean_slower;
      } else {
        check.recoverable = false;
        check.problems.push_back(what + ": " + R(g.members[p]) +
                                 (members[p].store == nullptr ? " (store not given)" : "") +
                                 " has no good copy and the group cannot rebuild it");
      }
    }
    if (!all_known) {
      check.problems.push_back(what +
                               ": some members' segment lengths are unknown (no copy and "
                               "no parity segment records them): the stripes cannot be laid out");
    }
    check.parity.resize(n);
    // A member that holds no parity (a node lost and replaced since) leaves the group with fewer
    // blocks: the spare count says so, it is not a problem in itself.
    for (uint32_t p = 0; p < n; ++p) check.parity[p] = members[p].parity_state;
    clean &= check.recoverable && check.parity_bad == 0 && check.problems.empty();
    fn(check);
  }
  if (!clean) return Status::Corrupt("verify of coding groups found problems");
  return Status::Ok();
}

}  // namespace ckpt::engine
