#include "harness/job.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace ckpt::harness {

namespace {

constexpr size_t kMaxCounters = 256;
constexpr size_t kMaxName = 47;
constexpr size_t kMaxAddress = 255;

// The harness's own bugs and misuse: said on stderr, and the process stops (a test harness that
// continued would report the wrong thing).
[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "harness: %s\n", why.c_str());
  std::fflush(nullptr);
  std::abort();
}

timespec Deadline(int timeout_ms) {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  t.tv_sec += timeout_ms / 1000;
  t.tv_nsec += static_cast<long>(timeout_ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec += 1;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

int64_t NowMs() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1000 + t.tv_nsec / 1000000;
}

}  // namespace

struct Job::Shared {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  char coordinator[kMaxAddress + 1];
  uint32_t failed;              // ranks of this run whose function returned non-zero
  uint32_t awaiting_report;     // the launcher waits for rank 0's report (the others unforked)
  uint32_t barrier_arrived;     // ranks at the barrier of this generation
  uint64_t barrier_generation;  // barriers passed in this run
  uint32_t used;
  struct Counter {
    char name[kMaxName + 1];
    int64_t value;
  } counters[kMaxCounters];
};

namespace {

// The shared mutex, held: a process killed while holding it (robust) leaves it to the next
// locker, which makes it consistent (the counters are single words: nothing is half-written).
class Held {
 public:
  explicit Held(pthread_mutex_t* mu) : mu_(mu) {
    const int rc = pthread_mutex_lock(mu_);
    if (rc == EOWNERDEAD) {
      pthread_mutex_consistent(mu_);
    } else if (rc != 0) {
      Die(std::string("locking the job's shared mutex: ") + std::strerror(rc));
    }
  }
  ~Held() { pthread_mutex_unlock(mu_); }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;

 private:
  pthread_mutex_t* mu_;
};

Job::Shared::Counter* Find(Job::Shared* s, const std::string& name, bool create) {
  if (name.empty() || name.size() > kMaxName) Die("counter name '" + name + "': 1 to 47 bytes");
  for (uint32_t i = 0; i < s->used; ++i) {
    if (name == s->counters[i].name) return &s->counters[i];
  }
  if (!create) return nullptr;
  if (s->used == kMaxCounters) Die("more than 256 counters in one run");
  Job::Shared::Counter* c = &s->counters[s->used++];
  std::memcpy(c->name, name.c_str(), name.size() + 1);
  c->value = 0;
  return c;
}

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

}  // namespace

AddressPipe::AddressPipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) Die(std::string("pipe: ") + std::strerror(errno));
  read_fd_ = fds[0];
  write_fd_ = fds[1];
}

AddressPipe::~AddressPipe() { Drop(); }

void AddressPipe::Give() {
  if (read_fd_ >= 0) close(read_fd_);
  read_fd_ = -1;
  setenv("CKPTDB_REPORT_FD", std::to_string(write_fd_).c_str(), 1);
}

void AddressPipe::Drop() {
  for (int* fd : {&read_fd_, &write_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

std::string AddressPipe::Read(int timeout_ms) {
  if (write_fd_ >= 0) close(write_fd_);
  write_fd_ = -1;
  std::string line;
  const int64_t end = NowMs() + timeout_ms;
  while (read_fd_ >= 0 && line.size() <= kMaxAddress) {
    const int64_t left = end - NowMs();
    if (left <= 0) {
      std::fprintf(stderr, "harness: no address reported within %d ms\n", timeout_ms);
      return "";
    }
    pollfd p{read_fd_, POLLIN, 0};
    const int n = poll(&p, 1, static_cast<int>(left));
    if (n <= 0) continue;  // EINTR, or the deadline (checked above)
    char c = 0;
    const ssize_t got = read(read_fd_, &c, 1);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return "";  // the reporter exited (or never listened) without reporting
    if (c == '\n') return line;
    line.push_back(c);
  }
  std::fprintf(stderr, "harness: a report longer than %zu bytes\n", kMaxAddress);
  return "";
}

int PortOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return 0;
  return std::atoi(address.c_str() + colon + 1);
}

int ExitCode(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
}

Job::Job(uint32_t ranks) : ranks_(ranks) {
  if (ranks == 0 || ranks > kMaxRanks) {
    Die("a job of " + std::to_string(ranks) + " ranks: 1 to " + std::to_string(kMaxRanks));
  }
  void* p =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Die(std::string("mapping the job's shared memory: ") + strerror(errno));
  shared_ = static_cast<Shared*>(p);
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&shared_->mu, &ma);
  pthread_mutexattr_destroy(&ma);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&shared_->cv, &ca);
  pthread_condattr_destroy(&ca);
  Reset();
}

