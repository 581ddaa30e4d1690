// `memento bench restore --size BYTES [--threads N] --json`: a trainer saves
// its state into shared memory and exits; a new trainer (a new Client) maps
// the slots and restores. Reports restore_s (load from shared memory into the
// registered tensors, checksums verified) and, measured in the same run, the
// time of a plain memcpy of the same bytes into warm memory.
//
// A restore is one pass (docs/node_store.md, "Restore"): copy_s copies into
// the tensors with every chunk's checksum checked in the same pass; verify_s
// (a separate verification pass before the copy in earlier versions) is 0.
// first_restore_s is the first restarted trainer's restore (best-of-reps
// hides one-off costs); faults_* are this process's page faults during the
// restores; --idle S waits S seconds between the save and the first restore
// (an idle machine: see docs/node_store.md, "Restore timing on VMs").

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/byte_flag.h"
#include "common/clock.h"
#include "common/log.h"
#include "memento/client.h"
#include "shm/segment.h"
#include "tools/bench_node.h"
#include "tools/command.h"
#include "tools/environment.h"
#include "tools/json_output.h"

namespace memento::tools {
namespace {

struct RestoreBenchArgs {
  uint64_t size = uint64_t{1} << 30;
  int threads = 1;
  int reps = 3;
  uint64_t chunk = 4 << 20;
  double idle_s = 0;
  std::string huge_pages = "on";
  bool json = false;
};

struct Faults {
  long minor = 0;
  long major = 0;
};
Faults FaultsNow(int who = RUSAGE_SELF) {
  rusage u{};
  getrusage(who, &u);
  return {u.ru_minflt, u.ru_majflt};
}

int RunRestoreBench(const RestoreBenchArgs& a) {
  InitLogging("bench", LogOptionsFromEnvironment());
  spdlog::set_level(spdlog::level::warn);
  if (a.huge_pages != "on" && a.huge_pages != "off") {
    return ReportStatus(InvalidArgumentError("--huge-pages must be on or off"));
  }
  shm::SetHugePagesWanted(a.huge_pages == "on");  // for the in-process agent
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
  double best_verify = 0, best_fused = 0, first_restore = 0;
  Faults faults;
  shm::MappedPages pages;
  double snap_call_s = 0, snap_fence_s = 0;
  long snap_thread_faults = 0;
  if (st.ok()) {  // the first trainer saves and exits
    auto c = Client::Connect(o);
    st = c.status();
    if (st.ok()) st = RegisterQuarters(**c, src, a.size);
    if (st.ok()) st = (*c)->Seal();
    if (st.ok()) st = (*c)->Snapshot(1);
    if (st.ok()) st = (*c)->Fence();
  }
  if (st.ok() && a.idle_s > 0) usleep(static_cast<useconds_t>(a.idle_s * 1e6));
  for (int r = 0; st.ok() && r < a.reps; ++r) {  // restarted trainers restore
    std::memset(dst, 0, a.size);
    auto c = Client::Connect(o);
    st = c.status();
    if (st.ok()) st = RegisterQuarters(**c, dst, a.size);
    Stopwatch seal;
    if (st.ok()) st = (*c)->Seal();
    best_seal = std::min(best_seal, seal.Seconds());
    if (st.ok()) {
      Faults f0 = FaultsNow();
      auto step = (*c)->Restore();
      Faults f1 = FaultsNow();
      faults.minor += f1.minor - f0.minor;
      faults.major += f1.major - f0.major;
      st = step.status();
      const RestoreStats rs = (*c)->LastRestoreStats();
      if (r == 0) first_restore = rs.restore_s;
      if (rs.restore_s < best_restore) {
        best_restore = rs.restore_s;
        best_verify = rs.verify_s;
        best_fused = rs.copy_s;
      }
    }
    if (st.ok() && std::memcmp(src, dst, a.size) != 0) {
      st = InternalError("restored bytes differ from the saved ones");
    }
    if (st.ok() && r == 0) {
      // The restarted trainer's first snapshot: the Snapshot() call (the
      // training thread; its own page faults) and the wait for the copy.
      Faults t0 = FaultsNow(RUSAGE_THREAD);
      Stopwatch call;
      st = (*c)->Snapshot(2);
      snap_call_s = call.Seconds();
      snap_thread_faults = FaultsNow(RUSAGE_THREAD).minor - t0.minor;
      if (st.ok()) st = (*c)->Fence();
      snap_fence_s = call.Seconds();
      pages = shm::MappedPagesOf((*node)->root() + "/");
    }
  }
  if (st.ok()) best_copy = BestMemcpySeconds(dst, src, a.size, a.reps);
  if (!st.ok()) return ReportStatus(st);
  double gb = static_cast<double>(a.size) / 1e9;
  nlohmann::json j = {
      {"bench", "restore"},
      {"bytes", a.size},
      {"threads", a.threads},
      {"chunk_bytes", a.chunk},
      {"reps", a.reps},
      {"restore_s", best_restore},
      {"restore_gbps", gb / best_restore},
      {"verify_s", best_verify},
      {"copy_s", best_fused},
      {"verify_overhead", best_fused > 0 ? best_verify / best_fused : 0},
      {"first_restore_s", first_restore},
      {"idle_s", a.idle_s},
      {"faults_minor", faults.minor},
      {"faults_major", faults.major},
      {"map_slots_s", best_seal},
      {"huge_pages", a.huge_pages},
      {"tmpfs_huge", shm::TmpfsHugeOption((*node)->root())},
      {"shmem_thp", shm::ShmemThpSetting()},
      {"slot_huge_fraction", pages.rss_bytes > 0 ? static_cast<double>(pages.huge_bytes) /
                                                       static_cast<double>(pages.rss_bytes)
                                                 : 0.0},
      {"first_snapshot_call_s", snap_call_s},
      {"first_snapshot_call_thread_faults", snap_thread_faults},
      {"first_snapshot_s", snap_fence_s},
      {"restart_to_restored_s", best_seal + best_restore},
      {"memcpy_s", best_copy},
      {"memcpy_gbps", gb / best_copy},
      {"ratio", best_copy / best_restore}};
  memento::tools::PrintJson("memento.bench.restore/1", std::move(j));
  return 0;
}

void Setup(CLI::App& app, CommandContext& ctx) {
  static RestoreBenchArgs args;
  auto* cmd = app.add_subcommand(
      "restore", "Restore from shared memory after a trainer restart vs memcpy (seconds)");
  cmd->add_option("--size", args.size, "Bytes of state")
      ->transform(ByteSize())
      ->default_val(args.size);
  cmd->add_option("--threads", args.threads, "Copy engine threads")->default_val(1);
  cmd->add_option("--reps", args.reps, "Restarts (the best is reported)")->default_val(3);
  cmd->add_option("--chunk", args.chunk, "Chunk bytes")
      ->transform(ByteSize())
      ->default_val(args.chunk);
  cmd->add_option("--idle", args.idle_s, "Seconds to wait between the save and the first restore")
      ->default_val(0);
  cmd->add_option("--huge-pages", args.huge_pages,
                  "on: slots in 2 MiB pages where the kernel allows (default); off: 4 KiB pages "
                  "(MEMENTO_SHM_HUGE_PAGES=off), for comparison")
      ->default_val("on");
  cmd->add_flag("--json", args.json, "One-line JSON");
  cmd->callback([&ctx] { ctx.exit_code = RunRestoreBench(args); });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_BENCH(restore, memento::tools::Setup);
