// `memento bench memory [--no-sharded] [--cases dp4,dp2pp2] [--zero 0,1] [--policies
// replicate,xor,rs:2] [--preset small] [--steps 5] [--json]`: host memory and
// copy volume per node of the save path that runs, next to REFT's formula
// (issue 15, docs/reft.md section 6).
//
// Each case is a real `memento launch` job: 4 nodes, one rank per node,
// memento-trainer with a snapshot every step, the case's DP x PP, ZeRO stage
// and policy. The launcher measures every node root at the end
// (launch::MeasureNodeMemory, LaunchSummary::memory):
//
//   - T0: per rank of the node, the data bytes of its slot of the newest
//     committed step (one version; the other slot of the double buffer is
//     not counted);
//   - T1: the node's `red.<step>` entries of that step;
//   - resident: every file under the node root, allocated bytes (both slots,
//     every version the agent still holds, the commit word);
//   - the plan's bytes of the node (the launcher's plan, the agents' plan):
//     REFT's formulas (ARC 2W/m, AEC W/m + W/(m(m-1)), rs:f, AOR shard
//     copies, private peer copies; topo_test checks them).
//
// Prints one JSON object: per case `case`, `host_bytes_per_node` (T0 + T1 of
// the fullest node), `reft_bytes_per_node` (the plan's bytes of that node),
// `ratio`, `copy_bytes_per_step` (T0 bytes the node's ranks copy per
// snapshot), `full_copy_bytes_per_step` (the node's ranks' whole registered
// state), `plan_copy_bytes_per_step` (the node's own pieces: what REFT
// copies), `resident_bytes_per_node`, and every node's figures.
#if __has_include("launch/launcher.h")

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/log.h"
#include "launch/launcher.h"
#include "tools/command.h"
#include "tools/environment.h"
#include "tools/json_output.h"
#include "tools/trainer_binary.h"

