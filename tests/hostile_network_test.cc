// The hostile-network campaign (docs/testing.md, "The hostile-network campaign"): a job of two
// ranks (each a process) keeps committing, restoring every version it commits bit for bit, while
// this process attacks every port the job listens on: the coordinator's (rank 0's), rank 1's and
// a `ckptdb serve` daemon's, ckptdb's own sockets, the only ones each process listens on (checked
// in /proc). The attacks: the bytes that killed ranks when UCX owned the ports (16 and 4096 bytes
// of 0xff, 100,000 zero bytes), random bytes of 0 to 64 KiB, a valid frame then garbage, a frame
// announcing a body over the bound, UCX's tcp handshake, a replay of a recorded valid handshake,
// a wrong token, slow senders past the handshake's deadline, 1,000 idle connections (a
// legitimate peer still connects, and the serve daemon still joins, during the flood) and
// connect-and-close storms. The oracle: no ckptdb process dies and every version the ranks
// commit meanwhile restores bit for bit.
//
// CKPTDB_HOSTILE_CONNECTIONS sets the campaign's size (10,000 hostile connections by default;
// fewer under the sanitizers).
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "harness/job.h"
#include "test_util.h"
#include "transport/transport.h"
#include "transport/wire_format.h"
#include "util/clock.h"

