// `memento bench swift`: SWIFT recovery modes on the reference trainer
// under `memento launch` (docs/swift.md): a coordination store, one memento
// agent per node, the trainer's ranks as processes, memento snapshots every
// --save-every steps (the trainer's --memento-every). Each round runs, with
// the same model:
//   - failure-free baselines (step time; DP x PP, and DP 1 x PP without and
//     with the pipeline log: the log's overhead);
//   - one rank SIGKILLed at --kill-step (after it, or inside its optimizer
//     update) under `memento launch --recovery restart` and `undo` on DP x
//     PP, and `restart` and `log` on DP 1 x PP (log replay needs DP 1: with
//     DP replicas the trainer recovers from a replica).
// Per failure run, from the launcher's recovery report (--summary-json):
// time from the failure to the first step completed after the recovery,
// steps lost, processes restarted, steps and bytes replayed.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/subprocess.h"
#include "tools/command.h"
#include "tools/json_output.h"
#include "tools/trainer_binary.h"

namespace memento::tools {
namespace {

using json = nlohmann::json;

struct Args {
  bool json = false;
  std::string trainer;
  std::string preset = "small";
  int layers = 0;  // 0: the preset's
  int dp = 2, pp = 4;
  int nodes = 4;
  int micro_batches = 4;
  int steps = 24;
  int save_every = 8;
  int kill_step = 20;
  int kill_rank = -1;  // -1: a middle stage's rank (pp / 2, dp 0)
  std::string fail_point = "update";
  int rounds = 3;
  // Selective logging: one more log-replay failure run per group size
  // (--log-groups as given, parsed into log_groups; "" or "none": none).
  std::string log_groups_text = "1,2,4";
  std::vector<int> log_groups;
  double run_timeout_s = 600;
  bool keep = false;
  // One more undo failure run per round with the trainer's
  // --rebuild-all-groups (modes.undo_all_groups), before or after the undo
  // run in alternate rounds.
  bool compare_group_rebuild = false;
  // The run that logs one step in 4 (logging_overhead_pct_adjacent): its
  // own length and snapshot interval, ~115 logged steps per round.
  int overhead_steps = 480;
  int overhead_save_every = 120;
  bool overhead_only = false;  // only those runs
  // Per round also a control run: the same, logging no step in the windows
  // (--log-one-step-in 1000000000: only step 1), the same estimator on it.
  bool overhead_control = true;
  // The trainer's --log-copy in every log run (empty: the trainer's
  // default), to compare the copy worker with the inline copy.
  std::string log_copy;
};

struct RunOutput {
  std::vector<json> lines;  // every JSON line of the ranks' logs
  json summary;             // the launcher's --summary-json
  double wall_s = 0;
  std::vector<json> All(const char* key) const {
    std::vector<json> out;
    for (const json& j : lines)
      if (j.contains(key)) out.push_back(j[key]);
    return out;
  }
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

json Spread(const std::vector<double>& v) {
  if (v.empty()) return json::object();
  return {{"median", Median(v)},
          {"min", *std::min_element(v.begin(), v.end())},
          {"max", *std::max_element(v.begin(), v.end())},
          {"rounds", v}};
}

class Bench {
 public:
  Bench(const Args& a, std::string trainer, std::string memento, std::string base)
      : a_(a), trainer_(std::move(trainer)), memento_(std::move(memento)), base_(std::move(base)) {}

