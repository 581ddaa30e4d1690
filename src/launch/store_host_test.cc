// StoreHost: the launcher's store in its three modes, with a real `memento
// store` child process that is SIGKILLed and restarted empty on its address.
#include "launch/store_host.h"

#include <unistd.h>

#include <csignal>

#include "common/test_util.h"
#include "coord/commit.h"
#include "gtest/gtest.h"

namespace memento::launch {
namespace {

class StoreHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto token = net::JobToken::Generate();
    ASSERT_TRUE(token.ok());
    token_ = std::make_unique<net::JobToken>(std::move(*token));
    token_path_ = dir_.path() + "/job.token";
    ASSERT_TRUE(token_->WriteFile(token_path_).ok());  // mode 0600
  }

  StoreHostOptions ProcessOptions() const {
    StoreHostOptions o;
    o.mode = StoreMode::kProcess;
    o.memento_binary = MEMENTO_BIN;
    o.token_path = token_path_;
    o.log_path = dir_.path() + "/store.log";
    o.port_file = dir_.path() + "/store.port";
    return o;
  }

  testing::ScratchDir dir_{"store-host"};
  std::unique_ptr<net::JobToken> token_;
  std::string token_path_;
};

TEST_F(StoreHostTest, InProcessCannotBeKilled) {
  StoreHostOptions o;
  auto h = StoreHost::Start(o, *token_, Deadline::AfterSeconds(10));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ((*h)->url().rfind("tcp://127.0.0.1:", 0), 0u) << (*h)->url();
  ASSERT_TRUE((*h)->store().Set("/k", "v", Deadline::AfterSeconds(5)).ok());
  Status st = (*h)->Kill();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("--store-process"), std::string::npos) << st;
  EXPECT_FALSE((*h)->PollExited().has_value());
}

TEST_F(StoreHostTest, ProcessKilledAndRestartedEmptyOnTheSameAddress) {
  auto h = StoreHost::Start(ProcessOptions(), *token_, Deadline::AfterSeconds(30));
  ASSERT_TRUE(h.ok()) << h.status();
  StoreHost& host = **h;
  const std::string url = host.url();
  const pid_t first = host.pid();
  ASSERT_GT(first, 0);
  coord::Store& store = host.store();
  ASSERT_TRUE(store.Set("/memento/j/x", "1", Deadline::AfterSeconds(5)).ok());
  auto before = store.List("/memento/", Deadline::AfterSeconds(5));
  ASSERT_TRUE(before.ok());

  ASSERT_TRUE(host.Kill().ok());
  EXPECT_EQ(host.pid(), -1);
  EXPECT_FALSE(host.PollExited().has_value()) << "a kill is not an unexpected exit";
  EXPECT_FALSE(store.Get("/memento/j/x", Deadline::AfterSeconds(0.3)).ok());
  // Restart brings a fresh, empty store onto the same address.
  ASSERT_TRUE(host.Restart(Deadline::AfterSeconds(30)).ok());
  EXPECT_EQ(host.url(), url);
  EXPECT_GT(host.pid(), 0);
  EXPECT_NE(host.pid(), first);
  // The same client reaches the new store: empty, with a new epoch.
  auto kv = store.Get("/memento/j/x", Deadline::AfterSeconds(5));
  EXPECT_EQ(kv.status().code(), StatusCode::kNotFound) << kv.status();
  auto after = store.List("/memento/", Deadline::AfterSeconds(5));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_NE(after->epoch, before->epoch);
  EXPECT_TRUE(after->kvs.empty());

  // A store process that dies on its own is reported once.
  ASSERT_EQ(kill(host.pid(), SIGKILL), 0);
  std::optional<ExitStatus> exited;
  for (Deadline d = Deadline::AfterSeconds(10); !d.expired() && !exited;) {
    exited = host.PollExited();
    usleep(5000);
  }
  ASSERT_TRUE(exited.has_value());
  EXPECT_EQ(exited->signal, SIGKILL);
  ASSERT_TRUE(host.Restart(Deadline::AfterSeconds(30)).ok());
  EXPECT_TRUE(store.Set("/memento/j/y", "2", Deadline::AfterSeconds(5)).ok());
  host.Stop();
  EXPECT_EQ(host.pid(), -1);
}

TEST_F(StoreHostTest, ExternalStore) {
  // Someone else's store: here an in-process one.
  auto server = coord::EmbeddedStoreServer::Start("127.0.0.1", 0, *token_);
  ASSERT_TRUE(server.ok()) << server.status();
  StoreHostOptions o;
  o.mode = StoreMode::kExternal;
  o.url = "tcp://127.0.0.1:" + std::to_string((*server)->port());
  o.token_path = token_path_;
  auto h = StoreHost::Start(o, *token_, Deadline::AfterSeconds(10));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ((*h)->url(), o.url);
  ASSERT_TRUE((*h)->store().Set("/a", "b", Deadline::AfterSeconds(5)).ok());
  auto kv = (*server)->store().Get("/a", Deadline::AfterSeconds(5));
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->value, "b");
  EXPECT_EQ((*h)->Kill().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*h)->Restart(Deadline::AfterSeconds(1)).code(), StatusCode::kFailedPrecondition);

  o.url = "nope://somewhere:2379";
  auto bad = StoreHost::Start(o, *token_, Deadline::AfterSeconds(2));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
}

}  // namespace
}  // namespace memento::launch
