// Reading a tier directory alone (docs/api.md, "Reading a tier directory alone"): a read-only
// ckptdb_open with tiers and no root, as another job does with a job's nfs tier after the job
// and its nodes are gone (no ram, no local disk, no catalog).
//
// What the directory proves: each version the rank committed and demoted there has the rank's
// commit witness in <tier>/commits (written after the copy was recorded, removed before it is
// evicted), and in a job of many ranks, rank 0's decision record in <tier>/decisions (written when
// rank 0's own copy got there). A version is listed for the rank when its witness is valid, names
// the same job as the newest one, the rank's segment is on one of the tiers, and (a job of many
// ranks) a decision record of the job names it. Nothing is verified at open beyond that: restore
// checks the footer's manifest against the witness's and every chunk as it reads, as always.
//
// The view is a catalog built in a private temporary root (TMPDIR, else /tmp) from those records,
// which the read-only open then uses as any store's; the handle removes it at close.
#pragma once

#include <string>

#include "engine/db.h"
#include "io/io.h"
#include "util/status.h"

namespace ckpt::engine {

// Builds the view of rank options.rank over options.tiers (directory tiers only: a ram tier is
// Invalid) and returns its temporary root in *root. NotFound when no version of the rank is
// listed (saying what was found and why it was left out).
Status BuildTierView(const DbOptions& options, io::Io* io, std::string* root);

}  // namespace ckpt::engine