namespace ckpt {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr uint64_t kDefaultConnections = 2000;
#else
constexpr uint64_t kDefaultConnections = 10000;
#endif
constexpr size_t kTensorBytes = 256 << 10;
constexpr int kIdleFlood = 1000;

// ---- The job ------------------------------------------------------------------------------

struct Ports {
  int coordinator = 0;
  int rank1 = 0;
  int serve = 0;
};

std::vector<uint8_t> TensorData(uint32_t rank, uint64_t version, int which) {
  return test::RandomBytes(kTensorBytes, (uint64_t{rank} << 40) ^ (version << 8) ^ which);
}

void JobEnvironment() {
  setenv("CKPTDB_HEARTBEAT_MS", "100", 1);
  setenv("CKPTDB_DEAD_AFTER_MS", "5000", 1);
  setenv("CKPTDB_JOIN_TIMEOUT_MS", "20000", 1);
  // UCX's own choice of transports: each process runs a UCX worker (never with tcp, which
  // ckptdb keeps from UCX), and on this machine without RDMA their messages take ckptdb's socket.
  unsetenv("CKPTDB_UCX_TLS");
  unsetenv("UCX_TLS");
}

// A rank: commits versions until the parent sets `stop` (at least 3), restoring each right after
// its commit and comparing every byte; then waits for the other rank and closes. Rank 1 listens
// on a free port and reports it down `rank1_pipe` (rank 0's is the harness's).
int RankBody(const test::TempDir& dir, const harness::Job& job, harness::AddressPipe& rank1_pipe,
             uint32_t rank) {
  JobEnvironment();
  const std::string node = dir.Sub("node" + std::to_string(rank));
  std::filesystem::create_directories(node + "/shm");
  const std::string root = node + "/root";
  const std::string tiers = "ram:16M,keep=2,dir=" + node + "/shm";
  const std::string coordinator = job.CoordinatorFor(rank);
  if (rank == 1) {
    setenv("CKPTDB_LISTEN", "127.0.0.1:0", 1);
    rank1_pipe.Give();
  } else {
    rank1_pipe.Drop();
  }
  const std::string node_id = "node" + std::to_string(rank);
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root.c_str();
  o.tiers = tiers.c_str();
  o.rank = rank;
  o.world_size = 2;
  o.node_id = node_id.c_str();
  o.coordinator = coordinator.c_str();
  o.job_token = "job-secret";
  o.redundancy = "replicate:2";
  o.staging_bytes = 4 << 20;
  o.chunk_bytes = 128 << 10;
  ckptdb* db = nullptr;
  int rc = ckptdb_open(&o, &db);
  RANK_CHECK(rc == 0, "open: %d", rc);
  job.Add("open");
  // The ranks commit in lockstep (a version commits when both voted), so they must agree on
  // the last one: when rank 0 sees `stop` it names the next version the last ("final"). Rank 1
  // cannot finish that version before rank 0 has voted for it, so it reads "final" before it
  // could start the one after.
  uint64_t v = 0;
  uint64_t final = 0;
  while (true) {
    if (final == 0 && rank == 0 && v >= 3 && job.Get("stop") > 0) {
      final = v + 1;
      job.Set("final", static_cast<int64_t>(final));
    } else if (final == 0 && job.Get("final") > 0) {
      final = static_cast<uint64_t>(job.Get("final"));
    }
    if (final != 0 && v >= final) break;
    ++v;
    for (int which = 0; which < 2; ++which) {
      auto data = TensorData(rank, v, which);
      const std::string name = "t" + std::to_string(which) + "/r" + std::to_string(rank);
      rc = ckptdb_put_shard(db, v, name.c_str(), data.data(), data.size(), nullptr,
                            CKPTDB_PUT_COPY_NOW);
      RANK_CHECK(rc == 0, "put v%llu: %d", (unsigned long long)v, rc);
    }
    rc = ckptdb_commit(db, v, 0);
    RANK_CHECK(rc == 0, "commit v%llu under attack: %d", (unsigned long long)v, rc);
    for (int which = 0; which < 2; ++which) {
      const std::string name = "t" + std::to_string(which) + "/r" + std::to_string(rank);
      std::vector<uint8_t> out(kTensorBytes, 0xee);
      rc = ckptdb_restore(db, v, name.c_str(), out.data(), out.size(), 0);
      RANK_CHECK(rc == 0, "restore v%llu: %d", (unsigned long long)v, rc);
      RANK_CHECK(out == TensorData(rank, v, which), "v%llu restored other bytes",
                 (unsigned long long)v);
    }
  }
  uint64_t latest = 0;
  rc = ckptdb_latest(db, &latest);
  RANK_CHECK(rc == 0 && latest == v, "latest v%llu, committed through v%llu",
             (unsigned long long)latest, (unsigned long long)v);
  job.Set("committed/" + std::to_string(rank), static_cast<int64_t>(v));
  // Rank 0 hosts the coordinator: it closes last.
  if (rank == 0) job.WaitAtLeast("closed/1", 1, 30000);
  ckptdb_close(db);
  job.Set("closed/" + std::to_string(rank), 1);
  return 0;
}

// The serve daemon: listens on a free port, reported down `pipe`, until SIGTERM.
int ServeBody(const test::TempDir& dir, const harness::Job& job, harness::AddressPipe& pipe) {
  JobEnvironment();
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  setenv("CKPTDB_LISTEN", "127.0.0.1:0", 1);
  pipe.Give();
  const std::string tiers = "ram:1M,dir=" + dir.Sub("node2");
  std::filesystem::create_directories(dir.Sub("node2"));
  const std::string coordinator = job.coordinator();
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.tiers = tiers.c_str();
  o.node_id = "node2";
  o.coordinator = coordinator.c_str();
  o.job_token = "job-secret";
  ckptdb_server* server = nullptr;
  if (ckptdb_serve(&o, &server) != 0) {
    std::fprintf(stderr, "serve: %s\n", ckptdb_last_error());
    return 2;
  }
  job.Set("serving", 1);
  int sig = 0;
  sigwait(&stop, &sig);
  ckptdb_serve_stop(server);
  return 0;
}

pid_t Fork(const std::function<int()>& body) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(240);  // never outlive the test
    _exit(body());
  }
  return pid;
}

// ---- Looking at the processes' sockets ----------------------------------------------------