  // One `memento launch` run of the trainer on --nodes nodes; `recovery`:
  // the launcher's --recovery; `extra`: trainer flags; `steps` and
  // `save_every`: when > 0, instead of --steps and --save-every.
  Result<RunOutput> Run(const std::string& name, int dp, const std::string& recovery,
                        const std::vector<std::string>& extra, int steps = 0, int save_every = 0) {
    const int n = runs_++;
    const std::string dir = base_ + "/" + name + "." + std::to_string(n);
    if (mkdir(dir.c_str(), 0700) != 0) return ErrnoError("mkdir " + dir, errno);
    // Node roots in shared memory (the launcher's default place).
    const std::string job = "bench-swift-" + std::to_string(getpid()) + "-" + std::to_string(n);
    const std::string run_dir = "/dev/shm/memento-launch/" + job;
    const int world = dp * a_.pp;
    std::vector<std::string> argv = {memento_,
                                     "launch",
                                     "--quiet",
                                     "--job",
                                     job,
                                     "--nodes",
                                     std::to_string(a_.nodes),
                                     "--ranks-per-node",
                                     std::to_string(world / a_.nodes),
                                     "--dp",
                                     std::to_string(dp),
                                     "--pp",
                                     std::to_string(a_.pp),
                                     "--recovery",
                                     recovery,
                                     "--run-dir",
                                     run_dir,
                                     "--summary-json",
                                     dir + "/summary.json",
                                     "--",
                                     trainer_,
                                     "--preset",
                                     a_.preset,
                                     "--micro-batches",
                                     std::to_string(a_.micro_batches),
                                     "--batch",
                                     std::to_string(a_.micro_batches * dp),
                                     "--steps",
                                     std::to_string(steps > 0 ? steps : a_.steps),
                                     "--quiet",
                                     "--json",
                                     "--memento-every",
                                     std::to_string(save_every > 0 ? save_every : a_.save_every),
                                     "--comm-timeout",
                                     "60"};
    if (a_.layers > 0) argv.insert(argv.end(), {"--layers", std::to_string(a_.layers)});
    if (recovery == "log") {
      // The pipeline log in shared memory, a file per step.
      argv.insert(argv.end(), {"--pipeline-log-dir", run_dir + "/pipeline_log"});
      if (!a_.log_copy.empty()) argv.insert(argv.end(), {"--log-copy", a_.log_copy});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    SpawnOptions to;
    to.argv = argv;
    to.log_path = dir + "/launch.log";
    Stopwatch wall;
    auto child = Subprocess::Spawn(to);
    if (!child.ok()) return child.status();
    auto status = child->Wait(Deadline::AfterSeconds(a_.run_timeout_s));
    RunOutput out;
    out.wall_s = wall.Seconds();
    auto cleanup = [&] {
      if (a_.keep) return;
      std::error_code ec;
      std::filesystem::remove_all(run_dir, ec);
      std::filesystem::remove_all(dir, ec);
    };
    if (!status.ok() || !status->ok()) {
      if (!status.ok()) child->Terminate(1);
      const std::string tail = TailFile(to.log_path, 3000);
      cleanup();
      return InternalError("memento launch (" + name + ") " +
                           (status.ok() ? status->ToString() : std::string("timed out")) + ": " +
                           tail);
    }
    {
      std::ifstream in(dir + "/summary.json");
      std::stringstream ss;
      ss << in.rdbuf();
      out.summary = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    }
    for (int r = 0; r < world; ++r) {
      std::ifstream in(run_dir + "/logs/rank" + std::to_string(r) + ".log");
      std::string line;
      while (std::getline(in, line)) {
        const size_t pos = line.find('{');
        if (pos == std::string::npos) continue;
        auto j = json::parse(line.substr(pos), nullptr, /*allow_exceptions=*/false);
        if (!j.is_discarded() && j.is_object()) out.lines.push_back(std::move(j));
      }
    }
    cleanup();
    if (!out.summary.is_object()) return InternalError("run " + name + ": no launcher summary");
    return out;
  }

  // A run with a kill; the recovery figures from the launcher's report.
  // `log_group`: the trainer's --log-group-size (log mode; 0: not given).
  // `rebuild_all`: the trainer's --rebuild-all-groups.
  Result<json> Failure(const std::string& mode, int dp, int log_group = 0,
                       bool rebuild_all = false) {
    const int kill_rank = a_.kill_rank >= 0 ? a_.kill_rank : (a_.pp / 2) * dp;
    // The snapshots up to the kill are paced on their commits: the one
    // before the kill has committed when the kill comes however loaded the
    // machine, so steps_lost is the recovery mode's, not the commit lag's
    // (a restart resumes from the newest commit). These runs time the
    // recovery only.
    std::vector<std::string> extra = {"--fail-rank",
                                      std::to_string(kill_rank),
                                      "--fail-at-step",
                                      std::to_string(a_.kill_step),
                                      "--fail-point",
                                      a_.fail_point,
                                      "--memento-pace-commits",
                                      std::to_string(a_.kill_step / a_.save_every)};
    if (log_group > 0) extra.insert(extra.end(), {"--log-group-size", std::to_string(log_group)});
    if (rebuild_all) extra.push_back("--rebuild-all-groups");
    MEMENTO_ASSIGN_OR_RETURN(
        RunOutput out, Run(mode + ".dp" + std::to_string(dp) +
                               (log_group > 0 ? ".g" + std::to_string(log_group) : std::string()) +
                               (rebuild_all ? ".all" : ""),
                           dp, mode, extra));
    const json& recs = out.summary["recoveries"];
    if (!recs.is_array() || recs.size() != 1) {
      return InternalError("run " + mode + ": expected one recovery in the launcher's summary: " +
                           out.summary.dump());
    }
    const json& rep = recs[0];
    if (rep.value("mode", "") != mode) {
      return InternalError("run " + mode + ": the recovery ran as " + rep.value("mode", "?") +
                           " (fallback: " + rep.value("fallback", "") + ")");
    }
    if (rep.value("resume_s", -1.0) <= 0) {
      return InternalError("run " + mode + ": no resume time in the report: " + rep.dump());
    }
    // The newest step any rank had completed when the kill came: after step
    // N the killed rank had N; inside the update of N or in the middle of
    // its pipeline schedule (its first receive), N - 1; an in-process
    // report adds the survivors' newest (reached_step).
    int64_t reached = a_.fail_point == "step" ? a_.kill_step : a_.kill_step - 1;
    reached = std::max<int64_t>(reached, rep.value("reached_step", int64_t{-1}));
    json j;
    j["resume_s"] = rep["resume_s"].get<double>();
    j["steps_lost"] = std::max<int64_t>(0, reached - rep.value("step", int64_t{0}));
    j["processes_restarted"] = rep.value("processes_restarted", 0);
    j["resumed_from_step"] = rep.value("step", int64_t{-1});
    // The newest commit when the recovery decided (a restart resumes from it).
    j["committed_at_failure"] = rep.value("committed", int64_t{-1});
    if (mode == "log") {
      j["replayed_steps"] = rep.value("replayed_steps", int64_t{0});
      j["replayed_stages"] = rep.value("replayed_stages", 0);
      j["bytes_replayed"] = rep.value("bytes_replayed", uint64_t{0});
      // What the log held per step in this run, summed over the ranks.
      double bytes = 0;
      for (const json& r : out.All("rank_summary")) bytes += r.value("log_bytes_per_step", 0.0);
      j["log_bytes_per_step"] = bytes;
    }
    return j;
  }

  // Logging's overhead from one run that logs one step in kLogPeriod (4):
  // steps L (L % 4 == 1, logged), L + 1 (after it: the log's background
  // write of step L runs during it), L + 2 and L + 3 (clean). Per logged
  // step, with c the mean of the clean steps around it (L - 2, L - 1,
  // L + 2, L + 3), in percent of c:
  //   in_step = 100 (t_L - c) / c, after = 100 (t_{L+1} - c) / c,
  //   total = in_step + after: what logging one step costs, in percent of
  //   a step (the overhead when every step is logged).
  // Nearby steps share the machine's load, so the differences do not
  // measure the machine. Windows that touch a memento snapshot step (a
  // multiple of `every`) or the step after it (its fence) are left out.
  static constexpr int kLogPeriod = 4;
  struct Overheads {
    std::vector<double> total, in_step, after;
  };
  static Overheads LoggedStepOverheads(const RunOutput& out, int every) {
    Overheads o;
    for (const json& j : out.lines) {
      if (!j.contains("step_s") || !j.contains("steps")) continue;
      const std::vector<double> t = j["step_s"].get<std::vector<double>>();
      const int64_t last = j["steps"].get<int64_t>();
      const int64_t first = last - static_cast<int64_t>(t.size()) + 1;  // step of t[0]
      auto at = [&](int64_t s) { return t[s - first]; };
      auto near_snapshot = [&](int64_t s) { return s % every == 0 || (s - 1) % every == 0; };
      for (int64_t l = first + 2; l + 3 <= last; ++l) {
        if (l % kLogPeriod != 1) continue;
        bool clear = true;
        for (int64_t s = l - 2; s <= l + 3; ++s) clear = clear && !near_snapshot(s);
        if (!clear) continue;
        const double c = (at(l - 2) + at(l - 1) + at(l + 2) + at(l + 3)) / 4;
        if (c <= 0) continue;
        o.in_step.push_back(100.0 * (at(l) - c) / c);
        o.after.push_back(100.0 * (at(l + 1) - c) / c);
        o.total.push_back(o.in_step.back() + o.after.back());
      }
    }
    return o;
  }

  static double MedianStep(const RunOutput& out) {
    for (const json& j : out.lines)
      if (j.contains("median_step_s")) return j["median_step_s"].get<double>();
    return 0;
  }

 private:
  const Args& a_;
  std::string trainer_, memento_, base_;
  int runs_ = 0;
};

// "1,2,4" -> {1, 2, 4}; "" or "none" -> {} (no selective-logging runs).
Result<std::vector<int>> ParseLogGroups(const std::string& text) {
  std::vector<int> groups;
  if (text.empty() || text == "none") return groups;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    int g = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), g);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size()) {
      return InvalidArgumentError("--log-groups '" + text + "': '" + item +
                                  "' is not a group size (expected e.g. 1,2,4, or none)");
    }
    groups.push_back(g);
    begin = end + 1;
  }
  return groups;
}

