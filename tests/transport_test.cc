// The UCX transport between two Transports in one process: calls with bodies and eager and
// rendezvous payloads, the job-token handshake (a wrong token is refused and nothing it sends is
// delivered), bounded in-flight calls, timeouts and a peer that vanishes, on UCX_TLS=tcp, shared
// memory and UCX's own choice.
#include "transport/transport.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "test_util.h"
#include "transport/wire.h"

namespace ckpt::transport {
namespace {

constexpr uint16_t kEcho = 100;   // reply: body and payload back
constexpr uint16_t kSleep = 101;  // sleeps body[0] * 100 ms, replies empty
constexpr uint16_t kFail = 102;   // replies CKPTDB_ENOTFOUND
// Replies with Server::file's bytes as the payload, also named by payload_fd; body[0] 'S': the
// reply claims 1 MiB more than the file holds (a file cut short under a send).
constexpr uint16_t kFile = 103;

// A test parameter: a UCX_TLS list, or "ucx-shm": UCX over shared memory without peer-failure
// handling (TransportOptions::ucx_without_peer_failure), the only way to run the UCX path on a
// machine without RDMA.
void SetTls(TransportOptions* o, const std::string& param) {
  o->tls = param == "ucx-shm" ? "shm" : param;
  o->ucx_without_peer_failure = param == "ucx-shm";
}

struct Server {
  std::atomic<int> delivered{0};
  std::atomic<int> placed{0};  // requests whose payload the handler found in `arena`
  std::vector<uint8_t> arena;  // with a placer: where echo payloads whose body starts 'P' go
  int file_fd = -1;            // kFile's file, and a copy of its bytes
  std::vector<uint8_t> file_bytes;
  std::unique_ptr<Transport> t;
  Status Start(const std::string& token, const std::string& tls, bool with_placer = false) {
    TransportOptions o;
    o.name = "server";
    o.listen = "127.0.0.1:0";
    o.job_token = token;
    SetTls(&o, tls);
    o.max_in_flight = 4;
    if (with_placer) {
      arena.assign(16 << 20, 0);
      o.placer = [this](uint16_t type, std::span<const uint8_t> body, size_t bytes) {
        PayloadPlace p;
        if (type == kEcho && !body.empty() && body[0] == 'P' && bytes <= arena.size()) {
          p.data = arena.data();
        }
        return p;
      };
    }
    return Transport::Start(
        o,
        [this](const Request& r, Reply* reply) {
          delivered++;
          if (r.placed.data == arena.data() && !arena.empty()) placed++;
          if (r.type == kEcho) {
            reply->body = r.body;
            auto payload = r.Payload();
            auto copy = std::make_shared<std::vector<uint8_t>>(payload.begin(), payload.end());
            reply->payload = copy->data();
            reply->payload_bytes = copy->size();
            reply->keep = copy;
          } else if (r.type == kFile) {
            const bool short_file = !r.body.empty() && r.body[0] == 'S';
            reply->payload = file_bytes.data();
            reply->payload_bytes = file_bytes.size() + (short_file ? 1 << 20 : 0);
            if (short_file) {  // a payload pointer that covers it, for a path that reads it
              auto big = std::make_shared<std::vector<uint8_t>>(reply->payload_bytes);
              reply->payload = big->data();
              reply->keep = big;
            }
            reply->payload_fd = file_fd;
            reply->payload_file_offset = 0;
          } else if (r.type == kSleep) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100 * r.body.at(0)));
          } else {
            reply->status = CKPTDB_ENOTFOUND;
            reply->message = "no such thing";
          }
        },
        &t);
  }
};

std::unique_ptr<Transport> Client(const std::string& token, const std::string& tls) {
  TransportOptions o;
  o.name = "client";
  o.job_token = token;
  SetTls(&o, tls);
  o.max_in_flight = 4;
  std::unique_ptr<Transport> t;
  Status st = Transport::Start(
      o, [](const Request&, Reply*) {}, &t);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return t;
}

class TransportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TransportTest, CallsCarryBodiesAndPayloadsBothWays) {
  Server server;
  {
    Status s0 = server.Start("secret", GetParam());
    ASSERT_TRUE(s0.ok()) << s0.ToString();
  }
  auto client = Client("secret", GetParam());
  PeerId peer = 0;
  Status st = client->Connect(server.t->address(), 10000, &peer);
  ASSERT_TRUE(st.ok()) << st.ToString();
  // UCX never carries tcp: "tcp" is ckptdb's socket. UCX 1.13's shared memory has no
  // peer-failure handling, so on a machine without RDMA every choice ends on the socket too.
  EXPECT_EQ(client->stats().socket_connections + client->stats().ucx_connections, 1u);
  EXPECT_EQ(server.t->stats().socket_connections, client->stats().socket_connections);
  if (GetParam() == "tcp") {
    EXPECT_EQ(client->stats().socket_connections, 1u);
  }
  if (GetParam() == "ucx-shm") {
    EXPECT_EQ(client->stats().ucx_connections, 1u);
  }
  // The payload sizes about the socket's receive low-water mark (kPayloadLowatBytes, 1 MiB): a
  // rest smaller than it must still wake the reader.
  for (size_t bytes :
       {size_t{0}, size_t{100}, size_t{64} << 10, (size_t{1} << 20) - 1, size_t{1} << 20,
        (size_t{1} << 20) + 1, (size_t{3} << 20) + 12345, size_t{8} << 20}) {
    auto payload = test::RandomBytes(bytes, 7 + bytes);
    std::vector<uint8_t> back(bytes + 16, 0xee);
    std::vector<uint8_t> body = {1, 2, 3};
    std::vector<uint8_t> reply_body;
    size_t got = 0;
    st = client->CallSync(peer, kEcho, body, payload.data(), payload.size(), 10000, &reply_body,
                          back.data(), back.size(), &got);
    ASSERT_TRUE(st.ok()) << st.ToString() << " at " << bytes;
    EXPECT_EQ(reply_body, body);
    ASSERT_EQ(got, bytes);
    EXPECT_TRUE(std::equal(payload.begin(), payload.end(), back.begin()));  // 0 bytes: no memcmp
  }
  std::vector<uint8_t> reply_body;
  st = client->CallSync(peer, kFail, {}, nullptr, 0, 10000, &reply_body);
  EXPECT_EQ(st.code(), CKPTDB_ENOTFOUND);
  EXPECT_EQ(st.message(), "no such thing");
  // Many calls in flight, more than the connection's window: the caller waits for slots.
  std::vector<std::unique_ptr<Call>> calls;
  std::vector<std::vector<uint8_t>> buffers(32, std::vector<uint8_t>(1 << 20));
  auto data = test::RandomBytes(1 << 20, 99);
  for (int i = 0; i < 32; ++i) {
    std::unique_ptr<Call> call;
    ASSERT_TRUE(client
                    ->Start(peer, kEcho, {static_cast<uint8_t>(i)}, data.data(), data.size(),
                            buffers[i].data(), buffers[i].size(), &call)
                    .ok());
    calls.push_back(std::move(call));
  }
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(calls[i]->Wait(10000).ok());
    EXPECT_EQ(calls[i]->body().at(0), i);
    EXPECT_EQ(buffers[i], data);
  }
  EXPECT_GT(client->stats().bytes_sent, uint64_t{40} << 20);
}

// A Placer has a large (rendezvous) payload received straight into memory it chose; small
// (eager) payloads and payloads it declines arrive in the request's vector as before.
TEST_P(TransportTest, APlacerChoosesWhereALargePayloadLands) {
  Server server;
  {
    Status s0 = server.Start("secret", GetParam(), /*with_placer=*/true);
    ASSERT_TRUE(s0.ok()) << s0.ToString();
  }
  auto client = Client("secret", GetParam());
  PeerId peer = 0;
  ASSERT_TRUE(client->Connect(server.t->address(), 10000, &peer).ok());
  auto big = test::RandomBytes(8 << 20, 4242);
  std::vector<uint8_t> back(big.size());
  std::vector<uint8_t> reply_body;
  size_t got = 0;
  Status st = client->CallSync(peer, kEcho, {'P'}, big.data(), big.size(), 10000, &reply_body,
                               back.data(), back.size(), &got);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(back, big);
  EXPECT_EQ(server.placed.load(), 1);
  EXPECT_EQ(0, std::memcmp(server.arena.data(), big.data(), big.size()));
  // Declined (body not 'P'), and eager: both through the vector, both intact.
  for (auto [tag, bytes] : {std::pair<uint8_t, size_t>{'x', 8 << 20}, {'P', 100}}) {
    auto data = test::RandomBytes(bytes, 77 + bytes);
    back.assign(bytes, 0);
    st = client->CallSync(peer, kEcho, {tag}, data.data(), data.size(), 10000, &reply_body,
                          back.data(), back.size(), &got);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(back, data);
  }
  EXPECT_EQ(server.placed.load(), 1);
}

