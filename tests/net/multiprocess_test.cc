// Multi-process coordination tests (Gloo MultiProcTest style): the store runs
// in its own process (net_store_helper), clients in forked processes, and
// failures are real kill -9s.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "common/test_util.h"
#include "coord/commit.h"
#include "coord/embedded_store.h"
#include "coord/membership.h"

namespace memento::coord {
namespace {

constexpr const char* kToken = "multiprocess-test-token-0123456789";
net::JobToken Token() { return net::JobToken::FromSecret(kToken).value(); }
Deadline Soon() { return Deadline::AfterSeconds(15); }

// A store process. Start(0) picks an ephemeral port; Start(p) reuses one.
class StoreProcess {
 public:
  ~StoreProcess() { Kill9(); }
  void Start(int port) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    std::string addr = "127.0.0.1:" + std::to_string(port);
    setenv("MEMENTO_JOB_TOKEN", kToken, 1);
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec (the parent has threads).
      dup2(fds[1], 1);
      close(fds[0]);
      execl(MEMENTO_STORE_HELPER, MEMENTO_STORE_HELPER, addr.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    std::string out;
    Deadline d = Soon();
    while (out.find('\n') == std::string::npos && !d.expired()) {
      pollfd p{fds[0], POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[64];
      ssize_t n = read(fds[0], buf, sizeof(buf));
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    close(fds[0]);
    ASSERT_EQ(out.rfind("PORT ", 0), 0u) << "store helper said: '" << out << "'";
    port_ = std::stoi(out.substr(5));
  }
  void Kill9() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int st;
      waitpid(pid_, &st, 0);
      pid_ = -1;
    }
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

// Runs `body` in a forked child; returns its exit status (0 = success).
template <typename Fn>
pid_t ForkChild(Fn body) {
  pid_t pid = fork();
  if (pid == 0) _exit(body() ? 0 : 1);
  return pid;
}

int WaitChild(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

TEST(MultiProcessTest, ClientProcessesRaceOnCompareAndSwap) {
  StoreProcess store;
  ASSERT_NO_FATAL_FAILURE(store.Start(0));
  constexpr int kProcs = 4, kIncrements = 25;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    kids.push_back(ForkChild([&] {
      StoreClient c("127.0.0.1", store.port(), Token());
      for (int i = 0; i < kIncrements; ++i) {
        for (;;) {
          auto cur = c.Get("/ctr", Soon());
          std::optional<std::string> expected;
          long v = 0;
          if (cur.ok()) {
            expected = cur->value;
            v = std::stol(cur->value);
          } else if (cur.status().code() != StatusCode::kNotFound) {
            return false;
          }
          auto r = c.CompareAndSwap("/ctr", expected, std::to_string(v + 1), Soon());
          if (!r.ok()) return false;
          if (r->swapped) break;
        }
        if (!c.Add("/adds", 1, Soon()).ok()) return false;
      }
      return true;
    }));
  }
  for (pid_t k : kids) EXPECT_EQ(WaitChild(k), 0);
  StoreClient c("127.0.0.1", store.port(), Token());
  EXPECT_EQ(c.Get("/ctr", Soon())->value, std::to_string(kProcs * kIncrements));
  EXPECT_EQ(c.Get("/adds", Soon())->value, std::to_string(kProcs * kIncrements));
}

TEST(MultiProcessTest, KilledAgentProcessGoesOffline) {
  StoreProcess store;
  ASSERT_NO_FATAL_FAILURE(store.Start(0));
  pid_t agent = ForkChild([&] {
    StoreClient c("127.0.0.1", store.port(), Token());
    MembershipOptions o;
    o.job = "job";
    o.node = "n7";
    o.endpoint = "127.0.0.1:1";
    o.ttl_s = 0.5;
    auto m = Membership::Join(&c, o, Soon());
    if (!m.ok()) return false;
    if (!(*m)->SetSignal(NodeSignal::kCompleted, 3, "", Soon()).ok()) return false;
    pause();  // heartbeats until killed
    return true;
  });
  StoreClient c("127.0.0.1", store.port(), Token());
  auto state_of = [&]() -> std::optional<NodeState> {
    auto states = ReadClusterState(c, "job", Soon());
    if (!states.ok()) return std::nullopt;
    for (auto& s : *states) {
      if (s.node == "n7") return s;
    }
    return std::nullopt;
  };
  Deadline d = Soon();
  while (!d.expired()) {
    auto s = state_of();
    if (s && s->record.signal == NodeSignal::kCompleted) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(state_of() && state_of()->alive);
  // Stays alive across several TTLs, then dies for real.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  ASSERT_TRUE(state_of()->alive);
  kill(agent, SIGKILL);
  EXPECT_EQ(WaitChild(agent), 128 + SIGKILL);
  d = Soon();
  while (!d.expired() && state_of()->alive)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto s = state_of();
  ASSERT_TRUE(s);
  EXPECT_FALSE(s->alive);
  EXPECT_EQ(s->record.signal, NodeSignal::kOffline);
  EXPECT_EQ(s->record.step, 3);
}

// Three agents (threads here, each with its own store client, commit log and
// membership) and a coordinator; the store process is killed with SIGKILL and
// restarted empty on the same port. The agents re-register and republish
// their commit records, so the new store knows the last commit, and the next
// step commits as usual.
TEST(MultiProcessTest, StoreKilledAndRestartedIsRepopulatedFromAgents) {
  testing::ScratchDir dir("net-mp");
  StoreProcess store;
  ASSERT_NO_FATAL_FAILURE(store.Start(0));
  int port = store.port();
  const std::vector<std::string> nodes = {"n0", "n1", "n2"};
  struct Agent {
    std::unique_ptr<StoreClient> client;
    std::unique_ptr<CommitLog> log;
    std::unique_ptr<Membership> membership;
    std::unique_ptr<CommitFollower> follower;
  };
  std::vector<Agent> agents(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    Agent& a = agents[i];
    a.client = std::make_unique<StoreClient>("127.0.0.1", port, Token());
    a.log = CommitLog::Open(dir.path() + "/" + nodes[i] + ".log").value();
    MembershipOptions o;
    o.job = "job";
    o.node = nodes[i];
    o.endpoint = "127.0.0.1:" + std::to_string(7000 + i);
    o.ttl_s = 0.6;
    StoreClient* client = a.client.get();
    CommitLog* log = a.log.get();
    o.on_reregister = [client, log] {
      return RepublishCommits(*client, "job", *log, Deadline::AfterSeconds(5));
    };
    auto m = Membership::Join(client, o, Soon());
    ASSERT_TRUE(m.ok()) << m.status();
    a.membership = std::move(m).value();
    auto f = CommitFollower::Start(client, "job", log, nullptr, Soon());
    ASSERT_TRUE(f.ok()) << f.status();
    a.follower = std::move(f).value();
  }
  StoreClient coord_client("127.0.0.1", port, Token());
  auto coordinator = CommitCoordinator::Start(&coord_client, "job", {"n0", "n1", "n2"}, Soon());
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();

  auto report_all = [&](int64_t step) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      ASSERT_TRUE(agents[i].membership->SetSignal(NodeSignal::kCompleted, step, "", Soon()).ok());
      Status s = ReportCompleted(*agents[i].client, "job", nodes[i], step, Soon());
      ASSERT_TRUE(s.ok()) << s;
    }
  };
  auto wait_followers = [&](int64_t step) {
    Deadline d = Soon();
    for (auto& a : agents) {
      while (a.follower->last_seen() < step && !d.expired()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      EXPECT_EQ(a.follower->last_seen(), step);
      EXPECT_EQ(a.log->latest()->step, step);
    }
  };
  report_all(1);
  wait_followers(1);
  report_all(2);
  wait_followers(2);

  store.Kill9();
  ASSERT_NO_FATAL_FAILURE(store.Start(port));
  ASSERT_EQ(store.port(), port);

  // The new store is repopulated by the agents: commit record and members.
  StoreClient probe("127.0.0.1", port, Token());
  Deadline d = Soon();
  bool repopulated = false;
  while (!d.expired() && !repopulated) {
    auto latest = ReadLatestCommit(probe, "job", Deadline::AfterSeconds(1));
    auto states = ReadClusterState(probe, "job", Deadline::AfterSeconds(1));
    size_t alive = 0;
    if (states.ok()) {
      for (const auto& s : *states) alive += s.alive && s.record.signal == NodeSignal::kCompleted;
    }
    size_t back = 0;
    for (auto& a : agents) back += a.membership->reregistrations() >= 1;
    repopulated = latest.ok() && *latest == 2 && alive == nodes.size() && back == nodes.size();
    if (!repopulated) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(repopulated) << "the restarted store was not repopulated by the agents";

  // Training goes on: step 3 commits on the new store.
  report_all(3);
  wait_followers(3);
  EXPECT_EQ(*ReadLatestCommit(probe, "job", Soon()), 3);
  EXPECT_EQ((*coordinator)->committed(), 3);
  coordinator->reset();
  for (auto& a : agents) {
    a.follower.reset();
    a.membership.reset();
  }
}

}  // namespace
}  // namespace memento::coord
