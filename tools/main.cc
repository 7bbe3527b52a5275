// ckptdb: the command a user reaches for first (inspect, verify, restore, export, import, repair,
// demo, plan, serve, gc, simulate).
#include <CLI/CLI.hpp>

#include "ckptdb/ckptdb.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"ckptdb: checkpoint storage for large-model training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::to_string(CKPTDB_VERSION_MAJOR) + "." +
                                        std::to_string(CKPTDB_VERSION_MINOR) + "." +
                                        std::to_string(CKPTDB_VERSION_PATCH));
  int exit_code = 0;
  ckpt::tools::AddInspectCommand(app, &exit_code);
  ckpt::tools::AddVerifyCommand(app, &exit_code);
  ckpt::tools::AddRestoreCommand(app, &exit_code);
  ckpt::tools::AddDemoCommand(app, &exit_code);
  ckpt::tools::AddPlanCommand(app, &exit_code);
  ckpt::tools::AddServeCommand(app, &exit_code);
  ckpt::tools::AddExportCommand(app, &exit_code);
  ckpt::tools::AddImportCommand(app, &exit_code);
  ckpt::tools::AddRepairCommand(app, &exit_code);
  ckpt::tools::AddGcCommand(app, &exit_code);
  ckpt::tools::AddSimulateCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Usage errors exit 2 (CLI11 prints the message and help hint); --help exits 0.
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return exit_code;
}
