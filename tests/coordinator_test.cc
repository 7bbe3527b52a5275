// Rank 0's coordinator (engine/coordinator.h) on its own, driven by the requests ranks send it
// and a Tell that records what it announces: its epochs (durable, only growing), votes and
// decisions, fencing, failure detection, and hostile bodies refused without a change.
#include "engine/coordinator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/catalog.h"
#include "engine/cluster_wire.h"
#include "engine/holdings.h"
#include "test_util.h"
#include "transport/wire.h"

namespace ckpt::engine {
namespace {

using transport::Reply;
using transport::Request;
using transport::WireReader;
using transport::WireWriter;

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Catalog::Open(dir_.Sub("catalog"), false, true, &catalog_).ok());
  }

  // A coordinator of `world` ranks over the test's catalog, its announcements recorded.
  std::unique_ptr<Coordinator> Open(uint32_t world, int dead_after_ms = 60000) {
    Coordinator::Options o;
    o.world_size = world;
    o.heartbeat_ms = 10;
    o.dead_after_ms = dead_after_ms;
    std::unique_ptr<Coordinator> c;
    Status st = Coordinator::Open(
        o, catalog_.get(),
        [this](uint32_t rank, const std::string&, const Coordinator::Announcement& d) {
          std::lock_guard<std::mutex> lock(mu_);
          told_.push_back({rank, d.version, d.committed, d.why});
          cv_.notify_all();
          return Status::Ok();
        },
        &c);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return c;
  }

  static Reply Call(void (Coordinator::*handler)(const Request&, Reply*), Coordinator* c,
                    std::vector<uint8_t> body, std::vector<uint8_t> payload = {}) {
    Request r;
    r.peer = "test peer";
    r.body = std::move(body);
    r.payload = std::move(payload);
    Reply reply;
    (c->*handler)(r, &reply);
    return reply;
  }
  static Reply Register(Coordinator* c, uint32_t rank, uint32_t world, uint64_t incarnation) {
    WireWriter w;
    w.U32(rank);
    w.U32(world);
    w.U64(incarnation);
    w.Str("node" + std::to_string(rank));
    w.Str("127.0.0.1:" + std::to_string(9000 + rank));
    w.U32(cluster_wire::kProtocolVersion);
    return Call(&Coordinator::HandleRegister, c, w.Take(), EncodeHoldings(HoldingsReport{}));
  }
  static Reply Vote(Coordinator* c, uint32_t rank, uint64_t incarnation, uint64_t epoch,
                    uint64_t version, bool yes) {
    WireWriter w;
    w.U32(rank);
    w.U64(incarnation);
    w.U64(epoch);
    w.U64(version);
    w.U8(yes ? 1 : 0);
    w.Str(yes ? "" : "its disk filled");
    return Call(&Coordinator::HandleVote, c, w.Take());
  }
  // Waits (bounded) until `count` announcements were told.
  bool WaitTold(size_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return told_.size() >= count; });
  }
  std::string Meta(const std::string& key) {
    std::string value;
    return catalog_->GetMeta(key, &value).ok() ? value : "";
  }

  struct Told {
    uint32_t rank;
    uint64_t version;
    bool committed;
    std::string why;
  };
  test::TempDir dir_;
  std::unique_ptr<Catalog> catalog_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Told> told_;
};

TEST_F(CoordinatorTest, EveryCoordinatorStartsANewDurableEpoch) {
  uint64_t last = 0;
  for (int i = 0; i < 3; ++i) {
    std::unique_ptr<Coordinator> c = Open(2);
    EXPECT_GT(c->epoch(), last);  // votes cast to an older coordinator are void
    last = c->epoch();
    EXPECT_EQ(Meta("coord/epoch"), std::to_string(last));
  }
}

