// Agent::Metrics: the Prometheus text of `memento agent --metrics-listen`
// (docs/operating.md lists every metric). Each value is read from the
// component that does the work (no copy is kept here).
#include <algorithm>
#include <utility>

#include "agent/agent.h"
#include "common/metrics.h"

namespace memento::agent {

std::string Agent::Metrics() {
  MetricsText m;
  const SnapshotStats snap = snapshot_stats();
  m.Counter("memento_snapshots_total",
            "Snapshots the trainers of this node completed (each rank "
            "counts)",
            static_cast<double>(snap.snapshots));
  m.Counter("memento_snapshot_bytes_total",
            "Data bytes of the completed snapshots (the slot headers' data_bytes)",
            static_cast<double>(snap.bytes));
  m.Counter("memento_snapshot_seconds_total",
            "Seconds the trainers spent writing those snapshots into their slots (header begin "
            "to complete)",
            snap.seconds);
  m.Gauge("memento_snapshot_last_seconds", "Write time of the newest completed snapshot",
          snap.last_seconds);
  m.Counter("memento_snapshots_skipped_total",
            "Snapshots the trainers skipped because their slot was held (commit or durable "
            "write)",
            static_cast<double>(snap.skipped));
  for (const auto& [rank, step] : snap.rank_step) {
    m.Gauge("memento_rank_snapshot_step", "Newest step each local rank completed",
            static_cast<double>(step), {{"rank", std::to_string(rank)}});
  }

  // Shared memory against the budget.
  const uint64_t slot_bytes = store_->allocated_bytes();
  uint64_t redundancy_bytes = 0;
  JobMemberStats jm;
  if (job_member_ != nullptr) {
    jm = job_member_->stats();
    redundancy_bytes = jm.redundancy_bytes;
  }
  m.Gauge("memento_shm_bytes", "Shared memory this agent's files take, by kind",
          static_cast<double>(slot_bytes), {{"kind", "slots"}});
  m.Gauge("memento_shm_bytes", "Shared memory this agent's files take, by kind",
          static_cast<double>(redundancy_bytes), {{"kind", "redundancy"}});
  m.Gauge("memento_shm_budget_bytes",
          "The node's budget (--budget; 0: none set, the filesystem is the limit)",
          static_cast<double>(options_.budget_bytes));
  if (auto fs = shm::GetFsSpace(root_); fs.ok()) {
    m.Gauge("memento_shm_filesystem_bytes", "The shared-memory filesystem of the root",
            static_cast<double>(fs->total), {{"kind", "total"}});
    m.Gauge("memento_shm_filesystem_bytes", "The shared-memory filesystem of the root",
            static_cast<double>(fs->available), {{"kind", "available"}});
  }

  if (job_member_ != nullptr) {
    m.Gauge("memento_committed_step", "Newest step the job committed (-1: none)",
            static_cast<double>(jm.committed));
    m.Gauge("memento_reported_step", "Newest step this node reported COMPLETED (-1: none)",
            static_cast<double>(jm.last_reported));
    int64_t local_step = -1;  // the newest step every local rank has completed
    if (!snap.rank_step.empty()) {
      local_step = snap.rank_step.begin()->second;
      for (const auto& rs : snap.rank_step) local_step = std::min(local_step, rs.second);
    }
    m.Gauge("memento_commit_lag_steps",
            "Steps between the newest step every local rank completed and the newest commit",
            static_cast<double>(local_step > jm.committed ? local_step - jm.committed : 0));
    m.Counter("memento_commit_lag_seconds_total",
              "Seconds from this node's COMPLETED report of a step to its commit, summed",
              jm.commit_lag_s);
    m.Counter("memento_commit_lag_measured_total",
              "Commits of steps this node had reported (the count of the sum above)",
              static_cast<double>(jm.commit_lags));
    m.Gauge("memento_commit_lag_last_seconds", "The newest measured commit lag",
            jm.last_commit_lag_s);
    m.Counter("memento_redundancy_versions_total",
              "Versions whose redundancy (T1) this node produced and reported, by outcome",
              static_cast<double>(jm.produced), {{"outcome", "produced"}});
    m.Counter("memento_redundancy_versions_total",
              "Versions whose redundancy (T1) this node produced and reported, by outcome",
              static_cast<double>(jm.abandoned), {{"outcome", "abandoned"}});
    m.Counter("memento_redundancy_pushed_bytes_total",
              "Bytes of copies this node pushed to the peers that hold them",
              static_cast<double>(jm.pushed_bytes));
    const JobMember::AorStats aor = job_member_->aor_stats();
    m.Counter("memento_aor_entries_from_replica_total",
              "kAor copies of this node made from its host-recomputed replicas (no network)",
              static_cast<double>(aor.entries_from_replica));
    m.Counter("memento_aor_skipped_push_bytes_total",
              "Bytes of kAor copies this node did not push (their holders recompute them)",
              static_cast<double>(aor.skipped_push_bytes));
    m.Counter("memento_aor_checks_total",
              "Replica steps checked against the owner's checksum, by outcome",
              static_cast<double>(aor.confirmed), {{"outcome", "confirmed"}});
    m.Counter("memento_aor_checks_total",
              "Replica steps checked against the owner's checksum, by outcome",
              static_cast<double>(aor.refused), {{"outcome", "refused"}});
    m.Counter("memento_aor_copies_refused_total",
              "kAor entries not made from a replica whose bytes changed in memory since its "
              "step (the replica is seeded again)",
              static_cast<double>(aor.copy_refused));
    const AorHolder::Stats holder = aor_->stats();
    m.Counter("memento_aor_captures_total",
              "aor_capture requests queued for the agent's AOR thread",
              static_cast<double>(holder.submitted));
    m.Counter("memento_aor_stage_refused_total",
              "AOR stage slots not used (torn, overwritten early, not hashing right)",
              static_cast<double>(holder.stage_refused));
    m.Counter("memento_redundancy_seconds_total",
              "Seconds from local completion to the COMPLETED report (encode, copy, push), summed",
              jm.produce_s);
    m.Gauge("memento_restore_target_step", "The step trainers restore from this agent (-1: none)",
            static_cast<double>(jm.restore_target));
    const PeerServiceStats& p = jm.peer;
    m.Counter("memento_recovery_rebuilds_total",
              "Recovery requests (kPeerRecover) that rebuilt ranks on this node, by outcome",
              static_cast<double>(p.rebuilds), {{"outcome", "ok"}});
    m.Counter("memento_recovery_rebuilds_total",
              "Recovery requests (kPeerRecover) that rebuilt ranks on this node, by outcome",
              static_cast<double>(p.rebuild_failures), {{"outcome", "failed"}});
    m.Counter("memento_recovery_bytes_total", "Bytes of the rebuilds on this node, by direction",
              static_cast<double>(p.rebuilt_bytes), {{"direction", "written"}});
    m.Counter("memento_recovery_bytes_total", "Bytes of the rebuilds on this node, by direction",
              static_cast<double>(p.rebuild_read_bytes), {{"direction", "read"}});
    const std::pair<const char*, double> phases[] = {{"transfer", p.transfer_s},
                                                     {"decode", p.decode_s},
                                                     {"write", p.write_s},
                                                     {"total", p.rebuild_s}};
    for (const auto& [phase, s] : phases) {
      m.Counter("memento_recovery_seconds_total",
                "Seconds of the rebuilds on this node by phase, summed", s, {{"phase", phase}});
    }
    m.Counter("memento_durable_loads_total",
              "Durable versions loaded into this node's slots (fallback to the durable tier)",
              static_cast<double>(p.durable_loads));
    m.Counter("memento_durable_load_bytes_total", "Bytes those loads wrote into slots",
              static_cast<double>(p.durable_load_bytes));
    m.Counter("memento_durable_load_seconds_total", "Seconds of those loads, summed",
              p.durable_load_s);
    m.Counter("memento_restore_targets_total", "Restore targets the job set on this node",
              static_cast<double>(p.restore_targets));
    m.Counter("memento_peer_refused_connections_total",
              "Peer connections refused (failed job-token authentication)",
              static_cast<double>(p.refused));
  }

  if (durable_ != nullptr) {
    const DurableStats d = durable_->stats();
    const tier::PersisterStats& ps = d.persister;
    m.Counter("memento_persist_versions_total", "Versions the durable tier wrote, by outcome",
              static_cast<double>(ps.persisted), {{"outcome", "persisted"}});
    m.Counter("memento_persist_versions_total", "Versions the durable tier wrote, by outcome",
              static_cast<double>(ps.failures), {{"outcome", "failed"}});
    m.Counter("memento_persist_versions_total", "Versions the durable tier wrote, by outcome",
              static_cast<double>(ps.dropped), {{"outcome", "superseded"}});
    m.Counter("memento_persist_versions_total", "Versions the durable tier wrote, by outcome",
              static_cast<double>(d.abandoned_overwritten + d.abandoned_mismatch +
                                  d.abandoned_claimed + d.gone),
              {{"outcome", "abandoned"}});
    m.Counter("memento_persist_bytes_total", "Bytes written to the durable tier",
              static_cast<double>(ps.bytes_written));
    m.Gauge("memento_persist_last_step", "Newest step persisted (-1: none)",
            static_cast<double>(ps.last_persisted_step));
    m.Gauge("memento_persist_last_seconds", "Write time of the newest persisted version",
            ps.last_seconds);
    m.Gauge("memento_persist_throughput_bytes_per_second",
            "Throughput of the newest persisted version", ps.last_bytes_per_sec);
    m.Gauge("memento_persist_backlog",
            "1 while a version is queued or being written to the durable tier, else 0",
            ps.busy ? 1 : 0);
    m.Counter("memento_persist_holds_total",
              "Versions written under the durable hold (trainers skip rather than overwrite)",
              static_cast<double>(d.holds));
    m.Counter("memento_persist_hold_expired_total", "Writes that outlived --durable-hold-max-s",
              static_cast<double>(d.hold_expired));
  }

  if (scrubber_ != nullptr) {
    const ScrubStats sc = scrubber_->Stats();
    m.Counter("memento_scrub_passes_total", "Completed scrub passes over the slots at rest",
              static_cast<double>(sc.passes));
    m.Counter("memento_scrub_bytes_total", "Data bytes the scrub hashed",
              static_cast<double>(sc.bytes));
    m.Counter("memento_scrub_slots_checked_total", "Conclusive slot checks of the scrub",
              static_cast<double>(sc.slots_checked));
    m.Gauge("memento_scrub_corrupt_slots",
            "Slots the scrub found corrupt and that were not rewritten since",
            static_cast<double>(sc.corrupt.size()));
  }
  return m.str();
}

}  // namespace memento::agent
