// A job's ranks as processes forked from this one, the way a scheduler starts them: the one
// harness of the tests (tests/cluster_test.cc, tests/cluster_crash_states_test.cc), `ckptdb demo
// --ranks` and bench_cluster.
//
// Ports: nothing picks a port by binding it and closing it again (another process may take it
// in between). Rank 0 is given "HOST:0" as its coordinator address (CoordinatorFor) and the write
// end of a pipe as CKPTDB_REPORT_FD; ckptdb_open binds a free port there and writes the address
// down the pipe (docs/api.md). Run forks rank 0 first, reads that line, and only then forks the
// other ranks, which are given the address. A rank 0 that opens again within the run binds the
// same port again, as a restarted coordinator does. A rank 0 that waits for the others (a counter,
// the barrier) before it reported releases the launcher, which then starts them without an
// address: nothing waits for a report that cannot come before the others exist.
//
// Waits: on events, never on sleeps. The job's processes share one anonymous mapping made before
// any fork, holding named counters under a process-shared mutex and condition variable (robust:
// a rank killed holding the mutex does not wedge the others). Ranks and the parent add to them,
// set them and wait for them with a deadline; Arrive is the barrier built on them. Counters
// start at 0 in each Run.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ckpt::harness {

inline constexpr uint32_t kMaxRanks = 1024;  // a bound on forks, not a layout: nothing is per rank

struct RunOptions {
  unsigned alarm_s = 90;             // SIGALRM in each rank after this long (none outlives a test)
  bool kill_all_on_failure = false;  // a rank failing (exit != 0, a signal) kills the others
  int report_timeout_ms = 60000;     // how long rank 0 may take to report its address; 0: it
                                     // reports none (no job), every rank is forked at once
  // Rank 0 reported its address (or exited without): runs in this process before the other
  // ranks are forked (e.g. starting `ckptdb serve` daemons that need the coordinator's address).
  std::function<void()> before_others;
  // Runs in this process once every rank is forked, while they run.
  std::function<void()> parent;
};

// A pipe for one process's address report (CKPTDB_REPORT_FD: ckptdb_open or ckptdb_serve writes
// "host:port\n" once it listens): how a launcher learns a port bound as port 0. Made before the
// fork; the reporting process calls Give, every other forked process Drop, the launcher Read.
class AddressPipe {
 public:
  AddressPipe();
  ~AddressPipe();
  AddressPipe(const AddressPipe&) = delete;
  AddressPipe& operator=(const AddressPipe&) = delete;
  // In the reporting process, before it opens: CKPTDB_REPORT_FD names the write end.
  void Give();
  // In a forked process that does not report: its copies of both ends closed.
  void Drop();
  // In the launcher, after the fork: its write end closed, then the first line within
  // timeout_ms; empty when the reporter exited first or the time passed. The read end stays
  // open (a later report by the same process must not meet a closed pipe: SIGPIPE).
  std::string Read(int timeout_ms);
  int write_fd() const { return write_fd_; }

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
};

// The port of "host:port" (0 when there is none).
int PortOf(const std::string& address);

class Job {
 public:
  explicit Job(uint32_t ranks);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  uint32_t ranks() const { return ranks_; }

  struct Shared;  // the shared mapping's layout (harness/job.cc)

  // The host rank 0's coordinator listens on: 127.0.0.1 unless set (an address of its network
  // namespace; an IPv6 address in brackets).
  void set_coordinator_host(const std::string& host) { host_ = host; }
  // A port for rank 0 to bind instead of a free one (0: a free one, reported).
  void set_coordinator_port(int port) { port_ = port; }

  // The coordinator address `rank` is to open with: "HOST:0" (or the port set) for rank 0 until
  // it has reported in this run, then (for every rank) the address it reported.
  std::string CoordinatorFor(uint32_t rank) const;
  // The address rank 0 reported in the current or last run; empty when it has not.
  std::string coordinator() const;

  // Runs fn(rank) in one forked child per rank, each exiting with fn's result; rank 0 first,
  // with CKPTDB_REPORT_FD set, the others once it reported its address (or exited, or
  // report_timeout_ms passed). Returns the exit codes by rank (killed by a signal: 128 + it).
  // Start, then options.parent, then Wait().
  std::vector<int> Run(const std::function<int(uint32_t rank)>& fn, const RunOptions& options = {});

  // Run in steps, for a caller that kills ranks and waits for them itself (`ckptdb demo`): Start
  // forks as Run does and returns once every rank is forked; Wait(rank) reaps one (again: the
  // code it had); Wait() reaps the rest as Run does. A run is reaped before the next Start.
  void Start(const std::function<int(uint32_t rank)>& fn, const RunOptions& options = {});
  pid_t pid(uint32_t rank) const;
  bool Exited(uint32_t rank) const;  // it ended (not reaped here: Wait still gives its code)
  void Kill(uint32_t rank, int sig = SIGKILL) const;  // a rank not yet reaped
  int Wait(uint32_t rank);
  std::vector<int> Wait();

  // Named counters shared by the job's processes (names up to 47 bytes; at most 256 of them in
  // a run). Wait returns false when `timeout_ms` (-1: none) passed first.
  // (Const: they change the shared mapping, not this handle to it.)
  void Add(const std::string& counter, int64_t delta = 1) const;
  void Set(const std::string& counter, int64_t value) const;
  int64_t Get(const std::string& counter) const;
  // Waits end early (false) once a rank of the run returned non-zero: what they wait for may
  // never come.
  bool WaitAtLeast(const std::string& counter, int64_t value, int timeout_ms) const;

  // The calling rank arrives at `phase` (a counter); with wait, it then waits (at most
  // timeout_ms) for every rank of the job to arrive there too. False on the deadline.
  bool Arrive(const std::string& phase, bool wait, int timeout_ms = 60000) const;

  // Every rank of the run calls it; each returns once all have. False on the deadline (-1: none)
  // or a failed rank, after which the barrier is not to be used again in this run.
  bool Barrier(int timeout_ms = -1) const;

 private:
  void Reset();
  void Reaped();  // closes the report pipe once every rank is reaped
  void ReleaseLauncherLocked() const;

  const uint32_t ranks_;
  std::string host_ = "127.0.0.1";
  int port_ = 0;
  Shared* shared_ = nullptr;
  RunOptions options_;
  std::vector<pid_t> pids_;
  std::vector<int> codes_;               // -1: not reaped yet
  std::unique_ptr<AddressPipe> report_;  // rank 0's, until the run is reaped
  int rank0_report_fd_ = -1;             // in rank 0's process: the pipe's write end
};

// A child's exit code as a shell reports it: its status, or 128 + the signal that killed it.
int ExitCode(int wait_status);

}  // namespace ckpt::harness
