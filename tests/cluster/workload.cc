// memento-test-workload: a deterministic, state-mutating trainer for the
// cluster tests, run by `memento launch` with the environment of
// docs/cluster.md (MEMENTO_RANK, MEMENTO_WORLD_SIZE, MEMENTO_NODE,
// MEMENTO_RUN_DIR, MEMENTO_JOB, MEMENTO_DP/TP/PP, MEMENTO_ATTEMPT).
//
// State of a rank (toy::ParallelState, src/toy/toy_state.h, registered with
// the memento Client): "w" and "b" replicated, "opt" dp_sharded (with
// --zero 1 / MEMENTO_ZERO=1), the "rng" blob.
// state(s) = Update(state(s-1), s) from a fixed Init(rank): every word
// changes every step and depends on the previous state, so state(s) is a
// pure function of (rank, s) and a restored state can be checked against a
// recomputation bit for bit.
//
// Each step (toy::RunSteps): Fence() (the copy of the previous snapshot must
// be done before the state mutates), Update(s), Snapshot(s), a barrier with
// the other ranks in $MEMENTO_RENDEZVOUS (lock step, like a real job's
// collectives). At start: Restore() (in
// cluster mode the cluster's restore target) and check the loaded state against the recomputed
// state(s): a mismatch writes <out>/rank<r>.mismatch and exits 2. At the end: <out>/rank<r>.digest
// = "<steps> <digest>" and exit 0. Every restore appends "<attempt> <step>" to
// <out>/rank<r>.restores.
//
// --reference: no memento; prints the digest of state(--steps) and exits.
// --pace-commits: after each snapshot it wrote, wait until its agent's commit
// word says that step committed or was let go uncommitted, or another rank
// marked it skipped in the rendezvous directory (at most 30 s;
// src/toy/commit_pace.h): on a loaded machine the steps still become
// versions one after the other instead of being skipped while an early one
// waits for its commit.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "memento/client.h"
#include "toy/toy_run.h"

namespace {

using memento::toy::ParallelLayout;
using memento::toy::ParallelState;

int EnvInt(const char* name, int def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : def;
}

std::string EnvStr(const char* name, const std::string& def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : def;
}

void AppendFile(const std::string& path, const std::string& text) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!write(fd, text.data(), text.size());
  close(fd);
}

void WriteFileAtomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!write(fd, text.data(), text.size());
  fsync(fd);
  close(fd);
  rename(tmp.c_str(), path.c_str());
}

