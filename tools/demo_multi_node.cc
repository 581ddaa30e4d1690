// `memento demo` (tools/demo.h, docs/demo.md): `memento launch`'s Launcher
// runs memento-trainer (DP 2 x PP 2, ZeRO-1) on 4 simulated nodes with a
// trainer crash and a whole-node loss injected, then the same job without
// failures, and reports every recovery, the snapshot overhead, the bytes
// protected per node and whether the final parameters are bit-identical.
// Built only when the build has the launch layer (src/launch).
#if __has_include("launch/launcher.h")

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/byte_flag.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "launch/launcher.h"
#include "launch/node_memory.h"
#include "memento/client.h"
#include "shm/node_store.h"
#include "shm/protocol.h"
#include "shm/slot.h"
#include "shm/slot_format.h"
#include "tools/command.h"
#include "tools/demo.h"
#include "tools/environment.h"
#include "tools/trainer_binary.h"
#include "topo/plan.h"

namespace memento::tools {
namespace {

// The --trainer flag, else the memento-trainer next to this binary in a build
// tree, else on PATH (tools/trainer_binary.h); the launcher reports a missing one.
std::string TrainerPath(const std::string& given) {
  auto found = FindTrainer(given);
  return found.ok() ? *found : (given.empty() ? "memento-trainer" : given);
}

// One run of the job under the Launcher: its summary and what the trainers
// left behind (loss log, digests, the reporting rank's JSON summary, the
// bytes each node held at the end).
struct ClusterRun {
  std::string name;
  std::string dir;
  launch::LaunchSummary summary;
  double wall_s = 0;
  std::vector<std::pair<int64_t, std::string>> losses;     // (step, loss bits) in log order
  std::map<int, std::string> params_digest, state_digest;  // rank -> xxh3
  std::map<int, int64_t> final_step;
  nlohmann::json trainer_json;  // reporting rank, last attempt
  // The reporting rank's snapshot summary ("rank_summary" -> "snapshot"),
  // last attempt: its commit_lag (docs/cluster.md, "Commit lag").
  nlohmann::json snapshot_json;
  // Per node at the end, as the launcher measured it (LaunchSummary::memory),
  // with the plan's (REFT's) bytes; empty where a node was not measured.
  std::map<int, launch::NodeMemory> memory;
};

// Follows a trainer log while the job runs and echoes its progress lines.
class LogFollower {
 public:
  LogFollower(std::string path, std::string prefix)
      : path_(std::move(path)), prefix_(std::move(prefix)) {}
  void Poll() {
    std::ifstream in(path_);
    if (!in) return;
    in.seekg(static_cast<std::streamoff>(offset_));
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t end = chunk.rfind('\n');
    if (end == std::string::npos) return;
    offset_ += end + 1;
    std::istringstream lines(chunk.substr(0, end + 1));
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("progress ", 0) == 0 || line.find("restored step") != std::string::npos ||
          line.rfind("---- memento launch", 0) == 0 || line.find(": step ") != std::string::npos) {
        std::printf("%s%s\n", prefix_.c_str(), line.c_str());
        std::fflush(stdout);
      }
    }
  }

 private:
  std::string path_, prefix_;
  size_t offset_ = 0;
};

