// nfs:// paths (io/nfs_path.h).
#include "io/nfs_path.h"

namespace ckpt::io {

std::string NfsLocation::Server() const {
  return host + ":" + std::to_string(port) + ":" + std::to_string(mount_port);
}

std::string MakeNfsPath(const std::string& host, uint16_t port, uint16_t mount_port,
                        const std::string& path) {
  return std::string(kNfsPathPrefix) + host + ":" + std::to_string(port) + ":" +
         std::to_string(mount_port) + path;
}

bool IsNfsPath(std::string_view path) { return path.starts_with(kNfsPathPrefix); }

Status ParseNfsPath(std::string_view path, NfsLocation* out) {
  auto bad = [&](const char* why) {
    return Status::Invalid("nfs path \"" + std::string(path.substr(0, 200)) + "\": " + why);
  };
  if (!IsNfsPath(path)) return bad("does not start with nfs://");
  std::string_view rest = path.substr(kNfsPathPrefix.size());
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos) return bad("no path after the server");
  std::string_view authority = rest.substr(0, slash);
  NfsLocation loc;
  loc.path = std::string(rest.substr(slash));
  // HOST:PORT:MOUNTPORT, HOST possibly [IPv6].
  const size_t last = authority.rfind(':');
  if (last == std::string_view::npos || last == 0) return bad("no mount port");
  const size_t middle = authority.rfind(':', last - 1);
  if (middle == std::string_view::npos || middle == 0) return bad("no port");
  auto number = [](std::string_view s, uint16_t* v) {
    if (s.empty() || s.size() > 5) return false;
    uint32_t n = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      n = n * 10 + static_cast<uint32_t>(c - '0');
    }
    if (n > 65535) return false;
    *v = static_cast<uint16_t>(n);
    return true;
  };
  if (!number(authority.substr(middle + 1, last - middle - 1), &loc.port) ||
      !number(authority.substr(last + 1), &loc.mount_port)) {
    return bad("a port is not a number from 0 to 65535");
  }
  loc.host = std::string(authority.substr(0, middle));
  if (loc.host.empty()) return bad("empty host");
  *out = std::move(loc);
  return Status::Ok();
}

}  // namespace ckpt::io
