// The trainer-side API of memento.
//
// A trainer process (one rank) connects to its node's agent, registers the
// tensors and blobs that make up its training state, and then, once per step:
//
//   auto client = memento::Client::Connect(options);          // once
//   client->RegisterTensor(meta, ptr);  ...                    // once, then Seal()
//   MEMENTO_RETURN_IF_ERROR(client->Seal());
//   if (auto restored = client->Restore(); restored.ok()) step = *restored + 1;
//   for (;; ++step) {
//     client->Fence();            // before the optimizer step mutates state
//     optimizer_step();
//     client->Snapshot(step);     // returns at once; copies run in the background
//     forward_backward();         // overlaps with the copy
//   }
//
// Ownership: registered memory stays owned by the caller and must stay valid
// and at the same address until the Client is destroyed. Between Snapshot(s)
// and the next Fence() the caller must not write registered memory (reads
// are fine): that is the window in which the copy engine reads it.
//
// Thread safety: one Client is used from one trainer thread. Phase hooks
// (OnPhase) may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "memento/deadline.h"
#include "memento/status.h"
#include "memento/types.h"

namespace memento {

// Scheduling priority of the copy workers (docs/thread_model.md).
enum class CopyPriority : uint8_t {
  // SCHED_IDLE: the copy runs on CPU time that training leaves unused and
  // never preempts the trainer. A Fence() or Restore() that has to wait
  // copies the remaining chunks on the calling thread and lifts the workers
  // to normal priority (where the OS allows it) until the next Snapshot(), so
  // a fence cannot be starved.
  kIdle = 0,
  // The trainer's own priority; Fence() only waits.
  kNormal = 1,
};
std::string_view CopyPriorityName(CopyPriority priority);  // "idle", "normal"
// "idle" or "normal"; InvalidArgument naming the value and the choices.
Result<CopyPriority> ParseCopyPriority(std::string_view name);

// How a snapshot's chunks are scheduled (docs/has.md).
enum class Schedule : uint8_t {
  // "eager" until the trainer reports an idle window (OnPhase(kIdle)); "has"
  // from the next Snapshot() on. A trainer without phase hooks keeps the
  // eager path unchanged.
  kAuto = 0,
  // Every chunk is copied at once on copy_threads workers.
  kEager = 1,
  // Hierarchical asynchronous snapshotting: chunks go into idle windows
  // reported by OnPhase(kIdle) first, are paced beside computation, and only
  // the rest is copied at full speed when Fence() waits. Same slot format and
  // crash consistency.
  kHas = 2,
};
std::string_view ScheduleName(Schedule schedule);  // "auto", "eager", "has"
// "auto", "eager" or "has"; InvalidArgument naming the value and the choices.
Result<Schedule> ParseSchedule(std::string_view name);

// Tuning of the HAS schedule (Schedule::kHas, and kAuto once it switched).
struct HasTuning {
  // The 1F1B pipeline schedule of this rank's stage, when known (REFT
  // Algorithm 1 estimates its bubbles from it). pipeline_stages == 0:
  // unknown, bubbles are measured online from the phase hooks.
  int pipeline_stages = 0;
  int pipeline_stage = 0;
  int pipeline_microbatches = 0;
  double pipeline_fwd_s = 0;  // forward time of one micro-batch on this stage
  double pipeline_bwd_s = 0;  // backward time of one micro-batch on this stage
  // The snapshot copy uses another link than training's communication, so
  // it may run while the trainer communicates (layer 3).
  bool separate_comm_link = false;
  // A hard cap (bytes/s) on copying beside computation; 0: none.
  double compute_max_rate = 0;
};

struct ClientOptions {
  // Job id: names the agent's directories; letters, digits, '-', '_' and '.'.
  std::string job_id;
  // This process's global rank and the job's world size.
  int rank = 0;
  int world_size = 1;
  // Directory of the node's agent (holds agent.sock). Empty: the default,
  // $MEMENTO_RUN_DIR or /dev/shm/memento/<job_id>/node<node>.
  std::string agent_dir;
  int node = 0;
  // Copy engine worker threads and chunk size (bytes; a multiple of 64 KiB).
  int copy_threads = 1;
  size_t chunk_bytes = size_t{4} << 20;
  CopyPriority copy_priority = CopyPriority::kIdle;
  // How long Connect waits for the agent to answer.
  double connect_timeout_s = 10.0;
  Schedule schedule = Schedule::kAuto;
  HasTuning has;
  // Sharded snapshots (docs/reft.md): when the job's topology asks for them
  // (`memento launch --sharded`), the rank's slot holds only the byte ranges
  // the plan gives it, asked from the agent (`plan` op) at the first
  // snapshot and again after each Restore(). The agent decides; false keeps
  // whole-tensor slots whatever it says. Ranks with device-resident tensors
  // keep whole-tensor slots for now.
  bool sharded_snapshots = true;
  // With sharded snapshots: the XOR / Reed-Solomon parities this rank's
  // memory produces under the plan are computed by the copy workers from
  // registered memory as the snapshot runs, and the slot holds only the
  // parity bytes, not the stripe inputs (docs/reft.md section 4). false (or
  // MEMENTO_PARITY_IN=agent in the environment): the slot holds the inputs
  // and the agent encodes the parity afterwards. Connect also takes
  // MEMENTO_PARITY_IN=client (the default) and refuses any other value.
  bool client_parity = true;
  // The copy kernel of this process (docs/node_store.md, "Kernels":
  // avx512, avx2, sse2, avx2-twopass, portable). Empty: the one named by
  // MEMENTO_COPY_KERNEL when set and no kernel was chosen in this process
  // yet (a name this CPU cannot run is logged and the default kept), else
  // the widest the CPU runs. Connect fails with InvalidArgument naming the
  // kernels this CPU has when it cannot run the one named here.
  std::string copy_kernel;
};

// AOR (REFT 4.2, Eq. 4; docs/client_api.md "AOR", docs/reft.md section 5):
// under ZeRO-1 a node keeps a replica of a peer's optimizer shard in host
// memory and brings it forward every step itself, from the gradient that
// every data-parallel rank holds after the all-reduce, so nothing crosses
// the network at save time. The trainer's part:
//
//   GradientRegistration g{grads, numel, "params", optimizer.Encode()};
//   client->RegisterGradients(g);            // once, before Seal()
//   for (;; ++step) {
//     forward_backward(); all_reduce(); clip();
//     client->Fence();
//     client->CaptureGradients(step, lr);     // before the optimizer step
//     optimizer_step(step, lr);               // (ZeRO-1: the rank's shard, all-gather)
//     client->ReportShardChecksum(step, opt::ShardChecksum(own shard));
//     client->Snapshot(step);
//   }
//
// The optimizer is given as its opt::Optimizer::Encode() bytes (src/opt,
// docs/optimizer.md): the agent runs the same compiled update, so the
// replica equals the owner's shard byte for byte; a PyTorch optimizer plugs
// in by implementing opt::Optimizer with PyTorch's operation order.
struct GradientRegistration {
  // The flat fp32 gradient buffer, as the optimizer reads it (after the
  // all-reduce and any clipping) when CaptureGradients is called. Owned by
  // the caller; stays valid while the client lives.
  const float* grads = nullptr;
  size_t numel = 0;
  // The registered fp32 host tensor holding the flat parameters the
  // optimizer updates, element i of it matching element i of grads.
  std::string params_tensor;
  // opt::Optimizer::Encode() of the trainer's optimizer (kind,
  // hyperparameters, learning-rate schedule, parameter groups).
  std::string optimizer_encoding;
};

// A version of this rank's state that the agent holds.
struct VersionInfo {
  int64_t step = -1;
  // Complete and verified against its checksums in this rank's slots (T0).
  // Not "committed": whether every node of a cluster holds it is the commit
  // log's business (docs/cluster.md); see DESIGN.md "version".
  bool intact = false;
  uint64_t bytes = 0;
};

// Statistics of the last Restore().
struct RestoreStats {
  int64_t step = -1;  // the version loaded; -1 when none
  uint64_t bytes = 0;
  double restore_s = 0;  // wall time of the load (checksums included)
  // The copy into the registered tensors over the versions tried, every
  // chunk's checksum checked in the same pass (copy_s). verify_s is 0: the
  // separate verification pass of earlier versions is fused into the copy.
  double verify_s = 0;
  double copy_s = 0;
  // True when the call failed after writing into the registered tensors (a
  // version failed a checksum while copied, and no older version restored
  // over it): their content is then undefined (docs/node_store.md,
  // "Restore").
  bool overwritten = false;
  // Versions that were newer but could not be loaded, one line each
  // ("step 12: DataLoss: ... chunk 3 fails its checksum").
  std::vector<std::string> skipped;
};

// Every call that can block takes a Deadline (DeadlineExceeded when it
// passes); the defaults are the waits of earlier versions.
class Client {
 public:
  // Waits for the snapshot in flight, if any, to finish (its copy reads
  // registered memory, so it must end before the caller may free that
  // memory; there is no deadline: a copy of memory always ends), then stops
  // the client's threads and closes the connection. A version whose copy
  // completed is in shared memory whether or not the agent heard of it.
  virtual ~Client() = default;

