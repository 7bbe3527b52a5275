// What the benchmarks that shape links between simulated nodes share (bench_interleave,
// bench_encode): a shell command run quietly, a namespace entered the way a rank needs it, and
// the bytes a tc qdisc has sent. Needs root (network namespaces, tc).
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace bench {

// Runs `command` with its output discarded; true when it exited 0.
inline bool RunQuiet(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// Bytes the root qdisc of `dev` in namespace `ns` has sent (tc -s qdisc), -1 when unread.
inline long long QdiscSentBytes(const std::string& ns, const std::string& dev) {
  FILE* f = popen(("tc -n " + ns + " -s qdisc show dev " + dev).c_str(), "r");
  if (f == nullptr) return -1;
  char line[512];
  long long sent = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (const char* at = std::strstr(line, "Sent "); at != nullptr) sent = std::atoll(at + 5);
  }
  pclose(f);
  return sent;
}

// In a rank's process: into namespace `ns`, with a /sys of it (where UCX finds interfaces).
// 0, or -1 with errno set.
inline int EnterNetns(const std::string& ns) {
  int fd = open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  int rc = fd >= 0 ? setns(fd, CLONE_NEWNET) : -1;
  if (fd >= 0) close(fd);
  if (rc == 0) rc = unshare(CLONE_NEWNS);
  if (rc == 0) rc = mount("", "/", nullptr, MS_SLAVE | MS_REC, nullptr);
  if (rc == 0) rc = umount2("/sys", MNT_DETACH);
  if (rc == 0) rc = mount(ns.c_str(), "/sys", "sysfs", 0, nullptr);
  return rc;
}

}  // namespace bench
