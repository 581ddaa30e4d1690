// `memento agent --metrics-listen` and MEMENTO_LOG_FORMAT=json against a real
// job (docs/operating.md): an embedded store and a commit coordinator in this
// process, two `memento agent --store ...` processes (one node each, own
// shared-memory root, a durable directory, a fast scrub), two trainer
// processes (cluster_trainer.cc) in lockstep. The test scrapes every agent's
// endpoint over HTTP while the job runs and after it, and checks the values
// against what the job did: the snapshots and skips each trainer reported
// (its progress file), the slot sizes in the slot headers and files, the
// commit in the store, a slot corrupted on purpose that the scrub must count.
// Every line each agent wrote must be one JSON object.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "../shm/proc_util.h"
#include "common/check.h"
#include "common/metrics.h"
#include "common/test_util.h"
#include "coord/commit.h"
#include "coord/embedded_store.h"
#include "coord/keys.h"
#include "coord/membership.h"
#include "job_store.h"
#include "shm/node_store.h"
#include "shm/segment.h"
#include "shm/shm_test_util.h"
#include "shm/slot.h"
#include "topo/plan.h"
#include "topo/topology_json.h"

namespace memento {
namespace {

using shm::testing::Spawn;
using shm::testing::WaitExit;

constexpr int kNodes = 2;
constexpr const char* kJob = "metricsjob";
constexpr const char* kSecret = "agent-metrics-test-token-0123456789abcdef";

using memento::testing::ReadAll;

// The C (fenced) and K (skipped) lines of a trainer's progress file, and the
// steps of its C lines.
void CountProgress(const std::string& path, int64_t* completed, int64_t* skipped,
                   std::set<int64_t>* written = nullptr) {
  *completed = *skipped = 0;
  std::istringstream in(ReadAll(path));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("C ", 0) == 0) {
      ++*completed;
      if (written != nullptr) written->insert(std::stoll(line.substr(2)));
    }
    if (line.rfind("K ", 0) == 0) ++*skipped;
  }
}

class AgentMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(job_store_.Start(tmp_.path(), "127.0.0.1", kJob, kSecret, kNodes));
    ASSERT_NO_FATAL_FAILURE(job_store_.SetUniformTopology(kNodes, "replicate"));
  }
  void TearDown() override {
    for (pid_t p : trainers_) {
      if (p > 0) shm::testing::KillAndReap(p);
    }
    StopAgents();
    job_store_.Stop();
  }
  void StopAgents() {
    for (pid_t& p : agents_) {
      if (p > 0) {
        kill(p, SIGTERM);
        if (WaitExit(p, 10) == -1) ADD_FAILURE() << "an agent did not stop on SIGTERM";
        p = -1;
      }
    }
  }

  std::string Root(int node) { return shm_.path() + "/node" + std::to_string(node); }
  std::string Log(const std::string& name) { return tmp_.path() + "/" + name + ".log"; }
  std::string ProgressPath(int rank) { return tmp_.path() + "/progress" + std::to_string(rank); }

  void StartAgents() {
    const std::string url = job_store_.url();
    for (int n = 0; n < kNodes; ++n) {
      agents_.push_back(Spawn({MEMENTO_BIN,
                               "agent",
                               "--job",
                               kJob,
                               "--node",
                               std::to_string(n),
                               "--root",
                               Root(n),
                               "--store",
                               url,
                               "--token-file",
                               job_store_.token_file(),
                               "--listen",
                               "127.0.0.1:0",
                               "--hold-timeout",
                               "60",  // a slow commit under load is not let go
                               "--metrics-listen",
                               "127.0.0.1:0",
                               "--durable-dir",
                               tmp_.path() + "/durable",
                               "--persist-every",
                               "1",
                               "--scrub-interval",
                               "0.2",
                               "--scrub-rate",
                               "1G"},
                              Log("agent" + std::to_string(n)), {"MEMENTO_LOG_FORMAT=json"}));
    }
    for (int n = 0; n < kNodes; ++n) {
      const std::string log = Log("agent" + std::to_string(n));
      Deadline d = Deadline::AfterSeconds(20);
      for (;;) {
        std::istringstream in(ReadAll(log));
        std::string line;
        bool ready = false;
        while (std::getline(in, line)) {
          auto j = nlohmann::json::parse(line, nullptr, false);
          if (!j.is_discarded() && j.value("event", "") == "ready") {
            metrics_.push_back(j.at("metrics").get<std::string>());
            ready = true;
          }
        }
        if (ready) break;
        ASSERT_FALSE(d.expired()) << "agent " << n << " did not start:\n" << ReadAll(log);
        int st = 0;
        if (waitpid(agents_[n], &st, WNOHANG) == agents_[n]) {
          agents_[n] = -1;
          FAIL() << "agent " << n << " exited:\n" << ReadAll(log);
        }
        usleep(20000);
      }
    }
  }

  // GET http://<metrics_[node]>/metrics; every sample line well-formed.
  std::string Scrape(int node) {
    const std::string& addr = metrics_.at(node);
    const size_t colon = addr.rfind(':');
    httplib::Client c(addr.substr(0, colon), std::stoi(addr.substr(colon + 1)));
    c.set_connection_timeout(5);
    c.set_read_timeout(10);
    auto res = c.Get("/metrics");
    if (!res) {
      ADD_FAILURE() << "GET http://" << addr << "/metrics: " << httplib::to_string(res.error());
      return "";
    }
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->get_header_value("Content-Type"), kMetricsContentType);
    static const std::regex kSample(R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? -?[0-9.e+-]+$)");
    std::istringstream in(res->body);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) continue;
      EXPECT_TRUE(std::regex_match(line, kSample)) << "not a sample line: " << line;
    }
    auto other = c.Get("/other");
    EXPECT_TRUE(other && other->status == 404);
    return res->body;
  }

  static double Value(const std::string& text, const std::string& name,
                      const std::string& labels = "") {
    double v = 0;
    EXPECT_TRUE(FindMetric(text, name, labels, &v)) << name << "{" << labels << "} missing in\n"
                                                    << text;
    return v;
  }

  int64_t Committed() { return job_store_.Committed(); }

  // Data bytes of a complete slot of `rank` (its header), 0 when none.
  uint64_t SlotDataBytes(int rank) {
    for (int s = 0; s < 2; ++s) {
      auto seg = shm::Segment::Open(shm::SlotPath(Root(rank), rank, s), false);
      if (!seg.ok()) continue;
      auto info = shm::ReadSlot(**seg);
      if (info.ok() && info->state == shm::SlotState::kComplete) return info->data_bytes;
    }
    return 0;
  }

  uint64_t SlotFileBytes(int node) {
    uint64_t n = 0;
    for (int s = 0; s < 2; ++s) {
      struct stat st {};
      if (stat(shm::SlotPath(Root(node), node, s).c_str(), &st) == 0) n += st.st_size;
    }
    return n;
  }

  memento::testing::ScratchDir tmp_{"agent-metrics"};
  shm::testing::ShmScratchDir shm_{"agent-metrics"};
  cluster_save_testing::JobStore job_store_;
  std::vector<pid_t> agents_;
  std::vector<pid_t> trainers_;
  std::vector<std::string> metrics_;  // by node
};

