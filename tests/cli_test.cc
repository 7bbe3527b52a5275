// The ckptdb command as a user runs it: inspect (text and JSON), verify (clean, then a flipped
// byte named exactly), restore (bit-exact files, hostile tensor names kept inside --out, nothing
// overwritten or followed), --help on every subcommand, and the exit codes of docs/cli.md.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "ckptdb/ckptdb.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using test::RandomBytes;
using test::ReadWholeFile;
using test::RunCommand;
using test::TempDir;

constexpr uint64_t kChunkBytes = 64 << 10;

// Single-quotes `s` for /bin/sh.
std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct Result {
  int code = -1;
  std::string output;
};

// Runs the ckptdb command with `args` (already quoted); stdout and stderr together.
Result Cli(const std::string& args) {
  Result r;
  r.code = RunCommand(std::string(CKPTDB_CLI) + " " + args, &r.output);
  return r;
}

struct Shard {
  std::string name;
  std::vector<uint8_t> data;
  int dtype = CKPTDB_DTYPE_UNKNOWN;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = mem_.Sub("store");
    t1_ = mem_.Sub("tmpfs-tier");
    t2_ = disk_.Sub("disk-tier");
    tiers_ = "tmpfs:" + t1_ + ";disk:" + t2_;
    // Version 5: two ordinary tensors. Version 9: names chosen to escape a naive restore.
    v5_ = {{"model.weight", RandomBytes(3 * kChunkBytes + 100, 1), CKPTDB_DTYPE_U8},
           {"opt.step", RandomBytes(8, 2), CKPTDB_DTYPE_I64}};
    v9_ = v5_;
    for (const char* hostile : {"../../escape", "/etc/passwd-abs", "a/b/c", "..", ".",
                                "sp ace%and\xc3\xbc", "index.json"}) {
      v9_.push_back({hostile, RandomBytes(100 + v9_.size(), v9_.size())});
    }
    v9_.push_back({std::string(400, 'x') + "/long", RandomBytes(50, 77)});
    v9_.push_back({std::string(400, 'x') + "/lonG", RandomBytes(60, 78)});
    Write(5, v5_);
    Write(9, v9_);
  }

  void Write(uint64_t version, const std::vector<Shard>& shards) {
    ckptdb_options o;
    ckptdb_options_init(&o);
    o.root = root_.c_str();
    o.tiers = tiers_.c_str();
    o.chunk_bytes = kChunkBytes;
    o.staging_bytes = 1 << 20;
    ckptdb* db = nullptr;
    ASSERT_EQ(ckptdb_open(&o, &db), CKPTDB_OK) << ckptdb_last_error();
    for (const Shard& s : shards) {
      ckptdb_tensor_info info{};
      info.dtype = s.dtype;
      info.ndim = 1;
      info.shape[0] = s.data.size() / ckptdb_dtype_bytes(s.dtype);
      ASSERT_EQ(
          ckptdb_put_shard(db, version, s.name.c_str(), s.data.data(), s.data.size(), &info, 0),
          CKPTDB_OK)
          << ckptdb_last_error();
    }
    ASSERT_EQ(ckptdb_commit(db, version, 0), CKPTDB_OK) << ckptdb_last_error();
    ASSERT_EQ(ckptdb_close(db), CKPTDB_OK);
  }

  nlohmann::json InspectJson(const std::string& extra) {
    Result r = Cli("inspect " + Quote(root_) + " --json " + extra);
    EXPECT_EQ(r.code, 0) << r.output;
    return nlohmann::json::parse(r.output);
  }

  std::string Segment(const std::string& dir, uint64_t version) {
    char name[64];
    std::snprintf(name, sizeof name, "/v%020llu-r00000.seg",
                  static_cast<unsigned long long>(version));
    return dir + name;
  }

  TempDir mem_{"/dev/shm"};
  TempDir disk_{"/var/tmp"};
  std::string root_, t1_, t2_, tiers_;
  std::vector<Shard> v5_, v9_;
};

