// `memento bench snapshot --size BYTES [--threads N] --json`: registered host
// tensors into a shared-memory slot through the real client and agent
// (checksums included), against plain memcpy of the same bytes into warm
// memory in the same run.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/log.h"
#include "memento/client.h"
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

void RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

// Anonymous memory, touched so that no page fault is timed.
uint8_t* WarmBuffer(size_t n, uint8_t fill) {
  void* p =
      mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  std::memset(p, fill, n);
  return static_cast<uint8_t*>(p);
}

int RunSnapshotBench(const SnapshotBenchArgs& a) {
  InitLogging("bench");
  spdlog::set_level(spdlog::level::warn);
  char tmpl[] = "/dev/shm/memento-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return ReportStatus(ErrnoError("mkdtemp", errno));
  std::string base = tmpl;
  std::string root = base + "/node0";
  int rc = 0;
  {
    auto agent = agent::Agent::Start({"bench", 0, root, 0});
    if (!agent.ok()) {
      RemoveTree(base);
      return ReportStatus(agent.status());
    }
    std::thread serve([&] { (*agent)->Serve().IgnoreError(); });
    uint8_t* src = WarmBuffer(a.size, 0x5a);
    uint8_t* dst = WarmBuffer(a.size, 0);
    Status st = src && dst ? Status::Ok() : ResourceExhaustedError("cannot allocate buffers");
    double best_snap = 1e9, best_copy = 1e9, fence_wait = 0;
    if (st.ok()) {
      // plain memcpy into warm memory
      for (int r = 0; r < a.reps; ++r) {
        Stopwatch sw;
        std::memcpy(dst, src, a.size);
        best_copy = std::min(best_copy, sw.Seconds());
      }
      ClientOptions o;
      o.job_id = "bench";
      o.agent_dir = root;
      o.copy_threads = a.threads;
      o.chunk_bytes = a.chunk;
      auto client = Client::Connect(o);
      st = client.status();
      if (st.ok()) {
        // Four tensors, as a model's parameters and optimizer state would be.
        uint64_t quarter = a.size / 4;
        for (int i = 0; i < 4; ++i) {
          uint64_t n = i < 3 ? quarter : a.size - 3 * quarter;
          TensorMeta m{"t" + std::to_string(i),
                       DType::kUInt8,
                       {static_cast<int64_t>(n)},
                       StateClass::kReplicated};
          if (st.ok()) st = (*client)->RegisterTensor(m, src + i * quarter);
        }
        if (st.ok()) st = (*client)->Seal();
        for (int r = 0; st.ok() && r < a.reps + 1; ++r) {
          Stopwatch sw;
          st = (*client)->Snapshot(r + 1);
          if (st.ok()) st = (*client)->Fence();
          if (r > 0) best_snap = std::min(best_snap, sw.Seconds());  // first: warm-up
          fence_wait = (*client)->LastSnapshotStats().fence_wait_s;
        }
      }
    }
    if (st.ok()) {
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
    } else {
      rc = ReportStatus(st);
    }
    if (src) munmap(src, a.size);
    if (dst) munmap(dst, a.size);
    (*agent)->Stop();
    serve.join();
  }
  RemoveTree(base);
  return rc;
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
