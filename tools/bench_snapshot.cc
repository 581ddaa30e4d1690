// `memento bench snapshot --size BYTES [--threads N] --json`: registered host
// tensors into a shared-memory slot through the real client and agent
// (checksums included), against plain memcpy of the same bytes into warm
// memory in the same run.

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/log.h"
#include "memento/client.h"
#include "tools/bench_node.h"
#include "tools/command.h"

namespace memento::tools {
namespace {

struct SnapshotBenchArgs {
  uint64_t size = uint64_t{1} << 30;
  int threads = 1;
  int reps = 5;
  uint64_t chunk = 4 << 20;
  bool json = false;
};

int RunSnapshotBench(const SnapshotBenchArgs& a) {
  InitLogging("bench");
  spdlog::set_level(spdlog::level::warn);
  auto node = BenchNode::Start();
  if (!node.ok()) return ReportStatus(node.status());
  WarmBuffer src(a.size, 0x5a), dst(a.size, 0);
  Status st =
      src.data() && dst.data() ? Status::Ok() : ResourceExhaustedError("cannot allocate buffers");
  double best_snap = 1e9, best_copy = 1e9, fence_wait = 0;
  if (st.ok()) {
    // plain memcpy into warm memory
    best_copy = BestMemcpySeconds(dst.data(), src.data(), a.size, a.reps);
    auto client = Client::Connect((*node)->ClientOptionsFor(a.threads, a.chunk));
    st = client.status();
    if (st.ok()) st = RegisterQuarters(**client, src.data(), a.size);
    if (st.ok()) st = (*client)->Seal();
    for (int r = 0; st.ok() && r < a.reps + 1; ++r) {
      Stopwatch sw;
      st = (*client)->Snapshot(r + 1);
      if (st.ok()) st = (*client)->Fence();
      if (r > 0) best_snap = std::min(best_snap, sw.Seconds());  // first: warm-up
      fence_wait = (*client)->LastSnapshotStats().fence_wait_s;
    }
  }
  if (!st.ok()) return ReportStatus(st);
  double gb = static_cast<double>(a.size) / 1e9;
  nlohmann::json j = {{"bench", "snapshot"},
                      {"bytes", a.size},
                      {"threads", a.threads},
                      {"chunk_bytes", a.chunk},
                      {"reps", a.reps},
                      {"snapshot_s", best_snap},
                      {"snapshot_gbps", gb / best_snap},
                      {"memcpy_s", best_copy},
                      {"memcpy_gbps", gb / best_copy},
                      {"ratio", best_copy / best_snap},
                      {"last_fence_wait_s", fence_wait}};
  std::printf("%s\n", a.json ? j.dump().c_str() : j.dump(2).c_str());
  return 0;
}

void Setup(CLI::App& app, CommandContext& ctx) {
  static SnapshotBenchArgs args;
  auto* cmd = app.add_subcommand(
      "snapshot", "Registered host tensors into a shared-memory slot vs memcpy (GB/s)");
  cmd->add_option("--size", args.size, "Bytes of state")->default_val(args.size);
  cmd->add_option("--threads", args.threads, "Copy engine threads")->default_val(1);
  cmd->add_option("--reps", args.reps, "Repetitions (the best is reported)")->default_val(5);
  cmd->add_option("--chunk", args.chunk, "Chunk bytes")->default_val(args.chunk);
  cmd->add_flag("--json", args.json, "One-line JSON");
  cmd->callback([&ctx] { ctx.exit_code = RunSnapshotBench(args); });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_BENCH(snapshot, memento::tools::Setup);
