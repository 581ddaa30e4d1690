// `memento bench has --loop trainer` (the default on the CPU): REFT's HAS
// against its baselines on the reference trainer.
//
// Every run is a real job: `memento-trainer --launch` with a pipeline (PP 2
// by default, several micro-batches, so the 1F1B schedule has real bubbles),
// and, except for `off`, a real `memento agent` per node under a private
// /dev/shm root and a fresh job id, so nothing is restored and every step is
// snapshotted through the memento client into the agent's slots. The mode is
// the trainer's `--snapshot-mode` (examples/trainer/memento_hooks.h):
//   off          no memento
//   sync         Snapshot(step) + Fence() at once: a blocking copy
//   host         eager copy engine, one chunk per tensor, right after the step
//   host_device  eager copy engine, chunks queued right after the step
//   has          the client's HAS schedule, idle windows from the trainer's
//                phase hooks (receives of activations and gradients)
// Rounds run every mode once, in an order rotated by one each round, on the
// same topology, so a drift of the shared machine falls on every mode.
//
// Output (one JSON object): modes.<mode>.step_s (median over every timed
// step of every round, from the reporting rank's --json summary),
// overhead_pct against off, fence_wait_s (mean per snapshot and rank), and
// has.bytes_*_per_step (summed over ranks, mean per snapshot), plus the same
// layer breakdown per mode.
#include "tools/bench_has_trainer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/subprocess.h"
#include "tools/bench_agents.h"
#include "tools/bench_stats.h"
#include "tools/json_output.h"
#include "tools/trainer_binary.h"

namespace memento::tools {
namespace {

using json = nlohmann::json;

struct RunOutput {
  json summary;                  // the reporting rank's --json line
  std::vector<json> rank_snaps;  // every rank's snapshot summary (null for off)
  double wall_s = 0;
};

// Snapshot statistics of one mode, summed over its runs.
struct Tally {
  std::vector<double> step_s;      // every timed step of every run
  std::vector<double> run_median;  // per run
  double snapshots = 0;            // rank-snapshots
  double skipped = 0;
  double bytes = 0, idle = 0, compute = 0, communicate = 0, fence = 0;
  double fence_wait_s = 0;
  // Per step (summed over ranks): sum over runs of bytes / snapshots per rank.
  double per_step_bytes = 0, per_step_idle = 0, per_step_compute = 0, per_step_comm = 0,
         per_step_fence = 0;
  int runs = 0;
  bool all_ok = true;
};

class Bench {
 public:
  Bench(const HasTrainerBenchArgs& a, std::string trainer, std::string self, std::string base)
      : a_(a), trainer_(std::move(trainer)), self_(std::move(self)), base_(std::move(base)) {}

  Result<RunOutput> Run(const std::string& mode, int index) {
    const int world = a_.dp * a_.pp;
    const int per_node = a_.ranks_per_node > 0 ? a_.ranks_per_node : world;
    const int nodes = (world + per_node - 1) / per_node;
    const std::string dir = base_ + "/run" + std::to_string(index);
    if (mkdir(dir.c_str(), 0700) != 0) return ErrnoError("mkdir " + dir, errno);
    const std::string job = "bench-has-" + std::to_string(getpid()) + "-" + std::to_string(index);
    const bool on = mode != "off";
    std::vector<Subprocess> agents;
    auto cleanup = [&] {
      StopBenchAgents(&agents);
      if (!a_.keep) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      }
    };
    if (on) {
      auto started = StartBenchAgents(self_, job, dir, nodes);
      if (!started.ok()) {
        cleanup();
        return started.status();
      }
      agents = std::move(*started);
    }
    std::vector<std::string> argv = {trainer_,
                                     "--launch",
                                     "--preset",
                                     a_.preset,
                                     "--dp",
                                     std::to_string(a_.dp),
                                     "--pp",
                                     std::to_string(a_.pp),
                                     "--micro-batches",
                                     std::to_string(a_.micro_batches),
                                     "--batch",
                                     std::to_string(Batch()),
                                     "--steps",
                                     std::to_string(a_.steps),
                                     "--quiet",
                                     "--json",
                                     "--snapshot-mode",
                                     mode};
    if (a_.d_model > 0) argv.insert(argv.end(), {"--d-model", std::to_string(a_.d_model)});
    if (a_.layers > 0) argv.insert(argv.end(), {"--layers", std::to_string(a_.layers)});
    if (a_.seq > 0) argv.insert(argv.end(), {"--seq", std::to_string(a_.seq)});
    if (on) {
      argv.insert(argv.end(), {"--memento", "--job-id", job, "--agent-dir", dir + "/node{node}",
                               "--ranks-per-node", std::to_string(per_node), "--snapshot-chunk-kib",
                               std::to_string(a_.chunk_kib)});
    }
    SpawnOptions to;
    to.argv = argv;
    to.log_path = dir + "/trainer.log";
    Stopwatch wall;
    auto child = Subprocess::Spawn(to);
    if (!child.ok()) {
      cleanup();
      return child.status();
    }
    auto status = child->Wait(Deadline::AfterSeconds(a_.run_timeout_s));
    RunOutput out;
    out.wall_s = wall.Seconds();
    if (!status.ok() || !status->ok()) {
      if (!status.ok()) child->Terminate(1);
      std::string tail = TailFile(to.log_path, 3000);
      cleanup();
      return InternalError("memento-trainer --snapshot-mode " + mode + " " +
                           (status.ok() ? status->ToString() : std::string("timed out")) + ": " +
                           tail);
    }
    std::ifstream in(to.log_path);
    std::string line;
    while (std::getline(in, line)) {
      for (const char* key : {"{\"params\"", "{\"rank_summary\""}) {
        size_t pos = line.find(key);
        if (pos == std::string::npos) continue;
        auto j = json::parse(line.substr(pos), nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded()) continue;
        if (j.contains("median_step_s")) out.summary = j;
        if (j.contains("rank_summary")) out.rank_snaps.push_back(j["rank_summary"]["snapshot"]);
      }
    }
    std::string tail = out.summary.is_null() ? TailFile(to.log_path, 3000) : "";
    cleanup();
    if (out.summary.is_null()) {
      return InternalError("no JSON summary in the trainer's output: " + tail);
    }
    if (static_cast<int>(out.rank_snaps.size()) != world) {
      return InternalError("expected " + std::to_string(world) + " rank summaries, got " +
                           std::to_string(out.rank_snaps.size()));
    }
    return out;
  }