  // Connects to the node's agent. Fails with Unavailable (agent not running
  // or a stale socket), NotFound (unknown job), PermissionDenied (the agent
  // runs as another uid), with a message that says which.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  // Registers a tensor at `data` (meta.nbytes() bytes). Names are unique per
  // rank. REQUIRES: not sealed.
  virtual Status RegisterTensor(const TensorMeta& meta, void* data,
                                Device device = Device::Host()) = 0;
  // Registers opaque state (RNG, data-loader cursor, counters): a private
  // tensor of dtype U8 and shape {nbytes}. REQUIRES: not sealed.
  virtual Status RegisterBlob(const std::string& name, void* data, size_t nbytes) = 0;

  // Ends registration: the agent allocates (or adopts) this rank's slots,
  // pre-faulted. Fails with ResourceExhausted when the node's memory budget
  // or the shared-memory filesystem cannot hold them, saying how much is
  // needed. DeadlineExceeded when the agent has not allocated them by
  // `deadline` (a large job on a loaded node can take minutes).
  virtual Status Seal(Deadline deadline = Deadline::AfterSeconds(600)) = 0;

  // Starts snapshotting the registered state as version `step` and returns
  // at once. REQUIRES: sealed; step greater than every earlier snapshot's.
  // A snapshot still running is fenced first. In cluster mode the slot that
  // holds the newest globally committed version is never overwritten; when
  // the other slot holds a newer version the agent is still protecting, the
  // step is skipped (OK; LastSnapshotStats().skipped).
  virtual Status Snapshot(int64_t step) = 0;

