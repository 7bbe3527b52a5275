// A real NFSv3 server for the nfs tier's tests: Debian's nfs-ganesha (VFS backend, user space)
// exporting one local directory on two free ports (NFS and MOUNT), started and stopped by the
// test with nothing left running (../shared/nfs/ has the configuration it grew from).
//
// ganesha registers its programs with rpcbind and will not start without one. rpcbind listens on
// the machine's fixed port 111: a running one is reused; otherwise one is started here. Test
// processes run side by side share it, so the one a test started is stopped by the last process
// using it, whichever started it (lock files /tmp/ckptdb-test-rpcbind.{gate,users} count them).
// Clients connect with explicit ports (nfs:HOST:/PATH,port=N,mountport=N), never through the
// portmapper.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "util/status.h"

namespace ckpt::test {

class NfsServer {
 public:
  // Whether ganesha and rpcbind are installed (scripts/install-deps.sh installs them).
  static bool Installed(std::string* why);

  // Starts a server exporting `export_dir` (an existing absolute directory); its configuration
  // and log go to `work_dir`.
  static Status Start(const std::string& export_dir, const std::string& work_dir,
                      std::unique_ptr<NfsServer>* out);
  ~NfsServer();
  NfsServer(const NfsServer&) = delete;
  NfsServer& operator=(const NfsServer&) = delete;

  // Kills the server (SIGKILL: a crash) and waits for it to go.
  void Kill();
  // Starts it again on the same ports (a stopped one only).
  Status Restart();

  uint16_t port() const { return port_; }
  uint16_t mount_port() const { return mount_port_; }
  const std::string& export_dir() const { return export_dir_; }
  // The tier spec of directory `dir` (absolute, inside the export) on this server.
  std::string Spec(const std::string& dir, const std::string& options = "") const;
  // The last lines of the server's log (for a failing test's message).
  std::string LogTail() const;

 private:
  NfsServer() = default;
  Status Launch();

  std::string export_dir_;
  std::string work_dir_;
  uint16_t port_ = 0;
  uint16_t mount_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace ckpt::test