Result<ClusterRun> RunCluster(const DemoArgs& a, const std::string& name, const std::string& dir,
                              const std::string& inject, int64_t steps) {
  ClusterRun run;
  run.name = name;
  run.dir = dir;
  const std::string out = dir + "/out";
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return ErrnoError("mkdir " + out, ec.value());
  launch::LaunchOptions o;
  o.job = "demo-" + name;
  if (!a.store_url.empty()) {
    // A long-lived external store (etcd) refuses a job name that already has
    // commits there: each demo run gets its own.
    o.store_url = a.store_url;
    o.job += fmt::format("-{}-{}", getpid(), WallNanos() / 1000000 % 1000000000);
  }
  o.nodes = a.nodes;
  o.ranks_per_node = 1;
  o.dp = a.dp;
  o.pp = a.pp;
  o.zero = 1;
  o.policy = a.policy;
  // REFT's save path (docs/reft.md section 1): each rank snapshots only the
  // pieces of replicated state the plan gives it (--no-sharded: whole state).
  o.sharded = a.sharded;
  o.inject = inject;
  o.run_dir = dir + "/run";
  o.keep_run_dir = true;  // measured below, then removed with `dir`
  o.max_restarts = 4;
  o.trainer = {TrainerPath(a.trainer_bin), "--preset", a.preset, "--steps", std::to_string(steps),
               "--zero", "--batch", "8", "--micro-batches", "2", "--warmup", "10",
               "--progress-every", std::to_string(a.progress_every), "--loss-log",
               out + "/loss.txt",
               // Not "{rank}": the launcher substitutes that; the trainer
               // appends ".rank<k>".
               "--digest-file", out + "/digest", "--json", "--comm-timeout", "30"};
  MEMENTO_ASSIGN_OR_RETURN(auto launcher, launch::Launcher::Create(o));
  // The reporting rank: dp 0, tp 0, last pipeline stage.
  const int reporter = (a.pp - 1) * a.dp;
  LogFollower follow(o.run_dir + "/logs/rank" + std::to_string(reporter) + ".log",
                     "  [" + name + " rank " + std::to_string(reporter) + "] ");
  Stopwatch wall;
  Result<launch::LaunchSummary> summary = InternalError("not run");
  std::atomic<bool> done{false};
  std::thread runner([&] {
    summary = launcher->Run();
    done.store(true);
  });
  while (!done.load()) {
    follow.Poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  runner.join();
  follow.Poll();
  run.wall_s = wall.Seconds();
  if (!summary.ok()) return summary.status();
  run.summary = *summary;
  for (const launch::NodeMemory& m : run.summary.memory) run.memory[m.node] = m;
  {
    std::ifstream in(out + "/loss.txt");
    int64_t step;
    std::string loss, bits, gn;
    while (in >> step >> loss >> bits >> gn) run.losses.emplace_back(step, bits);
  }
  for (int r = 0; r < a.dp * a.pp; ++r) {
    std::ifstream in(out + "/digest.rank" + std::to_string(r));
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_object()) {
      run.params_digest[r] = j.value("params_xxh3", "");
      run.state_digest[r] = j.value("state_xxh3", "");
      run.final_step[r] = j.value("step", int64_t{-1});
    }
  }
  {
    std::ifstream in(o.run_dir + "/logs/rank" + std::to_string(reporter) + ".log");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("{\"rank_summary\"", 0) == 0) {
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_object() && j["rank_summary"].contains("snapshot")) {
          run.snapshot_json = j["rank_summary"]["snapshot"];
        }
        continue;
      }
      if (line.rfind("{\"params\"", 0) != 0) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object()) run.trainer_json = j;
    }
  }
  return run;
}

// The step each recovery interrupted. The reporting rank's loss log runs
// 1, 2, ..., h_k (attempt k), then r_k + 1, ... (attempt k + 1) after the
// recovery that restored r_k <= h_k: a visible restart (the log drops back
// to r_k + 1) when steps were lost, none when h_k == r_k. Recoveries happen
// in order, so the first restart after the previous one is recovery k's when
// it drops to r_k + 1; otherwise recovery k lost nothing.
std::vector<int64_t> StepsHit(const ClusterRun& run) {
  std::vector<int64_t> hits;
  const auto& l = run.losses;
  size_t pos = 0;
  for (const launch::RecoveryReport& rec : run.summary.recoveries) {
    int64_t hit = rec.step;
    size_t drop = 0;
    for (size_t i = pos + 1; i < l.size() && drop == 0; ++i) {
      if (l[i].first <= l[i - 1].first) drop = i;
    }
    if (drop != 0 && l[drop].first == rec.step + 1) {
      hit = l[drop - 1].first;
      pos = drop;
    } else {
      // Invisible restart: attempt k + 1 begins at the first r_k + 1 after pos.
      for (size_t i = pos; i < l.size(); ++i) {
        if (l[i].first == rec.step + 1) {
          pos = i;
          break;
        }
      }
    }
    hits.push_back(hit);
  }
  return hits;
}

}  // namespace