Result<json> RunSwift(const Args& a) {
  if (a.fail_point != "step" && a.fail_point != "update" && a.fail_point != "pipeline") {
    return InvalidArgumentError("--fail-point " + a.fail_point +
                                ": expected step, update or pipeline");
  }
  if (a.dp < 2 || a.pp < 2) {
    return InvalidArgumentError("--dp " + std::to_string(a.dp) + " --pp " + std::to_string(a.pp) +
                                ": undo needs dp >= 2 and log replay pp >= 2");
  }
  if (a.kill_step <= a.save_every || a.kill_step >= a.steps || a.save_every < 1) {
    return InvalidArgumentError("--kill-step " + std::to_string(a.kill_step) +
                                " must lie after the first save (--save-every " +
                                std::to_string(a.save_every) + ") and before --steps " +
                                std::to_string(a.steps));
  }
  if (a.rounds < 1) return InvalidArgumentError("--rounds must be >= 1");
  if (a.overhead_steps < 3 || a.overhead_save_every < 1) {
    return InvalidArgumentError("--overhead-steps " + std::to_string(a.overhead_steps) +
                                " must be >= 3 and --overhead-save-every " +
                                std::to_string(a.overhead_save_every) + " >= 1");
  }
  for (int g : a.log_groups) {
    if (g < 1 || g > a.pp) {
      return InvalidArgumentError("--log-groups " + std::to_string(g) + " must be in 1..pp (" +
                                  std::to_string(a.pp) + ")");
    }
  }
  if (a.nodes < 1 || a.pp % a.nodes != 0) {
    return InvalidArgumentError("--nodes " + std::to_string(a.nodes) + " must divide --pp " +
                                std::to_string(a.pp) +
                                " (the DP 1 runs put pp ranks on the nodes)");
  }
  MEMENTO_ASSIGN_OR_RETURN(std::string trainer, FindTrainer(a.trainer));
  const std::string memento = SelfExe();
  if (memento.empty()) return InternalError("cannot read /proc/self/exe (the memento binary)");
  char tmpl[] = "/tmp/memento-bench-swift-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return ErrnoError("mkdtemp", errno);
  const std::string base = tmpl;
  Bench bench(a, trainer, memento, base);
  std::map<std::string, std::vector<double>> resume, lost, restarted, replayed, replayed_bytes,
      committed;
  // Selective logging, per group size G: resume_s, steps and stages
  // replayed, bytes replayed, log bytes per step.
  std::map<int, std::map<std::string, std::vector<double>>> groups;
  std::vector<double> step_dp, step_dp1, step_dp1_log, overhead, log_bytes, log_s, log_cpu;
  // The runs that log one step in Bench::kLogPeriod.
  Bench::Overheads odd_all, control_all;
  std::vector<double> odd_round_median, control_round_median;
  // Per round, the logging run's slowest rank: the trainer thread's CPU
  // seconds in the log per logged step, and that in percent of the run's
  // median step.
  std::vector<double> log_cpu_logged, log_cpu_pct;
  Stopwatch wall;
  Status failed;
  for (int round = 0; round < a.rounds && failed.ok(); ++round) {
    auto odd_run = [&]() -> Status {
      // The control before the logging run in odd rounds, after it in even.
      const bool control_first = a.overhead_control && round % 2 == 1;
      for (int k = 0; k < (a.overhead_control ? 2 : 1); ++k) {
        const bool control = a.overhead_control && (k == 0) == control_first;
        const std::string period = control ? "1000000000" : std::to_string(Bench::kLogPeriod);
        MEMENTO_ASSIGN_OR_RETURN(
            RunOutput out,
            bench.Run(control ? "logging.control" : "logging.period", 1, "log",
                      {"--log-one-step-in", period}, a.overhead_steps, a.overhead_save_every));
        const Bench::Overheads o = Bench::LoggedStepOverheads(out, a.overhead_save_every);
        Bench::Overheads& all = control ? control_all : odd_all;
        all.total.insert(all.total.end(), o.total.begin(), o.total.end());
        all.in_step.insert(all.in_step.end(), o.in_step.begin(), o.in_step.end());
        all.after.insert(all.after.end(), o.after.begin(), o.after.end());
        (control ? control_round_median : odd_round_median).push_back(Median(o.total));
        if (!control) {
          double cpu = 0;
          for (const json& r : out.All("rank_summary"))
            cpu = std::max(cpu, r.value("log_cpu_s_per_logged_step", 0.0));
          log_cpu_logged.push_back(cpu);
          const double step = Bench::MedianStep(out);
          log_cpu_pct.push_back(step > 0 ? 100.0 * cpu / step : 0.0);
        }
      }
      return Status::Ok();
    };
    if (a.overhead_only) {
      failed = odd_run();
      continue;
    }
    auto run = [&]() -> Status {
      MEMENTO_ASSIGN_OR_RETURN(RunOutput base_dp, bench.Run("baseline.dp", a.dp, "restart", {}));
      // The two runs logging_overhead_pct compares, in alternate order
      // (without the log first in the 1st, 3rd, ... round), so that a
      // machine whose load drifts during a round does not favour one side.
      RunOutput base_1, log_1;
      for (int k = 0; k < 2; ++k) {
        if ((k == 0) == (round % 2 == 0)) {
          MEMENTO_ASSIGN_OR_RETURN(base_1, bench.Run("baseline.dp1", 1, "restart", {}));
        } else {
          MEMENTO_ASSIGN_OR_RETURN(log_1, bench.Run("logging.dp1", 1, "log", {}));
        }
      }
      step_dp.push_back(Bench::MedianStep(base_dp));
      step_dp1.push_back(Bench::MedianStep(base_1));
      step_dp1_log.push_back(Bench::MedianStep(log_1));
      MEMENTO_RETURN_IF_ERROR(odd_run());
      overhead.push_back(100.0 * (step_dp1_log.back() - step_dp1.back()) / step_dp1.back());
      double bytes = 0, secs = 0, cpu = 0, ranks = 0;
      for (const json& r : log_1.All("rank_summary")) {
        bytes += r.value("log_bytes_per_step", 0.0);
        secs = std::max(secs, r.value("log_s_per_step", 0.0));
        cpu = std::max(cpu, r.value("log_cpu_s_per_step", 0.0));
        ranks += 1;
      }
      log_bytes.push_back(bytes);
      log_s.push_back(secs);
      log_cpu.push_back(cpu);
      struct FailureRun {
        std::string mode;
        int dp;
        bool rebuild_all;
      };
      std::vector<FailureRun> runs = {{"restart", a.dp, false},
                                      {"undo", a.dp, false},
                                      {"restart", 1, false},
                                      {"log", 1, false}};
      if (a.compare_group_rebuild) {
        // Next to the undo run: before it in the 1st, 3rd, ... round, after
        // it in the others.
        runs.insert(runs.begin() + (round % 2 == 0 ? 1 : 2), FailureRun{"undo", a.dp, true});
      }
      for (const auto& [mode, dp, rebuild_all] : runs) {
        MEMENTO_ASSIGN_OR_RETURN(json f, bench.Failure(mode, dp, 0, rebuild_all));
        const std::string key = dp == 1 && mode == "restart" ? "restart_dp1"
                                : rebuild_all                ? "undo_all_groups"
                                                             : mode;
        resume[key].push_back(f["resume_s"].get<double>());
        lost[key].push_back(f["steps_lost"].get<double>());
        restarted[key].push_back(f["processes_restarted"].get<double>());
        committed[key].push_back(f["committed_at_failure"].get<double>());
        if (f.contains("replayed_steps")) {
          replayed[key].push_back(f["replayed_steps"].get<double>());
          replayed_bytes[key].push_back(f["bytes_replayed"].get<double>());
        }
      }
      for (int g : a.log_groups) {
        MEMENTO_ASSIGN_OR_RETURN(json f, bench.Failure("log", 1, g));
        for (const char* k : {"resume_s", "steps_lost", "replayed_steps", "replayed_stages",
                              "bytes_replayed", "log_bytes_per_step"}) {
          groups[g][k].push_back(f[k].get<double>());
        }
      }
      return Status::Ok();
    };
    failed = run();
  }
  if (!a.keep) std::filesystem::remove_all(base);
  if (!failed.ok()) return failed;
  // The pooled adjacent-step differences: their median and a
  // distribution-free 95% interval for it (order statistics n/2 -+
  // 0.98 sqrt(n)); the goal (< 2 % of a step) is met when the whole
  // interval lies below 2, missed when it lies above.
  auto pooled = [](const Bench::Overheads& o, const std::vector<double>& round_medians) {
    std::vector<double> v = o.total;
    std::sort(v.begin(), v.end());
    json m = {{"median", Median(v)},
              {"samples", v.size()},
              {"round_medians", round_medians},
              {"in_step_median", Median(o.in_step)},
              {"after_median", Median(o.after)},
              {"log_one_step_in", Bench::kLogPeriod}};
    std::string goal = "no samples";
    if (!v.empty()) {
      const double n = static_cast<double>(v.size()), h = 0.98 * std::sqrt(n);
      const auto at = [&](double r) { return v[static_cast<size_t>(std::clamp(r, 0.0, n - 1))]; };
      const double lo = at(std::floor(n / 2 - h)), hi = at(std::ceil(n / 2 + h) - 1);
      m["ci95_low"] = lo;
      m["ci95_high"] = hi;
      goal = hi < 2.0   ? "met: the 95% interval lies below 2%"
             : lo > 2.0 ? "missed: the 95% interval lies above 2%"
                        : "not shown: the 95% interval contains 2% (more steps or a quieter "
                          "machine)";
    }
    m["goal_below_2pct"] = goal;
    return m;
  };
  json adjacent = pooled(odd_all, odd_round_median);
  adjacent["log_cpu_s_per_logged_step"] = Median(log_cpu_logged);
  adjacent["log_cpu_pct_of_step"] = Median(log_cpu_pct);
  adjacent["log_cpu_pct_of_step_rounds"] = log_cpu_pct;
  if (a.overhead_control) {
    // The same windows with nothing logged: what the estimator gives for
    // no logging at all (0 if the steps have no period-4 pattern of their
    // own).
    json c = pooled(control_all, control_round_median);
    c.erase("goal_below_2pct");
    c.erase("log_one_step_in");
    adjacent["control"] = c;
    adjacent["median_minus_control"] = adjacent["median"].get<double>() - c["median"].get<double>();
  }
  const json overhead_config = {{"preset", a.preset},
                                {"layers", a.layers},
                                {"pp", a.pp},
                                {"nodes", a.nodes},
                                {"micro_batches", a.micro_batches},
                                {"overhead_steps", a.overhead_steps},
                                {"overhead_save_every", a.overhead_save_every},
                                {"overhead_control", a.overhead_control},
                                {"rounds", a.rounds},
                                {"log_copy", a.log_copy.empty() ? "default" : a.log_copy}};
  if (a.overhead_only) {
    json o;
    o["bench"] = "swift";
    o["logging_overhead_pct_adjacent"] = adjacent;
    o["config"] = overhead_config;
    o["config"]["overhead_only"] = true;
    o["config"]["trainer"] = trainer;
    o["notes"] =
        "--overhead-only: per round one dp 1 run (memento launch, pipeline log in shared memory) "
        "whose trainer logs one step in 4 (--log-one-step-in 4); per logged step L, with c the "
        "mean time of the clean steps L-2, L-1, L+2, L+3: in_step 100 (t_L - c) / c, after "
        "100 (t_{L+1} - c) / c (the log's background write of L runs during L+1), total = their "
        "sum (the overhead if every step is logged), pooled over rounds: median and a "
        "distribution-free 95% interval of the median; windows touching a snapshot step or its "
        "fence left out; log_cpu_s_per_logged_step: the slowest rank's trainer-thread CPU "
        "seconds in the log per logged step (median over rounds), log_cpu_pct_of_step: that "
        "in percent of the run's median step; all nodes are processes on this machine";
    o["wall_s"] = wall.Seconds();
    return o;
  }
  json j;
  j["bench"] = "swift";
  j["modes"] = json::object();
  for (const auto& [key, v] : resume) {
    json m;
    const bool dp1 = key == "restart_dp1" || key == "log";
    const double step_s = Median(dp1 ? step_dp1 : step_dp);
    m["resume_s"] = Median(v);
    // The lost steps must be trained again: the time until the job is back
    // where it was, at the baseline's step time.
    m["regain_s"] = Median(v) + Median(lost[key]) * step_s;
    m["resume_s_spread"] = Spread(v);
    m["steps_lost"] = Median(lost[key]);
    m["processes_restarted"] = Median(restarted[key]);
    m["committed_at_failure"] = Median(committed[key]);
    if (replayed.count(key)) {
      m["replayed_steps"] = Median(replayed[key]);
      m["bytes_replayed"] = Median(replayed_bytes[key]);
    }
    m["topology"] = key == "restart_dp1" || key == "log"
                        ? "dp 1 x pp " + std::to_string(a.pp)
                        : "dp " + std::to_string(a.dp) + " x pp " + std::to_string(a.pp);
    j["modes"][key] = m;
  }
  const double restart = Median(resume["restart"]), restart1 = Median(resume["restart_dp1"]);
  if (resume.count("undo_all_groups")) {
    // Keeping the quiescent Gloo groups no lost rank is in, against
    // rebuilding every group (the same undo failure, alternate order).
    j["undo_vs_undo_all_groups"] = Median(resume["undo_all_groups"]) > 0
                                       ? Median(resume["undo"]) / Median(resume["undo_all_groups"])
                                       : 0.0;
  }
  j["undo_vs_restart"] = restart > 0 ? Median(resume["undo"]) / restart : 0.0;
  j["log_vs_restart_dp1"] = restart1 > 0 ? Median(resume["log"]) / restart1 : 0.0;
  j["undo_vs_restart_regain"] = j["modes"]["restart"]["regain_s"].get<double>() > 0
                                    ? j["modes"]["undo"]["regain_s"].get<double>() /
                                          j["modes"]["restart"]["regain_s"].get<double>()
                                    : 0.0;
  j["log_vs_restart_dp1_regain"] = j["modes"]["restart_dp1"]["regain_s"].get<double>() > 0
                                       ? j["modes"]["log"]["regain_s"].get<double>() /
                                             j["modes"]["restart_dp1"]["regain_s"].get<double>()
                                       : 0.0;
  if (!groups.empty()) {
    json lg = json::object();
    for (const auto& [g, v] : groups) {
      json m;
      for (const auto& [k, vals] : v) m[k] = Median(vals);
      m["resume_s_spread"] = Spread(v.at("resume_s"));
      lg[std::to_string(g)] = m;
    }
    j["log_groups"] = lg;
  }
  j["logging_overhead_pct"] = Median(overhead);
  j["logging_overhead_pct_spread"] = Spread(overhead);
  j["logging_overhead_pct_adjacent"] = adjacent;
  j["log_bytes_per_step"] = Median(log_bytes);
  j["log_copy_s_per_step"] = Median(log_s);
  j["log_cpu_s_per_step"] = Median(log_cpu);
  j["baseline"] = {{"step_s_dp", Spread(step_dp)},
                   {"step_s_dp1", Spread(step_dp1)},
                   {"step_s_dp1_logging", Spread(step_dp1_log)}};
  j["config"] = {{"preset", a.preset},
                 {"layers", a.layers},
                 {"dp", a.dp},
                 {"pp", a.pp},
                 {"nodes", a.nodes},
                 {"micro_batches", a.micro_batches},
                 {"steps", a.steps},
                 {"save_every", a.save_every},
                 {"kill_step", a.kill_step},
                 {"kill_rank", a.kill_rank},
                 {"fail_point", a.fail_point},
                 {"rounds", a.rounds},
                 {"log_groups", a.log_groups},
                 {"compare_group_rebuild", a.compare_group_rebuild},
                 {"overhead_steps", a.overhead_steps},
                 {"overhead_save_every", a.overhead_save_every},
                 {"log_copy", a.log_copy.empty() ? "default" : a.log_copy},
                 {"trainer", trainer}};
  j["notes"] =
      "every run is `memento launch` (store, one agent per node, memento snapshots every "
      "save_every steps) of the reference trainer; resume_s: the launcher's report, from it "
      "reaping the SIGKILLed rank to the first step the trainers completed after the recovery; "
      "steps_lost: newest step completed before the kill minus the step the job resumed from "
      "(restart: a lower bound, the killed survivors do not report); failure runs pace the "
      "snapshots up to the kill on their commits (memento-trainer --memento-pace-commits), so "
      "the snapshot before the kill has committed (committed_at_failure); regain_s: resume_s + "
      "steps_lost x the baseline's median step time; bytes_replayed: logged payload the log "
      "replacement replayed; logging_overhead_pct: median step time with the pipeline log "
      "against without (dp 1, no failure, separate runs: it also measures the machine); "
      "logging_overhead_pct_adjacent: one more dp 1 run per round that logs one step in 4 "
      "(--log-one-step-in 4; overhead_steps long, snapshots every overhead_save_every): per "
      "logged step, its time and the next step's (which the log's background write may slow) "
      "above the mean of the 4 clean steps around them, in percent of a step, pooled over rounds "
      "(median, 95% interval of the median, goal_below_2pct; in_step_median, after_median), "
      "snapshot steps left out; "
      "log_bytes_per_step summed over ranks; log_groups: "
      "per log group size G (selective logging), the log-replay failure run's resume_s, "
      "stages and steps replayed (summed over stages), bytes replayed and the log bytes per "
      "step over all ranks; all nodes "
      "are processes on this machine";
  j["wall_s"] = wall.Seconds();
  return j;
}