TEST_F(CliTest, HelpOnEverySubcommandExitsZero) {
  for (const char* args :
       {"--help", "inspect --help", "verify --help", "restore --help", "demo --help"}) {
    Result r = Cli(args);
    EXPECT_EQ(r.code, 0) << args << ": " << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << args << ": " << r.output;
  }
}

TEST_F(CliTest, BadUsageExitsTwoAndNamesTheProblem) {
  EXPECT_EQ(Cli("").code, 2);
  EXPECT_EQ(Cli("frobnicate").code, 2);
  EXPECT_EQ(Cli("inspect").code, 2);
  EXPECT_EQ(Cli("inspect " + Quote(root_) + " --no-such-flag").code, 2);
  EXPECT_EQ(Cli("restore " + Quote(root_)).code, 2);  // --out is required
  Result r = Cli("inspect " + Quote(root_) + " --version 12abc");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("12abc"), std::string::npos) << r.output;
  r = Cli("verify " + Quote(root_) + " --version 18446744073709551616");
  EXPECT_EQ(r.code, 2) << r.output;
}

TEST_F(CliTest, MissingStoreExitsTwoAndCreatesNothing) {
  std::string missing = mem_.Sub("no-store-here");
  for (const char* cmd : {"inspect", "verify"}) {
    Result r = Cli(std::string(cmd) + " " + Quote(missing));
    EXPECT_EQ(r.code, 2) << cmd << ": " << r.output;
    EXPECT_NE(r.output.find(missing), std::string::npos) << r.output;
  }
  Result r = Cli("restore " + Quote(missing) + " --out " + Quote(mem_.Sub("out")));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_FALSE(fs::exists(missing));
  EXPECT_FALSE(fs::exists(mem_.Sub("out")));
}

