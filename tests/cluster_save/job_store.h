// The coordination side of a test job in tests/cluster_save (cluster_save_test,
// agent_metrics_test, agent_recovery_test, multihost_netns_test): the job
// token in a file, an embedded store server, the commit coordinator of the
// member nodes, the job topology, and the reads the tests make of the store;
// waiting for an agent to be ready and stopping the processes at the end.
// Header only; the agents' and trainers' command lines are the tests' own.
#pragma once

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../shm/proc_util.h"
#include "common/clock.h"
#include "common/test_util.h"
#include "coord/commit.h"
#include "coord/embedded_store.h"
#include "coord/keys.h"
#include "coord/store.h"
#include "gtest/gtest.h"
#include "memento/status.h"
#include "net/job_token.h"
#include "topo/plan.h"
#include "topo/topology_json.h"

namespace memento::cluster_save_testing {

class JobStore {
 public:
  // Writes `secret` to `dir`/token (mode 0600), starts the store on `address`
  // (a free port) with that token, and the commit coordinator of job `job`
  // whose members are nodes 0 .. nodes-1 (none when !coordinator: the
  // agents' recovery leader coordinates, `memento agent
  // --coordinate-commits`). A failure fails the test (call under
  // ASSERT_NO_FATAL_FAILURE).
  void Start(const std::string& dir, const std::string& address, const std::string& job,
             const std::string& secret, int nodes, bool coordinator = true) {
    job_ = job;
    token_file_ = dir + "/token";
    {
      std::ofstream f(token_file_);
      f << secret;
    }
    chmod(token_file_.c_str(), 0600);
    auto token = net::JobToken::FromSecret(secret);
    ASSERT_TRUE(token.ok()) << token.status();
    auto server = coord::EmbeddedStoreServer::Start(address, 0, *token);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    url_ = "tcp://" + address + ":" + std::to_string(server_->port());
    if (!coordinator) return;
    std::set<std::string> members;
    for (int n = 0; n < nodes; ++n) members.insert(coord::NodeName(n));
    auto coordinator =
        coord::CommitCoordinator::Start(store(), job_, members, Deadline::AfterSeconds(10));
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = std::move(*coordinator);
  }

  // Publishes the job topology: `topology` under `policy` ("replicate",
  // "xor", ...), sharded snapshots when `sharded`.
  void SetTopology(const topo::Topology& topology, const std::string& policy,
                   bool sharded = false) {
    auto p = topo::ParsePolicy(policy);
    ASSERT_TRUE(p.ok()) << p.status();
    auto set = store()->Set(coord::JobKeys(job_).Topology(),
                            topo::JobTopologyToJson({topology, *p, sharded}).dump(),
                            Deadline::AfterSeconds(5));
    ASSERT_TRUE(set.ok()) << set.status();
  }

  // `nodes` nodes of one rank each, ZeRO-1, under `policy`.
  void SetUniformTopology(int nodes, const std::string& policy) {
    auto t = topo::Topology::Uniform(nodes, 1, 1, /*zero_stage=*/1, /*ranks_per_node=*/1);
    ASSERT_TRUE(t.ok()) << t.status();
    SetTopology(*t, policy);
  }

  // Stops the coordinator, then the store (after the agents are gone).
  void Stop() {
    coordinator_.reset();
    server_.reset();
  }

  coord::Store* store() const { return server_ == nullptr ? nullptr : &server_->store(); }
  const std::string& url() const { return url_; }
  const std::string& token_file() const { return token_file_; }

  // The job's newest committed step; -1 when none or unreadable.
  int64_t Committed() const {
    auto c = coord::ReadLatestCommit(*store(), job_, Deadline::AfterSeconds(5));
    return c.ok() ? *c : -1;
  }

 private:
  std::string job_;
  std::string token_file_;
  std::string url_;
  std::unique_ptr<coord::EmbeddedStoreServer> server_;
  std::unique_ptr<coord::CommitCoordinator> coordinator_;
};

// Waits up to 20 s for the agent `*pid` of node `n` to log "memento agent
// ready" in `log`. Fails the test when it does not, or when it exits (then
// *pid is -1).
inline void WaitAgentReady(pid_t* pid, const std::string& log, int n) {
  Deadline d = Deadline::AfterSeconds(20);
  while (memento::testing::ReadAll(log).find("memento agent ready") == std::string::npos) {
    ASSERT_FALSE(d.expired()) << "agent " << n << " did not start:\n"
                              << memento::testing::ReadAll(log);
    int st = 0;
    if (waitpid(*pid, &st, WNOHANG) == *pid) {
      *pid = -1;
      FAIL() << "agent " << n << " exited:\n" << memento::testing::ReadAll(log);
    }
    usleep(20000);
  }
}

// The end of a test: every trainer SIGKILLed, every agent stopped with
// SIGTERM (one that does not exit within 10 s fails the test). Entries <= 0
// are passed over.
inline void StopTrainersAndAgents(const std::vector<pid_t>& trainers,
                                  const std::vector<pid_t>& agents) {
  for (pid_t p : trainers) {
    if (p > 0) shm::testing::KillAndReap(p);
  }
  for (pid_t p : agents) {
    if (p > 0) {
      kill(p, SIGTERM);
      if (shm::testing::WaitExit(p, 10) == -1) ADD_FAILURE() << "an agent did not stop on SIGTERM";
    }
  }
}

}  // namespace memento::cluster_save_testing
