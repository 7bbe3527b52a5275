// The ckptdb command's subcommands. Each Add*Command registers one CLI11 subcommand whose
// callback sets *exit_code. Subcommands use the public C API (and format/ for inspect's chunk
// detail), never engine internals (DESIGN.md section 2); the one exception is plan, which only
// does arithmetic with redundancy/placement.h (no store, no I/O).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace ckpt::tools {

void AddInspectCommand(CLI::App& app, int* exit_code);
void AddVerifyCommand(CLI::App& app, int* exit_code);
void AddRestoreCommand(CLI::App& app, int* exit_code);
void AddDemoCommand(CLI::App& app, int* exit_code);
void AddPlanCommand(CLI::App& app, int* exit_code);  // arithmetic only: redundancy/placement.h
void AddServeCommand(CLI::App& app, int* exit_code);
void AddExportCommand(CLI::App& app, int* exit_code);  // and ckptdb_restore_slice for --merge
void AddImportCommand(CLI::App& app, int* exit_code);
void AddRepairCommand(CLI::App& app, int* exit_code);
void AddGcCommand(CLI::App& app, int* exit_code);
void AddSimulateCommand(CLI::App& app, int* exit_code);

// The file name `ckptdb restore` writes tensor `name` to (one safe path component; see
// tools/restore.cc and docs/cli.md).
std::string RestoreFileName(const std::string& name);

}  // namespace ckpt::tools
