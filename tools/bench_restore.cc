// `memento bench restore --size BYTES [--threads N] --json`: a trainer saves
// its state into shared memory and exits; a new trainer (a new Client) maps
// the slots and restores. Reports restore_s (load from shared memory into the
// registered tensors, checksums verified) and, measured in the same run, the
// time of a plain memcpy of the same bytes into warm memory.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/agent.h"
#include "common/clock.h"
#include "common/log.h"
#include "memento/client.h"
#include "tools/command.h"

namespace memento::tools {
namespace {

struct RestoreBenchArgs {
  uint64_t size = uint64_t{1} << 30;
  int threads = 1;
  int reps = 3;
  uint64_t chunk = 4 << 20;
  bool json = false;
};

uint8_t* Warm(size_t n, uint8_t fill) {
  void* p =
      mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  std::memset(p, fill, n);
  return static_cast<uint8_t*>(p);
}

Status RegisterAll(Client& c, uint8_t* base, uint64_t size) {
  uint64_t quarter = size / 4;
  for (int i = 0; i < 4; ++i) {
    uint64_t n = i < 3 ? quarter : size - 3 * quarter;
    TensorMeta m{
        "t" + std::to_string(i), DType::kUInt8, {static_cast<int64_t>(n)}, StateClass::kReplicated};
    MEMENTO_RETURN_IF_ERROR(c.RegisterTensor(m, base + i * quarter));
  }
  return Status::Ok();
}

int RunRestoreBench(const RestoreBenchArgs& a) {
  InitLogging("bench");
  spdlog::set_level(spdlog::level::warn);
  char tmpl[] = "/dev/shm/memento-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return ReportStatus(ErrnoError("mkdtemp", errno));
  std::string base = tmpl, root = base + "/node0";
  int rc = 0;
  {
    auto agent = agent::Agent::Start({"bench", 0, root, 0});
    if (!agent.ok()) return ReportStatus(agent.status());
    std::thread serve([&] { (*agent)->Serve().IgnoreError(); });
    uint8_t* src = Warm(a.size, 0);
    uint8_t* dst = Warm(a.size, 0);
    Status st = src && dst ? Status::Ok() : ResourceExhaustedError("cannot allocate buffers");
    for (uint64_t i = 0; st.ok() && i < a.size; i += 8) {
      uint64_t v = i * 0x9e3779b97f4a7c15ULL;
      std::memcpy(src + i, &v, std::min<uint64_t>(8, a.size - i));
    }
    ClientOptions o;
    o.job_id = "bench";
    o.agent_dir = root;
    o.copy_threads = a.threads;
    o.chunk_bytes = a.chunk;
    double best_restore = 1e9, best_seal = 1e9, best_copy = 1e9;
    if (st.ok()) {  // the first trainer saves and exits
      auto c = Client::Connect(o);
      st = c.status();
      if (st.ok()) st = RegisterAll(**c, src, a.size);
      if (st.ok()) st = (*c)->Seal();
      if (st.ok()) st = (*c)->Snapshot(1);
      if (st.ok()) st = (*c)->Fence();
    }
    for (int r = 0; st.ok() && r < a.reps; ++r) {  // restarted trainers restore
      std::memset(dst, 0, a.size);
      auto c = Client::Connect(o);
      st = c.status();
      if (st.ok()) st = RegisterAll(**c, dst, a.size);
      Stopwatch seal;
      if (st.ok()) st = (*c)->Seal();
      best_seal = std::min(best_seal, seal.Seconds());
      if (st.ok()) {
        auto step = (*c)->Restore();
        st = step.status();
        best_restore = std::min(best_restore, (*c)->LastRestoreStats().restore_s);
      }
      if (st.ok() && std::memcmp(src, dst, a.size) != 0) {
        st = InternalError("restored bytes differ from the saved ones");
      }
    }
    for (int r = 0; st.ok() && r < a.reps; ++r) {
      Stopwatch sw;
      std::memcpy(dst, src, a.size);
      best_copy = std::min(best_copy, sw.Seconds());
    }
    if (st.ok()) {
      double gb = static_cast<double>(a.size) / 1e9;
      nlohmann::json j = {{"bench", "restore"},
                          {"bytes", a.size},
                          {"threads", a.threads},
                          {"chunk_bytes", a.chunk},
                          {"reps", a.reps},
                          {"restore_s", best_restore},
                          {"restore_gbps", gb / best_restore},
                          {"map_slots_s", best_seal},
                          {"restart_to_restored_s", best_seal + best_restore},
                          {"memcpy_s", best_copy},
                          {"memcpy_gbps", gb / best_copy},
                          {"ratio", best_copy / best_restore}};
      std::printf("%s\n", a.json ? j.dump().c_str() : j.dump(2).c_str());
    } else {
      rc = ReportStatus(st);
    }
    if (src) munmap(src, a.size);
    if (dst) munmap(dst, a.size);
    (*agent)->Stop();
    serve.join();
  }
  std::error_code ec;
  std::filesystem::remove_all(base, ec);
  return rc;
}

void Setup(CLI::App& app, CommandContext& ctx) {
  static RestoreBenchArgs args;
  auto* cmd = app.add_subcommand(
      "restore", "Restore from shared memory after a trainer restart vs memcpy (seconds)");
  cmd->add_option("--size", args.size, "Bytes of state")->default_val(args.size);
  cmd->add_option("--threads", args.threads, "Copy engine threads")->default_val(1);
  cmd->add_option("--reps", args.reps, "Restarts (the best is reported)")->default_val(3);
  cmd->add_option("--chunk", args.chunk, "Chunk bytes")->default_val(args.chunk);
  cmd->add_flag("--json", args.json, "One-line JSON");
  cmd->callback([&ctx] { ctx.exit_code = RunRestoreBench(args); });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_BENCH(restore, memento::tools::Setup);
