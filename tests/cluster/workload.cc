// memento-test-workload: a deterministic, state-mutating trainer for the
// cluster tests, run by `memento launch` with the environment of
// docs/cluster.md (MEMENTO_RANK, MEMENTO_WORLD_SIZE, MEMENTO_NODE,
// MEMENTO_RUN_DIR, MEMENTO_JOB, MEMENTO_DP/TP/PP, MEMENTO_ATTEMPT).
//
// State of a rank (registered with the memento Client):
//   "w"    replicated, I32 [n]: identical on every DP rank of a (pp, tp) position
//   "b"    replicated, U8 [n/3 + 5] (odd length: pieces end mid-tensor)
//   "opt"  dp_sharded, I64 [n/2] (with --zero 1 / MEMENTO_ZERO=1): this DP
//          rank's 1/dp of a ZeRO-1 optimizer state, global_numel and
//          shard_offset set
//   "rng"  private blob: {step, rng} of this rank
// state(s) = Update(state(s-1), s) from a fixed Init(rank): every word
// changes every step and depends on the previous state, so state(s) is a
// pure function of (rank, s) and a restored state can be checked against a
// recomputation bit for bit.
//
// Each step: Fence() (the copy of the previous snapshot must be done before
// the state mutates), Update(s), Snapshot(s), a barrier with the other ranks
// in $MEMENTO_RENDEZVOUS (lock step, like a real job's collectives). At start: Restore() (in
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
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "memento/client.h"
#include "toy/commit_pace.h"

namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

int EnvInt(const char* name, int def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : def;
}

std::string EnvStr(const char* name, const std::string& def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : def;
}

struct Rng {
  int64_t step = 0;
  uint64_t state = 0;
};

struct Layout {
  int rank = 0, world = 1, dp = 1, tp = 1, pp = 1, zero = 0;
  int dp_i() const { return (rank / tp) % dp; }
  int tp_i() const { return rank % tp; }
  int pp_i() const { return rank / (tp * dp); }
};

// The whole state of one rank.
struct State {
  Layout l;
  std::vector<int32_t> w;
  std::vector<uint8_t> b;
  std::vector<int64_t> opt;
  Rng rng;

  State(const Layout& layout, size_t n) : l(layout) {
    const uint64_t pos = static_cast<uint64_t>(l.pp_i() * l.tp + l.tp_i()) + 1;  // SG seed
    w.resize(n);
    b.resize(n / 3 + 5);
    if (l.zero >= 1) opt.resize(n / 2);
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<int32_t>(SplitMix(pos * 1000003 + i));
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(SplitMix(pos * 7919 + i));
    const uint64_t shard_base = static_cast<uint64_t>(l.dp_i()) * opt.size();
    for (size_t i = 0; i < opt.size(); ++i) {
      opt[i] = static_cast<int64_t>(SplitMix((pos << 40) + shard_base + i));
    }
    rng.step = 0;
    rng.state = SplitMix(0x5eed0000ULL + static_cast<uint64_t>(l.rank));
  }

  // One optimizer step. Replicated tensors depend only on the (pp, tp)
  // position and the step, so DP replicas stay identical; the ZeRO shard and
  // the rng depend on this rank too.
  void Update(int64_t step) {
    const uint64_t pos = static_cast<uint64_t>(l.pp_i() * l.tp + l.tp_i()) + 1;
    const uint32_t k = static_cast<uint32_t>(SplitMix(pos * 31 + static_cast<uint64_t>(step)));
    uint32_t carry = k;
    for (size_t i = 0; i < w.size(); ++i) {
      uint32_t x = static_cast<uint32_t>(w[i]);
      x = x * 1664525u + 1013904223u + carry;
      carry = x >> 7;
      w[i] = static_cast<int32_t>(x);
    }
    for (size_t i = 0; i < b.size(); ++i) {
      b[i] = static_cast<uint8_t>(b[i] * 5 + 1 + static_cast<uint8_t>(w[i % w.size()]));
    }
    for (size_t i = 0; i < opt.size(); ++i) {
      // Unsigned arithmetic: the same bits as the wrapping the state wants,
      // without signed overflow (UBSan found it).
      opt[i] = static_cast<int64_t>(static_cast<uint64_t>(opt[i]) * 6364136223846793005ULL +
                                    static_cast<uint64_t>(int64_t{w[(i * 2) % w.size()]}) +
                                    static_cast<uint64_t>(step));
    }
    rng.step = step;
    rng.state = SplitMix(rng.state ^ static_cast<uint64_t>(step));
  }