Job::~Job() {
  // A caller that stopped early (a failed assertion) leaves no rank running.
  for (uint32_t r = 0; r < pids_.size(); ++r) {
    if (codes_[r] < 0) {
      Kill(r);
      Wait(r);
    }
  }
  pthread_cond_destroy(&shared_->cv);
  pthread_mutex_destroy(&shared_->mu);
  munmap(shared_, sizeof(Shared));
}

void Job::Reset() {
  Held held(&shared_->mu);
  shared_->coordinator[0] = '\0';
  shared_->failed = 0;
  shared_->awaiting_report = 0;
  shared_->barrier_arrived = 0;
  shared_->barrier_generation = 0;
  shared_->used = 0;
}

std::string Job::coordinator() const {
  Held held(&shared_->mu);
  return shared_->coordinator;
}

std::string Job::CoordinatorFor(uint32_t rank) const {
  (void)rank;  // every rank gets the reported address; before the report, only rank 0 runs
  std::string reported = coordinator();
  return reported.empty() ? host_ + ":" + std::to_string(port_) : reported;
}

void Job::Start(const std::function<int(uint32_t)>& fn, const RunOptions& options) {
  for (uint32_t r = 0; r < ranks_ && !pids_.empty(); ++r) {
    if (codes_[r] < 0) Die("Start while rank " + std::to_string(r) + " of the last run lives");
  }
  Reset();
  options_ = options;
  std::fflush(nullptr);  // nothing buffered is written twice, once by each child
  report_ = std::make_unique<AddressPipe>();
  pids_.assign(ranks_, -1);
  codes_.assign(ranks_, -1);
  auto start = [&](uint32_t rank) {
    const pid_t pid = fork();
    if (pid < 0) Die(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      if (rank == 0) {
        report_->Give();
        rank0_report_fd_ = report_->write_fd();
      } else {
        report_->Drop();
      }
      if (options.alarm_s > 0) alarm(options.alarm_s);
      const int rc = fn(rank);
      if (rc != 0) {
        Held held(&shared_->mu);
        shared_->failed++;
        pthread_cond_broadcast(&shared_->cv);
      }
      std::fflush(nullptr);
      _exit(rc);
    }
    pids_[rank] = pid;
  };
  const bool await_report = ranks_ > 1 && options.report_timeout_ms > 0;
  if (await_report) {
    Held held(&shared_->mu);
    shared_->awaiting_report = 1;
  }
  start(0);
  if (await_report) {
    const std::string address = report_->Read(options.report_timeout_ms);
    Held held(&shared_->mu);
    shared_->awaiting_report = 0;
    if (!address.empty()) {
      std::memcpy(shared_->coordinator, address.c_str(), address.size() + 1);
    }
    pthread_cond_broadcast(&shared_->cv);
  }
  // The pipe stays open until the run is reaped: a rank 0 that opens again reports into it.
  if (options.before_others) options.before_others();
  for (uint32_t r = 1; r < ranks_; ++r) start(r);
}

pid_t Job::pid(uint32_t rank) const {
  if (rank >= pids_.size()) Die("no rank " + std::to_string(rank) + " in this run");
  return pids_[rank];
}

