// The catalog's recording file system, for the crash-state enumeration (io/crash_model.h):
// tests only, outside the library.
#pragma once

#include "io/crash_model.h"

namespace ckpt::engine {

// The catalogs this process opens read-write from now on record every change RocksDB makes to
// their files (creates, appends, syncs, renames, removes, directory fsyncs) into trace, which
// must outlive them; nullptr stops it for later opens.
void SetCatalogTraceForTesting(io::FsTrace* trace);

}  // namespace ckpt::engine
