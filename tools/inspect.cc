// ckptdb inspect ROOT [--version V] [--all] [--chunks] [--json]: the versions a store holds, their
// states and the tiers that hold them; per version its tensors and, with --chunks, each chunk's
// place and checksum as the segment's manifest records them. Read-only: safe beside a trainer.
// The JSON schema ("format": "ckptdb-inspect", "format_version": 1) is documented in docs/cli.md
// and only grows: keys are added, never renamed or removed, within a format_version.
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "format/manifest.h"
#include "format/segment_format.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "util/status.h"
#include "util/text.h"

namespace ckpt::tools {
namespace {

struct InspectArgs {
  std::string root;
  std::string version;
  bool all = false;
  bool chunks = false;
  bool json = false;
  bool stats = false;
};

struct ChunkRecord {
  uint64_t record_offset = 0;
  uint64_t payload_bytes = 0;
  uint64_t xxh3 = 0;
};

// A version's detail: its tensors and, when asked, the chunks of each (from one durable copy).
struct Detail {
  bool listed = false;     // the tensor list could be read
  std::string list_error;  // why not, when it could not
  std::vector<TensorRecord> tensors;
  bool chunked = false;      // chunk entries were read from the copy on tier `chunk_tier`
  std::string chunk_tier;    // that copy's tier
  std::string chunk_source;  // and its file (a segment, or the ram tier's arena)
  std::string chunk_error;
  std::vector<std::vector<ChunkRecord>> chunks;  // per tensor, parallel to `tensors`
  // The coding group (ec:K+M, xor:K) the version's segment belongs to, from its manifest.
  bool coded = false;
  uint32_t group = 0;
  std::string code;
  std::vector<uint32_t> group_ranks;
};

std::string Hex64(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%016" PRIx64, value);
  return text;
}

Detail ReadDetail(ckptdb* db, const VersionRecord& v, bool want_chunks) {
  Detail d;
  if (v.state != CKPTDB_STATE_COMMITTED) return d;
  int rc = ListTensors(db, v.version, &d.tensors);
  if (rc != CKPTDB_OK) {
    d.list_error = ErrorText(rc);
    return d;
  }
  d.listed = true;
  (void)ckptdb_verify_groups(
      &db, 1, v.version, CKPTDB_GROUPS_LAYOUT_ONLY,
      [](void* arg, const ckptdb_group_check* c) {
        auto* detail = static_cast<Detail*>(arg);
        detail->coded = true;
        detail->group = c->group;
        detail->code = c->code;
        detail->group_ranks.assign(c->ranks, c->ranks + c->members);
      },
      &d);
  if (!want_chunks) return d;
  d.chunks.assign(d.tensors.size(), {});
  for (size_t i = 0; i < d.tensors.size(); i++) {
    const char* source = nullptr;
    rc = ckptdb_list_chunks(
        db, v.version, d.tensors[i].name.c_str(),
        [](void* arg, const ckptdb_chunk_desc* c) {
          static_cast<std::vector<ChunkRecord>*>(arg)->push_back(
              {c->record_offset, c->payload_bytes, c->xxh3});
          return 0;
        },
        &d.chunks[i], &source);
    if (rc != CKPTDB_OK) {
      d.chunk_error = ErrorText(rc);
      d.chunks.clear();
      return d;
    }
    if (source != nullptr) d.chunk_tier = source;
  }
  for (const Residency& r : v.residency) {
    if (r.tier == d.chunk_tier) d.chunk_source = r.path;
  }
  d.chunked = true;
  return d;
}

nlohmann::ordered_json VersionJson(const VersionRecord& v, const Detail* d) {
  nlohmann::ordered_json j;
  j["version"] = v.version;
  j["state"] = ckptdb_state_name(v.state);
  j["rank"] = v.rank;
  j["data_bytes"] = v.data_bytes;
  j["tensor_count"] = v.tensor_count;
  j["chunk_count"] = v.chunk_count;
  j["created_unix_ns"] = v.created_unix_ns;
  j["committed_unix_ns"] = v.committed_unix_ns;
  j["residency"] = nlohmann::ordered_json::array();
  for (const Residency& r : v.residency) {
    j["residency"].push_back({{"tier", r.tier},
                              {"path", r.path},
                              {"state", ResidencyName(r.state)},
                              {"configured", r.configured}});
  }
  if (d == nullptr || v.state != CKPTDB_STATE_COMMITTED) return j;
  if (!d->listed) {
    j["error"] = d->list_error;
    return j;
  }
  if (!d->chunk_error.empty() && !d->chunked) j["chunks_error"] = d->chunk_error;
  if (d->chunked) {
    j["chunks_source"] = d->chunk_source;
    j["chunks_tier"] = d->chunk_tier;
  }
  if (d->coded) {
    j["coding_group"] = {{"group", d->group}, {"code", d->code}, {"ranks", d->group_ranks}};
  }
  j["tensors"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < d->tensors.size(); i++) {
    const TensorRecord& t = d->tensors[i];
    nlohmann::ordered_json tj;
    tj["name"] = t.name;
    tj["dtype"] = ckptdb_dtype_name(t.dtype);
    tj["shape"] = t.shape;
    tj["global_shape"] = t.global_shape;
    tj["global_offset"] = t.global_offset;
    tj["bytes"] = t.bytes;
    tj["kept_bytes"] = t.kept_bytes;
    tj["parity_bytes"] = t.parity_bytes;
    tj["recomputed"] = t.recomputed;
    tj["chunk_count"] = t.chunk_count;
    if (d->chunked) {
      tj["chunks"] = nlohmann::ordered_json::array();
      for (const ChunkRecord& c : d->chunks[i]) {
        tj["chunks"].push_back({{"record_offset", c.record_offset},
                                {"payload_offset", c.record_offset + format::kBlockBytes},
                                {"payload_bytes", c.payload_bytes},
                                {"xxh3", Hex64(c.xxh3)}});
      }
    }
    j["tensors"].push_back(std::move(tj));
  }
  return j;
}

void PrintSummary(const std::string& root, const std::vector<VersionRecord>& versions) {
  size_t committed = 0;
  for (const VersionRecord& v : versions) committed += v.state == CKPTDB_STATE_COMMITTED;
  std::printf("store %s: %zu version(s), %zu committed\n", root.c_str(), versions.size(),
              committed);
  if (versions.empty()) return;
  std::printf("%10s  %-9s  %4s  %11s  %7s  %6s  %-20s  %s\n", "VERSION", "STATE", "RANK", "BYTES",
              "TENSORS", "CHUNKS", "COMMITTED", "TIERS");
  for (const VersionRecord& v : versions) {
    std::string tiers;
    for (const Residency& r : v.residency) {
      if (!tiers.empty()) tiers += ", ";
      tiers +=
          r.tier + " (" + ResidencyName(r.state) + (r.configured ? "" : ", not configured") + ")";
    }
    std::printf("%10" PRIu64 "  %-9s  %4u  %11s  %7u  %6u  %-20s  %s\n", v.version,
                ckptdb_state_name(v.state), v.rank, HumanBytes(v.data_bytes).c_str(),
                v.tensor_count, v.chunk_count, FormatUnixNs(v.committed_unix_ns).c_str(),
                tiers.empty() ? "-" : tiers.c_str());
  }
}

void PrintDetail(const VersionRecord& v, const Detail& d) {
  std::printf("\nversion %" PRIu64 ": %s, rank %u, %s in %u tensor(s), %u chunk(s)\n", v.version,
              ckptdb_state_name(v.state), v.rank, HumanBytes(v.data_bytes).c_str(), v.tensor_count,
              v.chunk_count);
  std::printf("  created %s, committed %s\n", FormatUnixNs(v.created_unix_ns).c_str(),
              FormatUnixNs(v.committed_unix_ns).c_str());
  for (const Residency& r : v.residency) {
    std::printf("  %-8s %s%s\n           %s\n", ResidencyName(r.state), r.tier.c_str(),
                r.configured ? "" : " (not in the tier spec)", r.path.c_str());
  }
  if (v.state != CKPTDB_STATE_COMMITTED) return;
  if (!d.listed) {
    std::printf("  tensors: cannot be listed: %s\n", d.list_error.c_str());
    return;
  }
  if (d.coded) {
    std::string ranks;
    for (uint32_t r : d.group_ranks) ranks += (ranks.empty() ? "" : " ") + std::to_string(r);
    std::printf(
        "  coding group %u (%s), ranks %s: its parity is on the other members' nodes "
        "(`ckptdb verify` of their roots checks it)\n",
        d.group, d.code.c_str(), ranks.c_str());
  }
  // Names as the store holds them are anyone's bytes: shown escaped (util/text.h), so that none
  // moves the cursor or forges a row.
  std::vector<std::string> shown;
  for (const TensorRecord& t : d.tensors) shown.push_back(ShowText(t.name));
  size_t width = 4;
  for (const std::string& n : shown) width = std::max(width, n.size());
  width = std::min<size_t>(width, 60);
  std::printf("  %-*s  %-7s  %-24s  %11s  %6s\n", static_cast<int>(width), "NAME", "DTYPE", "SHAPE",
              "BYTES", "CHUNKS");
  for (size_t i = 0; i < d.tensors.size(); i++) {
    const TensorRecord& t = d.tensors[i];
    std::printf("  %-*s  %-7s  %-24s  %11s  %6u\n", static_cast<int>(width), shown[i].c_str(),
                ckptdb_dtype_name(t.dtype), FormatShape(t.shape).c_str(),
                HumanBytes(t.bytes).c_str(), t.chunk_count);
    if (!t.global_shape.empty()) {
      std::printf("  %-*s  shard at %s of global %s\n", static_cast<int>(width), "",
                  FormatShape(t.global_offset).c_str(), FormatShape(t.global_shape).c_str());
    }
    if (t.recomputed) {
      std::printf(
          "  %-*s  a recomputed replica (REFT's AOR) of the next member's private shard '%s', "
          "kept here for that member's restore\n",
          static_cast<int>(width), "",
          ShowText(t.name.substr(format::kRecomputedPrefix.size())).c_str());
    }
    if (t.kept_bytes != t.bytes || t.parity_bytes != 0) {
      const std::string parity = t.parity_bytes == 0 ? ""
                                                     : " and " + HumanBytes(t.parity_bytes) +
                                                           " of AEC parity of the others' slices";
      std::printf(
          "  %-*s  deduplicated by its replica group: this segment keeps %s of it (its own slice "
          "and, with ARC, the next member's)%s; a restore gathers the rest from the group\n",
          static_cast<int>(width), "", HumanBytes(t.kept_bytes).c_str(), parity.c_str());
    }
    if (d.chunked) {
      for (size_t c = 0; c < d.chunks[i].size(); c++) {
        const ChunkRecord& chunk = d.chunks[i][c];
        std::printf("  %-*s    chunk %zu: record at %" PRIu64 ", %" PRIu64 " bytes, xxh3 %s\n",
                    static_cast<int>(width), "", c, chunk.record_offset, chunk.payload_bytes,
                    Hex64(chunk.xxh3).c_str());
      }
    }
  }
  if (d.chunked) {
    std::printf("  chunks as the copy on %s records them (%s)\n", d.chunk_tier.c_str(),
                d.chunk_source.c_str());
  }
  if (!d.chunked && !d.chunk_error.empty()) {
    std::printf("  chunks: cannot be read: %s\n", d.chunk_error.c_str());
  }
}

double Ms(uint64_t ns) { return ns / 1e6; }
double GBps(uint64_t bytes, uint64_t ns) { return ns == 0 ? 0 : bytes / static_cast<double>(ns); }

nlohmann::ordered_json StatsJson(const ckptdb_stats_t& s) {
  nlohmann::ordered_json j;
  j["put_calls"] = s.put_calls;
  j["put_bytes"] = s.put_bytes;
  j["put_blocked_ns"] = s.put_blocked_ns;
  j["wait_capture_blocked_ns"] = s.wait_capture_blocked_ns;
  j["capture_bytes"] = s.capture_bytes;
  j["capture_ns"] = s.capture_ns;
  j["commits"] = s.commits;
  j["commit_blocked_ns"] = s.commit_blocked_ns;
  j["backpressure_waits"] = s.backpressure_waits;
  j["backpressure_wait_ns"] = s.backpressure_wait_ns;
  j["direct_chunks"] = s.direct_chunks;
  j["staging_high_water_bytes"] = s.staging_high_water_bytes;
  j["fsyncs"] = s.fsyncs;
  j["tiers"] = nlohmann::ordered_json::array();
  for (uint32_t i = 0; i < s.tier_count; ++i) {
    const ckptdb_tier_stats& t = s.tiers[i];
    j["tiers"].push_back({{"tier", t.name},
                          {"bytes_written", t.bytes_written},
                          {"write_ns", t.write_ns},
                          {"pending_bytes", t.pending_bytes},
                          {"resident_versions", t.resident_versions},
                          {"resident_bytes", t.resident_bytes},
                          {"capacity_bytes", t.capacity_bytes}});
  }
  return j;
}

nlohmann::ordered_json VersionStatsJson(const ckptdb_version_stats_t& v, const ckptdb_stats_t& s) {
  nlohmann::ordered_json j;
  j["put_calls"] = v.put_calls;
  j["put_blocked_ns"] = v.put_blocked_ns;
  j["wait_capture_blocked_ns"] = v.wait_capture_blocked_ns;
  j["commit_blocked_ns"] = v.commit_blocked_ns;
  j["capture_ns"] = v.capture_ns;
  j["commit_ns"] = v.commit_ns;
  j["backpressure_waits"] = v.backpressure_waits;
  j["backpressure_wait_ns"] = v.backpressure_wait_ns;
  j["direct_chunks"] = v.direct_chunks;
  j["staging_high_water_bytes"] = v.staging_high_water_bytes;
  j["fsyncs"] = v.fsyncs;
  j["tiers"] = nlohmann::ordered_json::array();
  for (uint32_t i = 0; i < v.tier_count && i < s.tier_count; ++i) {
    if (v.tier_bytes_written[i] == 0) continue;
    j["tiers"].push_back({{"tier", s.tiers[i].name},
                          {"bytes_written", v.tier_bytes_written[i]},
                          {"write_ns", v.tier_write_ns[i]}});
  }
  return j;
}

// The figures of --stats: what checkpointing cost the trainer, per version and in all, and what
// each tier holds, took in and still waits for.
void PrintStats(ckptdb* db, const std::vector<VersionRecord>& versions, const ckptdb_stats_t& s) {
  std::printf("\nfigures kept for %" PRIu64 " version(s)\n", s.commits);
  if (s.commits > 0) {
    std::printf(
        "  per version, mean: put_shard %.2f ms, wait_capture %.2f ms, commit %.2f ms "
        "blocked; capture %.1f ms (%.2f GB/s)\n",
        Ms(s.put_blocked_ns) / s.commits, Ms(s.wait_capture_blocked_ns) / s.commits,
        Ms(s.commit_blocked_ns) / s.commits, Ms(s.capture_ns) / s.commits,
        GBps(s.capture_bytes, s.capture_ns));
    std::printf("  back-pressure: %" PRIu64 " waits (%.1f ms), %" PRIu64
                " chunks written from callers' buffers; staging high-water %s; %" PRIu64
                " fsyncs\n",
                s.backpressure_waits, Ms(s.backpressure_wait_ns), s.direct_chunks,
                HumanBytes(s.staging_high_water_bytes).c_str(), s.fsyncs);
  }
  std::printf("  %-40s %9s %11s %11s %11s %9s\n", "TIER", "VERSIONS", "RESIDENT", "PENDING",
              "WRITTEN", "GB/s");
  for (uint32_t i = 0; i < s.tier_count; ++i) {
    const ckptdb_tier_stats& t = s.tiers[i];
    std::string name = t.name;
    if (t.capacity_bytes) name += " (" + HumanBytes(t.capacity_bytes) + ")";
    std::printf("  %-40s %9u %11s %11s %11s %9.2f\n", name.c_str(), t.resident_versions,
                HumanBytes(t.resident_bytes).c_str(), HumanBytes(t.pending_bytes).c_str(),
                HumanBytes(t.bytes_written).c_str(), GBps(t.bytes_written, t.write_ns));
  }
  std::printf("\n  %10s %8s %8s %9s %10s %8s %10s %8s", "VERSION", "PUT_MS", "WAIT_MS", "COMMIT_MS",
              "CAPTURE_MS", "GB/s", "DURABLE_IN", "BP_WAITS");
  for (uint32_t i = 0; i < s.tier_count; ++i) std::printf("  T%u_GB/s", i);
  std::printf("\n");
  for (const VersionRecord& v : versions) {
    ckptdb_version_stats_t vs{};
    if (ckptdb_version_stats(db, v.version, &vs) != CKPTDB_OK) continue;
    std::printf("  %10" PRIu64 " %8.2f %8.2f %9.2f %10.1f %8.2f %8.1fms %8" PRIu64, v.version,
                Ms(vs.put_blocked_ns), Ms(vs.wait_capture_blocked_ns), Ms(vs.commit_blocked_ns),
                Ms(vs.capture_ns), GBps(vs.bytes, vs.capture_ns), Ms(vs.commit_ns),
                vs.backpressure_waits);
    for (uint32_t i = 0; i < s.tier_count; ++i) {
      if (vs.tier_bytes_written[i] == 0) {
        std::printf("  %7s", "-");
      } else {
        std::printf("  %7.2f", GBps(vs.tier_bytes_written[i], vs.tier_write_ns[i]));
      }
    }
    std::printf("\n");
  }
  for (uint32_t i = 0; i < s.tier_count; ++i) std::printf("  T%u = %s\n", i, s.tiers[i].name);
}

int RunInspect(const InspectArgs& args) {
  std::optional<uint64_t> only;
  if (!args.version.empty()) {
    uint64_t v = 0;
    if (!ParseVersion(args.version, &v)) {
      std::fprintf(stderr, "ckptdb inspect: --version %s is not a version number\n",
                   QuoteName(args.version).c_str());
      return kExitUsage;
    }
    only = v;
  }
  DbHandle db;
  if (int rc = OpenReadOnly(args.root, &db); rc != kExitOk) return rc;
  // Damage the open went past (a failing witness, an arena header): listed, and exit 1.
  uint64_t open_problems = 0;
  (void)ckptdb_open_problems(
      db.get(),
      [](void*, const char* problem) {
        std::fprintf(stderr, "ckptdb inspect: %s\n", SafeMessage(problem).c_str());
      },
      nullptr, &open_problems);
  std::vector<VersionRecord> versions;
  if (int rc = ListVersions(db.get(), &versions); rc != CKPTDB_OK) {
    std::fprintf(stderr, "ckptdb inspect: %s\n", ErrorText(rc).c_str());
    return kExitProblem;
  }
  if (only) {
    std::vector<VersionRecord> selected;
    for (VersionRecord& v : versions) {
      if (v.version == *only) selected.push_back(std::move(v));
    }
    if (selected.empty()) {
      std::fprintf(stderr, "ckptdb inspect: store %s has no version %" PRIu64 "\n",
                   args.root.c_str(), *only);
      return kExitUsage;
    }
    versions = std::move(selected);
  }
  // Details (tensors, chunks) for the selected version, or for every version with --all or
  // --json. A committed version whose tensors cannot be listed makes the exit status 1.
  bool detailed = only.has_value() || args.all || args.json;
  std::vector<Detail> details(versions.size());
  int exit_code = open_problems > 0 ? kExitProblem : kExitOk;
  if (detailed) {
    for (size_t i = 0; i < versions.size(); i++) {
      details[i] = ReadDetail(db.get(), versions[i], args.chunks);
      if (versions[i].state == CKPTDB_STATE_COMMITTED &&
          (!details[i].listed || (args.chunks && !details[i].chunked))) {
        exit_code = kExitProblem;
      }
    }
  }
  ckptdb_stats_t stats{};
  if (args.stats && ckptdb_stats(db.get(), &stats) != CKPTDB_OK) {
    std::fprintf(stderr, "ckptdb inspect: %s\n", ckptdb_last_error());
    return kExitProblem;
  }
  if (args.json) {
    nlohmann::ordered_json out;
    out["format"] = "ckptdb-inspect";
    out["format_version"] = 1;
    out["root"] = args.root;
    out["versions"] = nlohmann::ordered_json::array();
    for (size_t i = 0; i < versions.size(); i++) {
      nlohmann::ordered_json v = VersionJson(versions[i], &details[i]);
      ckptdb_version_stats_t vs{};
      if (args.stats && ckptdb_version_stats(db.get(), versions[i].version, &vs) == CKPTDB_OK) {
        v["stats"] = VersionStatsJson(vs, stats);
      }
      out["versions"].push_back(std::move(v));
    }
    if (args.stats) out["stats"] = StatsJson(stats);
    // Names are bytes: invalid UTF-8 is replaced rather than failing the whole report, and what
    // a terminal would hide or reorder is escaped as the text output escapes it.
    std::string text =
        JsonForTerminal(out.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
    std::printf("%s\n", text.c_str());
    return exit_code;
  }
  if (!only) PrintSummary(args.root, versions);
  if (detailed) {
    for (size_t i = 0; i < versions.size(); i++) PrintDetail(versions[i], details[i]);
  }
  if (args.stats) PrintStats(db.get(), versions, stats);
  return exit_code;
}

}  // namespace

void AddInspectCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "List a store's versions, their states and tiers; per version its tensors");
  cmd->add_option("root", args->root, "The store's root directory")->required();
  cmd->add_option("--version,-v", args->version, "Show only this version, with its tensors");
  cmd->add_flag("--all,-a", args->all, "Show the tensors of every committed version");
  cmd->add_flag("--chunks", args->chunks,
                "Also show each chunk's file offset, size and xxh3 (reads the manifest)");
  cmd->add_flag("--json", args->json,
                "Print one JSON document (schema in docs/cli.md), every version in detail");
  cmd->add_flag("--stats", args->stats,
                "Also print the figures: blocked time, capture and drain rates, back-pressure, "
                "pending bytes per tier, per version and in all");
  cmd->callback([args, exit_code] { *exit_code = RunInspect(*args); });
}

}  // namespace ckpt::tools
