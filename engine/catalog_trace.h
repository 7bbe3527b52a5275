// The catalog's recording file system (catalog_trace.cc), for catalog.cc. Not an interface.
#pragma once

#include <rocksdb/env.h>

#include <memory>

namespace ckpt::engine {

// An Env whose file system records every change into the trace SetCatalogTraceForTesting set;
// nullptr where none is set or the catalog is opened read-only (RocksDB's default Env then).
std::unique_ptr<rocksdb::Env> RecordingEnvForCatalog(bool read_only);

}  // namespace ckpt::engine
