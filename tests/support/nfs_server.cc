// The tests' NFS server (tests/support/nfs_server.h).
#include "tests/support/nfs_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

namespace ckpt::test {
namespace {

constexpr const char* kGanesha = "/usr/bin/ganesha.nfsd";
constexpr const char* kRpcbind = "/usr/sbin/rpcbind";
constexpr int kStartTries = 3;
constexpr auto kReadyWait = std::chrono::seconds(30);

bool Listening(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// A port nothing listens on now (the kernel's pick for a bound socket, released).
uint16_t FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  // The child: its own process group, output to the log, then the program.
  ::setpgid(0, 0);
  std::FILE* f = std::fopen(log.c_str(), "a");
  if (f != nullptr) {
    ::dup2(fileno(f), 1);
    ::dup2(fileno(f), 2);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  ::_exit(127);
}

// Stops pid (SIGTERM, then SIGKILL after five seconds) and reaps it.
void Stop(pid_t pid, int first_signal) {
  if (pid <= 0) return;
  ::kill(pid, first_signal);
  for (int i = 0; i < 500; ++i) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

// rpcbind is shared by every test process on the machine (ctest runs several at once), so one
// that a test started may be stopped only by the last process using it, whichever started it.
// Two lock files order this. Every decision (take a use, start, give the last use back and stop)
// is made holding the gate exclusively; each process using rpcbind holds a shared lock on the
// users file, so the last one is the one that can take it exclusively. The gate file holds the
// pid of the rpcbind a test started (empty when the running one is not a test's).
constexpr const char* kRpcbindGate = "/tmp/ckptdb-test-rpcbind.gate";
constexpr const char* kRpcbindUsers = "/tmp/ckptdb-test-rpcbind.users";

// This process's servers, and its shared lock on kRpcbindUsers while there are any.
std::mutex g_rpcbind_mu;
int g_servers = 0;
int g_users_fd = -1;

// The gate, held exclusively for its lifetime.
class RpcbindGate {
 public:
  RpcbindGate() : fd_(::open(kRpcbindGate, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RpcbindGate() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  RpcbindGate(const RpcbindGate&) = delete;
  RpcbindGate& operator=(const RpcbindGate&) = delete;

  bool ok() const { return fd_ >= 0; }
  pid_t StartedPid() const {
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    return n > 0 ? static_cast<pid_t>(std::atol(buf)) : -1;
  }
  void SetStartedPid(pid_t pid) {
    const std::string text = pid > 0 ? std::to_string(pid) : "";
    if (::ftruncate(fd_, 0) != 0 ||
        ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
      std::fprintf(stderr, "nfs_server: cannot record rpcbind's pid in %s\n", kRpcbindGate);
    }
  }

 private:
  int fd_;
};

// Whether pid is rpcbind (a pid recorded by a test that crashed may since name another program).
bool IsRpcbind(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/comm");
  std::string comm;
  return std::getline(f, comm) && comm == "rpcbind";
}

// Whether pid has exited: reaped here, gone, or a zombie (of the process that started it).
bool Exited(pid_t pid) {
  if (::waitpid(pid, nullptr, WNOHANG) == pid) return true;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return true;
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

// Stops an rpcbind that may be another process's child: SIGTERM, then SIGKILL after 5 s.
void StopRpcbind(pid_t pid) {
  ::kill(pid, SIGTERM);
  for (int i = 0; i < 500 && !Exited(pid); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!Exited(pid)) ::kill(pid, SIGKILL);
}

Status EnsureRpcbind(const std::string& work_dir) {
  std::lock_guard<std::mutex> guard(g_rpcbind_mu);
  RpcbindGate gate;
  if (!gate.ok()) {
    return Status::IoError(std::string("locking ") + kRpcbindGate + ": " + std::strerror(errno));
  }
  if (g_servers == 0) {
    // Never blocks: the users file is held exclusively only under the gate.
    g_users_fd = ::open(kRpcbindUsers, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (g_users_fd < 0 || ::flock(g_users_fd, LOCK_SH) != 0) {
      const Status st =
          Status::IoError(std::string("locking ") + kRpcbindUsers + ": " + std::strerror(errno));
      if (g_users_fd >= 0) ::close(g_users_fd);
      g_users_fd = -1;
      return st;
    }
  }
  ++g_servers;
  if (Listening(111)) return Status::Ok();
  const pid_t pid = Spawn({kRpcbind, "-f"}, work_dir + "/rpcbind.log");
  for (int i = 0; i < 500 && !Listening(111); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      return Status::IoError("rpcbind exited with status " + std::to_string(status) + " (see " +
                             work_dir + "/rpcbind.log)");
    }
  }
  if (!Listening(111)) {
    Stop(pid, SIGTERM);
    return Status::IoError("rpcbind did not listen on port 111 within 5 s");
  }
  gate.SetStartedPid(pid);
  return Status::Ok();
}

void ReleaseRpcbind() {
  std::lock_guard<std::mutex> guard(g_rpcbind_mu);
  if (--g_servers > 0) return;
  RpcbindGate gate;
  // The last user anywhere stops the rpcbind a test started. Without the gate, rpcbind is left
  // running rather than stopped under another process's feet.
  if (gate.ok() && ::flock(g_users_fd, LOCK_EX | LOCK_NB) == 0) {
    const pid_t pid = gate.StartedPid();
    if (pid > 0 && IsRpcbind(pid)) StopRpcbind(pid);
    gate.SetStartedPid(-1);
  }
  ::close(g_users_fd);
  g_users_fd = -1;
}

}  // namespace

bool NfsServer::Installed(std::string* why) {
  for (const char* p : {kGanesha, kRpcbind}) {
    if (::access(p, X_OK) != 0) {
      *why = std::string(p) + " is not installed (scripts/install-deps.sh installs it)";
      return false;
    }
  }
  return true;
}

Status NfsServer::Start(const std::string& export_dir, const std::string& work_dir,
                        std::unique_ptr<NfsServer>* out) {
  std::unique_ptr<NfsServer> s(new NfsServer());
  s->export_dir_ = export_dir;
  s->work_dir_ = work_dir;
  Status st = EnsureRpcbind(work_dir);
  if (!st.ok()) {
    ReleaseRpcbind();
    return st;
  }
  // Free ports can be taken between the pick and ganesha's bind: a few tries.
  for (int attempt = 0; attempt < kStartTries; ++attempt) {
    s->port_ = FreePort();
    do {
      s->mount_port_ = FreePort();
    } while (s->mount_port_ == s->port_);
    st = s->Launch();
    if (st.ok()) break;
  }
  if (!st.ok()) return st;  // ~NfsServer releases rpcbind
  *out = std::move(s);
  return Status::Ok();
}

Status NfsServer::Launch() {
  // One ganesha starts at a time on the machine: each clears the NFS and MOUNT programs'
  // registrations with rpcbind, then registers its own, and one starting beside another can find
  // the other's registration there and exit ("Cannot register NFS V3 on TCP").
  RpcbindGate gate;
  if (!gate.ok()) {
    return Status::IoError(std::string("locking ") + kRpcbindGate + ": " + std::strerror(errno));
  }
  const std::string conf = work_dir_ + "/ganesha.conf";
  {
    std::ofstream f(conf, std::ios::trunc);
    // NFSv3 over TCP only: no NLM, RQUOTA or UDP, so nothing else needs a port.
    f << "NFS_CORE_PARAM { Protocols = 3; NFS_Port = " << port_ << "; MNT_Port = " << mount_port_
      << "; Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false; }\n"
      << "EXPORT { Export_Id = 1; Path = " << export_dir_
      << "; Pseudo = /export; Access_Type = RW; Squash = No_Root_Squash; Protocols = 3; "
         "Transports = TCP; SecType = sys; FSAL { Name = VFS; } }\n"
      << "LOG { Default_Log_Level = WARN; Components { NFS_STARTUP = EVENT; } }\n";
    if (!f) return Status::IoError("writing " + conf);
  }
  const std::string log = work_dir_ + "/ganesha.log";
  // Registered with rpcbind once it logs this (the log is appended to across restarts).
  auto initialized = [&log] {
    std::ifstream f(log);
    int n = 0;
    for (std::string line; std::getline(f, line);) {
      n += line.find("NFS SERVER INITIALIZED") != std::string::npos;
    }
    return n;
  };
  const int before = initialized();
  pid_ = Spawn({kGanesha, "-F", "-f", conf, "-L", log, "-p", work_dir_ + "/ganesha.pid"},
               work_dir_ + "/ganesha.out");
  const auto deadline = std::chrono::steady_clock::now() + kReadyWait;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return Status::IoError("ganesha.nfsd exited at start (status " + std::to_string(status) +
                             "): " + LogTail());
    }
    if (Listening(port_) && Listening(mount_port_) && initialized() > before) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Stop(pid_, SIGKILL);
  pid_ = -1;
  return Status::TimedOut("ganesha.nfsd did not listen on ports " + std::to_string(port_) +
                          " and " + std::to_string(mount_port_) + ": " + LogTail());
}

NfsServer::~NfsServer() {
  Stop(pid_, SIGTERM);
  ReleaseRpcbind();
}

void NfsServer::Kill() {
  Stop(pid_, SIGKILL);
  pid_ = -1;
}

Status NfsServer::Restart() {
  if (pid_ > 0) return Status::State("the nfs server is running");
  std::lock_guard<std::mutex> guard(g_rpcbind_mu);
  if (!Listening(111)) return Status::IoError("rpcbind is gone");
  return Launch();
}

std::string NfsServer::Spec(const std::string& dir, const std::string& options) const {
  return "nfs:127.0.0.1:" + dir + ",port=" + std::to_string(port_) +
         ",mountport=" + std::to_string(mount_port_) + options;
}

std::string NfsServer::LogTail() const {
  std::ifstream f(work_dir_ + "/ganesha.log");
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);) {
    if (line.find("DBUS") != std::string::npos || line.find("krb5") != std::string::npos ||
        line.find("SetComponentLogLevel") != std::string::npos ||
        line.find(":NFS STARTUP :EVENT :") != std::string::npos) {
      continue;
    }
    lines.push_back(line);
  }
  std::string tail;
  for (size_t i = lines.size() > 5 ? lines.size() - 5 : 0; i < lines.size(); ++i) {
    tail += lines[i] + "\n";
  }
  return tail.empty() ? "(its log is empty)" : tail;
}

}  // namespace ckpt::test
