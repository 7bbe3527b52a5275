// ckptdb repair ROOT [--tiers SPEC]: rebuilds a store's catalog from what verifies
// (ckptdb_repair; docs/cli.md, "repair"). The one read-write command meant for damaged stores;
// it deletes nothing.
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>

#include "ckptdb/ckptdb.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace ckpt::tools {
namespace {

struct RepairArgs {
  std::string root;
  std::string tiers;
};

int RunRepair(const RepairArgs& args) {
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = args.root.c_str();
  o.tiers = args.tiers.empty() ? nullptr : args.tiers.c_str();
  ckptdb_repair_report report{};
  int rc = ckptdb_repair(
      &o, [](void*, const char* line) { std::printf("%s\n", line); }, nullptr, &report);
  if (rc != CKPTDB_OK && rc != CKPTDB_ECORRUPT) {
    std::fprintf(stderr, "ckptdb repair: %s\n", ErrorText(rc).c_str());
    return ExitCodeFor(rc);
  }
  std::printf("%s: %" PRIu64 " committed version(s) recovered, %" PRIu64 " lost; %" PRIu64
              " cop(ies) recorded, %" PRIu64 " witness(es) written, %" PRIu64
              " file(s) moved aside\n",
              report.catalog_rebuilt ? "catalog rebuilt" : "catalog intact",
              report.versions_recovered, report.versions_lost, report.copies_recovered,
              report.witnesses_written, report.files_moved_aside);
  if (rc == CKPTDB_ECORRUPT) {
    std::fprintf(stderr, "ckptdb repair: %s\n", ErrorText(rc).c_str());
    return kExitProblem;
  }
  return kExitOk;
}

}  // namespace

void AddRepairCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<RepairArgs>();
  CLI::App* cmd = app.add_subcommand(
      "repair",
      "Rebuild a damaged store's catalog from the commit witnesses and the copies that verify; "
      "deletes nothing; exit 1 when a committed version could not be recovered");
  cmd->add_option("root", args->root, "The store's root directory")->required();
  cmd->add_option("--tiers", args->tiers,
                  "The store's tiers, e.g. 'ram:8G;disk:/nvme/ck' (default: as the damaged "
                  "catalog or the newest commit witness records them)");
  cmd->callback([args, exit_code] { *exit_code = RunRepair(*args); });
}

}  // namespace ckpt::tools
