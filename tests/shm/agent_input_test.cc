// Hostile and broken input against a real `memento agent` process over its
// real Unix socket (issue 21, section 2): every field of every request is
// checked and answered with an error that names it, a failed slot allocation
// leaves no file and no entry behind, adoption removes short, empty and
// garbage slot files instead of crashing on them, and a half-sent message is
// dropped after shm::kFrameTimeoutS while a quiet connection stays open.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "common/test_util.h"
#include "proc_util.h"
#include "shm/agent_messages.h"
#include "shm/shm_test_util.h"

namespace memento::shm::testing {
namespace {

using nlohmann::json;

class AgentInputTest : public ::testing::Test {
 protected:
  AgentInputTest() : root_(dir_.path() + "/node0"), log_(dir_.path() + "/agent.log") {}
  ~AgentInputTest() override {
    if (agent_ > 0) KillAndReap(agent_);
  }

  // Starts `memento agent` on root_ with SIGXFSZ ignored (the ignore survives
  // exec), so that a file-size limit set on it later fails the allocation
  // with EFBIG instead of killing it.
  void StartAgent() {
    std::string cmd = std::string("trap '' XFSZ; exec ") + MEMENTO_BIN +
                      " agent --job input --node 0 --scrub-rate 0 --root " + root_;
    agent_ = Spawn({"/bin/sh", "-c", cmd}, log_);
    ASSERT_GT(agent_, 0);
    ASSERT_TRUE(WaitFor([&] { return AgentAnswers(root_) || !Alive(); }, 30)) << Log();
    ASSERT_TRUE(Alive()) << "the agent exited: " << Log();
  }

  bool Alive() {
    int st;
    return agent_ > 0 && waitpid(agent_, &st, WNOHANG) == 0;
  }
  std::string Log() { return ReadFile(log_); }

  int Connect() {
    auto fd = ConnectUnix(AgentSocketPath(root_));
    EXPECT_TRUE(fd.ok()) << fd.status();
    return fd.ok() ? *fd : -1;
  }

  // Sends one frame and returns the agent's reply as a Status.
  Status Ask(int fd, const std::string& body) {
    Deadline d = Deadline::AfterSeconds(10);
    Status s = SendFrame(fd, body, d);
    if (!s.ok()) return s.WithContext("send");
    auto reply = RecvJson(fd, d);
    if (!reply.ok()) return reply.status().WithContext("receive");
    return StatusFromJson(*reply);
  }
  Status Ask(int fd, const json& req) { return Ask(fd, req.dump()); }

  bool Exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
  }