TEST_F(CliTest, InspectTextListsVersionsTiersAndTensors) {
  Result r = Cli("inspect " + Quote(root_));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 version(s), 2 committed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tmpfs:" + t1_), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("disk:" + t2_), std::string::npos) << r.output;
  r = Cli("inspect " + Quote(root_) + " --version 5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("model.weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("opt.step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("i64"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(Segment(t1_, 5)), std::string::npos) << r.output;
  r = Cli("inspect " + Quote(root_) + " --version 6");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("no version 6"), std::string::npos) << r.output;
}

TEST_F(CliTest, InspectJsonIsTheDocumentedSchema) {
  nlohmann::json j = InspectJson("--chunks");
  EXPECT_EQ(j["format"], "ckptdb-inspect");
  EXPECT_EQ(j["format_version"], 1);
  ASSERT_EQ(j["versions"].size(), 2u);
  const nlohmann::json& v5 = j["versions"][0];
  EXPECT_EQ(v5["version"], 5);
  EXPECT_EQ(v5["state"], "COMMITTED");
  EXPECT_EQ(v5["rank"], 0);
  EXPECT_EQ(v5["tensor_count"], 2);
  EXPECT_EQ(v5["data_bytes"], v5_[0].data.size() + v5_[1].data.size());
  EXPECT_GT(v5["committed_unix_ns"].get<uint64_t>(), 0u);
  ASSERT_EQ(v5["residency"].size(), 2u);
  std::set<std::string> tiers;
  for (const auto& res : v5["residency"]) {
    tiers.insert(res["tier"]);
    EXPECT_EQ(res["state"], "DURABLE");
    EXPECT_EQ(res["configured"], true);
    EXPECT_TRUE(fs::exists(res["path"].get<std::string>()));
  }
  EXPECT_EQ(tiers, (std::set<std::string>{"tmpfs:" + t1_, "disk:" + t2_}));
  ASSERT_EQ(v5["tensors"].size(), 2u);
  const nlohmann::json& w = v5["tensors"][0];
  EXPECT_EQ(w["name"], "model.weight");
  EXPECT_EQ(w["dtype"], "u8");
  EXPECT_EQ(w["shape"], nlohmann::json::array({v5_[0].data.size()}));
  EXPECT_EQ(w["bytes"], v5_[0].data.size());
  EXPECT_EQ(w["chunk_count"], 4);
  ASSERT_EQ(w["chunks"].size(), 4u);
  uint64_t sum = 0;
  for (const auto& c : w["chunks"]) {
    sum += c["payload_bytes"].get<uint64_t>();
    EXPECT_EQ(c["payload_offset"].get<uint64_t>(), c["record_offset"].get<uint64_t>() + 4096);
    EXPECT_EQ(c["xxh3"].get<std::string>().rfind("0x", 0), 0u);
    EXPECT_EQ(c["xxh3"].get<std::string>().size(), 18u);
  }
  EXPECT_EQ(sum, v5_[0].data.size());
  // Without --chunks there are no chunk entries; the schema is otherwise the same.
  nlohmann::json plain = InspectJson("--version 9");
  ASSERT_EQ(plain["versions"].size(), 1u);
  EXPECT_EQ(plain["versions"][0]["tensors"].size(), v9_.size());
  EXPECT_FALSE(plain["versions"][0]["tensors"][0].contains("chunks"));
}

TEST_F(CliTest, VerifyIsCleanThenNamesAFlippedByte) {
  Result r = Cli("verify " + Quote(root_));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("verified 4 segment(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("clean"), std::string::npos) << r.output;

  // Flip one byte inside chunk 2 of model.weight on the tmpfs tier.
  nlohmann::json j = InspectJson("--version 5 --chunks");
  const nlohmann::json& chunk = j["versions"][0]["tensors"][0]["chunks"][2];
  uint64_t record = chunk["record_offset"];
  std::string expected = chunk["xxh3"];
  test::FlipByte(Segment(t1_, 5), chunk["payload_offset"].get<uint64_t>() + 77, 0x40);

  r = Cli("verify " + Quote(root_));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("tier tmpfs:" + t1_), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(Segment(t1_, 5)), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("chunk 2 at offset " + std::to_string(record)), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("expected " + expected), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 problem(s)"), std::string::npos) << r.output;
  // The disk tier's copy is still clean, and so is version 9.
  EXPECT_EQ(Cli("verify " + Quote(root_) + " --tier " + Quote("disk:" + t2_)).code, 0);
  EXPECT_EQ(Cli("verify " + Quote(root_) + " --version 9").code, 0);
  r = Cli("verify " + Quote(root_) + " --tier " + Quote("nfs:/nowhere"));
  EXPECT_EQ(r.code, 2) << r.output;
}

// `ckptdb demo --protection aec`: four ranks holding the same state in one replica group (REFT's
// AEC), node 3 lost; every rank restores bit for bit, slice 3 decoded from the others' parity
// units (aec:rankN); inspect shows what a member keeps. Bad combinations exit 2, naming why.
// Names are anyone's bytes: inspect shows them escaped (no control byte reaches the terminal, no
// name forges a row, no bidirectional override reorders a line), each at most 200 bytes, and
// an error that names one quotes it the same way.
TEST_F(CliTest, InspectAndErrorsShowHostileNamesEscapedAndBounded) {
  const std::vector<Shard> hostile = {{"\x1b[2J\x1b[31mred", RandomBytes(10, 1)},
                                      {"x\n        7  COMMITTED     0  forged", RandomBytes(11, 2)},
                                      {"\xe2\x80\xae"
                                       "fdp.exe",
                                       RandomBytes(12, 3)},
                                      {"bad\xff\xfeutf8", RandomBytes(13, 4)},
                                      {std::string(1000, 'n') + "\x07", RandomBytes(14, 5)}};
  Write(11, hostile);
  Result r = Cli("inspect " + Quote(root_) + " --version 11");
  ASSERT_EQ(r.code, 0) << r.output;
  auto check_safe = [](const std::string& out) {
    for (char c : out) {
      const auto b = static_cast<unsigned char>(c);
      EXPECT_FALSE((b < 0x20 && c != '\n') || b == 0x7f) << "byte " << int(b) << " in\n" << out;
    }
    EXPECT_EQ(out.find("\xe2\x80\xae"), std::string::npos) << out;
    EXPECT_EQ(out.find('\xff'), std::string::npos) << out;
  };
  check_safe(r.output);
  EXPECT_NE(r.output.find("\\x1b[2J\\x1b[31mred"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("x\\x0a        7  COMMITTED"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\n        7  COMMITTED"), std::string::npos) << "a forged row";
  EXPECT_NE(r.output.find("\\u{202E}fdp.exe"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bad\\xff\\xfeutf8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("... (1001 bytes)"), std::string::npos) << r.output;
  for (size_t at = 0, next; at < r.output.size(); at = next + 1) {
    next = r.output.find('\n', at);
    if (next == std::string::npos) next = r.output.size();
    EXPECT_LE(next - at, 400u) << r.output.substr(at, next - at);
  }
  // An error naming a name it was given: escaped, and short although the name is 5,000 bytes.
  r = Cli("restore " + Quote(root_) + " --version 11 --name " +
          Quote(std::string(5000, 'q') + "\x1b[2J") + " --out " + Quote(mem_.Sub("out")));
  EXPECT_EQ(r.code, 2) << r.output;
  check_safe(r.output);
  EXPECT_LT(r.output.size(), 600u) << r.output;
  EXPECT_NE(r.output.find("has no tensor named 'qqq"), std::string::npos) << r.output;
}

// A broken header or footer is one problem, said once (the framing scan that follows a failed
// open meets it again and used to say it again).
TEST_F(CliTest, VerifySaysABrokenHeaderOrFooterOnce) {
  const std::string seg = Segment(t1_, 5);
  const std::string original = ReadWholeFile(seg);
  for (const uint64_t offset : {uint64_t{20}, original.size() - 30}) {
    std::string damaged = original;
    damaged[offset] = static_cast<char>(damaged[offset] ^ 0x5a);
    test::WriteWholeFile(seg, damaged);
    Result r = Cli("verify " + Quote(root_) + " --version 5 --tier " + Quote("tmpfs:" + t1_));
    EXPECT_EQ(r.code, 1) << r.output;
    size_t lines = 0;
    for (size_t at = r.output.find("PROBLEM"); at != std::string::npos;
         at = r.output.find("PROBLEM", at + 1)) {
      ++lines;
    }
    EXPECT_EQ(lines, 1u) << "offset " << offset << ":\n" << r.output;
    EXPECT_NE(r.output.find(": 1 problem(s)"), std::string::npos) << r.output;
  }
  test::WriteWholeFile(seg, original);
}

// The many-rank demo ends with what ckptdb saved the trainer against the same state saved with
// write + fsync in the same run, the run's figures in ROOT/run.json, and ROOT/run.png when
// Debian's matplotlib is installed (said when it is not).
TEST_F(CliTest, DemoComparesWithASynchronousSaveAndWritesItsRun) {
  TempDir demo("/dev/shm");
  const std::string root = demo.Sub("job");
  Result r = Cli("demo --mib-per-rank 4 --iterations 4 --compute-ms 50 --root " + Quote(root) +
                 " --ram-dir " + Quote(demo.Sub("ram")));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("== what ckptdb saved the trainer, in this run =="), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("trainer blocked per checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("lost: it was on that node's disk"), std::string::npos) << r.output;
  const nlohmann::json run = nlohmann::json::parse(ReadWholeFile(root + "/run.json"));
  ASSERT_EQ(run["ranks"].size(), 4u);
  for (const auto& rank : run["ranks"]) {
    EXPECT_EQ(rank["blocked_ms"].size(), 4u) << rank;
    EXPECT_EQ(rank["sync_ms"].size(), 3u) << rank;
    for (const auto& ms : rank["sync_ms"]) EXPECT_GT(ms.get<double>(), 0.0) << rank;
    EXPECT_GT(rank["restore_ms"].get<double>(), 0.0) << rank;
    // The lost node's synchronous save went with its disk; the others read theirs back.
    EXPECT_EQ(rank["sync_read_ms"].get<double>() < 0, rank["lost"].get<bool>()) << rank;
  }
  const bool matplotlib = std::system("/usr/bin/python3 -c 'import matplotlib' 2>/dev/null") == 0;
  EXPECT_EQ(fs::exists(root + "/run.png"), matplotlib) << r.output;
  if (!matplotlib) EXPECT_NE(r.output.find("no plot"), std::string::npos) << r.output;
}

TEST_F(CliTest, DemoWithAecRestoresTheLostNodeFromParity) {
  TempDir demo("/dev/shm");
  const std::string root = demo.Sub("job");
  const std::string ram = demo.Sub("ram");
  Result r = Cli("demo --protection aec --mib-per-rank 8 --iterations 3 --compute-ms 50 --root " +
                 Quote(root) + " --ram-dir " + Quote(ram));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("protection aec"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("aec:rank"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(" NO\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ok: every rank restored v3 bit for bit"), std::string::npos) << r.output;
  r = Cli("inspect " + Quote(root + "/node0/rank0") + " --version 3");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("of AEC parity of the others' slices"), std::string::npos) << r.output;
  r = Cli("inspect " + Quote(root + "/node0/rank0") + " --version 3 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  uint64_t parity = 0;
  for (const auto& t : j["versions"][0]["tensors"]) parity += t["parity_bytes"].get<uint64_t>();
  EXPECT_GT(parity, 0u) << r.output;

  r = Cli("demo --protection aec --ranks 4 --nodes 2 --root " + Quote(root) + " --ram-dir " +
          Quote(ram));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("one rank per node"), std::string::npos) << r.output;
  r = Cli("demo --protection aec --ranks 2 --nodes 2 --root " + Quote(root) + " --ram-dir " +
          Quote(ram));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("3 or more of them with AEC"), std::string::npos) << r.output;
  r = Cli("demo --protection xor --root " + Quote(root));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--protection"), std::string::npos) << r.output;
}

// demo --protection aor (REFT's AOR with ARC): the lost node's rank restores its own optimizer
// moments from the recomputed replicas the rank before it kept ("aor:rank2"), bit for bit; that
// rank's segment lists them under the reserved prefix and verifies clean.
TEST_F(CliTest, DemoWithAorRestoresTheLostNodesMomentsFromTheRankBefore) {
  TempDir demo("/dev/shm");
  const std::string root = demo.Sub("job");
  const std::string ram = demo.Sub("ram");
  Result r = Cli("demo --protection aor --mib-per-rank 4 --iterations 3 --compute-ms 50 --root " +
                 Quote(root) + " --ram-dir " + Quote(ram));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--reft aor --private 3.98"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("aor:rank2"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(" NO\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ok: every rank restored v3 bit for bit"), std::string::npos) << r.output;
  r = Cli("inspect " + Quote(root + "/node2/rank2") + " --version 3");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("@aor:optimizer.exp_avg.layers.0.mlp.w.shard3"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("a recomputed replica (REFT's AOR) of the next member's private shard "
                          "'optimizer.exp_avg.layers.0.mlp.w.shard3'"),
            std::string::npos)
      << r.output;
  r = Cli("verify " + Quote(root + "/node2/rank2"));
  EXPECT_EQ(r.code, 0) << r.output;
  r = Cli("demo --protection aec+aor --ranks 2 --nodes 2 --root " + Quote(root) + " --ram-dir " +
          Quote(ram));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("3 or more of them with AEC"), std::string::npos) << r.output;
}

// verify of a coding group's roots, as a user runs it after `ckptdb demo --redundancy xor:3`
// (four ranks on four simulated nodes, node 3 lost and rebuilt): the group's parity recomputed
// and its spare counted; a flipped byte in a parity block is a problem (exit 1); one root says
// that parity was not checked, and inspect names the group.
TEST_F(CliTest, VerifyOfACodingGroupsRootsChecksItsParity) {
  TempDir demo("/dev/shm");
  const std::string root = demo.Sub("job");
  const std::string ram = demo.Sub("ram");
  Result r = Cli("demo --redundancy xor:3 --mib-per-rank 2 --iterations 3 --compute-ms 50 --root " +
                 Quote(root) + " --ram-dir " + Quote(ram));
  ASSERT_EQ(r.code, 0) << r.output;
  std::string roots;
  for (int i = 0; i < 4; ++i) {
    roots += " " + Quote(root + "/node" + std::to_string(i) + "/rank" + std::to_string(i));
  }
  r = Cli("verify -q --version 3" + roots);
  EXPECT_EQ(r.code, 0) << r.output;
  // Node 3 was lost and rejoined empty: its rank restores by a rebuild and holds no parity, and
  // xor:3 has no loss to spare then.
  EXPECT_NE(r.output.find("group 0 of version 3 (xor:3, ranks 0 1 2 3)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("recoverable from memory, 0 more node loss(es) to spare"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank 3: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restores from rebuild; its parity missing"), std::string::npos)
      << r.output;

  r = Cli("verify -q " + Quote(root + "/node0/rank0"));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("coding groups: parity not checked for"), std::string::npos) << r.output;
  // inspect names the group a version's segment belongs to, in text and JSON.
  r = Cli("inspect " + Quote(root + "/node0/rank0") + " --version 3");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("coding group 0 (xor:3), ranks 0 1 2 3"), std::string::npos) << r.output;
  r = Cli("inspect " + Quote(root + "/node0/rank0") + " --version 3 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["versions"][0]["coding_group"]["code"], "xor:3") << r.output;
  EXPECT_EQ(j["versions"][0]["coding_group"]["ranks"], (std::vector<int>{0, 1, 2, 3}));

  // A byte in the middle of the largest parity segment of v3: inside a block's payload (2 MiB a
  // rank, 4 MiB units: two stripes, each holder's block most of its file; a member that holds
  // no block of v3 has a segment of a header, a manifest and a footer).
  std::string parity;
  for (int i = 0; i < 3; ++i) {
    const std::string p = ram + "/node" + std::to_string(i) + "/ckptdb-parity-r" +
                          std::to_string(i) + "/g00000-v00000000000000000003.par";
    ASSERT_TRUE(fs::exists(p)) << p;
    if (parity.empty() || fs::file_size(p) > fs::file_size(parity)) parity = p;
  }
  ASSERT_GT(fs::file_size(parity), 1u << 20);
  test::FlipByte(parity, fs::file_size(parity) / 2, 0x01);
  r = Cli("verify -q --version 3" + roots);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("PROBLEM"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fails xxh3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("its parity bad"), std::string::npos) << r.output;

  // A damaged manifest of a parity segment that holds no block: unreadable, a problem too.
  std::string smallest;
  for (int i = 0; i < 3; ++i) {
    const std::string p = ram + "/node" + std::to_string(i) + "/ckptdb-parity-r" +
                          std::to_string(i) + "/g00000-v00000000000000000003.par";
    if (smallest.empty() || fs::file_size(p) < fs::file_size(smallest)) smallest = p;
  }
  ASSERT_LT(fs::file_size(smallest), 1u << 20);
  test::FlipByte(smallest, 4096 + 4096 + 8, 0x01);  // the manifest's payload
  r = Cli("verify -q --version 3" + roots);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("its parity unreadable"), std::string::npos) << r.output;
}

TEST_F(CliTest, RestoreWritesEveryTensorBitExactInsideOut) {
  std::string parent = mem_.Sub("restored");
  std::string out = parent + "/out";
  Result r = Cli("restore " + Quote(root_) + " --out " + Quote(out));  // latest: version 9
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("of version 9"), std::string::npos) << r.output;
  // Nothing was written outside --out: its parent holds only it, the store is as it was.
  std::vector<std::string> outside;
  for (const auto& e : fs::directory_iterator(parent)) outside.push_back(e.path().string());
  EXPECT_EQ(outside, std::vector<std::string>{out});
  EXPECT_FALSE(fs::exists(mem_.Sub("escape")));

  nlohmann::json index = nlohmann::json::parse(ReadWholeFile(out + "/index.json"));
  EXPECT_EQ(index["format"], "ckptdb-restore");
  EXPECT_EQ(index["version"], 9);
  EXPECT_TRUE(index["failed"].empty());
  ASSERT_EQ(index["tensors"].size(), v9_.size());
  std::map<std::string, std::string> files;
  for (const auto& t : index["tensors"]) files[t["name"]] = t["file"];
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    EXPECT_TRUE(e.is_regular_file()) << e.path();
    entries++;
  }
  EXPECT_EQ(entries, v9_.size() + 1);  // one file per tensor and index.json
  for (const Shard& s : v9_) {
    ASSERT_TRUE(files.count(s.name)) << s.name;
    const std::string& file = files[s.name];
    EXPECT_EQ(file.find('/'), std::string::npos) << file;
    EXPECT_LE(file.size(), 255u) << file;
    EXPECT_NE(file, "index.json");
    std::string bytes = ReadWholeFile(out + "/" + file);
    EXPECT_EQ(bytes, std::string(s.data.begin(), s.data.end())) << s.name;
  }
}

TEST_F(CliTest, RestoreSelectsByNameAndVersion) {
  std::string out = mem_.Sub("out");
  Result r = Cli("restore " + Quote(root_) + " --version 5 --name opt.step --out " + Quote(out));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(ReadWholeFile(out + "/opt.step.bin"),
            std::string(v5_[1].data.begin(), v5_[1].data.end()));
  EXPECT_FALSE(fs::exists(out + "/model.weight.bin"));
  r = Cli("restore " + Quote(root_) + " --name nope --out " + Quote(mem_.Sub("o2")));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("'nope'"), std::string::npos) << r.output;
  r = Cli("restore " + Quote(root_) + " --version 6 --out " + Quote(mem_.Sub("o3")));
  EXPECT_EQ(r.code, 2) << r.output;
}