TEST_F(CoordinatorTest, EveryVoteCommitsDurablyBeforeItIsAnnounced) {
  std::unique_ptr<Coordinator> c = Open(2);
  c->Start();
  ASSERT_EQ(Register(c.get(), 0, 2, 11).status, 0);
  ASSERT_EQ(Register(c.get(), 1, 2, 21).status, 0);
  const uint64_t e = c->epoch();
  EXPECT_EQ(Vote(c.get(), 0, 11, e, 7, true).status, 0);
  EXPECT_EQ(Meta("coord/committed/0000000000000007"), "");  // one vote of two
  EXPECT_EQ(Vote(c.get(), 1, 21, e, 7, true).status, 0);
  EXPECT_EQ(Meta("coord/committed/0000000000000007"), "1");
  ASSERT_TRUE(WaitTold(2));
  {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(told_[0].rank, 1u);  // rank 0 hears last
    EXPECT_EQ(told_[1].rank, 0u);
    for (const Told& t : told_) EXPECT_TRUE(t.version == 7 && t.committed);
  }
  // A repeated yes changes nothing; a no for a committed version is refused.
  EXPECT_EQ(Vote(c.get(), 1, 21, e, 7, true).status, 0);
  Reply no = Vote(c.get(), 1, 21, e, 7, false);
  EXPECT_EQ(no.status, CKPTDB_ESTATE);
  EXPECT_NE(no.message.find("already committed"), std::string::npos) << no.message;
  // A new coordinator over the same catalog knows the decision.
  c.reset();
  std::unique_ptr<Coordinator> again = Open(2);
  Reply reply = Call(&Coordinator::HandleDecisions, again.get(), {});
  WireReader r(reply.body, "decisions");
  EXPECT_EQ(r.U32("count"), 1u);
  EXPECT_EQ(r.U64("version"), 7u);
}

TEST_F(CoordinatorTest, ANoAbortsForEveryRankAndAYesAfterItIsRefused) {
  std::unique_ptr<Coordinator> c = Open(2);
  c->Start();
  ASSERT_EQ(Register(c.get(), 0, 2, 11).status, 0);
  ASSERT_EQ(Register(c.get(), 1, 2, 21).status, 0);
  const uint64_t e = c->epoch();
  EXPECT_EQ(Vote(c.get(), 0, 11, e, 8, true).status, 0);
  EXPECT_EQ(Vote(c.get(), 1, 21, e, 8, false).status, 0);
  ASSERT_TRUE(WaitTold(2));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Told& t : told_) {
      EXPECT_FALSE(t.committed);
      EXPECT_NE(t.why.find("rank 1 could not prepare it: its disk filled"), std::string::npos);
    }
  }
  Reply late = Vote(c.get(), 1, 21, e, 8, true);
  EXPECT_EQ(late.status, CKPTDB_ESTATE);
  EXPECT_NE(late.message.find("already aborted"), std::string::npos) << late.message;
  EXPECT_EQ(Meta("coord/committed/0000000000000008"), "");
}

TEST_F(CoordinatorTest, VotesOfAnOldEpochOrIncarnationAreFenced) {
  std::unique_ptr<Coordinator> c = Open(2);
  ASSERT_EQ(Register(c.get(), 0, 2, 11).status, 0);
  ASSERT_EQ(Register(c.get(), 1, 2, 21).status, 0);
  const uint64_t e = c->epoch();
  Reply old_epoch = Vote(c.get(), 1, 21, e - 1, 9, true);
  EXPECT_EQ(old_epoch.status, CKPTDB_ESTATE);
  EXPECT_NE(old_epoch.message.find("fenced"), std::string::npos) << old_epoch.message;
  // Rank 1 restarts: its old incarnation's votes no longer count, and the epoch moves on.
  EXPECT_EQ(Vote(c.get(), 1, 21, e, 9, true).status, 0);
  ASSERT_EQ(Register(c.get(), 1, 2, 23).status, 0);
  EXPECT_EQ(c->epoch(), e + 1);
  EXPECT_EQ(Meta("coord/epoch"), std::to_string(e + 1));
  EXPECT_EQ(Vote(c.get(), 1, 21, e + 1, 9, true).status, CKPTDB_ESTATE);
}

TEST_F(CoordinatorTest, ASilentRankIsDeclaredDeadAndWhatItLeftOpenIsAborted) {
  std::unique_ptr<Coordinator> c = Open(2, /*dead_after_ms=*/100);
  ASSERT_EQ(Register(c.get(), 0, 2, 11).status, 0);
  ASSERT_EQ(Register(c.get(), 1, 2, 21).status, 0);
  const uint64_t e = c->epoch();
  EXPECT_EQ(Vote(c.get(), 0, 11, e, 10, true).status, 0);
  c->Start();  // rank 1 sends no heartbeat
  ASSERT_TRUE(WaitTold(1));
  {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(told_[0].rank, 0u);  // rank 1 is dead: only rank 0 is told
    EXPECT_EQ(told_[0].version, 10u);
    EXPECT_FALSE(told_[0].committed);
    EXPECT_NE(told_[0].why.find("sent no heartbeat"), std::string::npos) << told_[0].why;
  }
  EXPECT_EQ(c->epoch(), e + 1);
  WireWriter hb;
  hb.U32(1);
  hb.U64(21);
  hb.U64(e);
  hb.U8(1);
  hb.U64(0);  // waits for no decision
  Reply reply =
      Call(&Coordinator::HandleHeartbeat, c.get(), hb.Take(), EncodeHoldings(HoldingsReport{}));
  EXPECT_EQ(reply.status, CKPTDB_ESTATE);  // it must restart and register again
  // Not as the same incarnation, which the job declared dead (it would ask until its join timed
  // out): as a new one, which is taken.
  Reply again = Register(c.get(), 1, 2, 21);
  EXPECT_EQ(again.status, CKPTDB_ESTATE);
  EXPECT_NE(again.message.find("declared dead"), std::string::npos) << again.message;
  EXPECT_EQ(Register(c.get(), 1, 2, 22).status, 0);
}