  ShmScratchDir dir_;
  std::string root_;
  std::string log_;
  pid_t agent_ = -1;
};

TEST_F(AgentInputTest, EveryBadFieldGetsAnErrorNamingItAndTheAgentLivesOn) {
  StartAgent();
  int fd = Connect();
  ASSERT_GE(fd, 0);
  struct Case {
    std::string body;
    const char* names;  // a word the error must contain
  };
  const std::vector<Case> cases = {
      {R"({"op":"seal","rank":0,"bytes":1e30})", "bytes"},
      {R"({"op":"seal","rank":0,"bytes":0})", "bytes"},
      {R"({"op":"seal","rank":0,"bytes":-5})", "bytes"},
      {R"({"op":"seal","rank":0,"bytes":100})", "bytes"},
      {R"({"op":"seal","rank":0,"bytes":18446744073709551615})", "bytes"},
      {R"({"op":"seal","rank":0,"bytes":"4096"})", "bytes"},
      {R"({"op":"seal","rank":0,"bytes":8192.5})", "bytes"},
      {R"({"op":"seal","rank":0})", "bytes"},
      {R"({"op":"seal","rank":0,"bytes":8192,"manifest":7})", "manifest"},
      {R"({"op":"seal","rank":-1,"bytes":8192})", "rank"},
      {R"({"op":"seal","rank":1099511627776,"bytes":8192})", "rank"},
      {R"({"op":"seal","rank":"zero","bytes":8192})", "rank"},
      {R"({"op":"seal","rank":null,"bytes":8192})", "rank"},
      {R"({"op":"seal","bytes":8192})", "rank"},
      {R"({"op":"complete","rank":0,"slot":2,"step":1})", "slot"},
      {R"({"op":"complete","rank":0,"slot":-1,"step":1})", "slot"},
      {R"({"op":"complete","rank":0,"slot":0,"step":-3})", "step"},
      {R"({"op":"complete","rank":0,"slot":0})", "step"},
      {R"({"op":"complete","rank":0,"slot":0,"step":[1]})", "step"},
      {R"({"op":"skipped","rank":0,"step":1.5})", "step"},
      {R"({"op":"verify","rank":0,"slot":"0"})", "slot"},
      {R"({"op":"verify","rank":0})", "slot"},
      {R"({"op":"list","rank":9e99})", "rank"},
      {R"({"op":"plan","rank":-1})", "rank"},
      {R"({"op":"plan","rank":"0"})", "rank"},
      {R"({"op":"plan"})", "rank"},
      {R"({"op":"hello","rank":0,"job":"input"})", "protocol"},
      {R"({"op":"hello","rank":0,"protocol":-1,"job":"input"})", "protocol"},
      {R"({"op":"hello","rank":0,"protocol":1,"job":5})", "job"},
      {R"({"op":"hello","rank":0,"protocol":1,"job":""})", "job"},
      {R"({"op":"launch_missiles","rank":0})", "launch_missiles"},
      {R"({"op":7})", "op"},
      {R"({"rank":0})", "op"},
      {R"([1,2,3])", "object"},
      {R"("seal")", "object"},
      {R"({{{)", "not JSON"},
      {"", "not JSON"},
      {std::string(100, '[') + std::string(100, ']'), "deeper"},
  };
  for (const Case& c : cases) {
    Status s = Ask(fd, c.body);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.body << " -> " << s;
    EXPECT_NE(s.message().find(c.names), std::string::npos)
        << c.body << " -> " << s << " (should name '" << c.names << "')";
    ASSERT_TRUE(Alive()) << "the agent died on " << c.body << ": " << Log();
  }
  // Nothing was allocated for any of them.
  for (int rank : {0, 1}) {
    for (int slot = 0; slot < kSlotsPerRank; ++slot) {
      EXPECT_FALSE(Exists(SlotPath(root_, rank, slot))) << SlotPath(root_, rank, slot);
    }
  }
  // The connection still serves good requests, and a seal still works.
  EXPECT_TRUE(Ask(fd, json{{"op", "ping"}}).ok());
  // A single-node agent has no cluster plan: its ranks save whole tensors.
  ASSERT_TRUE(SendJson(fd, AgentRequestToJson(PlanRequest(0)), Deadline::AfterSeconds(10)).ok());
  auto plan_reply = RecvJson(fd, Deadline::AfterSeconds(10));
  ASSERT_TRUE(plan_reply.ok()) << plan_reply.status();
  ASSERT_TRUE(StatusFromJson(*plan_reply).ok()) << plan_reply->dump();
  auto plan = ParsePlanReply(*plan_reply);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->sharded);
  EXPECT_TRUE(plan->ranges.empty());
  EXPECT_TRUE(Ask(fd, json{{"op", "seal"}, {"rank", 0}, {"bytes", 8192}}).ok());
  EXPECT_TRUE(Ask(fd, json{{"op", "seal"}, {"rank", 0}, {"bytes", 8192}}).ok());
  struct stat st;
  ASSERT_EQ(stat(SlotPath(root_, 0, 1).c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 8192);
  // Once a connection said hello as a rank, it speaks for that rank only.
  ASSERT_TRUE(
      Ask(fd, json{{"op", "hello"}, {"rank", 0}, {"protocol", kProtocolVersion}, {"job", "input"}})
          .ok());
  Status other = Ask(fd, json{{"op", "list"}, {"rank", 1}});
  EXPECT_EQ(other.code(), StatusCode::kInvalidArgument) << other;
  close(fd);
  EXPECT_TRUE(Alive()) << Log();
}

TEST_F(AgentInputTest, AFailedAllocationLeavesNoFileAndTheNextSealWorks) {
  StartAgent();
  // A real allocation failure inside the agent: a file-size limit of 1 MiB
  // makes fallocate of a larger slot fail (EFBIG) after the room check passed,
  // as a tmpfs that fills up between the check and the allocation does.
  rlimit lim{1 << 20, 1 << 20};
  ASSERT_EQ(prlimit(agent_, RLIMIT_FSIZE, &lim, nullptr), 0) << std::strerror(errno);
  int fd = Connect();
  ASSERT_GE(fd, 0);
  const json big = {{"op", "seal"}, {"rank", 0}, {"bytes", 4 << 20}};
  for (int attempt = 0; attempt < 3; ++attempt) {
    Status s = Ask(fd, big);
    EXPECT_FALSE(s.ok());
    // The error names the slot file and the size it could not get.
    EXPECT_NE(s.message().find("rank0.slot"), std::string::npos) << s;
    EXPECT_NE(s.message().find(std::to_string(4 << 20)), std::string::npos) << s;
    ASSERT_TRUE(Alive()) << "the agent died after a failed allocation: " << Log();
    for (int slot = 0; slot < kSlotsPerRank; ++slot) {
      EXPECT_FALSE(Exists(SlotPath(root_, 0, slot)))
          << "a failed allocation left " << SlotPath(root_, 0, slot);
    }
  }
  // A slot that fits the limit is allocated on the same connection.
  EXPECT_TRUE(Ask(fd, json{{"op", "seal"}, {"rank", 0}, {"bytes", 256 << 10}}).ok()) << Log();
  // Growing it past the limit fails and keeps the slots it had.
  EXPECT_FALSE(Ask(fd, big).ok());
  struct stat st;
  ASSERT_EQ(stat(SlotPath(root_, 0, 0).c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 256 << 10);
  EXPECT_TRUE(Ask(fd, json{{"op", "list"}, {"rank", 0}}).ok());
  close(fd);
  // A new agent on the same root adopts what is there.
  KillAndReap(agent_);
  agent_ = -1;
  StartAgent();
  EXPECT_TRUE(Alive()) << Log();
}

TEST_F(AgentInputTest, AdoptionRemovesShortEmptyAndGarbageSlotFiles) {
  ASSERT_EQ(MakePrivateDir(root_), Status::Ok());
  auto write = [&](const std::string& path, const std::string& bytes) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr) << path;
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  };
  std::mt19937_64 rng(memento::testing::TestSeed("AgentInputTest.Adoption"));
  std::string garbage(64 << 10, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());
  // The state word (offset 264) of the garbage file: no slot state.
  const uint32_t bad_state = 0xdeadbeef;
  std::memcpy(&garbage[offsetof(SlotHeader, state)], &bad_state, sizeof(bad_state));
  write(SlotPath(root_, 3, 1), "");                      // touch ROOT/rank3.slot1
  write(SlotPath(root_, 4, 0), garbage.substr(0, 100));  // shorter than a header
  write(SlotPath(root_, 5, 0), garbage);                 // garbage state word
  std::string complete = garbage;                        // says complete, checksums wrong
  const uint32_t complete_state = static_cast<uint32_t>(SlotState::kComplete);
  std::memcpy(&complete[offsetof(SlotHeader, state)], &complete_state, sizeof(complete_state));
  write(SlotPath(root_, 6, 0), complete);
  StartAgent();
  EXPECT_FALSE(Exists(SlotPath(root_, 3, 1)));
  EXPECT_FALSE(Exists(SlotPath(root_, 4, 0)));
  EXPECT_FALSE(Exists(SlotPath(root_, 5, 0)));
  const std::string log = Log();
  EXPECT_NE(log.find("slot 1 of rank 3 is torn"), std::string::npos) << log;
  EXPECT_NE(log.find("slot 0 of rank 4 is torn"), std::string::npos) << log;
  EXPECT_NE(log.find("slot 0 of rank 5 is torn"), std::string::npos) << log;
  // A corrupt "complete" slot is reported and left out, as before.
  EXPECT_NE(log.find("dropped slot 0 of rank 6"), std::string::npos) << log;
  // The ranks whose slots were removed can seal again.
  int fd = Connect();
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(Ask(fd, json{{"op", "seal"}, {"rank", 3}, {"bytes", 8192}}).ok()) << Log();
  auto list = Ask(fd, json{{"op", "list"}, {"rank", 6}});
  EXPECT_TRUE(list.ok()) << list;
  close(fd);
  EXPECT_TRUE(Alive()) << Log();
}

