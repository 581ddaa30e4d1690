// `memento bench has` on the CPU (tools/bench_has.h): the OpenBLAS loop, copies
// with CopyAndChecksum.
#include <cstring>

#include "common/checksum.h"
#include "common/clock.h"
#include "tools/bench_has.h"
#include "tools/bench_stats.h"

namespace memento::tools {
namespace {

Status CopyChunks(const std::vector<has::StateRegion>& state, const std::vector<Chunk>& chunks,
                  Slots* slots, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    const Chunk& c = chunks[i];
    (void)CopyAndChecksum(slots->region[c.region] + c.offset,
                          static_cast<const uint8_t*>(state[c.region].data) + c.offset, c.bytes);
  }
  return Status::Ok();
}

Result<std::unique_ptr<Snapshotter>> MakeCpuMode(const std::string& mode, has::TrainingLoop* loop,
                                                 const std::vector<Chunk>* chunks, Slots* slots,
                                                 const has::HasOptions& has_options, int threads) {
  const std::vector<has::StateRegion> state = loop->State();
  if (mode == "off") return std::unique_ptr<Snapshotter>(new OffSnapshotter());
  if (mode == "sync") {
    return std::unique_ptr<Snapshotter>(
        new SyncSnapshotter([=] { return CopyChunks(state, *chunks, slots, 0, chunks->size()); }));
  }
  if (mode == "host") {
    // Whole regions, one pass each, no chunking and no phase awareness.
    return std::unique_ptr<Snapshotter>(new ThreadSnapshotter([=] {
      for (size_t r = 0; r < state.size(); ++r) {
        CopyAndChecksum(slots->region[r], state[r].data, state[r].bytes);
      }
      return Status::Ok();
    }));
  }
  if (mode == "host_device") {
    return std::unique_ptr<Snapshotter>(new ThreadSnapshotter(
        [=] { return CopyChunks(state, *chunks, slots, 0, chunks->size()); }));
  }
  if (mode == "has") {
    has::HasRunnerOptions ro;
    ro.has = has_options;
    ro.threads = threads;
    MEMENTO_ASSIGN_OR_RETURN(auto runner, has::HasRunner::Create(ro, [=](size_t i) {
                               return CopyChunks(state, *chunks, slots, i, i + 1);
                             }));
    std::vector<uint64_t> sizes;
    for (const Chunk& c : *chunks) sizes.push_back(c.bytes);
    return std::unique_ptr<Snapshotter>(new HasSnapshotter(std::move(runner), sizes));
  }
  return Status(StatusCode::kInvalidArgument, "unknown mode '" + mode + "'");
}

nlohmann::json CpuCopyThroughput(const std::vector<has::StateRegion>& state, Slots* slots) {
  std::vector<double> plain, fused;
  uint64_t bytes = 0;
  for (const auto& r : state) bytes += r.bytes;
  for (int i = 0; i < 3; ++i) {
    Stopwatch sw;
    for (size_t r = 0; r < state.size(); ++r)
      std::memcpy(slots->region[r], state[r].data, state[r].bytes);
    plain.push_back(sw.Seconds());
    sw.Reset();
    for (size_t r = 0; r < state.size(); ++r) {
      CopyAndChecksum(slots->region[r], state[r].data, state[r].bytes);
    }
    fused.push_back(sw.Seconds());
  }
  const double p = bytes / Median(plain) / 1e9, f = bytes / Median(fused) / 1e9;
  return {{"bytes", bytes}, {"memcpy_gbps", p}, {"copy_and_checksum_gbps", f}, {"ratio", f / p}};
}

class CpuDevice : public HasBenchDevice {
 public:
  CpuDevice(std::unique_ptr<has::TrainingLoop> loop, int threads)
      : loop_(std::move(loop)), threads_(threads) {}
  const char* name() const override { return "cpu"; }
  has::TrainingLoop* loop() override { return loop_.get(); }
  Result<nlohmann::json> PrepareSlots(const std::vector<has::StateRegion>& state,
                                      Slots* slots) override {
    return CpuCopyThroughput(state, slots);
  }
  Result<std::unique_ptr<Snapshotter>> MakeMode(const std::string& mode,
                                                const std::vector<Chunk>* chunks, Slots* slots,
                                                const has::HasOptions& has_options) override {
    return MakeCpuMode(mode, loop_.get(), chunks, slots, has_options, threads_);
  }
  int has_threads() const override { return threads_; }
  const char* notes() const override {
    return "cpu: no device, so host and host_device differ only in chunking "
           "(whole regions vs chunks); every mode uses CopyAndChecksum";
  }

 private:
  std::unique_ptr<has::TrainingLoop> loop_;
  int threads_;
};

}  // namespace

Result<std::unique_ptr<HasBenchDevice>> MakeCpuHasBenchDevice(const HasBenchArgs& a) {
  has::CpuLoopOptions o;
  if (a.state_mib > 0) o.state_bytes = static_cast<size_t>(a.state_mib) * kHasBenchMiB;
  if (a.hidden > 0) o.hidden = a.hidden;
  if (a.layers > 0) o.layers = a.layers;
  if (a.comm_mib >= 0) o.comm_bytes = static_cast<size_t>(a.comm_mib) * kHasBenchMiB;
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<has::TrainingLoop> loop, has::MakeCpuLoop(o));
  return std::unique_ptr<HasBenchDevice>(
      new CpuDevice(std::move(loop), a.has_threads > 0 ? a.has_threads : 1));
}

}  // namespace memento::tools