TEST_F(AgentMetricsTest, ScrapedValuesMatchWhatTheJobDid) {
  ASSERT_NO_FATAL_FAILURE(StartAgents());
  // Before any trainer: the endpoint answers, nothing counted yet.
  for (int n = 0; n < kNodes; ++n) {
    const std::string text = Scrape(n);
    EXPECT_EQ(Value(text, "memento_snapshots_total"), 0);
    EXPECT_EQ(Value(text, "memento_committed_step"), -1);
  }
  constexpr int64_t kSteps = 8;
  const std::string barrier = tmp_.path() + "/barrier";
  mkdir(barrier.c_str(), 0700);
  for (int r = 0; r < kNodes; ++r) {
    trainers_.push_back(Spawn({CLUSTER_TRAINER_BIN,
                               "--job",
                               kJob,
                               "--dir",
                               Root(r),
                               "--rank",
                               std::to_string(r),
                               "--world",
                               std::to_string(kNodes),
                               "--bytes",
                               std::to_string(1 << 20),
                               "--steps",
                               std::to_string(kSteps),
                               "--step-sleep",
                               "0.1",
                               "--progress",
                               ProgressPath(r),
                               "--barrier",
                               barrier,
                               "--pace-commits"},
                              Log("trainer" + std::to_string(r))));
  }
  // During the job: scrapes succeed and the counters never go down.
  double last_snapshots[kNodes] = {0, 0};
  // (The trainers wait for each step's commit, --pace-commits: on a loaded
  // machine they otherwise skipped every step after an early one that was
  // still waiting for its commit, and the job ended with 2 commits.)
  for (Deadline d = Deadline::AfterSeconds(30); Committed() < 3 && !d.expired();) {
    for (int n = 0; n < kNodes; ++n) {
      const std::string text = Scrape(n);
      const double s = Value(text, "memento_snapshots_total");
      EXPECT_GE(s, last_snapshots[n]);
      last_snapshots[n] = s;
    }
    usleep(100000);
  }
  for (int r = 0; r < kNodes; ++r) {
    int st = WaitExit(trainers_[r], 60);
    trainers_[r] = -1;
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << "trainer " << r << ":\n"
        << ReadAll(ProgressPath(r)) << ReadAll(Log("trainer" + std::to_string(r)));
  }
  // The step each rank wrote last: kSteps, unless the rank skipped it (the
  // durable hold of an older step can keep a paced trainer off its slot),
  // and the newest step both wrote: the newest that can commit.
  int64_t last_written[kNodes];
  std::set<int64_t> written[kNodes];
  for (int r = 0; r < kNodes; ++r) {
    int64_t completed = 0, skipped = 0;
    CountProgress(ProgressPath(r), &completed, &skipped, &written[r]);
    last_written[r] = written[r].empty() ? -1 : *written[r].rbegin();
  }
  int64_t last_both = -1;
  for (int64_t s : written[0]) {
    if (written[1].count(s) > 0) last_both = s;
  }
  // The last commit (every node reported it) and the durable write of it.
  int64_t committed = Committed();
  for (Deadline d = Deadline::AfterSeconds(20); !d.expired(); usleep(50000)) {
    committed = Committed();
    bool persisted = true;
    for (int n = 0; n < kNodes; ++n) {
      double v = -1;
      FindMetric(Scrape(n), "memento_persist_last_step", "", &v);
      persisted = persisted && v == committed;
    }
    if (committed >= last_both && persisted) break;
  }
  ASSERT_GE(committed, 3);
  EXPECT_EQ(committed, last_both) << "the newest step both ranks wrote did not commit";

  for (int n = 0; n < kNodes; ++n) {
    SCOPED_TRACE("node " + std::to_string(n));
    const std::string text = Scrape(n);
    int64_t completed = 0, skipped = 0;
    CountProgress(ProgressPath(n), &completed, &skipped);
    ASSERT_GT(completed, 0);
    EXPECT_EQ(completed + skipped, kSteps);
    // One rank per node: its fenced snapshots and skips.
    EXPECT_EQ(Value(text, "memento_snapshots_total"), completed);
    EXPECT_EQ(Value(text, "memento_snapshots_skipped_total"), skipped);
    const uint64_t data_bytes = SlotDataBytes(n);
    ASSERT_GT(data_bytes, uint64_t{1} << 20);  // params + the rank's shard + cursor
    EXPECT_EQ(Value(text, "memento_snapshot_bytes_total"),
              static_cast<double>(data_bytes) * completed);
    EXPECT_GT(Value(text, "memento_snapshot_seconds_total"), 0);
    EXPECT_EQ(Value(text, "memento_rank_snapshot_step", "rank=\"" + std::to_string(n) + "\""),
              last_written[n]);
    // Commits: the store's, this node's reports, the lag of each.
    EXPECT_EQ(Value(text, "memento_committed_step"), committed);
    EXPECT_EQ(Value(text, "memento_restore_target_step"), committed);
    // (A step of this rank's that the other skipped may have been reported.)
    const double reported = Value(text, "memento_reported_step");
    EXPECT_TRUE(reported == committed || reported == last_written[n]) << reported;
    EXPECT_EQ(Value(text, "memento_commit_lag_steps"), last_written[n] - committed);
    EXPECT_GE(Value(text, "memento_commit_lag_measured_total"), 1);
    EXPECT_GE(Value(text, "memento_redundancy_versions_total", "outcome=\"produced\""),
              Value(text, "memento_commit_lag_measured_total"));
    // Replicate: this node pushed a copy of its rank's state to the other.
    EXPECT_GE(Value(text, "memento_redundancy_pushed_bytes_total"), data_bytes);
    EXPECT_GT(Value(text, "memento_shm_bytes", "kind=\"redundancy\""), 0);
    // Shared memory: the slot files on disk.
    EXPECT_EQ(Value(text, "memento_shm_bytes", "kind=\"slots\""), SlotFileBytes(n));
    EXPECT_EQ(Value(text, "memento_shm_budget_bytes"), 0);
    // The durable tier wrote the newest commit.
    EXPECT_EQ(Value(text, "memento_persist_last_step"), committed);
    EXPECT_GE(Value(text, "memento_persist_versions_total", "outcome=\"persisted\""), 1);
    EXPECT_GT(Value(text, "memento_persist_bytes_total"), 0);
    // No recovery ran.
    EXPECT_EQ(Value(text, "memento_recovery_rebuilds_total", "outcome=\"ok\""), 0);
    EXPECT_EQ(Value(text, "memento_scrub_corrupt_slots"), 0);
  }

  // A flipped byte in node 1's newest slot (the step rank 1 wrote last): the
  // scrub finds it, the metric says so (the trainers are gone, nothing
  // rewrites the slot).
  {
    int victim = -1;
    for (int s = 0; s < 2 && victim < 0; ++s) {
      auto seg = shm::Segment::Open(shm::SlotPath(Root(1), 1, s), true);
      ASSERT_TRUE(seg.ok()) << seg.status();
      auto info = shm::ReadSlot(**seg);
      if (info.ok() && info->state == shm::SlotState::kComplete && info->step == last_written[1]) {
        (*seg)->data()[info->data_offset + 17] ^= 0x40;
        victim = s;
      }
    }
    ASSERT_GE(victim, 0) << "node 1 holds no complete slot of step " << last_written[1];
    double corrupt = 0;
    for (Deadline d = Deadline::AfterSeconds(30); !d.expired() && corrupt < 1; usleep(100000)) {
      FindMetric(Scrape(1), "memento_scrub_corrupt_slots", "", &corrupt);
    }
    EXPECT_EQ(corrupt, 1);
    EXPECT_GE(Value(Scrape(1), "memento_scrub_passes_total"), 1);
    EXPECT_EQ(Value(Scrape(0), "memento_scrub_corrupt_slots"), 0);
  }

  // Every line each agent wrote is one JSON object, the ready line included.
  StopAgents();
  for (int n = 0; n < kNodes; ++n) {
    std::istringstream in(ReadAll(Log("agent" + std::to_string(n))));
    std::string line;
    int lines = 0;
    bool saw_scrub_error = false;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << "agent " << n << " wrote a line that is not JSON: " << line;
      ASSERT_TRUE(j.is_object()) << line;
      ASSERT_TRUE(j.contains("msg")) << line;
      if (j.value("level", "") == "error" &&
          j["msg"].get<std::string>().find("scrub: rank 1 slot") != std::string::npos) {
        saw_scrub_error = true;
      }
      ++lines;
    }
    EXPECT_GT(lines, 3);
    if (n == 1) {
      EXPECT_TRUE(saw_scrub_error) << "the scrub's finding was not logged as an error";
    }
  }
}

TEST_F(AgentMetricsTest, ABadListenAddressIsNamed) {
  const std::string log = Log("bad");
  pid_t p = Spawn({MEMENTO_BIN, "agent", "--job", kJob, "--root", Root(0), "--metrics-listen",
                   "127.0.0.1:notaport"},
                  log);
  int st = WaitExit(p, 20);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_NE(WEXITSTATUS(st), 0);
  EXPECT_NE(ReadAll(log).find("--metrics-listen"), std::string::npos) << ReadAll(log);
}

}  // namespace
}  // namespace memento
