// nfs_fixture EXPORT_DIR WORK_DIR: the tests' NFS server (tests/support/nfs_server.h) for tests
// that are not C++ (python/tests): starts it, prints "PORT MOUNTPORT" on a line of stdout, and
// stops it (and an rpcbind it started) when stdin reaches its end, so a test that dies leaves
// nothing running.
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "tests/support/nfs_server.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: nfs_fixture EXPORT_DIR WORK_DIR\n");
    return 2;
  }
  std::string why;
  if (!ckpt::test::NfsServer::Installed(&why)) {
    std::fprintf(stderr, "nfs_fixture: %s\n", why.c_str());
    return 1;
  }
  std::unique_ptr<ckpt::test::NfsServer> server;
  ckpt::Status st = ckpt::test::NfsServer::Start(argv[1], argv[2], &server);
  if (!st.ok()) {
    std::fprintf(stderr, "nfs_fixture: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("%u %u\n", server->port(), server->mount_port());
  std::fflush(stdout);
  char buffer[256];
  while (::read(0, buffer, sizeof buffer) > 0) {
  }
  return 0;
}