  uint64_t Digest() const {
    memento::StreamingChecksum h;
    h.Update(w.data(), w.size() * sizeof(w[0]));
    h.Update(b.data(), b.size());
    if (!opt.empty()) h.Update(opt.data(), opt.size() * sizeof(opt[0]));
    h.Update(&rng, sizeof(rng));
    return h.Digest();
  }
};

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

[[noreturn]] void Fail(const std::string& what, int code = 1) {
  std::fprintf(stderr, "memento-test-workload: %s\n", what.c_str());
  std::fflush(stderr);
  std::exit(code);
}

// The ranks of a real job move in lock step (their collectives wait for each
// other); a file barrier in the attempt's rendezvous directory does the same:
// every rank creates <dir>/<step>.<rank> and waits for the others' files.
void Barrier(const std::string& dir, int64_t step, int rank, int world) {
  if (dir.empty()) return;
  const std::string base = dir + "/" + std::to_string(step) + ".";
  AppendFile(base + std::to_string(rank), "");
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (int r = 0; r < world; ++r) {
    const std::string path = base + std::to_string(r);
    while (access(path.c_str(), F_OK) != 0) {
      if (std::chrono::steady_clock::now() > give_up) {
        Fail("barrier of step " + std::to_string(step) + ": rank " + std::to_string(r) +
             " never arrived");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("deterministic state-mutating trainer for the memento cluster tests");
  int64_t steps = 40;
  size_t n = 16384;
  int step_ms = 10;
  int warmup_ms = 0;
  std::string out;
  bool reference = false;
  bool pace_commits = false;
  Layout l;
  l.rank = EnvInt("MEMENTO_RANK", 0);
  l.world = EnvInt("MEMENTO_WORLD_SIZE", 1);
  l.dp = EnvInt("MEMENTO_DP", l.world);
  l.tp = EnvInt("MEMENTO_TP", 1);
  l.pp = EnvInt("MEMENTO_PP", 1);
  l.zero = EnvInt("MEMENTO_ZERO", 0);
  app.add_option("--steps", steps, "Train steps 1..N");
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
  app.add_flag("--pace-commits", pace_commits,
               "After each snapshot written, wait (at most 30 s) until it committed, its agent "
               "let it go or another rank skipped it");
  CLI11_PARSE(app, argc, argv);
  l.world = l.dp * l.tp * l.pp;
  if (n < 64) Fail("--elements must be >= 64");

  State s(l, n);
  if (reference) {
    for (int64_t step = 1; step <= steps; ++step) s.Update(step);
    std::printf("%016" PRIx64 "\n", s.Digest());
    return 0;
  }
  if (out.empty()) Fail("--out is required");
  const std::string prefix = out + "/rank" + std::to_string(l.rank);
  const int attempt = EnvInt("MEMENTO_ATTEMPT", 0);
  const std::string rendezvous = EnvStr("MEMENTO_RENDEZVOUS", "");

  memento::ClientOptions opts;
  opts.job_id = EnvStr("MEMENTO_JOB", "workload");
  opts.rank = l.rank;
  opts.world_size = l.world;
  opts.node = EnvInt("MEMENTO_NODE", 0);
  opts.agent_dir = EnvStr("MEMENTO_RUN_DIR", "");
  opts.connect_timeout_s = 30;
  auto client = memento::Client::Connect(opts);
  if (!client.ok()) Fail("connect: " + client.status().ToString());
  auto& c = **client;

  auto reg = [&](const char* name, memento::DType dt, int64_t numel, memento::StateClass cls,
                 void* data, int64_t global = 0, int64_t offset = 0) {
    memento::TensorMeta m;
    m.name = name;
    m.dtype = dt;
    m.shape = {numel};
    m.state_class = cls;
    m.global_numel = global;
    m.shard_offset = offset;
    memento::Status st = c.RegisterTensor(m, data);
    if (!st.ok()) Fail(std::string("register ") + name + ": " + st.ToString());
  };
  reg("w", memento::DType::kInt32, static_cast<int64_t>(s.w.size()),
      memento::StateClass::kReplicated, s.w.data());
  reg("b", memento::DType::kUInt8, static_cast<int64_t>(s.b.size()),
      memento::StateClass::kReplicated, s.b.data());
  if (!s.opt.empty()) {
    const int64_t shard = static_cast<int64_t>(s.opt.size());
    reg("opt", memento::DType::kInt64, shard, memento::StateClass::kDpSharded, s.opt.data(),
        shard * l.dp, shard * l.dp_i());
  }
  if (memento::Status st = c.RegisterBlob("rng", &s.rng, sizeof(s.rng)); !st.ok()) {
    Fail("register rng: " + st.ToString());
  }
  if (memento::Status st = c.Seal(); !st.ok()) Fail("seal: " + st.ToString());

  int64_t start = 1;
  auto restored = c.Restore();
  if (restored.ok()) {
    const int64_t step = *restored;
    State expect(l, n);
    for (int64_t k = 1; k <= step; ++k) expect.Update(k);
    if (s.Digest() != expect.Digest() || s.w != expect.w || s.b != expect.b ||
        s.opt != expect.opt || s.rng.state != expect.rng.state || s.rng.step != step) {
      const std::string msg = "attempt " + std::to_string(attempt) + ": restored step " +
                              std::to_string(step) + " differs from the recomputed state\n";
      AppendFile(prefix + ".mismatch", msg);
      Fail(msg, 2);
    }
    AppendFile(prefix + ".restores", std::to_string(attempt) + " " + std::to_string(step) + "\n");
    std::printf("rank %d attempt %d: restored step %lld (%.3f s)\n", l.rank, attempt,
                static_cast<long long>(step), c.LastRestoreStats().restore_s);
    start = step + 1;
  } else if (restored.status().code() == memento::StatusCode::kNotFound) {
    AppendFile(prefix + ".restores", std::to_string(attempt) + " -1\n");
    std::printf("rank %d attempt %d: nothing to restore, starting at step 1\n", l.rank, attempt);
  } else {
    Fail("restore: " + restored.status().ToString());
  }
  std::fflush(stdout);
  if (warmup_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(warmup_ms));

  for (int64_t step = start; step <= steps; ++step) {
    if (memento::Status st = c.Fence(memento::Deadline::AfterSeconds(60)); !st.ok()) {
      Fail("fence before step " + std::to_string(step) + ": " + st.ToString());
    }
    if (pace_commits && step > start && !c.LastSnapshotStats().skipped) {
      const auto end =
          memento::toy::WaitForCommitOrRelease(opts.agent_dir, step - 1, rendezvous, 30);
      if (end != memento::toy::PaceEnd::kCommitted) {
        std::printf("rank %d: step %lld did not commit (pace end %d)\n", l.rank,
                    static_cast<long long>(step - 1), static_cast<int>(end));
      }
    }
    s.Update(step);
    if (memento::Status st = c.Snapshot(step); !st.ok()) {
      Fail("snapshot " + std::to_string(step) + ": " + st.ToString());
    }
    if (pace_commits && c.LastSnapshotStats().step == step && c.LastSnapshotStats().skipped) {
      memento::toy::MarkSkipped(rendezvous, step);
    }
    if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    Barrier(rendezvous, step, l.rank, l.world);
  }
  if (memento::Status st = c.Fence(memento::Deadline::AfterSeconds(60)); !st.ok()) {
    Fail("final fence: " + st.ToString());
  }
  char line[64];
  std::snprintf(line, sizeof(line), "%lld %016" PRIx64 "\n", static_cast<long long>(steps),
                s.Digest());
  WriteFileAtomic(prefix + ".digest", line);
  std::printf("rank %d: done, %s", l.rank, line);
  return 0;
}
