// A trainer process for the cluster save tests: one rank of a DP job, in
// lockstep with the other ranks like a data-parallel trainer whose gradient
// all-reduce makes every rank finish step s together (here: a file barrier
// in --barrier before each optimizer step). State: "params" (replicated:
// identical on every rank), "opt" (dp_sharded: this rank's ZeRO-1 shard) and
// the private "cursor" blob. Progress lines (one write(2) each):
//   R <step> <digest>   restored <step>
//   S <step>            about to call Snapshot(step)
//   D <step> <digest>   state digest after the optimizer step <step>
//   C <step>            snapshot <step> fenced
//   K <step>            snapshot <step> was skipped (cluster mode)
//   E <message>         an error; exits 1
//   X done
// --pace-commits: after each snapshot it wrote, wait until the agent's commit
// word says that step committed or was let go uncommitted, or another rank
// marked it skipped in --barrier (at most 30 s; src/toy/commit_pace.h), so
// that on a loaded machine the steps still become versions one after the
// other instead of being skipped.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "client/testing_hooks.h"
#include "common/checksum.h"
#include "common/log.h"
#include "fmt/format.h"
#include "memento/client.h"
#include "toy/commit_pace.h"

namespace {

int g_progress = -1;

void Emit(const std::string& line) {
  std::string l = line + "\n";
  if (write(g_progress, l.data(), l.size()) != static_cast<ssize_t>(l.size())) _exit(3);
}

[[noreturn]] void Fail(const std::string& what) {
  Emit("E " + what);
  std::fprintf(stderr, "cluster_trainer: %s\n", what.c_str());
  _exit(1);
}

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct Cursor {
  int64_t step;
  uint64_t rng;
};

struct Model {
  std::vector<uint64_t> params, opt;
  Cursor cursor{0, 0};
  int rank;