namespace memento::tools {
namespace {

struct MemoryBenchOptions {
  std::vector<std::string> cases = {"dp4", "dp2pp2"};
  std::vector<int> zero = {0, 1};
  std::vector<std::string> policies = {"replicate", "xor", "rs:2"};
  std::string preset = "small";
  int steps = 5;
  std::string trainer;
  std::string run_dir;  // empty: /dev/shm/memento-bench-memory-<pid>
  bool json = true;
  bool sharded = true;  // memento launch's default; --no-sharded: whole slots (docs/reft.md)
};

struct Case {
  std::string name;
  int dp = 0, pp = 0;
};

Result<Case> ParseCase(const std::string& text) {
  if (text == "dp4") return Case{text, 4, 1};
  if (text == "dp2pp2") return Case{text, 2, 2};
  if (text == "dp1pp4") return Case{text, 1, 4};
  return InvalidArgumentError("--cases: unknown case '" + text +
                              "' (known: dp4, dp2pp2, dp1pp4; 4 nodes, one rank each)");
}

Result<nlohmann::json> RunCase(const MemoryBenchOptions& o, const Case& c, int zero,
                               const std::string& policy_text, const std::string& trainer,
                               const std::string& base) {
  constexpr int kNodes = 4;
  const std::string name = c.name + (zero ? "-zero1-" : "-zero0-") + policy_text;
  std::string job = "benchmem-" + c.name + "-z" + std::to_string(zero) + "-" + policy_text;
  std::replace(job.begin(), job.end(), ':', '-');
  launch::LaunchOptions lo;
  lo.job = job;
  lo.nodes = kNodes;
  lo.ranks_per_node = 1;
  lo.dp = c.dp;
  lo.pp = c.pp;
  lo.zero = zero;
  lo.policy = policy_text;
  lo.sharded = o.sharded;
  lo.run_dir = base + "/" + job;
  lo.max_restarts = 0;
  lo.quiet = true;
  lo.trainer = {trainer,   "--preset", o.preset,          "--steps", std::to_string(o.steps),
                "--batch", "8",        "--micro-batches", "2",       "--comm-timeout",
                "60",      "--quiet"};
  if (zero == 1) lo.trainer.push_back("--zero");
  MEMENTO_ASSIGN_OR_RETURN(auto launcher, launch::Launcher::Create(lo));
  struct Cleanup {  // the logs, on any way out
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{lo.run_dir};
  MEMENTO_ASSIGN_OR_RETURN(launch::LaunchSummary summary, launcher->Run());
  if (!summary.success) {
    return InternalError("case " + name + ": the job failed: " + summary.message);
  }
  if (summary.final_committed < 0) {
    return UnavailableError("case " + name +
                            ": no step committed before the trainers finished (a loaded "
                            "machine); run with more --steps");
  }
  if (summary.memory.size() != kNodes) {
    return InternalError("case " + name + ": " + std::to_string(summary.memory.size()) +
                         " of 4 nodes measured (see the log above)");
  }
  nlohmann::json per_node = nlohmann::json::array();
  int fullest = 0;
  double worst_ratio = 0;
  uint64_t full_copy_max = 0;
  for (int n = 0; n < kNodes; ++n) {
    const launch::NodeMemory& m = summary.memory[n];
    const launch::NodeMemory& f = summary.memory[fullest];
    if (m.t0_bytes + m.t1_bytes > f.t0_bytes + f.t1_bytes) fullest = n;
    nlohmann::json j = m.ToJson();
    worst_ratio = std::max(worst_ratio, j["ratio"].get<double>());
    full_copy_max = std::max(full_copy_max, m.full_bytes);
    per_node.push_back(std::move(j));
  }
  const launch::NodeMemory& fm = summary.memory[fullest];
  const uint64_t host = fm.t0_bytes + fm.t1_bytes, reft = fm.plan_total_bytes();
  nlohmann::json j = {{"case", name},
                      {"dp", c.dp},
                      {"pp", c.pp},
                      {"zero", zero},
                      {"policy", policy_text},
                      {"sharded", o.sharded},
                      {"committed_step", summary.final_committed},
                      {"fullest_node", fullest},
                      {"host_bytes_per_node", host},
                      {"reft_bytes_per_node", reft},
                      {"ratio", reft ? static_cast<double>(host) / reft : 0.0},
                      {"max_ratio", worst_ratio},
                      {"copy_bytes_per_step", fm.t0_bytes},
                      {"full_copy_bytes_per_step", full_copy_max},
                      {"plan_copy_bytes_per_step", fm.plan_piece_bytes},
                      {"resident_bytes_per_node", fm.resident_bytes},
                      {"t1_resident_bytes_per_node", fm.t1_resident_bytes},
                      {"nodes", per_node}};
  return j;
}

Result<nlohmann::json> Measure(const MemoryBenchOptions& o) {
  InitLogging("bench", LogOptionsFromEnvironment());
  if (o.steps < 1) return InvalidArgumentError("--steps must be >= 1");
  std::vector<Case> cases;
  for (const std::string& t : o.cases) {
    MEMENTO_ASSIGN_OR_RETURN(Case c, ParseCase(t));
    cases.push_back(c);
  }
  for (int z : o.zero) {
    if (z != 0 && z != 1) {
      return InvalidArgumentError("--zero: " + std::to_string(z) + " (only 0 and 1 are measured)");
    }
  }
  for (const std::string& p : o.policies) {
    MEMENTO_RETURN_IF_ERROR(topo::ParsePolicy(p).status().WithContext("--policies"));
  }
  MEMENTO_ASSIGN_OR_RETURN(std::string trainer, FindTrainer(o.trainer));
  const std::string base =
      o.run_dir.empty() ? "/dev/shm/memento-bench-memory-" + std::to_string(getpid()) : o.run_dir;
  nlohmann::json rows = nlohmann::json::array();
  for (const Case& c : cases) {
    for (int z : o.zero) {
      for (const std::string& p : o.policies) {
        MEMENTO_ASSIGN_OR_RETURN(nlohmann::json j, RunCase(o, c, z, p, trainer, base));
        std::fprintf(stderr, "bench memory: %s host %llu B/node, reft %llu B/node, ratio %.2f\n",
                     j["case"].get<std::string>().c_str(),
                     static_cast<unsigned long long>(j["host_bytes_per_node"].get<uint64_t>()),
                     static_cast<unsigned long long>(j["reft_bytes_per_node"].get<uint64_t>()),
                     j["ratio"].get<double>());
        rows.push_back(std::move(j));
      }
    }
  }
  std::error_code ec;
  if (o.run_dir.empty()) std::filesystem::remove_all(base, ec);
  return nlohmann::json{
      {"bench", "memory"}, {"preset", o.preset}, {"steps", o.steps}, {"nodes", 4}, {"cases", rows}};
}

void Setup(CLI::App& bench, CommandContext& ctx) {
  auto* cmd = bench.add_subcommand(
      "memory",
      "Host bytes and copy volume per node of a 4-node launch, next to REFT's formula (JSON)");
  auto o = std::make_shared<MemoryBenchOptions>();
  cmd->add_option("--cases", o->cases, "topologies on 4 nodes: dp4, dp2pp2, dp1pp4")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--zero", o->zero, "ZeRO stages to measure (0, 1)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--policies", o->policies, "policies (replicate, xor, rs:F, peer:M, none)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--preset", o->preset, "memento-trainer model preset (tiny, small, 100m)")
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "training steps per case (a snapshot every step)")
      ->capture_default_str();
  cmd->add_option("--trainer", o->trainer, "memento-trainer binary (default: next to memento)");
  cmd->add_option("--run-dir", o->run_dir,
                  "where the node roots go (default /dev/shm/memento-bench-memory-<pid>)");
  cmd->add_flag("--sharded,!--no-sharded", o->sharded,
                "sharded snapshots in every case, the default as in memento launch "
                "(docs/reft.md); --no-sharded: every rank's slot holds its whole state");
  cmd->add_flag("--json", o->json, "print JSON (always on)");
  cmd->callback([o, &ctx] {
    Result<nlohmann::json> j = Measure(*o);
    if (!j.ok()) {
      ctx.exit_code = ReportStatus(j.status());
      return;
    }
    memento::tools::PrintJson("memento.bench.memory/1", std::move(*j));
  });
}

}  // namespace
}  // namespace memento::tools

MEMENTO_REGISTER_BENCH(memory, memento::tools::Setup);

#endif
