// `memento bench parity`: where a rank's XOR / Reed-Solomon parity is best
// computed (docs/reft.md section 4). One rank of a DP group of --dp ranks
// holding --state-mib of replicated state, under the planner's plan for
// --policy, snapshots its sharded slot two ways, best of --reps each:
//   client: the copy workers copy the rank's ranges and encode its parities
//           from registered memory into the slot (client::ParityProducer);
//           the agent then copies the parity into T1;
//   agent:  the copy workers copy the ranges and the stripe inputs into the
//           slot; the agent then encodes each parity from the slot into T1
//           (codec::EncodeStream over the slot's bytes, as T1Producer does).
// Prints one JSON object: per mode the client's snapshot time and CPU, the
// agent's time (one thread, as the agent's save path), the slot's bytes,
// and the parity checked equal between the modes.
#include <time.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "client/parity_producer.h"
#include "codec/erasure_code.h"
#include "common/check.h"
#include "common/clock.h"
#include "shm/slot.h"
#include "snap/copy_engine.h"
#include "tools/command.h"
#include "tools/json_output.h"
#include "topo/plan.h"
#include "topo/save_ranges.h"

namespace memento::tools {
namespace {

struct ParityBenchOptions {
  size_t state_mib = 128;
  int dp = 4;
  std::string policy = "xor";
  int threads = 2;
  int reps = 5;
  bool json = true;
};

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Run {
  double client_s = 1e30, client_cpu_s = 1e30, agent_s = 1e30;
  uint64_t slot_bytes = 0;
  std::vector<std::vector<uint8_t>> parities;  // T1 entries
};

Status RunMode(const ParityBenchOptions& o, const topo::Plan& plan, const std::vector<uint8_t>& w,
               const TensorMeta& meta, bool client_parity, Run* out) {
  const std::vector<TensorMeta> inv = {meta};
  MEMENTO_ASSIGN_OR_RETURN(std::vector<topo::Segment> ranges,
                           topo::RankSaveRanges(plan, 0, inv, /*parity_inputs=*/!client_parity));
  std::vector<shm::SlotEntrySpec> specs;
  for (const topo::Segment& s : ranges) specs.push_back({meta, s.offset, s.length});
  std::vector<std::unique_ptr<client::ParityProducer>> producers;
  const std::vector<uint32_t>& pids = plan.ranks[0].parities;
  if (client_parity) {
    for (uint32_t pid : pids) {
      const topo::Parity& par = plan.parities[pid];
      const topo::Stripe& st = plan.stripes[par.stripe];
      shm::PlanParity pp;
      pp.id = pid;
      pp.xor_code = st.xor_code;
      pp.k = st.k;
      pp.f = st.f;
      pp.index = par.index;
      pp.block_bytes = st.block_bytes;
      for (const auto& block : topo::StripeBlockSegments(plan, st)) {
        std::vector<shm::SaveRange> b;
        for (const topo::Segment& s : block) b.push_back({s.tensor, s.offset, s.length});
        pp.blocks.push_back(std::move(b));
      }
      MEMENTO_ASSIGN_OR_RETURN(auto prod,
                               client::ParityProducer::Create(pp, [&](const shm::SaveRange& r) {
                                 return Result<const uint8_t*>(w.data() + r.offset);
                               }));
      shm::SlotEntrySpec spec;
      spec.meta = shm::ParityEntryMeta(pid, st.block_bytes);
      spec.parity = pid;
      specs.push_back(spec);
      producers.push_back(std::move(prod));
    }
  }
  MEMENTO_ASSIGN_OR_RETURN(shm::SlotLayout layout,
                           shm::ComputeRangeSlotLayout("bench", 0, specs, size_t{4} << 20));
  out->slot_bytes = layout.data_bytes;
  std::vector<uint8_t> slot(layout.data_bytes);
  std::vector<uint64_t> sums(layout.chunks.size());
  snap::CopyEngine engine({.threads = o.threads, .name = "bench-copy"});
  out->parities.assign(pids.size(), {});
  for (int rep = 0; rep <= o.reps; ++rep) {  // rep 0 warms up
    std::vector<snap::CopyChunk> chunks;
    size_t producer_index = 0;
    std::vector<int> entry_producer(layout.tensors.size(), -1);
    for (size_t e = 0; e < layout.tensors.size(); ++e) {
      if (layout.tensors[e].is_parity()) entry_producer[e] = static_cast<int>(producer_index++);
    }
    for (size_t i = 0; i < layout.chunks.size(); ++i) {
      const shm::ChunkEntry& c = layout.chunks[i];
      const shm::SavedTensor& t = layout.tensors[c.tensor_index];
      snap::CopyChunk cc;
      if (t.is_parity()) {
        cc.producer = producers[static_cast<size_t>(entry_producer[c.tensor_index])].get();
        cc.producer_offset = c.offset - t.offset;
      } else {
        cc.src = w.data() + t.range_offset + (c.offset - t.offset);
      }
      cc.dst = slot.data() + c.offset;
      cc.length = c.length;
      cc.checksum_out = &sums[i];
      chunks.push_back(cc);
    }
    const double cpu0 = ProcessCpuSeconds();
    Stopwatch sw;
    auto job = engine.Submit(std::move(chunks), nullptr, nullptr);
    MEMENTO_RETURN_IF_ERROR(job->Wait());
    const double client_s = sw.Seconds();
    const double client_cpu = ProcessCpuSeconds() - cpu0;
    // The agent: T1 parity entries from the slot.
    Stopwatch aw;
    for (size_t j = 0; j < pids.size(); ++j) {
      const topo::Parity& par = plan.parities[pids[j]];
      const topo::Stripe& st = plan.stripes[par.stripe];
      std::vector<uint8_t>& t1 = out->parities[j];
      t1.resize(st.block_bytes);
      const int pe = shm::FindParityEntry(layout.tensors, pids[j]);
      if (pe >= 0) {
        std::memcpy(t1.data(), slot.data() + layout.tensors[static_cast<size_t>(pe)].offset,
                    st.block_bytes);
        continue;
      }
      MEMENTO_ASSIGN_OR_RETURN(
          codec::ErasureCode code,
          codec::ErasureCode::Create(st.xor_code ? codec::CodeKind::kXor : codec::CodeKind::kRs,
                                     st.k, st.f));
      const auto blocks = topo::StripeBlockSegments(plan, st);
      MEMENTO_RETURN_IF_ERROR(codec::EncodeStream(
          code, st.block_bytes, size_t{1} << 20,
          [&](size_t off, size_t n, uint8_t* const* data) -> Status {
            for (int i = 0; i < st.k; ++i) {
              uint64_t at = 0;
              size_t filled = 0;
              for (const topo::Segment& s : blocks[i]) {
                const uint64_t lo = std::max<uint64_t>(off, at);
                const uint64_t hi = std::min<uint64_t>(off + n, at + s.length);
                if (lo < hi) {
                  MEMENTO_ASSIGN_OR_RETURN(
                      auto runs,
                      shm::FindRange(layout.tensors, s.tensor, s.offset + (lo - at), hi - lo));
                  uint8_t* d = data[i] + (lo - off);
                  for (const shm::SlotRun& r : runs) {
                    std::memcpy(d, slot.data() + r.data_offset, r.length);
                    d += r.length;
                  }
                  filled = std::max<size_t>(filled, hi - off);
                }
                at += s.length;
              }
              if (filled < n) std::memset(data[i] + filled, 0, n - filled);
            }
            return Status::Ok();
          },
          [&](size_t off, size_t n, const uint8_t* const* parity) -> Status {
            std::memcpy(t1.data() + off, parity[par.index], n);
            return Status::Ok();
          }));
    }
    const double agent_s = aw.Seconds();
    if (rep == 0) continue;
    out->client_s = std::min(out->client_s, client_s);
    out->client_cpu_s = std::min(out->client_cpu_s, client_cpu);
    out->agent_s = std::min(out->agent_s, agent_s);
  }
  return Status::Ok();
}

void Setup(CLI::App& bench, CommandContext& ctx) {
  auto* cmd = bench.add_subcommand(
      "parity", "Parity in the client's copy workers vs in the agent afterwards (docs/reft.md s4)");
  auto o = std::make_shared<ParityBenchOptions>();
  cmd->add_option("--state-mib", o->state_mib, "replicated state of the rank, MiB")
      ->capture_default_str();
  cmd->add_option("--dp", o->dp, "data-parallel ranks (one per node)")->capture_default_str();
  cmd->add_option("--policy", o->policy, "xor or rs:F")->capture_default_str();
  cmd->add_option("--threads", o->threads, "copy workers")->capture_default_str();
  cmd->add_option("--reps", o->reps, "repetitions (best of)")->capture_default_str();
  cmd->add_flag("--json", o->json, "print JSON (always on)");
  cmd->callback([o, &ctx] {
    auto policy = topo::ParsePolicy(o->policy);
    if (o->state_mib == 0 || o->state_mib > 65536 || o->dp < 2 || o->dp > 64 || o->threads < 1 ||
        o->threads > 64 || o->reps < 1 || !policy.ok() ||
        (policy->scheme != topo::Scheme::kXor && policy->scheme != topo::Scheme::kRs)) {
      ctx.exit_code = ReportStatus(InvalidArgumentError(
          "--state-mib in 1..65536, --dp in 2..64, --threads in 1..64, --reps >= 1, --policy xor "
          "or rs:F"));
      return;
    }
    auto topology = topo::Topology::Uniform(o->dp, 1, 1, 0, 1);
    TensorMeta meta;
    meta.name = "w";
    meta.dtype = DType::kUInt8;
    meta.shape = {static_cast<int64_t>(o->state_mib << 20)};
    meta.state_class = StateClass::kReplicated;
    auto plan = topology.ok() ? topo::MakePlan(*topology, topo::Inventory(o->dp, {meta}), *policy)
                              : Result<topo::Plan>(topology.status());
    if (!plan.ok()) {
      ctx.exit_code = ReportStatus(plan.status());
      return;
    }
    std::vector<uint8_t> w(o->state_mib << 20);
    std::mt19937_64 rng(7);
    for (size_t i = 0; i + 8 <= w.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(w.data() + i, &v, 8);
    }
    Run client, agent;
    Status st = RunMode(*o, *plan, w, meta, true, &client);
    if (st.ok()) st = RunMode(*o, *plan, w, meta, false, &agent);
    if (st.ok() && client.parities != agent.parities) {
      st = InternalError("the two modes computed different parities");
    }
    if (!st.ok()) {
      ctx.exit_code = ReportStatus(st);
      return;
    }
    auto mode = [](const Run& r) {
      return nlohmann::json{{"client_snapshot_s", r.client_s},
                            {"client_cpu_s", r.client_cpu_s},
                            {"agent_s", r.agent_s},
                            {"total_cpu_s", r.client_cpu_s + r.agent_s},
                            {"slot_bytes", r.slot_bytes}};
    };
    nlohmann::json j = {{"bench", "parity"},
                        {"state_bytes", w.size()},
                        {"dp", o->dp},
                        {"policy", topo::PolicyName(*policy)},
                        {"threads", o->threads},
                        {"parities", plan->ranks[0].parities.size()},
                        {"client", mode(client)},
                        {"agent", mode(agent)},
                        {"parity_equal", true}};
    memento::tools::PrintJson("memento.bench.parity/1", std::move(j));
  });
}

}  // namespace
}  // namespace memento::tools

MEMENTO_REGISTER_BENCH(parity, memento::tools::Setup);