  Model(size_t bytes, int r) : rank(r) {
    params.resize(bytes / 8 * 2 / 3);
    opt.resize(bytes / 8 - params.size());
    for (size_t i = 0; i < params.size(); ++i) params[i] = SplitMix(i);
    for (size_t i = 0; i < opt.size(); ++i) opt[i] = SplitMix(i + (static_cast<uint64_t>(r) << 40));
    cursor.rng = SplitMix(1000 + r);
  }
  void Step() {
    cursor.step += 1;
    cursor.rng = SplitMix(cursor.rng);
    const uint64_t k = SplitMix(cursor.step);  // the same on every rank
    for (size_t i = 0; i < params.size(); ++i) params[i] = params[i] * 6364136223846793005ULL + k;
    for (size_t i = 0; i < opt.size(); ++i) opt[i] = (opt[i] ^ (opt[i] >> 29)) + k + cursor.rng;
  }
  uint64_t Digest() const {
    uint64_t h = memento::Checksum(params.data(), params.size() * 8);
    h = memento::ChecksumWithSeed(opt.data(), opt.size() * 8, h);
    return memento::ChecksumWithSeed(&cursor, sizeof(cursor), h);
  }
};

// Every rank reaches `step` before any goes on.
void Barrier(const std::string& dir, int rank, int world, int64_t step) {
  if (dir.empty()) return;
  std::string mine = fmt::format("{}/{}.{}", dir, rank, step);
  int fd = open(mine.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) Fail("barrier file " + mine);
  close(fd);
  for (int waited_ms = 0;; ++waited_ms) {
    bool all = true;
    for (int r = 0; r < world && all; ++r) {
      struct stat st;
      all = stat(fmt::format("{}/{}.{}", dir, r, step).c_str(), &st) == 0;
    }
    if (all) return;
    if (waited_ms > 120000) Fail(fmt::format("barrier of step {} timed out", step));
    usleep(1000);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"memento cluster-test trainer"};
  std::string job, dir, progress, barrier;
  int rank = 0, world = 1;
  size_t bytes = 1 << 20;
  int64_t steps = 10;
  double step_sleep_s = 0;
  bool pace_commits = false;
  app.add_option("--job", job)->required();
  app.add_option("--dir", dir)->required();
  app.add_option("--rank", rank);
  app.add_option("--world", world);
  app.add_option("--bytes", bytes);
  app.add_option("--steps", steps);
  app.add_option("--step-sleep", step_sleep_s);
  app.add_option("--progress", progress)->required();
  app.add_option("--barrier", barrier);
  app.add_flag("--pace-commits", pace_commits);
  CLI11_PARSE(app, argc, argv);
  memento::InitLogging("trainer rank" + std::to_string(rank));
  // The tests slow this trainer's chunk copies down through its environment
  // (the library reads no such variable: client/testing_hooks.h).
  if (const char* d = std::getenv("MEMENTO_TEST_COPY_DELAY_US")) {
    memento::client::testing_hooks::SetCopyDelayUs(std::atoi(d));
  }
  g_progress = open(progress.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (g_progress < 0) return 2;

  Model model(bytes, rank);
  memento::ClientOptions o;
  o.job_id = job;
  o.rank = rank;
  o.world_size = world;
  o.agent_dir = dir;
  o.chunk_bytes = 256 << 10;
  o.connect_timeout_s = 20;
  auto c = memento::Client::Connect(o);
  if (!c.ok()) Fail(c.status().ToString());
  auto& client = *c;
  using memento::DType;
  using memento::StateClass;
  memento::Status st = client->RegisterTensor({"params",
                                               DType::kInt64,
                                               {static_cast<int64_t>(model.params.size())},
                                               StateClass::kReplicated},
                                              model.params.data());
  if (st.ok()) {
    memento::TensorMeta m{
        "opt", DType::kInt64, {static_cast<int64_t>(model.opt.size())}, StateClass::kDpSharded};
    m.global_numel = static_cast<int64_t>(model.opt.size()) * world;
    m.shard_offset = static_cast<int64_t>(model.opt.size()) * rank;
    st = client->RegisterTensor(m, model.opt.data());
  }
  if (st.ok()) st = client->RegisterBlob("cursor", &model.cursor, sizeof(model.cursor));
  if (st.ok()) st = client->Seal();
  if (!st.ok()) Fail(st.ToString());
  auto restored = client->Restore();
  if (restored.ok()) {
    if (model.cursor.step != *restored) {
      Fail(fmt::format("restored step {} but the cursor says {}", *restored, model.cursor.step));
    }
    Emit(fmt::format("R {} {}", *restored, model.Digest()));
  } else if (restored.status().code() != memento::StatusCode::kNotFound) {
    Fail(restored.status().ToString());
  }
  int64_t pending = -1;
  while (model.cursor.step < steps) {
    st = client->Fence();
    if (!st.ok()) Fail(st.ToString());
    if (pending >= 0) {
      const bool skipped = client->LastSnapshotStats().skipped;
      Emit(fmt::format("{} {}", skipped ? "K" : "C", pending));
      if (pace_commits && !skipped) {
        const auto end = memento::toy::WaitForCommitOrRelease(dir, pending, barrier, 30);
        if (end != memento::toy::PaceEnd::kCommitted) {
          std::fprintf(stderr, "cluster_trainer: step %lld did not commit (pace end %d)\n",
                       static_cast<long long>(pending), static_cast<int>(end));
        }
      }
    }
    Barrier(barrier, rank, world, model.cursor.step + 1);
    model.Step();
    Emit(fmt::format("S {}", model.cursor.step));
    st = client->Snapshot(model.cursor.step);
    if (!st.ok()) Fail(st.ToString());
    if (pace_commits && client->LastSnapshotStats().step == model.cursor.step &&
        client->LastSnapshotStats().skipped) {
      memento::toy::MarkSkipped(barrier, model.cursor.step);
    }
    pending = model.cursor.step;
    Emit(fmt::format("D {} {}", model.cursor.step, model.Digest()));
    if (step_sleep_s > 0) usleep(static_cast<useconds_t>(step_sleep_s * 1e6));
  }
  st = client->Fence();
  if (!st.ok()) Fail(st.ToString());
  if (pending >= 0) {
    Emit(fmt::format("{} {}", client->LastSnapshotStats().skipped ? "K" : "C", pending));
  }
  Emit("X done");
  return 0;
}