int RunMultiNodeDemo(const DemoArgs& a, int64_t steps) {
  // The store and the coordinator run in this process: their info lines
  // (every commit) would drown the report. Children keep the default level.
  LogOptions log = LogOptionsFromEnvironment();
  if (log.level.empty()) log.level = "warn";
  InitLogging("demo", log);
  Stopwatch total;
  char tmpl[] = "/dev/shm/memento-demo-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return ReportStatus(ErrnoError("mkdtemp", errno));
  const std::string work = tmpl;
  const int world = a.dp * a.pp;
  std::string inject;
  if (a.kill_rank_at > 0) {
    inject = fmt::format("kill-rank:{}@step={}", a.kill_rank, a.kill_rank_at);
  }
  if (a.kill_node_at > 0) {
    if (!inject.empty()) inject += ",";
    inject += fmt::format("kill-node:{}@step={}", a.kill_node, a.kill_node_at);
  }
  std::printf(
      "memento demo: %d nodes (one agent and one trainer rank each), DP %d x PP %d with ZeRO-1, "
      "memento-trainer preset '%s', %lld steps, a snapshot every step, policy %s, %s "
      "snapshots, AOR (each node recomputes a peer's optimizer shard on the host).\n"
      "Run 1 injects %s; run 2 is the same job without failures.\nworking directory: %s\n",
      a.nodes, a.dp, a.pp, a.preset.c_str(), static_cast<long long>(steps), a.policy.c_str(),
      a.sharded ? "sharded" : "whole-state", inject.empty() ? "nothing" : inject.c_str(),
      work.c_str());
  std::fflush(stdout);
  auto finish = [&](int rc) {
    if (a.keep || rc != 0) {
      std::printf("kept %s (logs under */run/logs)\n", work.c_str());
    } else {
      std::error_code ec;
      std::filesystem::remove_all(work, ec);
    }
    return rc;
  };

  std::printf("== run 1: with failures ==\n");
  std::fflush(stdout);
  auto failed = RunCluster(a, "failures", work + "/failures", inject, steps);
  if (!failed.ok()) {
    std::printf("run 1 could not run: %s\n", failed.status().ToString().c_str());
    return finish(1);
  }
  std::printf("run 1: %s", failed->summary.ToString().c_str());
  if (!failed->summary.success) {
    std::printf("RESULT: run 1 did not finish (%s); logs in %s/failures/run/logs\n",
                failed->summary.message.c_str(), work.c_str());
    return finish(1);
  }
  std::printf("== run 2: the same job without failures ==\n");
  std::fflush(stdout);
  auto clean = RunCluster(a, "reference", work + "/reference", "", steps);
  if (!clean.ok()) {
    std::printf("run 2 could not run: %s\n", clean.status().ToString().c_str());
    return finish(1);
  }
  std::printf("run 2: %s", clean->summary.ToString().c_str());
  if (!clean->summary.success) {
    std::printf("RESULT: run 2 did not finish (%s); logs in %s/reference/run/logs\n",
                clean->summary.message.c_str(), work.c_str());
    return finish(1);
  }

  // ---- the report ----
  std::printf("\n==== memento demo report ====\n");
  std::printf("run 1 (failures): %s in %.1f s, %d attempt(s); run 2 (reference): %s in %.1f s\n",
              failed->summary.success ? "finished" : "FAILED", failed->wall_s,
              failed->summary.attempts, clean->summary.success ? "finished" : "FAILED",
              clean->wall_s);
  const std::vector<int64_t> hits = StepsHit(*failed);
  std::printf("failures and recoveries:\n");
  for (size_t k = 0; k < failed->summary.recoveries.size(); ++k) {
    const launch::RecoveryReport& r = failed->summary.recoveries[k];
    const int64_t hit = hits[k];
    std::printf(
        "  %zu. %s: hit at step %lld (committed %lld), restored step %lld, %lld step(s) lost; "
        "recovery %.2f s = detect %.2f + restart %.2f + inventory/plan %.3f + transfer %.3f + "
        "decode %.3f + write %.3f (+ trainers restart and restore)%s\n",
        k + 1, r.cause.c_str(), static_cast<long long>(hit), static_cast<long long>(r.committed),
        static_cast<long long>(r.step), static_cast<long long>(std::max<int64_t>(0, hit - r.step)),
        r.total_s, r.detect_s, r.restart_s, r.inventory_plan_s, r.transfer_s, r.decode_s, r.write_s,
        r.lost_nodes.empty()
            ? ""
            : fmt::format("; node(s) lost: {}, {:.1f} MiB rebuilt from peers' memory{}",
                          fmt::join(r.lost_nodes, ","), r.rebuilt_bytes / 1048576.0,
                          r.source == "memory (aor replica)"
                              ? " (the lost optimizer shard from a peer's AOR replica)"
                              : "")
                  .c_str());
  }
  if (failed->summary.recoveries.empty()) std::printf("  (none)\n");
  const nlohmann::json& tj = clean->trainer_json;
  if (tj.is_object()) {
    const double step_s = tj.value("mean_step_s", 0.0);
    const double over_s = tj.value("mean_fence_s", 0.0) + tj.value("mean_snapshot_s", 0.0);
    std::printf(
        "snapshot overhead per step (run 2, reporting rank): %.3f ms of %.2f ms (%.1f%%): "
        "Fence %.3f ms + Snapshot %.3f ms; %lld parameters\n",
        over_s * 1e3, step_s * 1e3, step_s > 0 ? 100 * over_s / step_s : 0.0,
        tj.value("mean_fence_s", 0.0) * 1e3, tj.value("mean_snapshot_s", 0.0) * 1e3,
        static_cast<long long>(tj.value("params", int64_t{0})));
  }
  // Commit lag as the reporting rank saw it (its last attempt): how many
  // Snapshot() calls after its own a version was seen committed, and how far
  // each Snapshot() was ahead of the newest commit (what a failure then
  // loses).
  for (const ClusterRun* run : {&*failed, &*clean}) {
    const nlohmann::json& sj = run->snapshot_json;
    if (!sj.is_object() || !sj.contains("commit_lag")) {
      std::printf("commit lag (%s): not reported\n", run->name.c_str());
      continue;
    }
    const nlohmann::json& cl = sj["commit_lag"];
    std::printf(
        "commit lag (%s, reporting rank, last attempt): %lld versions seen committed after "
        "p50 %.0f / p90 %.0f / max %.0f steps, %.3f / %.3f / %.3f s; each snapshot was p50 "
        "%.0f / p90 %.0f / max %.0f steps ahead of the newest commit (%lld snapshots)\n",
        run->name.c_str(), static_cast<long long>(cl.value("versions", int64_t{0})),
        cl.value("steps_p50", -1.0), cl.value("steps_p90", -1.0), cl.value("steps_max", -1.0),
        cl.value("s_p50", -1.0), cl.value("s_p90", -1.0), cl.value("s_max", -1.0),
        cl.value("behind_p50", -1.0), cl.value("behind_p90", -1.0), cl.value("behind_max", -1.0),
        static_cast<long long>(cl.value("samples", int64_t{0})));
  }
  auto policy = topo::ParsePolicy(a.policy);
  std::printf(
      "bytes protected per node (run 2, end; %s snapshots; T0 = the node's ranks' newest "
      "version, T1 = redundancy it holds for the others; REFT = the plan's bytes, the formula "
      "%s, docs/reft.md):\n",
      a.sharded ? "sharded" : "whole-state (--no-sharded)",
      policy.ok() ? launch::ReftFormula(*policy).c_str() : a.policy.c_str());
  for (int i = 0; i < a.nodes; ++i) {
    const launch::NodeMemory m = clean->memory.count(i) ? clean->memory[i] : launch::NodeMemory{};
    const uint64_t reft = m.plan_total_bytes();
    std::printf(
        "  node%d: T0 %.2f MiB (copied per snapshot, of %.2f MiB registered), T1 %.2f MiB; "
        "REFT %.2f MiB (own pieces %.2f + copies %.2f + parity %.2f), %.2fx\n",
        i, m.t0_bytes / 1048576.0, m.full_bytes / 1048576.0, m.t1_bytes / 1048576.0,
        reft / 1048576.0, m.plan_piece_bytes / 1048576.0, m.plan_copy_bytes / 1048576.0,
        m.plan_parity_bytes / 1048576.0,
        reft ? static_cast<double>(m.t0_bytes + m.t1_bytes) / reft : 0.0);
  }
  std::printf("durable tier: not configured in this demo (restore from memory only)\n");
  bool same = failed->summary.success && clean->summary.success;
  for (int r = 0; r < world; ++r) {
    const bool eq = failed->params_digest.count(r) && clean->params_digest.count(r) &&
                    !clean->params_digest[r].empty() &&
                    failed->params_digest[r] == clean->params_digest[r] &&
                    failed->state_digest[r] == clean->state_digest[r] &&
                    failed->final_step[r] == steps && clean->final_step[r] == steps;
    std::printf(
        "  rank %d: step %lld params %s state %s | reference step %lld params %s state %s%s\n", r,
        static_cast<long long>(failed->final_step[r]), failed->params_digest[r].c_str(),
        failed->state_digest[r].c_str(), static_cast<long long>(clean->final_step[r]),
        clean->params_digest[r].c_str(), clean->state_digest[r].c_str(),
        eq ? "" : "  <- DIFFERENT");
    same &= eq;
  }
  // A run whose injections never fired proves nothing about recovery.
  const size_t injected = (a.kill_rank_at > 0 ? 1 : 0) + (a.kill_node_at > 0 ? 1 : 0);
  if (failed->summary.recoveries.size() < injected) {
    std::printf(
        "  only %zu of the %zu injected failures happened: the launcher fires an injection when "
        "the job reaches its step (committed or signalled COMPLETED); run 1's newest committed "
        "step was %lld\n",
        failed->summary.recoveries.size(), injected,
        static_cast<long long>(failed->summary.final_committed));
    same = false;
  }
  // The losses of the steps both runs logged last agree bit for bit too.
  if (!failed->losses.empty() && !clean->losses.empty()) {
    same &= failed->losses.back() == clean->losses.back();
  }
  if (failed->summary.recoveries.size() < injected) {
    std::printf(
        "RESULT: the demo did NOT show a recovery: %zu of %zu injected failures happened "
        "(%.1f s in all)\n",
        failed->summary.recoveries.size(), injected, total.Seconds());
  } else {
    std::printf(
        "RESULT: the final parameters %s bit-identical to the failure-free run (%.1f s in "
        "all)\n",
        same ? "ARE" : "are NOT", total.Seconds());
  }
  return finish(same ? 0 : 1);
}

}  // namespace memento::tools

#endif  // __has_include("launch/launcher.h")