void Setup(CLI::App& bench, CommandContext& ctx) {
  auto args = std::make_shared<Args>();
  auto* cmd = bench.add_subcommand(
      "swift", "SWIFT recovery (restart, update-undo, log replay) on the reference trainer");
  cmd->add_flag("--json", args->json, "print JSON (the only format; accepted for symmetry)");
  cmd->add_option("--trainer", args->trainer, "memento-trainer binary (default: found)");
  cmd->add_option("--preset", args->preset, "trainer model preset")->capture_default_str();
  cmd->add_option("--layers", args->layers, "override the preset's layers (a multiple of --pp)");
  cmd->add_option("--dp", args->dp, "data-parallel size of the restart/undo runs")
      ->capture_default_str();
  cmd->add_option("--pp", args->pp, "pipeline stages")->capture_default_str();
  cmd->add_option("--nodes", args->nodes, "memento launch nodes (one agent each; must divide --pp)")
      ->capture_default_str();
  cmd->add_option("--micro-batches", args->micro_batches, "micro-batches per step")
      ->capture_default_str();
  cmd->add_option("--steps", args->steps, "steps per run")->capture_default_str();
  cmd->add_option("--save-every", args->save_every,
                  "memento's snapshot interval in steps (the trainer's --memento-every)")
      ->capture_default_str();
  cmd->add_option("--kill-step", args->kill_step, "the step at which a rank is killed")
      ->capture_default_str();
  cmd->add_option("--kill-rank", args->kill_rank,
                  "the rank killed (default: DP rank 0 of the middle stage)")
      ->capture_default_str();
  cmd->add_option("--fail-point", args->fail_point,
                  "step (after the step) | update (inside its optimizer update) | pipeline "
                  "(mid-step: at its first pipeline receive of that step)")
      ->capture_default_str();
  cmd->add_option("--rounds", args->rounds, "each round runs every baseline and mode once")
      ->capture_default_str();
  cmd->add_option("--log-groups", args->log_groups_text,
                  "selective logging: a log-replay failure run (DP 1) per log group size G (the "
                  "trainer's --log-group-size; each in 1..pp), reported under log_groups; "
                  "'none' (or '') for none")
      ->capture_default_str();
  cmd->add_flag("--compare-group-rebuild", args->compare_group_rebuild,
                "one more undo failure run per round whose trainers rebuild every Gloo group "
                "(--rebuild-all-groups), reported as modes.undo_all_groups, and "
                "undo_vs_undo_all_groups (resume_s medians); it runs before the undo run in the "
                "1st, 3rd, ... round, after it in the others");
  cmd->add_option("--overhead-steps", args->overhead_steps,
                  "steps of the run per round that logs one step in 4 "
                  "(logging_overhead_pct_adjacent)")
      ->capture_default_str();
  cmd->add_option("--overhead-save-every", args->overhead_save_every,
                  "memento's snapshot interval in that run (steps next to a snapshot are left "
                  "out of the comparison)")
      ->capture_default_str();
  cmd->add_flag("--overhead-control,!--no-overhead-control", args->overhead_control,
                "per round also a control run that logs no step in the compared windows, "
                "reported as logging_overhead_pct_adjacent.control (the estimator's zero; on by "
                "default)");
  cmd->add_option("--log-copy", args->log_copy,
                  "the trainer's --log-copy in every log run: thread | inline (default: the "
                  "trainer's, inline)");
  cmd->add_flag("--overhead-only", args->overhead_only,
                "run only the logging-overhead runs (--rounds of them) and report "
                "logging_overhead_pct_adjacent");
  cmd->add_flag("--keep", args->keep,
                "keep the work directory (launcher summaries) and the runs' /dev/shm run dirs "
                "(node roots, logs)");
  cmd->footer(kExitCodesFooter);
  cmd->callback([args, &ctx] {
    auto groups = ParseLogGroups(args->log_groups_text);
    if (!groups.ok()) {
      ctx.exit_code = ReportStatus(groups.status());
      return;
    }
    args->log_groups = std::move(*groups);
    auto r = RunSwift(*args);
    if (!r.ok()) {
      ctx.exit_code = ReportStatus(r.status());
      return;
    }
    memento::tools::PrintJson("memento.bench.swift/1", std::move(*r));
  });
}

}  // namespace

MEMENTO_REGISTER_BENCH(swift, Setup);

}  // namespace memento::tools
