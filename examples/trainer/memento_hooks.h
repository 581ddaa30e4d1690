// memento integration of the trainer: registers the rank's state with the
// memento client by state class, snapshots after every optimizer step,
// fences before the next one and reports pipeline phases. Built only when the
// memento_client library exists (MEMENTO_TRAINER_WITH_CLIENT).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memento/status.h"
#include "trainer.h"

namespace memento::trainer {

struct MementoHookOptions {
  std::string job_id;
  std::string agent_dir;  // empty: the client's default
  int node = 0;
  bool restore = true;  // load the newest committed version, if any
  // ClientOptions::schedule: "auto", "eager" or "has" (HAS uses the phases
  // the trainer reports through OnPhase). Ignored when snapshot_mode is set.
  std::string schedule = "auto";
  // How snapshots are taken, for comparing REFT's baselines on this trainer
  // (`memento bench has --loop trainer`, docs/has.md). Empty: by `schedule`.
  //   sync         Snapshot(step) and at once Fence(): a blocking copy
  //   host         schedule "eager", one chunk per tensor: a host thread
  //                copies whole tensors right after the step, unaware of
  //                what the trainer does (REFT "host coordination")
  //   host_device  schedule "eager", chunks of chunk_bytes queued right
  //                after the step and copied at full speed (REFT
  //                "host-device coordination"; on a GPU the CUDA copy
  //                engine's side streams)
  //   has          schedule "has" (idle windows from the phase hooks)
  // ("off" is the trainer without memento.)
  std::string snapshot_mode;
  // ClientOptions::chunk_bytes (0: the client's default); "host" ignores it.
  size_t chunk_bytes = 0;
  // ClientOptions::copy_priority: "normal" (the trainer's default) or "idle".
  // The trainer runs several ranks per core pair: its copy workers never
  // find idle CPU, so "idle" HAS workers are starved until the fence waits
  // for them (docs/bench_overhead.md: fence 0.48 s per step against 0.004 s).
  std::string copy_priority = "normal";
  // Fault injection (--skip-snapshot-step): no snapshot of this step, as if
  // the client had skipped it (the commit word rule); -1: none.
  int64_t skip_step = -1;
  // Snapshot only after steps that are a multiple of this (1: every step).
  // Log replay (`--recovery log`, docs/swift.md) rebuilds a lost stage from
  // its last snapshot and the logged inputs of the steps since.
  int64_t every = 1;
  // Cluster mode: after a snapshot, wait until it commits (Client::
  // WaitForCommit, at most 60 s; a step that cannot commit ends the wait)
  // until this many snapshots committed so; -1: after every snapshot; 0:
  // never. For tests and benchmarks whose checks need versions committed by
  // some step, however loaded the machine.
  int64_t pace_commits = 0;
  // AOR (docs/reft.md section 5): under ZeRO-1 with DP > 1, register the
  // gradient buffer, capture it every step before the optimizer step and
  // report the rank's own shard checksum after it, so the node holding this
  // rank's peer's optimizer shard brings it forward on the host.
  bool aor = true;
  // Testing only: the learning rate captured for the host replicas is this
  // multiple of the trainer's (a host optimizer on another schedule).
  float aor_test_lr_scale = 1.0f;
  // Testing only: the shard checksums of steps 2 to this one - 1 are held
  // back and reported together after it (-1: none), so the node holding
  // this rank's replica (seeded at step 1) confirms it late, its AOR thread
  // ahead.
  int64_t aor_test_late_sums = -1;
};

// The snapshot modes above; InvalidArgument naming the value otherwise.
Status CheckSnapshotMode(const std::string& mode);

// Connects to the node's agent and registers `trainer`'s state:
//   params      kReplicated  fp32[padded_params]
//   adam_m/v    kDpSharded (ZeRO-1, with global_numel/shard_offset) or
//               kReplicated
//   train_state private blob (step, data cursor)
// then seals and (if asked) restores. *restored_step is the restored step or
// -1. The hooks, installed with SetHooks, must outlive every Step().
Result<std::unique_ptr<TrainerHooks>> ConnectMemento(Trainer* trainer,
                                                     const MementoHookOptions& options,
                                                     int64_t* restored_step);

// Loads exactly version `step` of this rank from memento (the client's
// Restore(step): its node's T0, verified) through hooks made by
// ConnectMemento. In-process recovery under ZeRO-1 rebuilds a lost moment
// shard with it (docs/swift.md).
Status RestoreMementoStep(TrainerHooks* hooks, int64_t step);

// The newest version of this rank that its node's T0 holds intact at or
// before `step` (ListVersions); NotFound listing the versions held when there
// is none. Snapshots of steps the slots already hold (a dead process took
// them) are not taken again. A log-replay replacement (and its group-mates)
// find their stage's snapshot with it and load it with RestoreMementoStep.
Result<int64_t> NewestMementoStep(TrainerHooks* hooks, int64_t step);

// The steps of the intact versions this rank's slots hold (ListVersions),
// newest first; for RecoverByUndo's `held`.
Result<std::vector<int64_t>> HeldMementoSteps(TrainerHooks* hooks);

}  // namespace memento::trainer
