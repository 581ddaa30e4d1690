// `memento bench restore --size BYTES [--threads N] --json`: a trainer saves
// its state into shared memory and exits; a new trainer (a new Client) maps
// the slots and restores. Reports restore_s (load from shared memory into the
// registered tensors, checksums verified) and, measured in the same run, the
// time of a plain memcpy of the same bytes into warm memory.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/log.h"
#include "memento/client.h"
#include "tools/bench_node.h"
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

int RunRestoreBench(const RestoreBenchArgs& a) {
  InitLogging("bench");
  spdlog::set_level(spdlog::level::warn);
  auto node = BenchNode::Start();
  if (!node.ok()) return ReportStatus(node.status());
  WarmBuffer src_buf(a.size, 0), dst_buf(a.size, 0);
  uint8_t* src = src_buf.data();
  uint8_t* dst = dst_buf.data();
  Status st = src && dst ? Status::Ok() : ResourceExhaustedError("cannot allocate buffers");
  for (uint64_t i = 0; st.ok() && i < a.size; i += 8) {
    uint64_t v = i * 0x9e3779b97f4a7c15ULL;
    std::memcpy(src + i, &v, std::min<uint64_t>(8, a.size - i));
  }
  const ClientOptions o = (*node)->ClientOptionsFor(a.threads, a.chunk);
  double best_restore = 1e9, best_seal = 1e9, best_copy = 1e9;
  if (st.ok()) {  // the first trainer saves and exits
    auto c = Client::Connect(o);
    st = c.status();
    if (st.ok()) st = RegisterQuarters(**c, src, a.size);
    if (st.ok()) st = (*c)->Seal();
    if (st.ok()) st = (*c)->Snapshot(1);
    if (st.ok()) st = (*c)->Fence();
  }
  for (int r = 0; st.ok() && r < a.reps; ++r) {  // restarted trainers restore
    std::memset(dst, 0, a.size);
    auto c = Client::Connect(o);
    st = c.status();
    if (st.ok()) st = RegisterQuarters(**c, dst, a.size);
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
  if (st.ok()) best_copy = BestMemcpySeconds(dst, src, a.size, a.reps);
  if (!st.ok()) return ReportStatus(st);
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
  return 0;
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