  int Batch() const { return a_.batch > 0 ? a_.batch : a_.micro_batches * a_.dp; }

 private:
  const HasTrainerBenchArgs& a_;
  const std::string trainer_, self_, base_;
};

void Accumulate(const RunOutput& r, Tally* t) {
  ++t->runs;
  std::vector<double> steps;
  for (const auto& s : r.summary["step_s"]) steps.push_back(s.get<double>());
  t->step_s.insert(t->step_s.end(), steps.begin(), steps.end());
  t->run_median.push_back(r.summary["median_step_s"].get<double>());
  for (const json& s : r.rank_snaps) {
    if (s.is_null()) continue;
    const double n = s["snapshots"].get<double>();
    t->snapshots += n;
    t->skipped += s["skipped"].get<double>();
    t->bytes += s["bytes"].get<double>();
    t->idle += s["bytes_idle"].get<double>();
    t->compute += s["bytes_compute"].get<double>();
    t->communicate += s["bytes_communicate"].get<double>();
    t->fence += s["bytes_fence"].get<double>();
    t->fence_wait_s += s["fence_wait_s"].get<double>();
    t->all_ok = t->all_ok && s["ok"].get<bool>();
    if (n > 0) {
      t->per_step_bytes += s["bytes"].get<double>() / n;
      t->per_step_idle += s["bytes_idle"].get<double>() / n;
      t->per_step_compute += s["bytes_compute"].get<double>() / n;
      t->per_step_comm += s["bytes_communicate"].get<double>() / n;
      t->per_step_fence += s["bytes_fence"].get<double>() / n;
    }
  }
}

json Layers(const Tally& t) {
  const double runs = std::max(1, t.runs);
  return {{"snapshots", t.snapshots},
          {"skipped", t.skipped},
          {"snapshots_ok", t.all_ok},
          {"bytes_per_step", t.per_step_bytes / runs},
          {"bytes_idle_per_step", t.per_step_idle / runs},
          {"bytes_compute_per_step", t.per_step_compute / runs},
          {"bytes_communicate_per_step", t.per_step_comm / runs},
          {"bytes_fence_per_step", t.per_step_fence / runs},
          {"idle_fraction", t.bytes > 0 ? t.idle / t.bytes : 0.0}};
}

}  // namespace

