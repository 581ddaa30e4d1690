// `memento demo` (docs/demo.md):
//
//   memento demo                 the multi-node demo: `memento launch`'s
//                                Launcher runs memento-trainer (DP 2 x PP 2,
//                                ZeRO-1) on 4 simulated nodes with a trainer
//                                crash and a whole-node loss injected, then
//                                the same job without failures, and reports
//                                every recovery, the snapshot overhead, the
//                                bytes protected per node and whether the
//                                final parameters are bit-identical.
//   memento demo --single-node   the first slice on one node: an agent and a
//                                trainer that snapshots every step, SIGKILL
//                                in the middle of a snapshot, restart,
//                                restore, continue, bit-identical check. Its
//                                trainer is this same binary (`memento demo
//                                --trainer ...`).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
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
#include "memento/client.h"
#include "shm/node_store.h"
#include "shm/protocol.h"
#include "shm/slot.h"
#include "shm/slot_format.h"
#include "tools/command.h"
#include "tools/trainer_binary.h"

#if __has_include("launch/launcher.h")
#include <atomic>
#include <nlohmann/json.hpp>

#include "fmt/ranges.h"
#include "launch/launcher.h"
#define MEMENTO_DEMO_HAVE_LAUNCH 1
#endif

namespace memento::tools {
namespace {

struct DemoArgs {
  uint64_t mib = 256;
  int64_t steps = 20;
  int64_t kill_after = 6;
  int threads = 2;
  bool keep = false;
  bool single_node = false;
  // multi-node demo (--steps defaults to 300 there)
  std::string trainer_bin;
  std::string preset = "small";
  int nodes = 4;
  int dp = 2, pp = 2;
  std::string policy = "xor";
  int64_t kill_rank_at = 100;
  int kill_rank = 3;
  int64_t kill_node_at = 200;
  int kill_node = 1;
  int64_t progress_every = 25;
  std::string store_url;  // empty: the launcher hosts the embedded store
  // trainer mode
  bool trainer = false;
  std::string root;
  std::string progress;
};

// ---- the trainer's deterministic state ---------------------------------------

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Parameters and two Adam-like moments, every word rewritten every step from
// the previous state; the cursor blob is the step and the RNG.
struct Model {
  struct Cursor {
    int64_t step = 0;
    uint64_t rng = 12345;
  };
  std::vector<uint64_t> params, m, v;
  Cursor cursor;

