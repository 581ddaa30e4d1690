// Recovery executor: rebuilds ranks' T0 slots from the recipes Decide() wrote
// (REFT 4.3 distributed in-memory loading: every piece is fetched from the
// node that holds it, in parallel, and decoded where only parity is left).
// docs/recovery.md, "Executor" and "Threads".
//
// ExecuteAssembliesWithOptions runs the steps of executor_steps.h in order:
// parse and check, open the slots, plan the transfers, run them, copy shared
// pieces, fill the checksums, complete and verify.
#include <algorithm>

#include "common/clock.h"
#include "common/log.h"
#include "fmt/format.h"
#include "recover/executor_steps.h"
#include "recover/recipe.h"
#include "recover/recover.h"

namespace memento::recover {

Result<AssemblyStats> ExecuteAssemblies(const topo::Plan& plan, const topo::Inventory& inventory,
                                        const std::string& job_id, int64_t step,
                                        const std::vector<RankAssembly>& assemblies,
                                        ByteReader& reader, shm::NodeStore& store,
                                        Deadline deadline) {
  return ExecuteAssembliesWithOptions(plan, inventory, job_id, step, assemblies, reader, store,
                                      deadline, ExecuteOptions{});
}

Result<AssemblyStats> ExecuteAssembliesWithOptions(
    const topo::Plan& plan, const topo::Inventory& inventory, const std::string& job_id,
    int64_t step, const std::vector<RankAssembly>& assemblies, ByteReader& reader,
    shm::NodeStore& store, Deadline deadline, const ExecuteOptions& options) {
  Stopwatch total;
  AssemblyStats stats;
  if (options.window_bytes == 0 || options.chunk_bytes == 0 || options.threads < 1) {
    return InvalidArgumentError("execute options: window, chunk and threads must be > 0");
  }
  if (inventory.size() != plan.ranks.size()) {
    return InvalidArgumentError(
        fmt::format("inventory has {} ranks, the plan {}", inventory.size(), plan.ranks.size()));
  }
  const int node = store.options().node;
  // Parse and check everything before touching a slot.
  MEMENTO_ASSIGN_OR_RETURN(
      std::vector<internal::RankJob> jobs,
      internal::ParseAssemblies(plan, inventory, job_id, step, node, assemblies, options));
  if (deadline.expired()) {
    return DeadlineExceededError(
        fmt::format("recovery of step {} on node {}: deadline passed before it began", step, node));
  }

  Stopwatch phase;  // per-phase wall times, logged at the end
  MEMENTO_ASSIGN_OR_RETURN(std::vector<internal::RankJob*> todo,
                           internal::OpenSlots(jobs, store, step, options));
  const internal::TransferPlan plan_units = internal::PlanTransfers(todo, options);
  internal::Transfers transfers(plan, todo, plan_units, reader, deadline, options);
  MEMENTO_RETURN_IF_ERROR(transfers.MakeDecoders());
  const double slots_s = phase.Seconds();

  phase.Reset();
  const Status st = transfers.Run();
  const internal::TransferTotals moved = transfers.Totals();
  stats.transfer_s += moved.transfer_s;
  stats.decode_s += moved.decode_s;
  stats.write_s += moved.write_s;
  stats.read_bytes += moved.read_bytes;
  if (!st.ok()) return st;  // the slots stay kWriting: never taken for complete
  const double fetch_s = phase.Seconds();

  phase.Reset();
  const int threads = std::max(1, options.threads);
  Stopwatch copy_sw;
  MEMENTO_RETURN_IF_ERROR(internal::CopySharedPieces(todo, plan_units.local_copies, threads));
  stats.write_s += copy_sw.Seconds();
  Stopwatch sw;
  MEMENTO_ASSIGN_OR_RETURN(const internal::ChecksumCounts sums,
                           internal::FillChecksums(todo, threads));
  const double checksum_s = phase.Seconds();

  phase.Reset();
  MEMENTO_RETURN_IF_ERROR(internal::PublishSlots(todo, store, step, options, &stats));
  stats.write_s += sw.Seconds();
  stats.total_s = total.Seconds();
  MEMENTO_LOG_INFO(
      "recover: step {}: {} bytes read, {} decode input bytes taken from this node's slots, "
      "{} of {} chunk checksums from arrival digests, {} hashed by the decode units, {} after; "
      "wall s: slots {:.3f}, fetch+decode {:.3f}, local copies + checksums {:.3f}, "
      "complete+verify {:.3f}",
      step, stats.read_bytes, moved.local_bytes, sums.from_digests,
      sums.from_digests + sums.at_decode + sums.hashed, sums.at_decode, sums.hashed, slots_s,
      fetch_s, checksum_s, phase.Seconds());
  return stats;
}

}  // namespace memento::recover
