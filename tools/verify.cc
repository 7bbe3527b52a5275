// ckptdb verify ROOT... [--version V] [--tier T] [--quiet]: re-reads every chunk of every
// committed version (or one) on every tier (or one) of each store and checks framing, manifest and
// each xxh3. Given the stores of a coding group's members (ec:K+M, xor:K), it also checks their
// parity (each block's xxh3, and recomputed from the stripe's data) and says whether each version
// is recoverable, from what, with how many node losses to spare (ckptdb_verify_groups). Exit 0
// when clean, 1 when anything is wrong (each problem printed with its tier, segment, chunk index,
// file offset, expected and actual xxh3), 2 for bad arguments or no store. A progress bar is
// drawn on stderr when it is a terminal.
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/commands.h"
#include "tools/common.h"
#include "util/text.h"

namespace ckpt::tools {
namespace {

struct VerifyArgs {
  std::vector<std::string> roots;
  std::string version;
  std::string tier;
  bool quiet = false;
};

class Progress {
 public:
  explicit Progress(bool enabled) : enabled_(enabled) {}

  void Update(uint64_t done, uint64_t total) {
    if (!enabled_ || total == 0) return;
    auto now = std::chrono::steady_clock::now();
    if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    drawn_ = true;
    constexpr int kWidth = 30;
    int filled = static_cast<int>(kWidth * static_cast<double>(done) / static_cast<double>(total));
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, ' ');
    std::fprintf(stderr, "\r[%s] %3d%%  %s / %s", bar.c_str(),
                 static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total)),
                 HumanBytes(done).c_str(), HumanBytes(total).c_str());
    std::fflush(stderr);
  }

  // Clears the bar's line so that a message can be printed on a clean line.
  void Clear() {
    if (!drawn_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }

 private:
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

struct VerifyState {
  Progress* progress;
  bool quiet;
};

void OnEvent(void* arg, const ckptdb_verify_event* e) {
  auto* state = static_cast<VerifyState*>(arg);
  switch (e->kind) {
    case CKPTDB_VERIFY_PROGRESS:
      state->progress->Update(e->bytes_done, e->bytes_total);
      break;
    case CKPTDB_VERIFY_OK:
      if (!state->quiet) {
        state->progress->Clear();
        std::printf("ok       version %" PRIu64 " on %s: %s\n", e->version, e->tier, e->path);
        std::fflush(stdout);
      }
      state->progress->Update(e->bytes_done, e->bytes_total);
      break;
    case CKPTDB_VERIFY_PROBLEM:
      state->progress->Clear();
      std::printf("PROBLEM  %s\n", SafeMessage(e->message).c_str());
      std::fflush(stdout);
      break;
  }
}

// VerifyStore's answer, with several roots, for a store that does not hold --version.
constexpr int kExitNotHeld = -1;

// One store's chunks; kExitOk, kExitProblem, kExitUsage or kExitNotHeld.
int VerifyStore(ckptdb* db, const std::string& root, uint64_t version, const VerifyArgs& args,
                bool several) {
  if (several) std::printf("%s:\n", root.c_str());
  Progress progress(isatty(STDERR_FILENO) == 1 && !args.quiet);
  VerifyState state{&progress, args.quiet};
  ckptdb_verify_report report{};
  int rc = ckptdb_verify(db, version, args.tier.empty() ? nullptr : args.tier.c_str(), OnEvent,
                         &state, &report);
  progress.Clear();
  if (rc == CKPTDB_ENOTFOUND || rc == CKPTDB_ESTATE || rc == CKPTDB_EINVAL) {
    if (several && rc != CKPTDB_EINVAL && version != CKPTDB_ALL_VERSIONS) {
      // A member that does not hold it (a replaced node): the group check still counts it.
      std::printf("not checked: %s\n", ErrorText(rc).c_str());
      return kExitNotHeld;
    }
    std::fprintf(stderr, "ckptdb verify: %s: %s\n", root.c_str(), ErrorText(rc).c_str());
    return kExitUsage;
  }
  std::printf(
      "verified %" PRIu64 " segment(s), %" PRIu64 " chunk(s), %s: ", report.segments_checked,
      report.chunks_checked, HumanBytes(report.bytes_checked).c_str());
  if (rc == CKPTDB_OK) {
    std::printf(report.segments_checked == 0 ? "nothing to check\n" : "clean\n");
    return kExitOk;
  }
  if (report.problems > 0) {
    std::printf("%" PRIu64 " problem(s)\n", report.problems);
  } else {
    std::printf("failed\n");
  }
  if (rc != CKPTDB_ECORRUPT) std::fprintf(stderr, "ckptdb verify: %s\n", ErrorText(rc).c_str());
  return kExitProblem;
}

std::string Ranks(const ckptdb_group_check* c) {
  std::string text;
  for (uint32_t p = 0; p < c->members; ++p) {
    text += (p ? " " : "") + std::to_string(c->ranks[p]);
  }
  return text;
}

void OnGroup(void* arg, const ckptdb_group_check* c) {
  auto* printed = static_cast<int*>(arg);
  ++*printed;
  std::printf("group %u of version %" PRIu64 " (%s, ranks %s): parity %" PRIu64 " of %" PRIu64
              " block(s) recomputed, %" PRIu64 " bad; ",
              c->group, c->version, c->code, Ranks(c).c_str(), c->parity_checked, c->parity_blocks,
              c->parity_bad);
  if (c->from_memory) {
    std::printf("recoverable from memory, %d more node loss(es) to spare\n", c->spare_losses);
  } else if (c->recoverable) {
    std::printf("recoverable, not from memory alone\n");
  } else {
    std::printf("NOT recoverable from the stores given\n");
  }
  for (uint32_t p = 0; p < c->members; ++p) {
    std::printf("  rank %u: %s bytes, restores from %s; its parity %s\n", c->ranks[p],
                std::to_string(c->member_bytes[p]).c_str(), c->sources[p], c->parity[p]);
  }
  std::string problems = c->problems;
  for (size_t at = 0; at < problems.size();) {
    size_t end = problems.find('\n', at);
    if (end == std::string::npos) end = problems.size();
    std::printf("PROBLEM  %s\n", problems.substr(at, end - at).c_str());
    at = end + 1;
  }
  std::fflush(stdout);
}

// With one root: which versions are coded, from the manifests (CKPTDB_GROUPS_LAYOUT_ONLY).
struct Unchecked {
  int versions = 0;
  std::string first;  // "group 0, ec:2+2, ranks 0 1 2 3"
};

void NoteUnchecked(void* arg, const ckptdb_group_check* c) {
  auto* u = static_cast<Unchecked*>(arg);
  if (u->versions++ == 0) {
    u->first = "group " + std::to_string(c->group) + ", " + c->code + ", ranks " + Ranks(c);
  }
}

int RunVerify(const VerifyArgs& args) {
  uint64_t version = CKPTDB_ALL_VERSIONS;
  if (!args.version.empty() && !ParseVersion(args.version, &version)) {
    std::fprintf(stderr, "ckptdb verify: --version %s is not a version number\n",
                 QuoteName(args.version).c_str());
    return kExitUsage;
  }
  std::vector<DbHandle> dbs;
  for (const std::string& root : args.roots) {
    DbHandle db;
    if (int rc = OpenReadOnly(root, &db); rc != kExitOk) return rc;
    dbs.push_back(std::move(db));
  }
  const bool several = dbs.size() > 1;
  int exit = kExitOk;
  size_t held = 0;
  for (size_t i = 0; i < dbs.size(); ++i) {
    int rc = VerifyStore(dbs[i].get(), args.roots[i], version, args, several);
    if (rc == kExitUsage) return rc;
    if (rc == kExitNotHeld) continue;
    ++held;
    if (rc != kExitOk) exit = rc;
  }
  if (held == 0) {
    std::fprintf(stderr, "ckptdb verify: version %s is committed in none of the %zu stores\n",
                 args.version.c_str(), dbs.size());
    return kExitUsage;
  }
  std::vector<ckptdb*> handles;
  for (const DbHandle& db : dbs) handles.push_back(db.get());
  if (!several) {
    Unchecked u;
    if (ckptdb_verify_groups(handles.data(), handles.size(), version, CKPTDB_GROUPS_LAYOUT_ONLY,
                             NoteUnchecked, &u) == CKPTDB_OK &&
        u.versions > 0) {
      std::printf(
          "coding groups: parity not checked for %d coded version(s) (%s): give every "
          "member's root, `ckptdb verify ROOT...`\n",
          u.versions, u.first.c_str());
    }
    return exit;
  }
  int groups = 0;
  int rc = ckptdb_verify_groups(handles.data(), handles.size(), version, 0, OnGroup, &groups);
  if (rc == CKPTDB_EINVAL) {
    std::fprintf(stderr, "ckptdb verify: %s\n", ErrorText(rc).c_str());
    return kExitUsage;
  }
  if (rc != CKPTDB_OK && rc != CKPTDB_ENOTFOUND) {
    if (rc != CKPTDB_ECORRUPT) std::fprintf(stderr, "ckptdb verify: %s\n", ErrorText(rc).c_str());
    exit = kExitProblem;
  }
  if (groups > 0) {
    std::printf("checked %d coding group version(s): %s\n", groups,
                rc == CKPTDB_OK ? "clean" : "problems");
  }
  return exit;
}

}  // namespace

void AddVerifyCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<VerifyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "verify",
      "Re-read every chunk on every tier and check it, and coding groups' parity across "
      "stores; exit 1 when anything is wrong");
  cmd->add_option("root", args->roots,
                  "The store's root directory; several: also check their coding groups' parity "
                  "and recoverability")
      ->required();
  cmd->add_option("--version,-v", args->version,
                  "Check only this committed version (default: every committed version)");
  cmd->add_option("--tier,-t", args->tier,
                  "Check only this tier, e.g. disk:/nvme/ck (default: every tier)");
  cmd->add_flag("--quiet,-q", args->quiet, "Print only problems and the summary");
  cmd->callback([args, exit_code] { *exit_code = RunVerify(*args); });
}

}  // namespace ckpt::tools