TEST_P(TransportTest, AWrongTokenIsRefusedAndNothingItSendsIsDelivered) {
  Server server;
  {
    Status s0 = server.Start("secret", GetParam());
    ASSERT_TRUE(s0.ok()) << s0.ToString();
  }
  auto intruder = Client("guess", GetParam());
  PeerId peer = 0;
  Status st = intruder->Connect(server.t->address(), 10000, &peer);
  EXPECT_EQ(st.code(), CKPTDB_EAUTH) << st.ToString();
  EXPECT_NE(st.message().find("token"), std::string::npos) << st.message();
  EXPECT_EQ(server.delivered.load(), 0);
  // The server is still fine for the right token.
  auto client = Client("secret", GetParam());
  ASSERT_TRUE(client->Connect(server.t->address(), 10000, &peer).ok());
  std::vector<uint8_t> reply;
  ASSERT_TRUE(client->CallSync(peer, kEcho, {9}, nullptr, 0, 10000, &reply).ok());
  EXPECT_EQ(server.delivered.load(), 1);
}

TEST_P(TransportTest, ATimeoutClosesTheConnectionAndAVanishedPeerFailsCalls) {
  auto server = std::make_unique<Server>();
  ASSERT_TRUE(server->Start("secret", GetParam()).ok());
  auto client = Client("secret", GetParam());
  PeerId peer = 0;
  ASSERT_TRUE(client->Connect(server->t->address(), 10000, &peer).ok());
  std::vector<uint8_t> reply;
  Status st = client->CallSync(peer, kSleep, {5}, nullptr, 0, 100, &reply);
  EXPECT_EQ(st.code(), CKPTDB_ETIMEDOUT) << st.ToString();
  st = client->CallSync(peer, kEcho, {}, nullptr, 0, 1000, &reply);
  EXPECT_EQ(st.code(), CKPTDB_EPEER) << st.ToString();
  // A new connection works; then the server goes away under a call.
  ASSERT_TRUE(client->Connect(server->t->address(), 10000, &peer).ok());
  std::unique_ptr<Call> call;
  ASSERT_TRUE(client->Start(peer, kSleep, {10}, nullptr, 0, nullptr, 0, &call).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server.reset();
  st = call->Wait(20000);
  EXPECT_EQ(st.code(), CKPTDB_EPEER) << st.ToString();
}

TEST(TransportOptionsTest, BadOptionsAreRefusedClearly) {
  TransportOptions o;
  o.name = "x";
  std::unique_ptr<Transport> t;
  Status st = Transport::Start(o, nullptr, &t);
  EXPECT_EQ(st.code(), CKPTDB_EINVAL);
  EXPECT_NE(st.message().find("token"), std::string::npos);
  o.job_token = "s";
  o.listen = "no-port";
  st = Transport::Start(o, nullptr, &t);
  EXPECT_EQ(st.code(), CKPTDB_EINVAL);
  EXPECT_NE(st.message().find("no-port"), std::string::npos);
  o.listen = "";
  ASSERT_TRUE(Transport::Start(o, nullptr, &t).ok());
  PeerId peer;
  // Nothing listens there: refused at once (EPEER with the reason), not a timeout.
  st = t->Connect("127.0.0.1:1", 10000, &peer);
  EXPECT_EQ(st.code(), CKPTDB_EPEER) << st.ToString();
  EXPECT_NE(st.message().find("refused"), std::string::npos) << st.message();
}

TEST(TransportOptionsTest, UcxIsNeverGivenTcp) {
  unsetenv("UCX_TLS");
  EXPECT_EQ(UcxTransports("tcp"), "");
  EXPECT_EQ(UcxTransports("shm,tcp"), "shm");
  EXPECT_EQ(UcxTransports("tcp,shm,cma"), "shm,cma");
  EXPECT_EQ(UcxTransports(""), "^tcp");
  EXPECT_EQ(UcxTransports("all"), "^tcp");
  EXPECT_EQ(UcxTransports("^rc"), "^rc,tcp");
  EXPECT_EQ(UcxTransports("^tcp"), "^tcp");
  setenv("UCX_TLS", "rc,tcp", 1);
  EXPECT_EQ(UcxTransports(""), "rc");
  EXPECT_EQ(UcxTransports("shm"), "shm");  // the option wins over the environment
  unsetenv("UCX_TLS");
}

// A process without UCX (its transports were only tcp) and one with it: the socket path.
TEST(TransportOptionsTest, PeersWithAndWithoutUcxMeetOnTheSocket) {
  Server server;
  ASSERT_TRUE(server.Start("secret", "shm,tcp").ok());
  auto client = Client("secret", "tcp");
  PeerId peer = 0;
  Status st = client->Connect(server.t->address(), 10000, &peer);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(client->stats().socket_connections, 1u);
  EXPECT_EQ(server.t->stats().socket_connections, 1u);
  auto data = test::RandomBytes(3 << 20, 5);
  std::vector<uint8_t> back(data.size());
  std::vector<uint8_t> reply;
  size_t got = 0;
  st = client->CallSync(peer, kEcho, {1}, data.data(), data.size(), 10000, &reply, back.data(),
                        back.size(), &got);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(back, data);
}

// A reply whose payload names a file goes out with sendfile on the socket path: the bytes arrive
// whole; a file cut short under the send closes the connection (the call fails with EPEER) and
// neither process is hurt (SIGPIPE and all).
TEST(TransportFileTest, APayloadFromAFileArrivesWholeAndAShortFileClosesTheConnection) {
  test::TempDir dir("/dev/shm");
  Server server;
  server.file_bytes = test::RandomBytes((5 << 20) + 123, 77);
  const std::string path = dir.Sub("payload");
  test::WriteWholeFile(path, std::string(server.file_bytes.begin(), server.file_bytes.end()));
  server.file_fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(server.file_fd, 0);
  ASSERT_TRUE(server.Start("secret", "tcp").ok());
  auto client = Client("secret", "tcp");
  PeerId peer = 0;
  ASSERT_TRUE(client->Connect(server.t->address(), 10000, &peer).ok());
  std::vector<uint8_t> got(server.file_bytes.size() + (2 << 20));
  for (int round = 0; round < 3; ++round) {
    std::vector<uint8_t> body;
    size_t n = 0;
    Status st =
        client->CallSync(peer, kFile, {'W'}, nullptr, 0, 10000, &body, got.data(), got.size(), &n);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(n, server.file_bytes.size());
    EXPECT_TRUE(std::equal(server.file_bytes.begin(), server.file_bytes.end(), got.begin()));
  }
  std::vector<uint8_t> body;
  Status st =
      client->CallSync(peer, kFile, {'S'}, nullptr, 0, 10000, &body, got.data(), got.size());
  EXPECT_EQ(st.code(), CKPTDB_EPEER) << st.ToString();
  // Both ends go on: a new connection works.
  ASSERT_TRUE(client->Connect(server.t->address(), 10000, &peer).ok());
  size_t n = 0;
  st = client->CallSync(peer, kFile, {'W'}, nullptr, 0, 10000, &body, got.data(), got.size(), &n);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(n, server.file_bytes.size());
  close(server.file_fd);
}

TEST(WireTest, ReaderRejectsShortAndOverlongInput) {
  WireWriter w;
  w.U32(7);
  w.Str("hello");
  auto bytes = w.Take();
  WireReader ok(bytes, "msg");
  EXPECT_EQ(ok.U32("a"), 7u);
  EXPECT_EQ(ok.Str("b", 16), "hello");
  EXPECT_TRUE(ok.Finish().ok());
  WireReader too_long(bytes, "msg");
  too_long.U32("a");
  too_long.Str("b", 3);
  EXPECT_FALSE(too_long.Finish().ok());
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    WireReader r(std::span<const uint8_t>(bytes.data(), cut), "msg");
    r.U32("a");
    r.Str("b", 16);
    EXPECT_FALSE(r.Finish().ok()) << cut;
  }
  WireReader extra(bytes, "msg");
  extra.U32("a");
  EXPECT_FALSE(extra.Finish().ok());
}

INSTANTIATE_TEST_SUITE_P(Tls, TransportTest, ::testing::Values("tcp", "shm,tcp", "", "ucx-shm"),
                         [](const auto& info) {
                           return info.param.empty()        ? std::string("ucx_choice")
                                  : info.param == "tcp"     ? "tcp"
                                  : info.param == "ucx-shm" ? "ucx_shm"
                                                            : "shm";
                         });

}  // namespace
}  // namespace ckpt::transport
