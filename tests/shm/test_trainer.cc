// A small trainer process for the crash tests: deterministic state of a given
// size (three tensors and a blob), mutated in full every step, snapshotted
// through memento after every step. Writes one line per event to --progress
// with a single write(2) each (O_APPEND), so a SIGKILL never leaves half a line:
//   R <step> <digest>   restored <step> (digest of the whole state)
//   S <step>            about to call Snapshot(step)
//   C <step>            snapshot <step> is complete (Fence returned OK)
//   K <step>            snapshot <step> was skipped (its slot was held)
//   D <step> <digest>   state digest after the optimizer step <step>
//   E <message>         an error; exits 1
// --no-memento runs the same training without snapshots (the reference).
// --schedule has: snapshots are scheduled by HAS; the trainer reports the
// digest computation as compute and the rest of the step as idle.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/testing_hooks.h"
#include "common/checksum.h"
#include "common/log.h"
#include "fmt/format.h"
#include "memento/client.h"

namespace {

int g_progress = -1;

void Emit(const std::string& line) {
  std::string l = line + "\n";
  if (write(g_progress, l.data(), l.size()) != static_cast<ssize_t>(l.size())) _exit(3);
}

[[noreturn]] void Fail(const std::string& what) {
  Emit("E " + what);
  std::fprintf(stderr, "test_trainer: %s\n", what.c_str());
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
  std::vector<uint64_t> params, m, v;
  Cursor cursor{0, 12345};

  // param_seed != 0: other parameters (another pipeline stage on the node).
  explicit Model(size_t bytes, uint64_t param_seed = 0) {
    size_t words = bytes / 8;
    params.resize(words / 2);
    m.resize(words * 3 / 10);
    v.resize(words - params.size() - m.size());
    for (size_t i = 0; i < params.size(); ++i) params[i] = SplitMix(i + (param_seed << 48));
    for (size_t i = 0; i < m.size(); ++i) m[i] = SplitMix(i + (1ULL << 40));
    for (size_t i = 0; i < v.size(); ++i) v[i] = SplitMix(i + (2ULL << 40));
  }
  // One "optimizer step": every word changes, depending on the previous state.
  void Step() {
    cursor.step += 1;
    cursor.rng = SplitMix(cursor.rng);
    const uint64_t k = cursor.rng | 1;
    for (size_t i = 0; i < m.size(); ++i) m[i] = m[i] * 6364136223846793005ULL + params[i];
    for (size_t i = 0; i < v.size(); ++i) v[i] = (v[i] ^ (v[i] >> 29)) + k;
    for (size_t i = 0; i < params.size(); ++i) {
      params[i] += m[i % m.size()] ^ (k + i);
    }
  }
  uint64_t Digest() const {
    uint64_t h = memento::Checksum(params.data(), params.size() * 8);
    h = memento::ChecksumWithSeed(m.data(), m.size() * 8, h);
    h = memento::ChecksumWithSeed(v.data(), v.size() * 8, h);
    return memento::ChecksumWithSeed(&cursor, sizeof(cursor), h);
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"memento crash-test trainer"};
  std::string job, dir, progress;
  int rank = 0, threads = 1;
  size_t bytes = 64 << 20;
  int64_t steps = 20;
  bool no_memento = false;
  double step_sleep_s = 0;
  std::string schedule = "eager";
  app.add_option("--job", job)->required();
  app.add_option("--dir", dir);
  app.add_option("--rank", rank);
  app.add_option("--bytes", bytes);
  app.add_option("--steps", steps);
  app.add_option("--threads", threads);
  app.add_option("--progress", progress)->required();
  app.add_option("--step-sleep", step_sleep_s);
  uint64_t param_seed = 0;
  app.add_option("--param-seed", param_seed,
                 "Initial parameters from this seed (0: the default; ranks with different seeds "
                 "stand for different pipeline stages registering `params`)");
  app.add_flag("--no-memento", no_memento);
  app.add_option("--schedule", schedule);
  CLI11_PARSE(app, argc, argv);
  memento::InitLogging("trainer rank" + std::to_string(rank));
  // The tests slow this trainer's chunk copies down through its environment
  // (the library reads no such variable: client/testing_hooks.h).
  if (const char* d = std::getenv("MEMENTO_TEST_COPY_DELAY_US")) {
    memento::client::testing_hooks::SetCopyDelayUs(std::atoi(d));
  }
  g_progress = open(progress.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (g_progress < 0) return 2;

  Model model(bytes, param_seed);
  std::unique_ptr<memento::Client> client;
  if (!no_memento) {
    memento::ClientOptions o;
    o.job_id = job;
    o.rank = rank;
    o.world_size = rank + 1;
    o.agent_dir = dir;
    o.copy_threads = threads;
    o.connect_timeout_s = 20;
    auto parsed = memento::ParseSchedule(schedule);
    if (!parsed.ok()) Fail(parsed.status().ToString());
    o.schedule = *parsed;
    auto c = memento::Client::Connect(o);
    if (!c.ok()) Fail(c.status().ToString());
    client = std::move(*c);
    using memento::DType;
    using memento::StateClass;
    auto reg = [&](const char* name, std::vector<uint64_t>& t, StateClass cls) {
      memento::Status st = client->RegisterTensor(
          {name, DType::kInt64, {static_cast<int64_t>(t.size())}, cls}, t.data());
      if (!st.ok()) Fail(st.ToString());
    };
    reg("params", model.params, StateClass::kReplicated);
    reg("adam.m", model.m, StateClass::kDpSharded);
    reg("adam.v", model.v, StateClass::kDpSharded);
    memento::Status st = client->RegisterBlob("cursor", &model.cursor, sizeof(model.cursor));
    if (!st.ok()) Fail(st.ToString());
    st = client->Seal();
    if (!st.ok()) Fail(st.ToString());
    auto restored = client->Restore();
    if (restored.ok()) {
      if (model.cursor.step != *restored) {
        Fail(fmt::format("restored step {} but the cursor says {}", *restored, model.cursor.step));
      }
      Emit(fmt::format("R {} {}", *restored, model.Digest()));
    } else if (restored.status().code() != memento::StatusCode::kNotFound) {
      Fail(restored.status().ToString());
    } else {
      Emit(fmt::format("R 0 {}", model.Digest()));
    }
  } else {
    Emit(fmt::format("D 0 {}", model.Digest()));
  }
  int64_t pending = -1;
  while (model.cursor.step < steps) {
    if (client) {
      memento::Status st = client->Fence();
      if (!st.ok()) Fail(st.ToString());
      if (pending >= 0) Emit(fmt::format("C {}", pending));
    }
    model.Step();
    if (client) {
      Emit(fmt::format("S {}", model.cursor.step));
      memento::Status st = client->Snapshot(model.cursor.step);
      if (!st.ok()) Fail(st.ToString());
      pending = model.cursor.step;
      // (A snapshot's own stats come with its Fence; these are a skip's.)
      const memento::SnapshotStats ss = client->LastSnapshotStats();
      if (ss.skipped && ss.step == model.cursor.step) {
        Emit(fmt::format("K {}", model.cursor.step));
        pending = -1;
      }
    }
    if (client) client->OnPhase(memento::Phase::kCompute);
    Emit(fmt::format("D {} {}", model.cursor.step, model.Digest()));
    if (client) client->OnPhase(memento::Phase::kIdle);
    if (step_sleep_s > 0) usleep(static_cast<useconds_t>(step_sleep_s * 1e6));
  }
  if (client) {
    memento::Status st = client->Fence();
    if (!st.ok()) Fail(st.ToString());
    if (pending >= 0) Emit(fmt::format("C {}", pending));
  }
  Emit("X done");
  return 0;
}