  // Waits until the last snapshot is complete in shared memory (the only call
  // that can delay training). Returns the snapshot's error, if any.
  virtual Status Fence(Deadline deadline = Deadline::Infinite()) = 0;

  // Cluster mode: fences the snapshot in flight, then waits until version
  // `step` is committed by the whole cluster (the agent's commit word says
  // `step` or a newer step of the job's current history); returns the
  // committed step. Aborted when `step` can no longer commit as far as this
  // rank can tell: this rank skipped its snapshot of `step`, or its agent
  // held `step` and released it uncommitted (another node skipped or
  // abandoned it, or it did not commit within the agent's --hold-timeout).
  // DeadlineExceeded at `deadline` (also when another node's skip kept this
  // node's agent from ever holding `step`: nothing in the word tells that
  // apart from a commit still to come). FailedPrecondition before Seal() or
  // outside cluster mode (the agent runs without --store: no commit word).
  // Training does not need this call: it paces a job on its commits (tests
  // and benchmarks whose checks need a version committed by some step;
  // memento-trainer --memento-pace-commits), or makes sure the last
  // snapshot is protected before a job ends.
  virtual Result<int64_t> WaitForCommit(int64_t step,
                                        Deadline deadline = Deadline::AfterSeconds(60)) = 0;

  // Loads the newest committed version into the registered tensors and
  // returns its step. NotFound when there is none. In cluster mode (the
  // agent runs with --store) the agent decides the step: the cluster's
  // restore target when the launcher set one, else the newest step in the
  // agent's commit log; exactly that step is loaded, as Restore(step) does
  // (no fallback to another step; NotFound when nothing is committed). When a saved tensor's name,
  // dtype or shape differs from the registered one, InvalidArgument listing
  // every difference, and nothing is written. A version that fails its
  // checksums is skipped: each chunk is checked while it is copied, and the
  // next older intact version then overwrites every registered byte.
  // DataLoss is returned only when no intact version is left; the registered
  // tensors are then partly overwritten with the chunks of the versions tried
  // (LastRestoreStats().overwritten; the message says so).
  // DeadlineExceeded when the snapshot in flight has not finished by
  // `deadline`, or the agent has not named the step by then (it is given 60
  // s at most); the verification and copy themselves run to the end.
  // REQUIRES: sealed.
  virtual Result<int64_t> Restore(Deadline deadline = Deadline::Infinite()) = 0;

