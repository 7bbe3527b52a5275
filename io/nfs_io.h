// The NFS client of the Io seam (DESIGN.md section 8): the directories of nfs: tiers live on an
// NFSv3 server reached through libnfs, with no kernel mount. They are named by nfs:// paths
//   nfs://HOST:PORT:MOUNTPORT/PATH      (PORT, MOUNTPORT 0: ask the server's portmapper)
// which the Io of NewPosixIo (io.h) sends here; every other path goes to the local file system.
//
// What it guarantees, and how:
//   - Metadata (open, create, mkdir, list, stat, rename, remove) is synchronous to its caller,
//     one connection per server shared under a mutex, each call made through libnfs's
//     asynchronous API and waited for with its completion owned by the connection (libnfs's own
//     synchronous calls leave a stack frame behind when their wait fails). A connection that
//     fails or misses its deadline is dropped and opened again on the next call; a call that
//     failed at once on a broken connection is tried once more on a fresh one (a rename is
//     checked instead: see below), one that waited out its deadline is not.
//   - Data goes through each IoQueue's own connection, asynchronously: a request is cut into
//     READ3/WRITE3 calls of at most the server's rsize/wsize, several in flight (NfsOptions), and
//     the queue's Reap drives the connection's event loop beside the local io_uring's.
//   - Writes are UNSTABLE; the queue's kSync is a COMMIT3 whose write verifier must match every
//     WRITE3's since the file's last COMMIT. A server that restarted in between (its verifier
//     changed, so unstable data may be lost) fails the sync with ECONNRESET, and every later sync
//     of that open file too: the caller writes the file again. A file is durable on the server
//     only after a matching COMMIT. (Verifiers are kept per queue: a file's writes and its sync
//     go through one queue.)
//   - Rename is NFSv3's RENAME, which the server makes stable before it answers (RFC 1813). The
//     directory's state is then checked: the new name must resolve to the file that the old one
//     named, the old name to nothing. A RENAME whose answer was lost (ENOENT on a retry) counts
//     only when that check passes. SyncDir is a GETATTR: it fails when the server or the
//     directory is gone.
//   - Server errors keep their errno (ENOSPC, ESTALE, EACCES, ...) and every message names the
//     server; a lost connection is EIO ("did not answer") for metadata and ECONNRESET (or
//     ETIMEDOUT) for a queue's requests.
// Shared memory and mapped files are local only: an nfs:// path there is NotSupported.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "io/io.h"
#include "io/nfs_path.h"
#include "util/status.h"

namespace ckpt::io {

struct NfsOptions {
  // Deadline of every call to the server; a connection that misses it is dropped.
  int timeout_ms = 10'000;
  // READ3/WRITE3 calls one queue keeps in flight (each at most the server's rsize/wsize, which
  // libnfs copies into its send buffer: this bounds that memory too).
  uint32_t max_in_flight = 16;
};

// File descriptors of nfs:// files are at least this (local ones are below it).
inline constexpr int kNfsFdBase = 1 << 30;

// An Io that sends nfs:// paths to their servers and every other path to `local`.
std::unique_ptr<Io> NewNfsIo(std::unique_ptr<Io> local, const NfsOptions& options = {});

}  // namespace ckpt::io