TEST_F(AgentInputTest, HalfSentMessagesAreDroppedAndQuietConnectionsKept) {
  StartAgent();
  int quiet = Connect();  // says nothing until the end
  ASSERT_GE(quiet, 0);
  // Two stalled writers: one sent half a length, one a length and part of
  // the body it announced.
  int half_len = Connect();
  int half_body = Connect();
  ASSERT_GE(half_len, 0);
  ASSERT_GE(half_body, 0);
  ASSERT_EQ(send(half_len, "\x10\x00", 2, MSG_NOSIGNAL), 2);
  const char partial[] = "\x40\x00\x00\x00{\"op\":\"pi";
  ASSERT_EQ(send(half_body, partial, sizeof(partial) - 1, MSG_NOSIGNAL),
            static_cast<ssize_t>(sizeof(partial) - 1));
  // The agent answers each with the reason and closes it (after
  // kFrameTimeoutS; the test only bounds the wait generously).
  for (int fd : {half_len, half_body}) {
    Deadline d = Deadline::AfterSeconds(kFrameTimeoutS + 25);
    auto reply = RecvJson(fd, d);
    ASSERT_TRUE(reply.ok()) << reply.status();
    Status s = StatusFromJson(*reply);
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
    EXPECT_EQ(RecvFrame(fd, d).status().code(), StatusCode::kUnavailable) << "not closed";
    close(fd);
  }
  EXPECT_NE(Log().find("did not arrive"), std::string::npos) << Log();
  // The quiet connection was idle, not half-sent: it is still served.
  EXPECT_TRUE(Ask(quiet, json{{"op", "ping"}}).ok());
  close(quiet);
  EXPECT_TRUE(Alive()) << Log();
}

}  // namespace
}  // namespace memento::shm::testing