// A rank whose telling of a decision was lost (a partition, a dropped connection) names the
// version it waits for in its heartbeat, and the reply carries the decision.
TEST_F(CoordinatorTest, AHeartbeatReplyCarriesTheDecisionTheRankWaitsFor) {
  std::unique_ptr<Coordinator> c = Open(2);
  ASSERT_EQ(Register(c.get(), 0, 2, 11).status, 0);
  ASSERT_EQ(Register(c.get(), 1, 2, 21).status, 0);
  const uint64_t e = c->epoch();
  auto heartbeat = [&](uint64_t waiting, uint8_t* decision, std::string* why) {
    WireWriter hb;
    hb.U32(1);
    hb.U64(21);
    hb.U64(e);
    hb.U8(1);
    hb.U64(waiting);
    Reply r =
        Call(&Coordinator::HandleHeartbeat, c.get(), hb.Take(), EncodeHoldings(HoldingsReport{}));
    ASSERT_EQ(r.status, 0) << r.message;
    WireReader rd(r.body, "reply");
    EXPECT_EQ(rd.U64("epoch"), e);
    *decision = rd.U8("decision");
    *why = rd.Str("why", 2048);
    ASSERT_TRUE(rd.Finish().ok());
  };
  uint8_t decision = 9;
  std::string why;
  ASSERT_EQ(Vote(c.get(), 1, 21, e, 5, true).status, 0);
  heartbeat(5, &decision, &why);
  EXPECT_EQ(decision, cluster_wire::kHeartbeatUndecided);  // rank 0 has not voted
  ASSERT_EQ(Vote(c.get(), 0, 11, e, 5, true).status, 0);
  heartbeat(5, &decision, &why);
  EXPECT_EQ(decision, cluster_wire::kHeartbeatCommitted);
  ASSERT_EQ(Vote(c.get(), 1, 21, e, 6, true).status, 0);
  ASSERT_EQ(Vote(c.get(), 0, 11, e, 6, false).status, 0);
  heartbeat(6, &decision, &why);
  EXPECT_EQ(decision, cluster_wire::kHeartbeatAborted);
  EXPECT_NE(why.find("its disk filled"), std::string::npos) << why;
  heartbeat(0, &decision, &why);
  EXPECT_EQ(decision, cluster_wire::kHeartbeatUndecided);
  heartbeat(77, &decision, &why);  // a version it never heard of: no decision, not an abort
  EXPECT_EQ(decision, cluster_wire::kHeartbeatUndecided);
}

TEST_F(CoordinatorTest, HostileBodiesAreRefusedAndChangeNothing) {
  std::unique_ptr<Coordinator> c = Open(2);
  const uint64_t e = c->epoch();
  const std::vector<std::vector<uint8_t>> bodies = {
      {}, {1, 2, 3}, std::vector<uint8_t>(16, 0xff), std::vector<uint8_t>(4096, 0x41)};
  for (auto handler :
       {&Coordinator::HandleRegister, &Coordinator::HandleHeartbeat, &Coordinator::HandleVote,
        &Coordinator::HandleHolders, &Coordinator::HandleRecoverable,
        &Coordinator::HandleReplicaCheck, &Coordinator::HandleServe}) {
    for (const std::vector<uint8_t>& body : bodies) {
      Reply reply = Call(handler, c.get(), body, body);
      EXPECT_NE(reply.status, 0);
      EXPECT_NE(reply.message.find("test peer"), std::string::npos) << reply.message;
    }
  }
  // A register for a rank past the job, and a vote from one: refused, naming it.
  Reply big = Register(c.get(), 5, 2, 1);
  EXPECT_EQ(big.status, CKPTDB_EINVAL);
  EXPECT_NE(big.message.find("rank 5 of 2"), std::string::npos) << big.message;
  EXPECT_EQ(Vote(c.get(), 7, 1, e, 1, true).status, CKPTDB_EINVAL);
  EXPECT_EQ(c->epoch(), e);
  EXPECT_EQ(Meta("coord/committed/0000000000000001"), "");
}

}  // namespace
}  // namespace ckpt::engine
