// The cluster tests' job runner (tests/cluster: cluster_test, sharded_test,
// durable_fallback_test, aor_test): the `memento launch` command line of a job
// of the test workload (workload.cc), running a launcher to its end, what it
// left (exit status, output, summary.json), and the bit-identity check of the
// workload's final state against its uninterrupted recomputation.
//
// Header only: each test is its own executable. The including test defines
// MEMENTO_BIN, and WORKLOAD_BIN for the workload's jobs (LaunchArgv, RunJob,
// the bit-identity checks); tests/cluster/CMakeLists.txt.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/subprocess.h"
#include "common/test_util.h"
#include "gtest/gtest.h"

namespace memento::cluster_testing {

using memento::testing::ReadAll;
using nlohmann::json;

// A job of the test workload: its topology, policy, failures to inject and
// the workload's own flags.
struct Job {
  int nodes = 4;
  int ranks_per_node = 1;
  int dp = 0, tp = 1, pp = 1, zero = 0;
  std::string policy = "xor";
  std::string inject;
  int steps = 40;
  int elements = 16384;
  int step_ms = 15;
  // The agents compute the plan ~50-100 ms after the last seal; steps taken
  // before that are never protected (and an early abandoned step was seen to
  // keep a short job from committing at all).
  int warmup_ms = 500;
  int max_restarts = 3;
  // The workload's --pace-commits: each step it wrote commits (or is let go)
  // before the next, so a loaded machine does not turn the job's steps into
  // skips (a kill "at step N" that never fires, no version after a recovery).
  bool pace_commits = false;
  std::vector<std::string> extra;  // more launch flags
  int world() const { return nodes * ranks_per_node; }
  int dp_size() const { return dp > 0 ? dp : world() / (tp * pp); }
};

// What a finished launcher left.
struct Outcome {
  ExitStatus exit;
  std::string output;   // the launcher's stdout + stderr
  json summary;         // its --summary-json; null when it wrote none
  std::string dir;      // launch.log, summary.json, run/ (the run directory)
  std::string out_dir;  // the trainers' outputs
};

inline std::string Logs(const Outcome& o) { return "launcher output:\n" + o.output; }

// Reads what a finished launcher left in `dir`: its output (launch.log) and
// its summary (summary.json).
inline void CollectOutcome(const std::string& dir, Outcome* o) {
  o->output = ReadAll(dir + "/launch.log");
  const std::string text = ReadAll(dir + "/summary.json");
  if (!text.empty()) o->summary = json::parse(text, nullptr, false);
}

// Runs the launcher command line `argv` (output to `dir`/launch.log, summary
// to `dir`/summary.json) and waits up to `timeout_s` for it to end; a
// launcher still running then is terminated and the test fails.
inline Outcome RunLaunch(const std::vector<std::string>& argv, const std::string& dir,
                         const std::string& out_dir, int timeout_s) {
  Outcome o;
  o.dir = dir;
  o.out_dir = out_dir;
  SpawnOptions so;
  so.argv = argv;
  so.log_path = dir + "/launch.log";
  auto p = Subprocess::Spawn(so);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return o;
  auto st = p->Wait(Deadline::AfterSeconds(timeout_s));
  if (!st.ok()) {
    p->Terminate(5);
    ADD_FAILURE() << "memento launch did not finish in " << timeout_s << " s";
    o.exit.code = -1;
  } else {
    o.exit = *st;
  }
  CollectOutcome(dir, &o);
  return o;
}

// The "<attempt> <step>" lines of a rank's restores.
inline std::vector<std::pair<int, int64_t>> Restores(const Outcome& o, int rank) {
  std::vector<std::pair<int, int64_t>> out;
  std::istringstream in(ReadAll(o.out_dir + "/rank" + std::to_string(rank) + ".restores"));
  int a;
  long long s;
  while (in >> a >> s) out.emplace_back(a, s);
  return out;
}

// Whether rank `rank` restored `step` in recovery attempt `attempt`.
inline bool Restored(const Outcome& o, int rank, int attempt, int64_t step) {
  for (auto [a, s] : Restores(o, rank)) {
    if (a == attempt && s == step) return true;
  }
  return false;
}

#ifdef WORKLOAD_BIN

// The `memento launch` command line of `job` (its run directory and summary
// under `dir`, the workload's outputs in `out_dir`).
inline std::vector<std::string> LaunchArgv(const Job& job, const std::string& dir,
                                           const std::string& job_name,
                                           const std::string& out_dir) {
  std::vector<std::string> argv = {MEMENTO_BIN,
                                   "launch",
                                   "--job",
                                   job_name,
                                   "--nodes",
                                   std::to_string(job.nodes),
                                   "--ranks-per-node",
                                   std::to_string(job.ranks_per_node),
                                   "--tp",
                                   std::to_string(job.tp),
                                   "--pp",
                                   std::to_string(job.pp),
                                   "--zero",
                                   std::to_string(job.zero),
                                   "--policy",
                                   job.policy,
                                   "--max-restarts",
                                   std::to_string(job.max_restarts),
                                   "--run-dir",
                                   dir + "/run",
                                   "--summary-json",
                                   dir + "/summary.json"};
  if (job.dp > 0) {
    argv.push_back("--dp");
    argv.push_back(std::to_string(job.dp));
  }
  if (!job.inject.empty()) {
    argv.push_back("--inject");
    argv.push_back(job.inject);
  }
  for (const auto& e : job.extra) argv.push_back(e);
  // MEMENTO_TEST_RECOVERY_BY=launcher|agents: who runs the whole-job
  // recoveries, unless the job names it (cluster_launcher_recovery_test runs
  // cluster cases with the launcher's own recovery; agents is the default).
  if (const char* by = std::getenv("MEMENTO_TEST_RECOVERY_BY");
      by != nullptr && *by != '\0' &&
      std::find(job.extra.begin(), job.extra.end(), "--recovery-by") == job.extra.end()) {
    argv.push_back("--recovery-by");
    argv.push_back(by);
  }
  for (const char* a : {"--", WORKLOAD_BIN}) argv.push_back(a);
  for (const std::string& a :
       {std::string("--steps"), std::to_string(job.steps), std::string("--elements"),
        std::to_string(job.elements), std::string("--step-ms"), std::to_string(job.step_ms),
        std::string("--warmup-ms"), std::to_string(job.warmup_ms), std::string("--out"), out_dir}) {
    argv.push_back(a);
  }
  if (job.pace_commits) argv.push_back("--pace-commits");
  return argv;
}

// Runs `job` under `dir` (job name `<name>-<pid>`, the workload's outputs in
// `dir`/out).
inline Outcome RunJob(const Job& job, const std::string& dir, const std::string& name,
                      int timeout_s = 150) {
  const std::string out_dir = dir + "/out";
  EXPECT_EQ(mkdir(out_dir.c_str(), 0700), 0);
  return RunLaunch(LaunchArgv(job, dir, name + "-" + std::to_string(getpid()), out_dir), dir,
                   out_dir, timeout_s);
}

// The digest of rank `rank`'s state after `job.steps` uninterrupted steps
// (the workload's --reference run; its output under `dir`).
inline std::string ReferenceDigest(const Job& job, int rank, const std::string& dir) {
  SpawnOptions so;
  so.argv = {WORKLOAD_BIN, "--reference",
             "--steps",    std::to_string(job.steps),
             "--elements", std::to_string(job.elements),
             "--rank",     std::to_string(rank),
             "--dp",       std::to_string(job.dp_size()),
             "--tp",       std::to_string(job.tp),
             "--pp",       std::to_string(job.pp),
             "--zero",     std::to_string(job.zero)};
  so.log_path = dir + "/reference" + std::to_string(rank);
  auto p = Subprocess::Spawn(so);
  if (!p.ok()) return "spawn failed: " + p.status().ToString();
  auto st = p->Wait(Deadline::AfterSeconds(60));
  if (!st.ok() || !st->ok()) return "reference failed";
  std::string d = ReadAll(so.log_path);
  while (!d.empty() && d.back() == '\n') d.pop_back();
  return d;
}

// Rank `rank` ended with the state of the uninterrupted computation and never
// loaded a state that differs from its recomputation.
inline void ExpectRankBitIdentical(const Job& job, const Outcome& o, int rank,
                                   const std::string& dir) {
  const std::string prefix = o.out_dir + "/rank" + std::to_string(rank);
  EXPECT_EQ(ReadAll(prefix + ".mismatch"), "") << "rank " << rank;
  EXPECT_EQ(ReadAll(prefix + ".digest"),
            std::to_string(job.steps) + " " + ReferenceDigest(job, rank, dir) + "\n")
      << "rank " << rank << "\n"
      << Logs(o);
}

// Every rank: ExpectRankBitIdentical.
inline void ExpectBitIdentical(const Job& job, const Outcome& o, const std::string& dir) {
  for (int r = 0; r < job.world(); ++r) ExpectRankBitIdentical(job, o, r, dir);
}

#endif  // WORKLOAD_BIN

}  // namespace memento::cluster_testing