TEST_F(CliTest, RestoreNeverOverwritesOrFollowsALink) {
  std::string out = mem_.Sub("out");
  std::string victim = mem_.Sub("victim");
  test::WriteWholeFile(victim, "precious");
  fs::create_directories(out);
  fs::create_symlink(victim, out + "/opt.step.bin");
  Result r = Cli("restore " + Quote(root_) + " --version 5 --out " + Quote(out));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("opt.step.bin already exists"), std::string::npos) << r.output;
  EXPECT_EQ(ReadWholeFile(victim), "precious");
  EXPECT_FALSE(fs::exists(out + "/model.weight.bin"));  // nothing was written
  EXPECT_FALSE(fs::exists(out + "/index.json"));
}

TEST_F(CliTest, RestoreOfATensorDamagedOnEveryTierWritesNoFile) {
  nlohmann::json j = InspectJson("--version 5 --chunks");
  uint64_t payload = j["versions"][0]["tensors"][0]["chunks"][1]["payload_offset"];
  test::FlipByte(Segment(t1_, 5), payload + 5);
  test::FlipByte(Segment(t2_, 5), payload + 5);
  std::string out = mem_.Sub("out");
  Result r = Cli("restore " + Quote(root_) + " --version 5 --out " + Quote(out));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("'model.weight' not restored"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("CKPTDB_ECORRUPT"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out + "/model.weight.bin"));
  EXPECT_EQ(ReadWholeFile(out + "/opt.step.bin"),
            std::string(v5_[1].data.begin(), v5_[1].data.end()));
  nlohmann::json index = nlohmann::json::parse(ReadWholeFile(out + "/index.json"));
  ASSERT_EQ(index["failed"].size(), 1u);
  EXPECT_EQ(index["failed"][0]["name"], "model.weight");
  EXPECT_EQ(index["tensors"].size(), 1u);
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

// The ram tier through the command line: residency, --stats, --chunks and verify --tier ram.
TEST(CliRamTest, InspectShowsTheRamTierAndItsFiguresAndVerifyChecksIt) {
  TempDir mem("/dev/shm");
  TempDir disk("/var/tmp");
  const std::string root = mem.Sub("store");
  const std::string tiers = "ram:16M,dir=" + mem.Sub("ram") + ";disk:" + disk.Sub("d") + ",every=2";
  ckptdb_options o;
  ckptdb_options_init(&o);
  o.root = root.c_str();
  o.tiers = tiers.c_str();
  o.chunk_bytes = kChunkBytes;
  o.staging_bytes = 1 << 20;
  ckptdb* db = nullptr;
  ASSERT_EQ(ckptdb_open(&o, &db), CKPTDB_OK) << ckptdb_last_error();
  std::vector<std::vector<uint8_t>> data;
  for (uint64_t v = 1; v <= 3; ++v) {
    data.push_back(RandomBytes(3 * kChunkBytes, v * 1000003));
    ASSERT_EQ(ckptdb_put_shard(db, v, "w", data.back().data(), data.back().size(), nullptr, 0),
              CKPTDB_OK);
    ASSERT_EQ(ckptdb_commit(db, v, 0), CKPTDB_OK) << ckptdb_last_error();
  }
  ASSERT_EQ(ckptdb_close(db), CKPTDB_OK);

  Result r = Cli("inspect " + Quote(root));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("ram (DURABLE)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("disk:" + disk.Sub("d") + " (DURABLE)"), std::string::npos) << r.output;

  r = Cli("inspect " + Quote(root) + " --stats");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("figures kept for 3 version(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ram (16.0 MiB)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("T1 = disk:"), std::string::npos) << r.output;

  r = Cli("inspect " + Quote(root) + " --json --stats");
  ASSERT_EQ(r.code, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_TRUE(j.contains("stats"));
  EXPECT_EQ(j["stats"]["commits"], 3);
  EXPECT_EQ(j["stats"]["tiers"][0]["tier"], "ram");
  EXPECT_EQ(j["stats"]["tiers"][0]["capacity_bytes"], 16 << 20);
  ASSERT_EQ(j["versions"].size(), 3u);
  EXPECT_EQ(j["versions"][2]["stats"]["put_calls"], 1);
  EXPECT_GT(j["versions"][2]["stats"]["capture_ns"].get<uint64_t>(), 0u);

  r = Cli("inspect " + Quote(root) + " --version 3 --chunks");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("chunks as the copy on ram records them (" + mem.Sub("ram")),
            std::string::npos)
      << r.output;

  r = Cli("verify " + Quote(root) + " --tier ram");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("on ram"), std::string::npos) << r.output;

  // One flipped payload byte of version 3 in the arena: verify names the tier and the chunk, and
  // restore writes nothing, since no other tier has version 3 (disk takes even versions).
  std::string arena;
  for (const auto& e : fs::directory_iterator(mem.Sub("ram"))) arena = e.path().string();
  std::string bytes = ReadWholeFile(arena);
  size_t at =
      bytes.find(std::string(reinterpret_cast<const char*>(data[2].data()) + kChunkBytes, 64));
  ASSERT_NE(at, std::string::npos);
  test::FlipByte(arena, at + 3);
  r = Cli("verify " + Quote(root) + " --tier ram --version 3");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("chunk 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fails xxh3"), std::string::npos) << r.output;
  r = Cli("restore " + Quote(root) + " --version 3 --out " + Quote(mem.Sub("out")));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_FALSE(fs::exists(mem.Sub("out") + "/w.bin")) << "no file of damaged data";
  // Version 2 lives on disk too and restores whole.
  r = Cli("restore " + Quote(root) + " --version 2 --out " + Quote(mem.Sub("out2")));
  EXPECT_EQ(r.code, 0) << r.output;
  std::string got = ReadWholeFile(mem.Sub("out2") + "/w.bin");
  EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.end()), data[1]);
}

}  // namespace
}  // namespace ckpt
