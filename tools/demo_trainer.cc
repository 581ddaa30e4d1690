// The single-node demo's trainer (`memento demo --trainer`, tools/demo.h): a
// deterministic model (parameters and two optimizer moments rewritten every
// step) that snapshots every step and reports its progress on a file.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/log.h"
#include "fmt/format.h"
#include "memento/client.h"
#include "tools/command.h"
#include "tools/demo.h"
#include "tools/environment.h"

namespace memento::tools {
namespace {

// ---- trainer mode ---------------------------------------------------------------

int g_progress = -1;
void Emit(const std::string& line) {
  std::string l = line + "\n";
  if (write(g_progress, l.data(), l.size()) < 0) _exit(3);
}

}  // namespace

int RunDemoTrainer(const DemoArgs& a) {
  InitLogging("trainer rank0", LogOptionsFromEnvironment());
  g_progress = open(a.progress.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (g_progress < 0) return ReportStatus(ErrnoError("open " + a.progress, errno));
  auto fail = [](const Status& st) {
    Emit("E " + st.ToString());
    return ReportStatus(st);
  };
  DemoModel model(a.mib << 20);
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

}  // namespace memento::tools
