// nfs:// paths (io/nfs_io.h): where the directory of an nfs tier lives, in one string that the
// Io seam's path-taking calls accept like a local path:
//   nfs://HOST:PORT:MOUNTPORT/PATH      (PORT, MOUNTPORT 0: ask the server's portmapper)
// Pure string functions, apart from the client: the tier spec's parser makes them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "util/status.h"

namespace ckpt::io {

inline constexpr std::string_view kNfsPathPrefix = "nfs://";

struct NfsLocation {
  std::string host;  // as written: an IPv6 address keeps its brackets
  uint16_t port = 0;
  uint16_t mount_port = 0;
  std::string path;  // absolute on the server, lexically normal
  // "HOST:PORT:MOUNTPORT": one server (and one connection per user of it).
  std::string Server() const;
};

std::string MakeNfsPath(const std::string& host, uint16_t port, uint16_t mount_port,
                        const std::string& path);
bool IsNfsPath(std::string_view path);
// Invalid for a path that MakeNfsPath could not have made.
Status ParseNfsPath(std::string_view path, NfsLocation* out);

}  // namespace ckpt::io