// The TCP ports process `pid` listens on: its socket descriptors' inodes, found in
// /proc/net/tcp{,6} in state LISTEN (0A).
std::set<int> ListeningPorts(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = opendir(fds.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[128] = {};
      ssize_t n = readlink((fds + "/" + e->d_name).c_str(), target, sizeof target - 1);
      if (n > 0 && std::strncmp(target, "socket:[", 8) == 0) {
        inodes.insert(std::string(target + 8, std::strchr(target, ']') - (target + 8)));
      }
    }
    closedir(d);
  }
  std::set<int> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream in(test::ReadWholeFile(table));
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state == "0A" && inodes.count(inode)) {
        ports.insert(std::stoi(local.substr(local.rfind(':') + 1), nullptr, 16));
      }
    }
  }
  return ports;
}

// ---- Attacks --------------------------------------------------------------------------------

int Dial(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

void SendAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return;  // the listener hung up on us: that is its right
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Reads until `n` bytes, EOF or `ms`; returns what it read.
std::vector<uint8_t> ReadSome(int fd, size_t n, int ms) {
  std::vector<uint8_t> out;
  const int64_t until = MonoMs() + ms;
  while (out.size() < n) {
    pollfd p{fd, POLLIN, 0};
    int left = static_cast<int>(until - MonoMs());
    if (left <= 0 || poll(&p, 1, left) <= 0) break;
    uint8_t b[4096];
    ssize_t r = recv(fd, b, std::min(sizeof b, n - out.size()), 0);
    if (r <= 0) break;
    out.insert(out.end(), b, b + r);
  }
  return out;
}

// True once the peer closed the connection (EOF or reset) within `ms`.
bool ClosedWithin(int fd, int ms) {
  const int64_t until = MonoMs() + ms;
  while (true) {
    pollfd p{fd, POLLIN, 0};
    int left = std::max(0, static_cast<int>(until - MonoMs()));
    if (poll(&p, 1, left) <= 0) return false;
    uint8_t b[256];
    ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (r <= 0) return true;
  }
}

struct WireWriterLite {
  std::vector<uint8_t> bytes;
  void U8(uint8_t v) { bytes.push_back(v); }
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
};

struct Campaign {
  std::mt19937_64 rng{20261127};
  std::vector<uint8_t> noise = test::RandomBytes(64 << 10, 4711);
  uint64_t connections = 0;

  // Random bytes: half under 64 bytes, most under 4 KiB, some up to 64 KiB; 0 bytes too.
  void RandomBytes(int port) {
    const uint64_t pick = rng() % 100;
    const size_t n = pick < 5    ? 0
                     : pick < 50 ? rng() % 64
                     : pick < 90 ? rng() % 4096
                                 : rng() % (64 << 10) + 1;
    const size_t at = rng() % (noise.size() - n + 1);
    int fd = Dial(port);
    if (fd < 0) return;
    connections++;
    SendAll(fd, noise.data() + at, n);
    close(fd);
  }
  // A valid Hello, then garbage where the next frame should be; or a header announcing a body
  // over the bound; or a valid header and a body that does not parse.
  void ValidPrefix(int port) {
    transport::HandshakeFrame hello;
    hello.kind = transport::HandshakeKind::kHello;
    hello.name = "attacker";
    std::vector<uint8_t> bytes = transport::EncodeHandshakeFrame(hello);
    switch (rng() % 4) {
      case 0:  // Hello, then noise
        bytes.insert(bytes.end(), noise.begin(), noise.begin() + 1 + rng() % 2048);
        break;
      case 1:  // a header announcing a body of up to 4 GiB
        bytes.resize(8);
        for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(rng() >> (8 * i)));
        bytes[8 + 3] |= 0x01;  // at least 16 MiB
        break;
      case 2:  // a valid header with a body of noise
        bytes.resize(transport::kHandshakeHeaderBytes);
        bytes.insert(bytes.end(), noise.begin(), noise.begin() + (bytes[8] | bytes[9] << 8));
        break;
      default:  // a prefix of a Hello: the deadline closes it
        bytes.resize(1 + rng() % (bytes.size() - 1));
        break;
    }
    int fd = Dial(port);
    if (fd < 0) return;
    connections++;
    SendAll(fd, bytes.data(), bytes.size());
    close(fd);
  }
  // For UCX's tcp interface ports: its connection's 8-byte magic number (UCT_TCP_MAGIC_NUMBER in
  // UCX 1.13), then a connection packet or active message of UCX's tcp framing (a 1-byte id and a
  // 4-byte length) that is malformed, or noise.
  void UcxPrefix(int port) {
    WireWriterLite w;
    w.U64(0xCAFEBABE12345678ull);
    switch (rng() % 4) {
      case 0:  // a connection request of the wrong length
        w.U8(64);
        w.U32(1 + rng() % 8);
        w.U8(1);
        break;
      case 1:  // a connection packet announcing up to 4 GiB
        w.U8(64);
        w.U32(static_cast<uint32_t>(rng()));
        break;
      case 2:  // an active message of any id and length
        w.U8(static_cast<uint8_t>(rng()));
        w.U32(static_cast<uint32_t>(rng() % 256));
        break;
      default:
        break;
    }
    std::vector<uint8_t> bytes = w.bytes;
    bytes.insert(bytes.end(), noise.begin(), noise.begin() + rng() % 512);
    int fd = Dial(port);
    if (fd < 0) return;
    connections++;
    SendAll(fd, bytes.data(), bytes.size());
    close(fd);
  }
  // A recorded handshake sent again: its Proof answers another server nonce, so it is refused.
  // Returns whether the listener answered Refused.
  bool Replay(int port, const std::vector<uint8_t>& hello, const std::vector<uint8_t>& proof) {
    int fd = Dial(port);
    if (fd < 0) return false;
    connections++;
    SendAll(fd, hello.data(), hello.size());
    std::vector<uint8_t> challenge = ReadSome(fd, transport::kHandshakeHeaderBytes, 2000);
    bool refused = false;
    if (challenge.size() == transport::kHandshakeHeaderBytes) {
      transport::HandshakeKind kind;
      uint32_t body = 0;
      if (transport::DecodeHandshakeHeader(challenge, "challenge", &kind, &body).ok()) {
        ReadSome(fd, body, 2000);
        SendAll(fd, proof.data(), proof.size());
        std::vector<uint8_t> answer = ReadSome(fd, transport::kHandshakeHeaderBytes, 2000);
        refused = answer.size() == transport::kHandshakeHeaderBytes &&
                  transport::DecodeHandshakeHeader(answer, "answer", &kind, &body).ok() &&
                  kind == transport::HandshakeKind::kRefused;
      }
    }
    close(fd);
    return refused;
  }
  void Storm(int port) {
    int fd = Dial(port);
    if (fd < 0) return;
    connections++;
    if (rng() % 2 == 0) {
      linger l{1, 0};  // close with a reset
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    close(fd);
  }
};

// A relay on a free port in front of `port`: records what the client sends (its Hello and its
// Proof) while a legitimate handshake goes through.
struct Recorder {
  std::vector<uint8_t> client_bytes;
  int listen_fd = -1;
  int port = 0;
  std::thread thread;
  explicit Recorder(int target) {
    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    bind(listen_fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    listen(listen_fd, 1);
    getsockname(listen_fd, reinterpret_cast<sockaddr*>(&sa), &len);
    port = ntohs(sa.sin_port);
    thread = std::thread([this, target] {
      int client = accept(listen_fd, nullptr, nullptr);
      int server = Dial(target);
      if (client < 0 || server < 0) return;
      const int64_t until = MonoMs() + 5000;
      while (MonoMs() < until) {
        pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
        if (poll(p, 2, 100) <= 0) continue;
        uint8_t b[16384];
        if (p[0].revents) {
          ssize_t r = recv(client, b, sizeof b, 0);
          if (r <= 0) break;
          client_bytes.insert(client_bytes.end(), b, b + r);
          SendAll(server, b, r);
        }
        if (p[1].revents) {
          ssize_t r = recv(server, b, sizeof b, 0);
          if (r <= 0) break;
          SendAll(client, b, r);
        }
      }
      close(client);
      close(server);
    });
  }
  ~Recorder() {
    if (thread.joinable()) thread.join();
    close(listen_fd);
  }
};

std::unique_ptr<transport::Transport> Peer(const std::string& token) {
  transport::TransportOptions o;
  o.name = "test peer";
  o.job_token = token;
  o.tls = "tcp";
  std::unique_ptr<transport::Transport> t;
  Status st = transport::Transport::Start(
      o, [](const transport::Request&, transport::Reply*) {}, &t);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return t;
}

TEST(HostileNetworkTest, NoAttackKillsAProcessOrLosesACommittedVersion) {
  // The idle flood holds 1,000 descriptors here.
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = std::max<rlim_t>(nofile.rlim_cur, std::min<rlim_t>(nofile.rlim_max, 8192));
  setrlimit(RLIMIT_NOFILE, &nofile);
  ASSERT_GE(nofile.rlim_cur, rlim_t{kIdleFlood + 100});

  test::TempDir dir("/dev/shm");
  // Every process listens on a free port it binds and reports (harness/job.h).
  harness::Job job(2);
  harness::AddressPipe rank1_pipe;
  harness::RunOptions run;
  run.alarm_s = 240;  // never outlive the test
  job.Start([&](uint32_t rank) { return RankBody(dir, job, rank1_pipe, rank); }, run);
  Ports ports;
  ports.coordinator = harness::PortOf(job.coordinator());
  ports.rank1 = harness::PortOf(rank1_pipe.Read(30000));
  ASSERT_TRUE(ports.coordinator > 0 && ports.rank1 > 0);
  std::map<std::string, pid_t> procs;
  procs["rank 0"] = job.pid(0);
  procs["rank 1"] = job.pid(1);
  ASSERT_TRUE(job.WaitAtLeast("open", 2, 30000)) << "the ranks did not open";

  Campaign campaign;
  const uint64_t budget = test::EnvCount("CKPTDB_HOSTILE_CONNECTIONS", kDefaultConnections);
  const int64_t started = MonoMs();

  // 1. The idle flood on the coordinator: beyond kMaxPendingHandshakes the oldest are closed; a
  //    legitimate peer connects and the serve daemon joins while the flood holds.
  std::vector<int> idle;
  for (int i = 0; i < kIdleFlood; ++i) {
    int fd = Dial(ports.coordinator);
    if (fd >= 0) idle.push_back(fd);
  }
  campaign.connections += idle.size();
  EXPECT_EQ(idle.size(), size_t{kIdleFlood});
  {
    auto peer = Peer("job-secret");
    transport::PeerId id = 0;
    Status st = peer->Connect("127.0.0.1:" + std::to_string(ports.coordinator), 10000, &id);
    EXPECT_TRUE(st.ok()) << "a legitimate peer during the idle flood: " << st.ToString();
  }
  harness::AddressPipe serve_pipe;
  procs["serve"] = Fork([&] { return ServeBody(dir, job, serve_pipe); });
  ports.serve = harness::PortOf(serve_pipe.Read(30000));
  ASSERT_GT(ports.serve, 0) << "the serve daemon did not listen in the flood";
  EXPECT_TRUE(job.WaitAtLeast("serving", 1, 30000)) << "the serve daemon did not join in the flood";
  size_t closed = 0;
  for (int fd : idle) closed += ClosedWithin(fd, 0) ? 1 : 0;
  // Every idle connection but the newest kMaxPendingHandshakes (less those the legitimate
  // connections evicted) was closed by the coordinator.
  EXPECT_GE(closed, idle.size() - transport::kMaxPendingHandshakes);
  for (int fd : idle) close(fd);
  std::printf("idle flood: %zu connections, %zu closed by the coordinator at once\n", idle.size(),
              closed);

  transport::HandshakeFrame slow_frame;
  slow_frame.kind = transport::HandshakeKind::kHello;
  slow_frame.name = "slow sender";
  const std::vector<uint8_t> slow_hello = transport::EncodeHandshakeFrame(slow_frame);
  // Slow senders, one byte of a Hello every 500 ms: closed at the handshake's deadline. They
  // run while the replays and wrong tokens below go on, and are done before the bulk, whose
  // strangers would evict them from the table of pending connections first.
  std::vector<int> slow;
  for (int port : {ports.coordinator, ports.rank1, ports.serve}) slow.push_back(Dial(port));
  campaign.connections += slow.size();
  std::atomic<bool> slow_done{false};
  std::vector<int64_t> slow_closed_ms(slow.size(), 0);
  std::thread slow_thread([&] {
    const int64_t t0 = MonoMs();
    for (int tick = 0; tick < 30 && !slow_done; ++tick) {
      if (std::count(slow_closed_ms.begin(), slow_closed_ms.end(), 0) == 0) break;
      for (size_t i = 0; i < slow.size(); ++i) {
        if (slow_closed_ms[i] != 0) continue;
        uint8_t b = slow_hello[tick % slow_hello.size()];
        if (send(slow[i], &b, 1, MSG_NOSIGNAL) != 1 || ClosedWithin(slow[i], 0)) {
          slow_closed_ms[i] = MonoMs() - t0;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });

  // 2. Every port each process listens on: ckptdb's own (it answers a Hello with a Challenge),
  //    and nothing else (UCX opens no listener: ckptdb creates no ucp_listener, and UCX is never
  //    given its tcp transport, whose interface listeners a crafted packet crashes).
  std::map<std::string, int> own = {
      {"rank 0", ports.coordinator}, {"rank 1", ports.rank1}, {"serve", ports.serve}};
  std::vector<std::pair<std::string, int>> targets;
  for (const auto& [name, pid] : procs) {
    std::set<int> listening = ListeningPorts(pid);
    EXPECT_EQ(listening, std::set<int>{own[name]}) << name << " listens on other ports";
    for (int port : listening) {
      const bool mine = port == own[name];
      targets.push_back({name, port});
      std::printf("%s listens on %d (%s)\n", name.c_str(), port, mine ? "ckptdb" : "another");
    }
    // ckptdb's port speaks ckptdb's handshake (no UCX connection manager behind it).
    int fd = Dial(own[name]);
    transport::HandshakeFrame hello;
    hello.kind = transport::HandshakeKind::kHello;
    hello.name = "probe";
    auto bytes = transport::EncodeHandshakeFrame(hello);
    SendAll(fd, bytes.data(), bytes.size());
    auto answer = ReadSome(fd, transport::kHandshakeHeaderBytes, 5000);
    transport::HandshakeKind kind{};
    uint32_t body = 0;
    EXPECT_TRUE(answer.size() == transport::kHandshakeHeaderBytes &&
                transport::DecodeHandshakeHeader(answer, "answer", &kind, &body).ok() &&
                kind == transport::HandshakeKind::kChallenge)
        << name << "'s port did not answer a Hello with a Challenge";
    close(fd);
  }

  // The attacks that killed ranks and the serve daemon when UCX owned the port (issue 21).
  for (int port : {ports.coordinator, ports.rank1, ports.serve}) {
    for (auto [byte, n] : {std::pair<uint8_t, size_t>{0xff, 16}, {0xff, 4096}, {0x00, 100000}}) {
      std::vector<uint8_t> bytes(n, byte);
      int fd = Dial(port);
      ASSERT_GE(fd, 0);
      campaign.connections++;
      SendAll(fd, bytes.data(), bytes.size());
      EXPECT_TRUE(ClosedWithin(fd, 5000)) << n << " bytes of " << int(byte) << " were not refused";
      close(fd);
    }
  }

  // 3. A recorded valid handshake (through a relay), then replayed to every ckptdb port.
  std::vector<uint8_t> rec_hello, rec_proof;
  {
    Recorder recorder(ports.rank1);
    auto peer = Peer("job-secret");
    transport::PeerId id = 0;
    Status st = peer->Connect("127.0.0.1:" + std::to_string(recorder.port), 10000, &id);
    ASSERT_TRUE(st.ok()) << "the recorded handshake: " << st.ToString();
    peer.reset();
    recorder.thread.join();
    const auto& b = recorder.client_bytes;
    ASSERT_GT(b.size(), transport::kHandshakeHeaderBytes);
    const size_t hello_bytes = transport::kHandshakeHeaderBytes + (b[8] | b[9] << 8);
    ASSERT_LT(hello_bytes, b.size());
    rec_hello.assign(b.begin(), b.begin() + hello_bytes);
    rec_proof.assign(b.begin() + hello_bytes, b.end());
  }
  int replays_refused = 0;
  for (int port : {ports.coordinator, ports.rank1, ports.serve}) {
    for (int i = 0; i < 20; ++i) replays_refused += campaign.Replay(port, rec_hello, rec_proof);
  }
  EXPECT_EQ(replays_refused, 60) << "a replayed handshake was not refused";

  // 4. A wrong token, from a real transport.
  for (int port : {ports.coordinator, ports.rank1, ports.serve}) {
    auto intruder = Peer("not-the-token");
    transport::PeerId id = 0;
    Status st = intruder->Connect("127.0.0.1:" + std::to_string(port), 10000, &id);
    EXPECT_EQ(st.code(), CKPTDB_EAUTH) << st.ToString();
    campaign.connections++;
  }

  slow_thread.join();
  for (size_t i = 0; i < slow.size(); ++i) {
    EXPECT_GE(slow_closed_ms[i], transport::kDefaultHandshakeTimeoutMs - 600)
        << "slow sender " << i << " closed before the deadline";
    EXPECT_LE(slow_closed_ms[i], transport::kDefaultHandshakeTimeoutMs + 1500)
        << "slow sender " << i << " not closed at the deadline";
    close(slow[i]);
  }

  // 5. The bulk: random bytes, valid prefixes, UCX's tcp handshake and storms on every port,
  //    round robin.
  uint64_t round = 0;
  while (campaign.connections < budget) {
    const int port = targets[round % targets.size()].second;
    const uint64_t pick = round / targets.size() % 10;
    if (pick < 5) {
      campaign.RandomBytes(port);
    } else if (pick < 7) {
      campaign.ValidPrefix(port);
    } else if (pick < 8) {
      campaign.UcxPrefix(port);  // another protocol's handshake
    } else {
      campaign.Storm(port);
    }
    round++;
  }
  const int64_t attack_ms = MonoMs() - started;
  std::printf("campaign: %llu hostile connections on %zu ports in %lld ms\n",
              (unsigned long long)campaign.connections, targets.size(), (long long)attack_ms);

  // Every process is alive; the ranks finish their commits and close.
  for (uint32_t r = 0; r < 2; ++r)
    EXPECT_FALSE(job.Exited(r)) << "rank " << r << " died under attack";
  EXPECT_EQ(waitpid(procs["serve"], nullptr, WNOHANG), 0) << "serve died under attack";
  job.Set("stop", 1);
  const std::vector<int> codes = job.Wait();
  for (uint32_t r = 0; r < 2; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " failed";
  kill(procs["serve"], SIGTERM);
  int status = 0;
  waitpid(procs["serve"], &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "serve: status " << status;
  for (uint32_t r = 0; r < 2; ++r) {
    const int64_t committed = job.Get("committed/" + std::to_string(r));
    EXPECT_GE(committed, 3) << "rank " << r;
    std::printf("rank %u committed and restored %lld versions under attack\n", r,
                static_cast<long long>(committed));
  }
}

}  // namespace
}  // namespace ckpt
