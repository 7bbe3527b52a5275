// ckptdb repair (docs/cli.md, "repair"; docs/commit-protocol.md, "Repair"): rebuilds a store's
// catalog from what verifies, never deleting data. The explicit act that the rule "damaged
// metadata changes nothing" leaves to the operator.
//
// When the catalog opens intact and every commit witness agrees with it, repair only rewrites
// missing or damaged witnesses of committed versions. Otherwise it:
//   1. takes the store's lock (a running trainer or another repair is refused);
//   2. reads what still decodes of the old catalog (Catalog::Salvage) and every commit witness;
//   3. takes as committed every version that a valid witness or a salvaged COMMITTED record
//      names, and for each looks for its copies on every tier (the tier spec: the caller's,
//      else the catalog's, else the newest witness's), keeping each copy whose footer and
//      manifest verify and match the committed manifest (chunks that fail are reported, and
//      left for restore's per-chunk fallback);
//   4. writes a new catalog beside the old one, then renames the old one to
//      catalog.damaged-<unix ns> and the new one into place (nothing of the old is deleted);
//   5. writes a witness for every recovered version, and moves aside (renames with a suffix,
//      never deletes) what the next open's sweep would otherwise remove: this rank's segment
//      files that no recovered version accounts for (".orphan") and damaged witnesses of
//      versions it could not recover (".damaged").
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "engine/db.h"
#include "util/status.h"

namespace ckpt::engine {

struct RepairOutcome {
  bool catalog_rebuilt = false;
  uint64_t versions_recovered = 0;  // committed versions with at least one verifying copy
  uint64_t versions_lost = 0;       // committed versions with none
  uint64_t copies_recovered = 0;
  uint64_t files_moved_aside = 0;
  uint64_t witnesses_written = 0;
};

// `say` gets one line per finding, as it goes. Returns Ok when every committed version it knows
// of is restorable after it; Corrupt when some is lost (each named through `say`); other errors
// when it could not run (the store is busy, not a store, a write failed), having changed nothing
// or, past step 4, with the new catalog in place.
Status RepairStore(const DbOptions& options, const std::function<void(const std::string&)>& say,
                   RepairOutcome* out);

}  // namespace ckpt::engine