Status RunHasTrainerBench(const HasTrainerBenchArgs& a) {
  if (a.steps < 3 || a.rounds < 1 || a.pp < 1 || a.dp < 1 || a.micro_batches < 1 ||
      a.ranks_per_node < 0 || a.chunk_kib < 64 || a.chunk_kib % 64 != 0) {
    return InvalidArgumentError(
        "bench has --loop trainer: need steps >= 3, rounds, pp, dp, micro-batches >= 1, "
        "ranks-per-node >= 0 and chunk-kib a multiple of 64");
  }
  const std::vector<std::string> modes = SplitCommas(a.modes);
  if (std::find(modes.begin(), modes.end(), "off") == modes.end()) {
    return InvalidArgumentError("bench has: --modes must include 'off'");
  }
  for (const std::string& m : modes) {
    if (m != "off" && m != "sync" && m != "host" && m != "host_device" && m != "has") {
      return InvalidArgumentError("bench has: unknown mode '" + m +
                                  "' (off, sync, host, host_device, has)");
    }
  }
  MEMENTO_ASSIGN_OR_RETURN(std::string trainer, FindTrainer(a.trainer));
  const std::string self = SelfExe();
  if (!IsExecutable(self)) return InternalError("cannot find /proc/self/exe");
  char tmpl[] = "/dev/shm/memento-bench-has-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return ErrnoError("mkdtemp", errno);
  const std::string base = tmpl;
  std::fprintf(stderr, "bench has (trainer loop): trainer %s, work dir %s\n", trainer.c_str(),
               base.c_str());
  Stopwatch total;
  Bench bench(a, trainer, self, base);
  std::map<std::string, Tally> tallies;
  json first;
  Status failed;
  int index = 0;
  for (int round = 0; round < a.rounds && failed.ok(); ++round) {
    for (size_t k = 0; k < modes.size() && failed.ok(); ++k) {
      const std::string& m = modes[(k + round) % modes.size()];
      auto r = bench.Run(m, index++);
      if (!r.ok()) {
        failed = r.status();
        break;
      }
      if (first.is_null()) first = r->summary;
      Accumulate(*r, &tallies[m]);
      std::fprintf(stderr, "bench has: round %d %-11s median step %.6f s (wall %.1f s)\n", round,
                   m.c_str(), r->summary["median_step_s"].get<double>(), r->wall_s);
    }
  }
  if (!a.keep) {
    std::error_code ec;
    std::filesystem::remove_all(base, ec);
  }
  MEMENTO_RETURN_IF_ERROR(failed);

  const double off = Median(tallies["off"].step_s);
  json jm = json::object();
  for (const std::string& m : modes) {
    const Tally& t = tallies[m];
    const double med = Median(t.step_s);
    jm[m] = {{"step_s", med},
             {"step_s_mean", Mean(t.step_s)},
             {"overhead_pct", off > 0 ? (med / off - 1) * 100 : 0},
             {"run_median_step_s", t.run_median},
             {"steps", t.step_s.size()}};
    if (m != "off") {
      jm[m]["fence_wait_s"] = t.snapshots > 0 ? t.fence_wait_s / t.snapshots : 0.0;
      jm[m]["layers"] = Layers(t);
    }
  }
  json out;
  out["bench"] = "has";
  out["device"] = "cpu";
  out["loop"] = {{"kind", "trainer"},
                 {"describe",
                  "memento-trainer --launch, 1F1B over micro-batches, OpenBLAS, "
                  "one thread per rank; memento client into a real agent"},
                 {"trainer", trainer},
                 {"preset", a.preset},
                 {"params", first.value("params", int64_t{0})},
                 {"d_model", a.d_model},
                 {"layers", a.layers},
                 {"pp", a.pp},
                 {"dp", a.dp},
                 {"micro_batches", a.micro_batches},
                 {"batch", bench.Batch()},
                 {"steps_per_run", a.steps},
                 {"timed_steps_per_run", a.steps - 1},
                 {"rounds", a.rounds},
                 {"chunk_bytes", a.chunk_kib * 1024},
                 {"ranks_per_node", a.ranks_per_node > 0 ? a.ranks_per_node : a.pp * a.dp},
                 {"bubbles", "online (phase hooks: receives of activations and gradients)"},
                 {"mean_idle_s_off", first.value("mean_idle_s", 0.0)}};
  out["modes"] = jm;
  if (tallies.count("has")) {
    out["has"] = Layers(tallies["has"]);
    if (tallies.count("host_device")) {
      out["has_vs_host_device_pct"] =
          jm["has"]["overhead_pct"].get<double>() - jm["host_device"]["overhead_pct"].get<double>();
    }
  }
  out["wall_s"] = total.Seconds();
  out["notes"] =
      "cpu: step_s is the median over all timed steps (the trainer leaves out step 1) of the "
      "reporting rank; bytes per step are summed over ranks; has and host_device use "
      "chunk_bytes chunks, host one chunk per tensor; every mode checksums (xxHash3)";
  memento::tools::PrintJson("memento.bench.has/1", std::move(out));
  return Status::Ok();
}

}  // namespace memento::tools