  explicit Model(uint64_t bytes) {
    size_t words = bytes / 8;
    params.resize(words / 2);
    m.resize(words * 3 / 10);
    v.resize(words - params.size() - m.size());
    for (size_t i = 0; i < params.size(); ++i) params[i] = SplitMix(i);
    for (size_t i = 0; i < m.size(); ++i) m[i] = SplitMix(i + (1ULL << 40));
    for (size_t i = 0; i < v.size(); ++i) v[i] = SplitMix(i + (2ULL << 40));
  }
  void Step() {
    cursor.step += 1;
    cursor.rng = SplitMix(cursor.rng);
    const uint64_t k = cursor.rng | 1;
    for (size_t i = 0; i < m.size(); ++i) m[i] = m[i] * 6364136223846793005ULL + params[i];
    for (size_t i = 0; i < v.size(); ++i) v[i] = (v[i] ^ (v[i] >> 29)) + k;
    for (size_t i = 0; i < params.size(); ++i) params[i] += m[i % m.size()] ^ (k + i);
  }
  uint64_t Digest() const {
    uint64_t h = Checksum(params.data(), params.size() * 8);
    h = ChecksumWithSeed(m.data(), m.size() * 8, h);
    h = ChecksumWithSeed(v.data(), v.size() * 8, h);
    return ChecksumWithSeed(&cursor, sizeof(cursor), h);
  }
};

// ---- trainer mode ---------------------------------------------------------------

int g_progress = -1;
void Emit(const std::string& line) {
  std::string l = line + "\n";
  if (write(g_progress, l.data(), l.size()) < 0) _exit(3);
}

int RunTrainer(const DemoArgs& a) {
  InitLogging("trainer rank0");
  g_progress = open(a.progress.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (g_progress < 0) return ReportStatus(ErrnoError("open " + a.progress, errno));
  auto fail = [](const Status& st) {
    Emit("E " + st.ToString());
    return ReportStatus(st);
  };
  Model model(a.mib << 20);
  ClientOptions o;
  o.job_id = "demo";
  o.agent_dir = a.root;
  o.copy_threads = a.threads;
  auto client = Client::Connect(o);
  if (!client.ok()) return fail(client.status());
  Client& c = **client;
  auto reg = [&](const char* name, std::vector<uint64_t>& t, StateClass cls) {
    return c.RegisterTensor({name, DType::kInt64, {static_cast<int64_t>(t.size())}, cls}, t.data());
  };
  Status st = reg("params", model.params, StateClass::kReplicated);
  if (st.ok()) st = reg("adam.m", model.m, StateClass::kDpSharded);
  if (st.ok()) st = reg("adam.v", model.v, StateClass::kDpSharded);
  if (st.ok()) st = c.RegisterBlob("cursor", &model.cursor, sizeof(model.cursor));
  Stopwatch seal;
  if (st.ok()) st = c.Seal();
  double seal_s = seal.Seconds();
  if (!st.ok()) return fail(st);
  auto restored = c.Restore();
  if (restored.ok()) {
    Emit(fmt::format("R {} {} {} {}", *restored, model.Digest(), c.LastRestoreStats().restore_s,
                     seal_s));
  } else if (restored.status().code() == StatusCode::kNotFound) {
    Emit(fmt::format("N {}", seal_s));
  } else {
    return fail(restored.status());
  }
  int64_t pending = -1;
  while (model.cursor.step < a.steps) {
    st = c.Fence();  // before the optimizer step mutates the state
    if (!st.ok()) return fail(st);
    if (pending >= 0) {
      SnapshotStats s = c.LastSnapshotStats();
      Emit(fmt::format("C {} {} {}", pending, s.copy_s, s.fence_wait_s));
    }
    model.Step();
    Emit(fmt::format("S {}", model.cursor.step));
    st = c.Snapshot(model.cursor.step);  // returns at once
    if (!st.ok()) return fail(st);
    pending = model.cursor.step;
    Emit(fmt::format("D {} {}", model.cursor.step, model.Digest()));  // "forward/backward"
  }
  st = c.Fence();
  if (!st.ok()) return fail(st);
  SnapshotStats s = c.LastSnapshotStats();
  Emit(fmt::format("C {} {} {}", pending, s.copy_s, s.fence_wait_s));
  Emit("X");
  return 0;
}

// ---- the orchestrator -------------------------------------------------------------

struct Progress {
  int64_t restored = -1;
  uint64_t restored_digest = 0;
  double restore_s = 0, seal_s = 0;
  bool fresh = false;
  std::map<int64_t, uint64_t> digests;
  int64_t max_complete = -1, max_started = -1;
  double copy_s_sum = 0, fence_s_sum = 0;
  int completes = 0;
  bool done = false;
  std::string error;
};

Progress ReadProgress(const std::string& path) {
  Progress p;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    char k = 0;
    ls >> k;
    int64_t step;
    uint64_t digest;
    double x, y;
    if (k == 'R' && ls >> step >> digest >> x >> y) {
      p.restored = step;
      p.restored_digest = digest;
      p.restore_s = x;
      p.seal_s = y;
    } else if (k == 'N' && ls >> y) {
      p.fresh = true;
      p.seal_s = y;
    } else if (k == 'D' && ls >> step >> digest) {
      p.digests[step] = digest;
    } else if (k == 'S' && ls >> step) {
      p.max_started = std::max(p.max_started, step);
    } else if (k == 'C' && ls >> step >> x >> y) {
      p.max_complete = std::max(p.max_complete, step);
      p.copy_s_sum += x;
      p.fence_s_sum += y;
      ++p.completes;
    } else if (k == 'X') {
      p.done = true;
    } else if (k == 'E') {
      p.error = line.substr(2);
    }
  }
  return p;
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  SpawnOptions options;
  options.argv = argv;
  options.log_path = log;
  auto child = Subprocess::Spawn(options);
  if (!child.ok()) {
    MEMENTO_LOG_ERROR("{}", child.status().ToString());
    return -1;
  }
  return child->Release();  // waited for and killed by pid below
}

template <typename Pred>
bool WaitFor(Pred pred, double timeout_s) {
  Stopwatch sw;
  while (!pred()) {
    if (sw.Seconds() > timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Slot states from the headers (pread: cheap enough to poll).
std::vector<std::pair<shm::SlotState, int64_t>> Slots(const std::string& root) {
  std::vector<std::pair<shm::SlotState, int64_t>> out;
  for (int s = 0; s < shm::kSlotsPerRank; ++s) {
    const shm::SlotPeek peek = shm::PeekSlotFile(shm::SlotPath(root, 0, s));
    out.emplace_back(peek.state, peek.step);
  }
  return out;
}

std::string SlotsText(const std::string& root) {
  std::string s;
  int i = 0;
  for (auto [state, step] : Slots(root)) {
    if (!s.empty()) s += ", ";
    s += fmt::format("slot{} {}", i++, shm::SlotStateName(state));
    if (state != shm::SlotState::kEmpty) s += fmt::format(" (step {})", step);
  }
  return s;
}

int RunDemo(const DemoArgs& a) {
  Stopwatch total;
  auto t = [&total] { return fmt::format("[{:6.2f}s]", total.Seconds()); };
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  char tmpl[] = "/dev/shm/memento-demo-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return ReportStatus(ErrnoError("mkdtemp /dev/shm", errno));
  std::string dir = tmpl, root = dir + "/node0";
  if (a.kill_after < 1 || a.kill_after + 2 > a.steps) {
    return ReportStatus(InvalidArgumentError("need 1 <= --kill-after <= --steps - 2"));
  }
  std::printf(
      "memento demo: one node, one trainer with %llu MiB of state (parameters + two optimizer "
      "moments + a cursor blob), a snapshot after every one of %lld steps, SIGKILL in the middle "
      "of a snapshot after step %lld.\n",
      static_cast<unsigned long long>(a.mib), static_cast<long long>(a.steps),
      static_cast<long long>(a.kill_after));
  std::printf("working directory: %s\n", dir.c_str());

  // 1. The uninterrupted reference run (same code, no memento).
  Stopwatch ref_sw;
  std::map<int64_t, uint64_t> ref;
  {
    Model model(a.mib << 20);
    ref[0] = model.Digest();
    while (model.cursor.step < a.steps) {
      model.Step();
      ref[model.cursor.step] = model.Digest();
    }
  }
  std::printf("%s reference: %lld uninterrupted steps without memento in %.2f s (%.0f ms/step)\n",
              t().c_str(), static_cast<long long>(a.steps), ref_sw.Seconds(),
              1000 * ref_sw.Seconds() / a.steps);

  // 2. The agent.
  std::string agent_log = dir + "/agent.log", trainer_log = dir + "/trainer.log";
  pid_t agent = Spawn({self, "agent", "--job", "demo", "--node", "0", "--root", root}, agent_log);
  bool up = WaitFor(
      [&] {
        auto fd = shm::ConnectUnix(shm::AgentSocketPath(root));
        if (fd.ok()) close(*fd);
        return fd.ok();
      },
      30);
  int rc = 0;
  auto finish = [&](int code) {
    kill(agent, SIGTERM);
    waitpid(agent, nullptr, 0);
    if (code != 0 || a.keep) {
      std::printf("logs and slots kept in %s\n", dir.c_str());
    } else {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
    return code;
  };
  if (!up) {
    std::printf("agent did not start; its log:\n%s\n", agent_log.c_str());
    return finish(1);
  }
  std::printf("%s agent started (pid %d): owns %s, socket %s\n", t().c_str(), agent, root.c_str(),
              shm::AgentSocketPath(root).c_str());

  // 3. The first trainer, killed mid-snapshot.
  auto trainer_argv = [&](const std::string& progress) {
    return std::vector<std::string>{self,
                                    "demo",
                                    "--trainer",
                                    "--root",
                                    root,
                                    "--progress",
                                    progress,
                                    "--mib",
                                    std::to_string(a.mib),
                                    "--steps",
                                    std::to_string(a.steps),
                                    "--threads",
                                    std::to_string(a.threads)};
  };
  std::string p1 = dir + "/progress.1", p2 = dir + "/progress.2";
  pid_t trainer = Spawn(trainer_argv(p1), trainer_log);
  if (!WaitFor([&] { return ReadProgress(p1).seal_s > 0 || !ReadProgress(p1).error.empty(); },
               60)) {
    std::printf("trainer did not start\n");
    return finish(1);
  }
  Progress first = ReadProgress(p1);
  if (!first.error.empty()) {
    std::printf("trainer failed: %s\n", first.error.c_str());
    return finish(1);
  }
  std::printf(
      "%s trainer 1 started (pid %d): registered 4 tensors, slots mapped in %.2f s, no "
      "saved version: starting at step 0\n",
      t().c_str(), trainer, first.seal_s);
  if (!WaitFor([&] { return ReadProgress(p1).max_complete >= a.kill_after; }, 120)) {
    std::printf("trainer made no progress; see %s\n", trainer_log.c_str());
    return finish(1);
  }
  WaitFor(
      [&] {
        for (auto [state, step] : Slots(root)) {
          if (state == shm::SlotState::kWriting) return true;
        }
        return false;
      },
      10);
  kill(trainer, SIGKILL);
  waitpid(trainer, nullptr, 0);
  first = ReadProgress(p1);
  std::printf(
      "%s SIGKILL trainer 1 after %d snapshots (mean copy %.0f ms, mean Fence wait %.1f "
      "ms); last snapshot it saw complete: step %lld, last one it started: step %lld\n",
      t().c_str(), first.completes, 1000 * first.copy_s_sum / std::max(1, first.completes),
      1000 * first.fence_s_sum / std::max(1, first.completes),
      static_cast<long long>(first.max_complete), static_cast<long long>(first.max_started));
  std::printf("%s slots left in shared memory: %s\n", t().c_str(), SlotsText(root).c_str());

  // 4. The restarted trainer restores and continues.
  Stopwatch restart;
  trainer = Spawn(trainer_argv(p2), trainer_log);
  WaitFor(
      [&] {
        Progress p = ReadProgress(p2);
        return p.restored >= 0 || p.fresh || !p.error.empty();
      },
      60);
  Progress second = ReadProgress(p2);
  if (second.restored < 0) {
    std::printf("restarted trainer did not restore: %s\n",
                second.error.empty() ? "no saved version" : second.error.c_str());
    return finish(1);
  }
  bool restored_ok = ref.count(second.restored) && ref[second.restored] == second.restored_digest &&
                     second.restored >= first.max_complete && second.restored <= first.max_started;
  std::printf(
      "%s trainer 2 restored step %lld in %.3f s from shared memory, checksums verified "
      "(%.2f s from restart to restored: process start and building its state %.2f s, "
      "mapping and prefaulting the slots %.2f s): %s\n",
      t().c_str(), static_cast<long long>(second.restored), second.restore_s, restart.Seconds(),
      restart.Seconds() - second.seal_s - second.restore_s, second.seal_s,
      restored_ok ? "bit-identical to the reference at that step" : "DIFFERENT from the reference");
  int st = 0;
  waitpid(trainer, &st, 0);
  second = ReadProgress(p2);
  if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) || !second.done) {
    std::printf("restarted trainer failed: %s (see %s)\n", second.error.c_str(),
                trainer_log.c_str());
    return finish(1);
  }
  bool diverged = false;
  for (auto [step, digest] : second.digests) diverged |= ref[step] != digest;
  std::printf(
      "%s trainer 2 continued to step %lld (%d more snapshots, mean copy %.0f ms, mean "
      "Fence wait %.1f ms)\n",
      t().c_str(), static_cast<long long>(a.steps), second.completes,
      1000 * second.copy_s_sum / std::max(1, second.completes),
      1000 * second.fence_s_sum / std::max(1, second.completes));
  std::printf("%s slots now: %s\n", t().c_str(), SlotsText(root).c_str());
  bool same = restored_ok && !diverged && second.digests.count(a.steps) &&
              second.digests[a.steps] == ref[a.steps];
  rc = same ? 0 : 1;
  std::printf("final state after step %lld: digest %016llx, uninterrupted run %016llx\n",
              static_cast<long long>(a.steps),
              static_cast<unsigned long long>(second.digests[a.steps]),
              static_cast<unsigned long long>(ref[a.steps]));
  std::printf("RESULT: the final state %s bit-identical to an uninterrupted run (%.1f s in all)\n",
              same ? "IS" : "is NOT", total.Seconds());
  return finish(rc);
}

// ---- the multi-node demo ------------------------------------------------------------

#ifdef MEMENTO_DEMO_HAVE_LAUNCH

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

int RunClusterDemo(const DemoArgs& a, int64_t steps) {
  // The store and the coordinator run in this process: their info lines
  // (every commit) would drown the report. Children keep the default level.
  const bool quiet_log = std::getenv("MEMENTO_LOG_LEVEL") == nullptr;
  if (quiet_log) setenv("MEMENTO_LOG_LEVEL", "warn", 1);
  InitLogging("demo");
  if (quiet_log) unsetenv("MEMENTO_LOG_LEVEL");
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
      "memento-trainer preset '%s', %lld steps, a snapshot every step, policy %s.\n"
      "Run 1 injects %s; run 2 is the same job without failures.\nworking directory: %s\n",
      a.nodes, a.dp, a.pp, a.preset.c_str(), static_cast<long long>(steps), a.policy.c_str(),
      inject.empty() ? "nothing" : inject.c_str(), work.c_str());
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
            : fmt::format("; node(s) lost: {}, {:.1f} MiB rebuilt from peers' memory",
                          fmt::join(r.lost_nodes, ","), r.rebuilt_bytes / 1048576.0)
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
  std::printf(
      "bytes protected per node (run 2, end; T0 = the node's ranks' newest version, "
      "T1 = redundancy it holds for the others; REFT = the plan's bytes for the policy, "
      "docs/reft.md):\n");
  for (int i = 0; i < a.nodes; ++i) {
    const launch::NodeMemory m = clean->memory.count(i) ? clean->memory[i] : launch::NodeMemory{};
    const uint64_t reft = m.plan_total_bytes();
    std::printf(
        "  node%d: T0 %.2f MiB, T1 %.2f MiB; REFT %.2f MiB (own pieces %.2f + copies %.2f + "
        "parity %.2f), %.2fx\n",
        i, m.t0_bytes / 1048576.0, m.t1_bytes / 1048576.0, reft / 1048576.0,
        m.plan_piece_bytes / 1048576.0, m.plan_copy_bytes / 1048576.0,
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

#endif  // MEMENTO_DEMO_HAVE_LAUNCH

void Setup(CLI::App& app, CommandContext& ctx) {
  static DemoArgs args;
  auto* cmd = app.add_subcommand(
      "demo",
      "Run the end-to-end demo: 4 nodes, a trainer crash and a node loss, recovery, and a "
      "bit-identity check against a failure-free run (--single-node: the one-node demo)");
  cmd->add_flag("--single-node", args.single_node,
                "the one-node demo: snapshot, SIGKILL, restart, restore, continue");
  auto* steps =
      cmd->add_option("--steps", args.steps, "Training steps (default 300; --single-node: 20)");
  cmd->add_flag("--keep", args.keep, "Keep the working directory (logs, slots)");
  // multi-node
  cmd->add_option("--trainer-bin", args.trainer_bin,
                  "memento-trainer binary (default: the one next to this build)");
  cmd->add_option("--preset", args.preset, "memento-trainer model preset")->capture_default_str();
  cmd->add_option("--nodes", args.nodes, "nodes (one rank each; dp x pp)")->capture_default_str();
  cmd->add_option("--dp", args.dp, "data-parallel size")->capture_default_str();
  cmd->add_option("--pp", args.pp, "pipeline-parallel size")->capture_default_str();
  cmd->add_option("--policy", args.policy, "redundancy policy")->capture_default_str();
  cmd->add_option("--kill-rank", args.kill_rank, "the rank the trainer crash kills")
      ->capture_default_str();
  cmd->add_option("--kill-rank-at", args.kill_rank_at, "step of the trainer crash; 0: none")
      ->capture_default_str();
  cmd->add_option("--kill-node", args.kill_node, "the node that is lost")->capture_default_str();
  cmd->add_option("--kill-node-at", args.kill_node_at, "step of the node loss; 0: none")
      ->capture_default_str();
  cmd->add_option("--progress-every", args.progress_every, "a progress line every K steps")
      ->capture_default_str();
  cmd->add_option("--store", args.store_url,
                  "coordinate through this store instead of the launcher's embedded one, e.g. "
                  "etcd://HOST:PORT[,...] (a real etcd, docs/etcd.md); each run uses a new job "
                  "name there");
  // single-node
  cmd->add_option("--mib", args.mib, "--single-node: MiB of trainer state")
      ->transform(ByteSize(uint64_t{1} << 20))
      ->default_val(args.mib);
  cmd->add_option("--kill-after", args.kill_after,
                  "--single-node: kill once this step's snapshot is complete")
      ->default_val(args.kill_after);
  cmd->add_option("--threads", args.threads, "--single-node: copy engine threads")
      ->default_val(args.threads);
  cmd->add_flag("--trainer", args.trainer, "(internal) run as the demo's trainer")->group("");
  cmd->add_option("--root", args.root, "(internal)")->group("");
  cmd->add_option("--progress", args.progress, "(internal)")->group("");
  cmd->callback([&ctx, steps] {
    if (args.trainer) {
      ctx.exit_code = RunTrainer(args);
    } else if (args.single_node) {
      ctx.exit_code = RunDemo(args);
    } else {
#ifdef MEMENTO_DEMO_HAVE_LAUNCH
      if (args.nodes != args.dp * args.pp) {
        ctx.exit_code = ReportStatus(InvalidArgumentError(
            fmt::format("--nodes {} but dp x pp = {}", args.nodes, args.dp * args.pp)));
        return;
      }
      ctx.exit_code = RunClusterDemo(args, steps->count() > 0 ? args.steps : 300);
#else
      ctx.exit_code = ReportStatus(FailedPreconditionError(
          "the multi-node demo needs the launch layer (src/launch) in the build; "
          "`memento demo --single-node` runs the one-node demo"));
#endif
    }
  });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_COMMAND(demo, memento::tools::Setup);
