#include "engine/group_check.h"

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
// fault, a read fails cleanly), opened through its store's Io.
class ParityFile {
 public:
  ~ParityFile() {
    if (fd_ >= 0) (void)io_->Close(fd_);
  }
  // NotFound when the file does not exist.
  Status Open(io::Io* io, const std::string& path) {
    io_ = io;
    what_ = "parity segment " + path;
    io::OpenOptions options;
    options.mode = io::OpenOptions::Mode::kRead;
    CKPTDB_RETURN_IF_ERROR(io->Open(path, options, &fd_, nullptr));
    uint64_t bytes = 0;
    CKPTDB_RETURN_IF_ERROR(io->FileSize(fd_, &bytes));
    return format::SegmentReader::Open(
        what_, bytes, [this](uint64_t off, void* buf, size_t len) { return Read(off, buf, len); },
        &reader_);
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
  io::Io* io_ = nullptr;
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

namespace {

using CopiesByRank = std::map<uint32_t, std::vector<Db::CopiesOf>>;
using GroupKey = std::pair<uint64_t, uint32_t>;  // (version, group)

// The stores' layouts, from the manifests alone: a store with nothing coded costs no data reads.
Status ReadLayouts(std::span<Db* const> stores, uint64_t version,
                   std::vector<std::vector<Db::CopiesOf>>* layouts) {
  layouts->assign(stores.size(), {});
  bool any = false;
  for (size_t i = 0; i < stores.size(); ++i) {
    Status st = stores[i]->CheckCopies(version, /*check_chunks=*/false, &(*layouts)[i]);
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
  return Status::Ok();
}

// A coding group's members are ranks of one job, each given once.
Status IndexByRank(std::span<Db* const> stores, std::map<uint32_t, Db*>* by_rank) {
  for (Db* db : stores) {
    if (db->job_id() != stores[0]->job_id()) {
      return Status::Invalid("verify of coding groups: " + R(db->rank()) +
                             "'s store is of another job than " + R(stores[0]->rank()) + "'s");
    }
    if (!by_rank->emplace(db->rank(), db).second) {
      return Status::Invalid("verify of coding groups: two stores of " + R(db->rank()));
    }
  }
  return Status::Ok();
}

// Every store's copies of the coded versions, checked chunk by chunk unless layout_only.
Status CheckCodedCopies(std::span<Db* const> stores,
                        const std::vector<std::vector<Db::CopiesOf>>& layouts,
                        const std::set<uint64_t>& coded, bool layout_only, CopiesByRank* copies) {
  for (size_t i = 0; i < stores.size(); ++i) {
    std::vector<Db::CopiesOf>& out = (*copies)[stores[i]->rank()];
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
  return Status::Ok();
}

// The groups, each with its layout from any member's manifest; members that disagree are named.
std::map<GroupKey, CodingGroup> CollectGroups(const CopiesByRank& copies,
                                              std::vector<std::string>* disagreements) {
  std::map<GroupKey, CodingGroup> groups;
  for (const auto& [rank, list] : copies) {
    for (const Db::CopiesOf& of : list) {
      if (!of.group) continue;
      auto [it, inserted] = groups.emplace(std::make_pair(of.version, of.group->group), *of.group);
      if (!inserted && !(it->second == *of.group)) {
        disagreements->push_back("version " + std::to_string(of.version) + ": " + R(rank) +
                                 "'s manifest records another layout of group " +
                                 std::to_string(of.group->group) + " than its other members'");
      }
    }
  }
  return groups;
}

// Steps 2 to 4 of the header's list for one group of one version. Each step fills `check_`.
class GroupChecker {
 public:
  GroupChecker(uint64_t version, uint32_t group_number, const CodingGroup& g,
               const std::map<uint32_t, Db*>& by_rank, CopiesByRank& copies,
               const std::vector<std::string>& disagreements)
      : v_(version),
        group_number_(group_number),
        g_(g),
        n_(g.code.k + g.code.m),
        what_("version " + std::to_string(version) + " of group " + std::to_string(group_number) +
              " (" + g.code.Name() + ")"),
        members_(n_),
        layout_(g.code.k, g.code.m, g.unit_bytes, version) {
    check_.version = version;
    check_.group = g;
    check_.problems = disagreements;
    for (uint32_t p = 0; p < n_; ++p) {
      auto it = by_rank.find(g.members[p]);
      if (it == by_rank.end()) continue;
      members_[p].store = it->second;
      for (const Db::CopiesOf& of : copies[g.members[p]]) {
        if (of.version == version) members_[p].copies = &of;
      }
    }
  }

  // Runs every step; the result is clean when the group is recoverable with clean parity.
  const GroupCheck& Run() {
    for (uint32_t p = 0; p < n_; ++p) OpenParity(p);
    LearnMemberBytes();
    if (Status st = redundancy::ErasureCode::Make(g_.code, &code_); !st.ok()) {
      check_.problems.push_back(what_ +
                                ": its layout is not a code this build makes: " + st.message());
      check_.sources.assign(n_, "lost");
      check_.parity.assign(n_, "unchecked");
      check_.member_bytes.assign(n_, 0);
      return check_;
    }
    check_.stripes = all_known_ ? layout_.Stripes(check_.member_bytes) : 0;
    check_.parity_blocks = check_.stripes * g_.code.m;
    for (uint32_t h = 0; h < n_; ++h) CheckParityBlocks(h);
    counts_.assign(check_.stripes, StripeBlocks{});
    rebuild_needed_.assign(n_, false);
    missing_stripes_.assign(n_, {});
    for (uint64_t s = 0; s < check_.stripes; ++s) CheckStripe(s);
    CountRecoverability();
    return check_;
  }

  bool clean() const {
    return code_ != nullptr && check_.recoverable && check_.parity_bad == 0 &&
           check_.problems.empty();
  }

 private:
  // Member p's parity segment, opened and its layout compared with the group's.
  void OpenParity(uint32_t p) {
    Member& mem = members_[p];
    if (mem.store == nullptr) return;
    const std::string dir = mem.store->ParityDir();
    if (dir.empty()) {
      mem.parity_state = "missing";
      return;
    }
    auto file = std::make_unique<ParityFile>();
    Status st = file->Open(mem.store->io(), dir + "/" + ParitySegmentName(group_number_, v_));
    if (st.code() == CKPTDB_ENOTFOUND) {
      mem.parity_state = "missing";
      return;
    }
    if (st.ok()) st = CheckParityLayout(p, *file);
    if (!st.ok()) {
      mem.parity_state = "unreadable";
      check_.problems.push_back(what_ + ": " + st.message());
      return;
    }
    mem.parity = std::move(file);
    mem.parity_state = "ok";
  }

  Status CheckParityLayout(uint32_t p, const ParityFile& file) const {
    const fb::Redundancy* r = file.reader().manifest().root().redundancy();
    const auto scheme = g_.code.scheme == CodeScheme::kXor ? fb::RedundancyScheme::Xor
                                                           : fb::RedundancyScheme::ReedSolomon;
    const bool same = r != nullptr && r->parity() && r->scheme() == scheme && r->k() == g_.code.k &&
                      r->m() == g_.code.m && r->group() == group_number_ &&
                      r->stripe_bytes() == g_.unit_bytes && r->position() == p &&
                      r->member_bytes() != nullptr && r->member_bytes()->size() == n_ &&
                      r->member_ranks() != nullptr &&
                      std::equal(g_.members.begin(), g_.members.end(), r->member_ranks()->begin(),
                                 r->member_ranks()->end());
    if (!same) return Status::Corrupt("parity of " + R(g_.members[p]) + " is of another layout");
    // A length no segment can have (it would lay out billions of stripes).
    for (uint64_t bytes : *r->member_bytes()) {
      if (bytes > kMaxMemberBytes) {
        return Status::Corrupt("parity of " + R(g_.members[p]) + " records a member's segment of " +
                               std::to_string(bytes) + " bytes");
      }
    }
    return Status::Ok();
  }

  // Every member's segment length: its own copies, else a parity segment's record of it.
  void LearnMemberBytes() {
    check_.member_bytes.assign(n_, 0);
    std::vector<bool> known(n_, false);
    for (uint32_t p = 0; p < n_; ++p) {
      if (members_[p].copies != nullptr && !members_[p].copies->copies.empty()) {
        check_.member_bytes[p] = members_[p].copies->copies.front().file_bytes;
        known[p] = true;
      }
    }
    for (uint32_t h = 0; h < n_; ++h) {
      if (members_[h].parity == nullptr) continue;
      const auto* recorded =
          members_[h].parity->reader().manifest().root().redundancy()->member_bytes();
      for (uint32_t p = 0; p < n_; ++p) {
        if (!known[p]) {
          check_.member_bytes[p] = recorded->Get(p);
          known[p] = true;
        } else if (recorded->Get(p) != check_.member_bytes[p]) {
          check_.problems.push_back(what_ + ": the parity on " + R(g_.members[h]) + " records " +
                                    R(g_.members[p]) + "'s segment as " +
                                    std::to_string(recorded->Get(p)) + " bytes, its copy is " +
                                    std::to_string(check_.member_bytes[p]));
          members_[h].parity_state = "bad";
        }
      }
    }
    all_known_ = std::all_of(known.begin(), known.end(), [](bool b) { return b; });
  }

  // Each parity block of holder h against its xxh3.
  void CheckParityBlocks(uint32_t h) {
    if (members_[h].parity == nullptr) return;
    const format::SegmentReader& reader = members_[h].parity->reader();
    std::vector<uint8_t> scratch;
    for (uint32_t t = 0; t < reader.manifest().tensor_count(); ++t) {
      const fb::Tensor& tensor = reader.manifest().tensor(t);
      if (tensor.chunk_count() != 1) continue;
      format::ChunkProblem problem;
      Status st = reader.CheckChunk(tensor.first_chunk(), &scratch, &problem);
      if (!st.ok()) {
        members_[h].bad_blocks[tensor.name()->str()] = 1;
        check_.problems.push_back(what_ + ": " + st.message());
      }
    }
  }

  // Stripe s: counts what is there, and recomputes its parity where every data unit reads.
  void CheckStripe(uint64_t s) {
    const uint64_t stripe_bytes = layout_.StripeBytes(check_.member_bytes, s);
    std::vector<std::vector<uint8_t>> data(g_.code.k);
    bool data_whole = true;
    for (uint32_t i = 0; i < g_.code.k; ++i) {
      data[i].assign(stripe_bytes, 0);
      data_whole &= ReadDataUnit(s, i, data[i].data());
    }
    std::vector<std::vector<uint8_t>> expected;
    if (data_whole) {
      expected.assign(g_.code.m, std::vector<uint8_t>(stripe_bytes));
      std::vector<const uint8_t*> in;
      std::vector<uint8_t*> out;
      for (auto& b : data) in.push_back(b.data());
      for (auto& b : expected) out.push_back(b.data());
      code_->Encode(stripe_bytes, in.data(), out.data());
    }
    for (uint32_t row = 0; row < g_.code.m; ++row) {
      if (CheckParityBlock(s, row, stripe_bytes, data_whole ? &expected[row] : nullptr)) {
        counts_[s].parity_present++;
      }
    }
  }

  // Data unit i of stripe s: counted present or missing by its member's ram copy, and its bytes
  // read into `out` from the fastest copy whose records over it check out. False: none reads.
  bool ReadDataUnit(uint64_t s, uint32_t i, uint8_t* out) {
    const uint32_t d = layout_.DataMember(s, i);
    const uint64_t u = layout_.DataUnit(s, i);
    const uint64_t bytes = layout_.UnitBytes(check_.member_bytes[d], u);
    if (bytes == 0) {
      counts_[s].zeros++;
      return true;
    }
    const uint64_t begin = u * g_.unit_bytes;
    const Db::CopyCheck* ram = members_[d].ram();
    if (ram != nullptr && !Overlaps(ram->bad, begin, begin + bytes)) {
      counts_[s].data_present++;
    } else {
      counts_[s].data_missing++;
      rebuild_needed_[d] = true;
      missing_stripes_[d].push_back(s);
    }
    if (members_[d].copies == nullptr) return false;
    for (const Db::CopyCheck& c : members_[d].copies->copies) {
      if (!c.readable.ok() || Overlaps(c.bad, begin, begin + bytes)) continue;
      if (members_[d].store->ReadCopy(v_, c.tier, begin, bytes, out).ok()) return true;
    }
    return false;
  }

  // Parity block `row` of stripe s on its holder: true when it is there and checks out (against
  // `expected` where the stripe's data read whole).
  bool CheckParityBlock(uint64_t s, uint32_t row, uint64_t stripe_bytes,
                        const std::vector<uint8_t>* expected) {
    const uint32_t h = layout_.ParityMember(s, row);
    Member& holder = members_[h];
    if (holder.parity == nullptr) return false;
    const std::string name = ParityBlockName(s, row);
    const format::ManifestView& manifest = holder.parity->reader().manifest();
    const fb::Tensor* t = manifest.Find(name);
    auto bad = [&](std::string problem) {
      check_.parity_bad++;
      holder.parity_state = "bad";
      if (!problem.empty()) check_.problems.push_back(what_ + ": " + std::move(problem));
      return false;
    };
    if (t == nullptr || t->bytes() != stripe_bytes || t->chunk_count() != 1) {
      return bad("the parity on " + R(g_.members[h]) + " has no block " + name + " of " +
                 std::to_string(stripe_bytes) + " bytes");
    }
    if (holder.bad_blocks.count(name)) return bad("");  // named by CheckParityBlocks
    if (expected == nullptr) return true;
    std::vector<uint8_t> held(stripe_bytes);
    const fb::Chunk& chunk = manifest.chunk(t->first_chunk());
    Status st =
        holder.parity->Read(chunk.record_offset() + format::kBlockBytes, held.data(), stripe_bytes);
    if (!st.ok()) return bad(st.message());
    check_.parity_checked++;
    if (held != *expected) {
      return bad("parity block " + name + " on " + R(g_.members[h]) +
                 " differs from the parity of its stripe's data (" +
                 (g_.code.scheme == CodeScheme::kXor ? "XOR syndrome" : "Reed-Solomon re-encode") +
                 " nonzero)");
    }
    return true;
  }

  // Where each member's segment restores from, and how many more members the group may lose.
  void CountRecoverability() {
    const uint32_t k = g_.code.k;
    const int spare = all_known_ ? SpareMemberLosses(k, g_.code.m, counts_) : -1;
    check_.from_memory = spare >= 0;
    check_.spare = spare;
    check_.recoverable = true;
    check_.sources.assign(n_, "lost");
    for (uint32_t p = 0; p < n_; ++p) {
      bool rebuildable = all_known_;
      for (uint64_t s : missing_stripes_[p]) {
        const StripeBlocks& c = counts_[s];
        rebuildable &= c.zeros + c.data_present + c.parity_present >= k;
      }
      const Db::CopyCheck* ram = members_[p].ram();
      const bool ram_whole = ram != nullptr && ram->bad.empty() && !rebuild_needed_[p];
      std::string clean_slower;
      if (members_[p].copies != nullptr) {
        for (const Db::CopyCheck& c : members_[p].copies->copies) {
          if (!c.ram && c.readable.ok() && c.bad.empty() && clean_slower.empty()) {
            clean_slower = c.tier;
          }
        }
      }
      if (ram_whole) {
        check_.sources[p] = "ram";
      } else if (rebuildable) {
        check_.sources[p] = ram != nullptr ? "ram+rebuild" : "rebuild";
      } else if (!clean_slower.empty()) {
        check_.sources[p] = clean_slower;
      } else {
        check_.recoverable = false;
        check_.problems.push_back(what_ + ": " + R(g_.members[p]) +
                                  (members_[p].store == nullptr ? " (store not given)" : "") +
                                  " has no good copy and the group cannot rebuild it");
      }
    }
    if (!all_known_) {
      check_.problems.push_back(what_ +
                                ": some members' segment lengths are unknown (no copy and "
                                "no parity segment records them): the stripes cannot be laid out");
    }
    // A member that holds no parity (a node lost and replaced since) leaves the group with fewer
    // blocks: the spare count says so, it is not a problem in itself.
    check_.parity.resize(n_);
    for (uint32_t p = 0; p < n_; ++p) check_.parity[p] = members_[p].parity_state;
  }

  const uint64_t v_;
  const uint32_t group_number_;
  const CodingGroup& g_;
  const uint32_t n_;
  const std::string what_;
  std::vector<Member> members_;
  const StripeLayout layout_;
  std::unique_ptr<ErasureCode> code_;
  GroupCheck check_;
  bool all_known_ = false;
  std::vector<StripeBlocks> counts_;
  std::vector<bool> rebuild_needed_;                    // a member's ram copy lacks some unit
  std::vector<std::vector<uint64_t>> missing_stripes_;  // per member, stripes it lacks a unit of
};

}  // namespace

Status CheckCodingGroups(std::span<Db* const> stores, uint64_t version, bool layout_only,
                         const std::function<void(const GroupCheck&)>& fn) {
  if (stores.empty()) return Status::Invalid("verify of coding groups: no store given");
  for (Db* db : stores) {
    if (db == nullptr) return Status::Invalid("verify of coding groups: a store is NULL");
  }
  std::vector<std::vector<Db::CopiesOf>> layouts;
  CKPTDB_RETURN_IF_ERROR(ReadLayouts(stores, version, &layouts));
  std::set<uint64_t> coded;
  for (const auto& list : layouts) {
    for (const Db::CopiesOf& of : list) {
      if (of.group) coded.insert(of.version);
    }
  }
  if (coded.empty()) return Status::Ok();  // no coding group to check
  std::map<uint32_t, Db*> by_rank;
  CKPTDB_RETURN_IF_ERROR(IndexByRank(stores, &by_rank));
  CopiesByRank copies;
  CKPTDB_RETURN_IF_ERROR(CheckCodedCopies(stores, layouts, coded, layout_only, &copies));
  std::vector<std::string> disagreements;
  const std::map<GroupKey, CodingGroup> groups = CollectGroups(copies, &disagreements);
  bool clean = disagreements.empty();
  for (const auto& [key, g] : groups) {
    if (layout_only) {
      GroupCheck check;
      check.version = key.first;
      check.group = g;
      check.member_bytes.assign(g.members.size(), 0);
      check.sources.assign(g.members.size(), "unchecked");
      check.parity.assign(g.members.size(), "unchecked");
      check.problems = disagreements;
      fn(check);
      continue;
    }
    GroupChecker checker(key.first, key.second, g, by_rank, copies, disagreements);
    fn(checker.Run());
    clean &= checker.clean();
  }
  if (!layout_only && !clean) {
    return Status::Corrupt("verify of coding groups found problems");
  }
  return Status::Ok();
}

}  // namespace ckpt::engine