bool Job::Exited(uint32_t rank) const {
  if (rank >= pids_.size()) Die("no rank " + std::to_string(rank) + " in this run");
  if (codes_[rank] >= 0) return true;
  siginfo_t info{};
  return waitid(P_PID, static_cast<id_t>(pids_[rank]), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
         info.si_pid == pids_[rank];
}

void Job::Kill(uint32_t rank, int sig) const {
  if (rank < pids_.size() && codes_[rank] < 0) kill(pids_[rank], sig);
}

int Job::Wait(uint32_t rank) {
  if (rank >= pids_.size()) Die("no rank " + std::to_string(rank) + " in this run");
  if (codes_[rank] < 0) {
    int status = 0;
    while (waitpid(pids_[rank], &status, 0) < 0) {
      if (errno != EINTR) Die("waitpid of rank " + std::to_string(rank) + ": " + strerror(errno));
    }
    codes_[rank] = ExitCode(status);
    Reaped();
  }
  return codes_[rank];
}

void Job::Reaped() {
  for (int code : codes_) {
    if (code < 0) return;
  }
  report_.reset();
}

std::vector<int> Job::Wait() {
  // Each child's exit, as it happens (pidfds), so that a failure can stop the others at once;
  // only this run's children are reaped (the caller's other children stay theirs to wait for).
  std::vector<int> fds(ranks_, -1);
  for (uint32_t r = 0; r < ranks_; ++r) {
    if (codes_[r] < 0) fds[r] = PidfdOpen(pids_[r]);
  }
  bool killed = false;
  for (;;) {
    std::vector<pollfd> polled;
    std::vector<uint32_t> rank_of;
    for (uint32_t r = 0; r < ranks_; ++r) {
      if (codes_[r] >= 0) continue;
      if (fds[r] < 0) {
        Wait(r);  // no pidfd (an old kernel): in turn
        continue;
      }
      polled.push_back(pollfd{fds[r], POLLIN, 0});
      rank_of.push_back(r);
    }
    if (polled.empty()) break;
    if (poll(polled.data(), polled.size(), -1) < 0 && errno != EINTR) {
      Die(std::string("poll of the ranks: ") + std::strerror(errno));
    }
    for (size_t i = 0; i < polled.size(); ++i) {
      if (polled[i].revents == 0) continue;
      const uint32_t r = rank_of[i];
      close(fds[r]);
      fds[r] = -1;
      if (Wait(r) != 0 && options_.kill_all_on_failure && !killed) {
        std::fprintf(stderr, "harness: rank %u failed (exit code %d): stopping the others\n", r,
                     codes_[r]);
        for (uint32_t o = 0; o < ranks_; ++o) Kill(o);
        killed = true;
      }
    }
  }
  return codes_;
}

std::vector<int> Job::Run(const std::function<int(uint32_t)>& fn, const RunOptions& options) {
  Start(fn, options);
  if (options.parent) options.parent();
  return Wait();
}

void Job::Add(const std::string& counter, int64_t delta) const {
  Held held(&shared_->mu);
  Find(shared_, counter, true)->value += delta;
  pthread_cond_broadcast(&shared_->cv);
}

void Job::Set(const std::string& counter, int64_t value) const {
  Held held(&shared_->mu);
  Find(shared_, counter, true)->value = value;
  pthread_cond_broadcast(&shared_->cv);
}

int64_t Job::Get(const std::string& counter) const {
  Held held(&shared_->mu);
  const Shared::Counter* c = Find(shared_, counter, false);
  return c == nullptr ? 0 : c->value;
}

// Rank 0 waits for the others while the launcher still waits for its report (it opened no job,
// or not yet): an empty line tells the launcher to start them without an address, rather than
// both waiting until the report's deadline.
void Job::ReleaseLauncherLocked() const {
  if (rank0_report_fd_ < 0 || shared_->awaiting_report == 0) return;
  while (write(rank0_report_fd_, "\n", 1) < 0 && errno == EINTR) {
  }
}

bool Job::WaitAtLeast(const std::string& counter, int64_t value, int timeout_ms) const {
  const timespec deadline = Deadline(timeout_ms < 0 ? 0 : timeout_ms);
  Held held(&shared_->mu);
  ReleaseLauncherLocked();
  for (;;) {
    const Shared::Counter* c = Find(shared_, counter, false);
    if ((c == nullptr ? 0 : c->value) >= value) return true;
    if (shared_->failed > 0) return false;
    const int rc = timeout_ms < 0 ? pthread_cond_wait(&shared_->cv, &shared_->mu)
                                  : pthread_cond_timedwait(&shared_->cv, &shared_->mu, &deadline);
    if (rc == EOWNERDEAD) {
      pthread_mutex_consistent(&shared_->mu);
    } else if (rc == ETIMEDOUT) {
      c = Find(shared_, counter, false);
      return (c == nullptr ? 0 : c->value) >= value;
    }
  }
}

bool Job::Barrier(int timeout_ms) const {
  const timespec deadline = Deadline(timeout_ms < 0 ? 0 : timeout_ms);
  Held held(&shared_->mu);
  ReleaseLauncherLocked();
  const uint64_t generation = shared_->barrier_generation;
  if (++shared_->barrier_arrived == ranks_) {
    shared_->barrier_arrived = 0;
    shared_->barrier_generation++;
    pthread_cond_broadcast(&shared_->cv);
    return true;
  }
  while (shared_->barrier_generation == generation) {
    if (shared_->failed > 0) return false;
    const int rc = timeout_ms < 0 ? pthread_cond_wait(&shared_->cv, &shared_->mu)
                                  : pthread_cond_timedwait(&shared_->cv, &shared_->mu, &deadline);
    if (rc == EOWNERDEAD) {
      pthread_mutex_consistent(&shared_->mu);
    } else if (rc == ETIMEDOUT) {
      return shared_->barrier_generation != generation;
    }
  }
  return true;
}

bool Job::Arrive(const std::string& phase, bool wait, int timeout_ms) const {
  Add(phase, 1);
  return !wait || WaitAtLeast(phase, ranks_, timeout_ms);
}

}  // namespace ckpt::harness