  // Loads exactly version `step` into the registered tensors and returns
  // `step`. For a multi-rank job, which must restart every rank at the same
  // step: take the newest step that every rank's ListVersions() holds and
  // call Restore(step) on every rank (a rank killed in the middle of
  // Snapshot(s) holds only s-1 while its peers hold s and s-1).
  // NotFound when this rank holds no complete version of `step` (the message
  // lists the steps it does hold); InvalidArgument for step < 0 or when the
  // saved tensors differ from the registered ones (nothing written);
  // DataLoss when the version fails its checksums; each chunk is checked
  // while it is copied, so the registered tensors are then partly
  // overwritten. Never falls back to another step. DeadlineExceeded as for
  // Restore(). REQUIRES: sealed.
  virtual Result<int64_t> Restore(int64_t step, Deadline deadline = Deadline::Infinite()) = 0;

  // Versions the agent holds for this rank, newest first (the agent first
  // verifies complete versions it has not verified yet, which reads them
  // whole). DeadlineExceeded when the agent has not answered by `deadline`.
  virtual Result<std::vector<VersionInfo>> ListVersions(
      Deadline deadline = Deadline::AfterSeconds(600)) = 0;

  // AOR. Registers the rank's gradient buffer (see GradientRegistration).
  // REQUIRES: not sealed; once. InvalidArgument naming the field when grads
  // is null, numel is 0, the encoding is empty or larger than 1 MiB, or
  // params_tensor is not a registered fp32 host tensor of numel elements;
  // AlreadyExists for a second call. Seal() then asks the agent for the
  // ranges this rank feeds (an encoding the agent cannot decode fails
  // Seal() with InvalidArgument naming the field 'optimizer').
  virtual Status RegisterGradients(const GradientRegistration& gradients) = 0;

  // AOR, each step after the gradient is final (all-reduce, clipping) and
  // before the optimizer step `step` changes the parameters: copies the
  // gradient and parameter slices of the ranges this rank feeds into the
  // node's staging file (hashing each block as it is copied) and rings the
  // file's doorbell; no request is made and nothing is waited for (but a
  // slot two steps back the agent has not read yet: at most 2 s, then the
  // step's capture is skipped with Unavailable saying so). The agent's
  // watcher of the file queues it and its AOR thread runs the host
  // optimizer step off the training path (docs/reft.md section 5). `lr`:
  // the learning rate of this step; NaN: the
  // optimizer's own schedule. OK and nothing copied when the rank feeds no
  // replica (single node, DP 1, ZeRO off) or the agent has no plan yet.
  // FailedPrecondition before Seal() or without RegisterGradients;
  // InvalidArgument for step < 1 or an infinite lr; the agent's error
  // when registering (a slot the agent refuses, or a replica that fails its
  // check, is not an error of the call: the agent logs and counts it, and
  // the replica is seeded again).
  virtual Status CaptureGradients(int64_t step, float lr) = 0;

  // AOR, after the optimizer step `step`: this rank's own
  // opt::ShardChecksum of its shard (params slice and state slices after the
  // step). Written into the staging file's checksum ring (no request; a
  // rank that feeds no replica, so has no staging file, sends a request);
  // the agent publishes it, at the latest before its node reports the step;
  // every replica of the shard is checked against it before the replica's
  // node reports the step COMPLETED. InvalidArgument for step < 1;
  // FailedPrecondition before Seal().
  virtual Status ReportShardChecksum(int64_t step, uint64_t checksum) = 0;

  // Reports the trainer's current phase (HAS scheduling; any thread). With
  // schedule "eager" it is recorded and has no effect on the copy.
  virtual void OnPhase(Phase phase) = 0;

  // Statistics of the last completed snapshot.
  virtual SnapshotStats LastSnapshotStats() const = 0;

  // Statistics of the last Restore(), including the versions it skipped.
  virtual RestoreStats LastRestoreStats() const = 0;
};

}  // namespace memento