// The restored state must be state(step) recomputed from Init: else
// <prefix>.mismatch and exit 2. Every restore appends "<attempt> <step>"
// (-1: nothing restored) to <prefix>.restores.
void CheckRestored(const memento::toy::ProgressLog& log, const ParallelState& s,
                   const ParallelLayout& l, size_t n, int64_t step, double restore_s, int attempt,
                   const std::string& prefix) {
  if (step < 0) {
    AppendFile(prefix + ".restores", std::to_string(attempt) + " -1\n");
    std::printf("rank %d attempt %d: nothing to restore, starting at step 1\n", l.rank, attempt);
    return;
  }
  ParallelState expect(l, n);
  while (expect.step() < step) expect.Step();
  if (!s.SameBytes(expect)) {
    const std::string msg = "attempt " + std::to_string(attempt) + ": restored step " +
                            std::to_string(step) + " differs from the recomputed state\n";
    AppendFile(prefix + ".mismatch", msg);
    log.Exit(msg, 2);
  }
  AppendFile(prefix + ".restores", std::to_string(attempt) + " " + std::to_string(step) + "\n");
  std::printf("rank %d attempt %d: restored step %lld (%.3f s)\n", l.rank, attempt,
              static_cast<long long>(step), restore_s);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("deterministic state-mutating trainer for the memento cluster tests");
  size_t n = 16384;
  int step_ms = 10;
  int warmup_ms = 0;
  std::string out;
  bool reference = false;
  memento::toy::StepLoopOptions loop;
  loop.steps = 40;
  ParallelLayout l;
  l.rank = EnvInt("MEMENTO_RANK", 0);
  l.world = EnvInt("MEMENTO_WORLD_SIZE", 1);
  l.dp = EnvInt("MEMENTO_DP", l.world);
  l.tp = EnvInt("MEMENTO_TP", 1);
  l.pp = EnvInt("MEMENTO_PP", 1);
  l.zero = EnvInt("MEMENTO_ZERO", 0);
  app.add_option("--steps", loop.steps, "Train steps 1..N");
  app.add_option("--elements", n, "Elements of the replicated tensor w (others scale with it)");
  app.add_option("--step-ms", step_ms, "Sleep after each step (simulated forward/backward)");
  app.add_option("--warmup-ms", warmup_ms,
                 "Sleep before the first step of every attempt (data loading; gives the agents "
                 "time to compute the plan)");
  app.add_option("--out", out, "Directory for rank<r>.digest / .restores / .mismatch");
  app.add_option("--rank", l.rank, "Rank (default $MEMENTO_RANK)");
  app.add_option("--dp", l.dp, "DP size (default $MEMENTO_DP)");
  app.add_option("--tp", l.tp, "TP size (default $MEMENTO_TP)");
  app.add_option("--pp", l.pp, "PP size (default $MEMENTO_PP)");
  app.add_option("--zero", l.zero, "ZeRO stage (default $MEMENTO_ZERO): 1 adds the dp_sharded opt");
  app.add_flag("--reference", reference, "No memento: print the digest of state(--steps)");
  app.add_flag("--pace-commits", loop.pace_commits,
               "After each snapshot written, wait (at most 30 s) until it committed, its agent "
               "let it go or another rank skipped it");
  CLI11_PARSE(app, argc, argv);
  l.world = l.dp * l.tp * l.pp;
  memento::toy::ProgressLog log("memento-test-workload");  // no progress lines
  if (n < 64) log.Exit("--elements must be >= 64");

  ParallelState s(l, n);
  if (reference) {
    while (s.step() < loop.steps) s.Step();
    std::printf("%016" PRIx64 "\n", s.Digest());
    return 0;
  }
  if (out.empty()) log.Exit("--out is required");
  const std::string prefix = out + "/rank" + std::to_string(l.rank);
  const int attempt = EnvInt("MEMENTO_ATTEMPT", 0);

  memento::ClientOptions opts;
  opts.job_id = EnvStr("MEMENTO_JOB", "workload");
  opts.rank = l.rank;
  opts.world_size = l.world;
  opts.node = EnvInt("MEMENTO_NODE", 0);
  opts.agent_dir = EnvStr("MEMENTO_RUN_DIR", "");
  opts.connect_timeout_s = 30;
  auto client = memento::Client::Connect(opts);
  if (!client.ok()) log.Exit("connect: " + client.status().ToString());
  auto start = memento::toy::RegisterSealRestore(**client, s);
  if (!start.ok() && start.status().code() == memento::StatusCode::kDataLoss) {
    AppendFile(prefix + ".mismatch",
               "attempt " + std::to_string(attempt) + ": " + start.status().ToString() + "\n");
    log.Exit(start.status(), 2);
  }
  if (!start.ok()) log.Exit(start.status());
  CheckRestored(log, s, l, n, start->restored_step, start->restore_s, attempt, prefix);
  std::fflush(stdout);
  if (warmup_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(warmup_ms));

  loop.step_sleep_s = step_ms / 1000.0;
  loop.fence_timeout_s = 60;
  loop.barrier_dir = EnvStr("MEMENTO_RENDEZVOUS", "");
  loop.barrier_at = memento::toy::BarrierAt::kAfterStep;
  loop.rank = l.rank;
  loop.world = l.world;
  loop.agent_dir = opts.agent_dir;
  if (memento::Status st = memento::toy::RunSteps(client->get(), s, log, loop); !st.ok()) {
    log.Exit(st);
  }
  char line[64];
  std::snprintf(line, sizeof(line), "%lld %016" PRIx64 "\n", static_cast<long long>(loop.steps),
                s.Digest());
  WriteFileAtomic(prefix + ".digest", line);
  std::printf("rank %d: done, %s", l.rank, line);
  return 0;
}
