// The launcher fires the injections (launch/inject.h): kills, store losses
// and corruptions at rest. See launcher_state.h.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <thread>

#include "fmt/format.h"
#include "launch/launcher_state.h"
#include "shm/node_store.h"
#include "shm/slot.h"
#include "shm/slot_format.h"
#include "tier/discovery.h"
#include "tier/env.h"
#include "tier/reader.h"

namespace memento::launch {

namespace {

// corrupt-rank: flips one byte in the middle of the data region of each
// complete T0 slot of `rank` under `root` that holds `step` or a newer step:
// the launcher's newest commit (`step`) can lag the one the recovery restores
// (after a store restart the agents republish theirs), and no slot of a
// rank holds a step the recovery may restore without the flip. Says which
// slots and steps.
Result<std::string> CorruptSlot(const std::string& root, int rank, int64_t step) {
  std::string flipped;
  std::string seen;
  for (int s = 0; s < shm::kSlotsPerRank; ++s) {
    auto seg = shm::Segment::Open(shm::SlotPath(root, rank, s), /*writable=*/true);
    if (!seg.ok()) {
      seen += fmt::format("{}slot {}: absent", seen.empty() ? "" : "; ", s);
      continue;
    }
    auto info = shm::ReadSlot(**seg);
    if (!info.ok() || info->state != shm::SlotState::kComplete || info->step < step ||
        info->data_bytes == 0) {
      seen += fmt::format("{}slot {}: {}", seen.empty() ? "" : "; ", s,
                          info.ok() ? fmt::format("step {}", info->step) : info.status().message());
      continue;
    }
    (*seg)->data()[info->data_offset + info->data_bytes / 2] ^= 0x5a;
    flipped += fmt::format("{}slot {} (step {})", flipped.empty() ? "" : ", ", s, info->step);
  }
  if (flipped.empty()) {
    return NotFoundError(fmt::format(
        "rank {} has no complete slot of step {} or newer under {}: {}", rank, step, root, seen));
  }
  return flipped;
}

// corrupt-durable: flips one byte in the middle of the first piece of the
// newest complete durable version under `dir`. Says what it flipped.
Result<std::string> CorruptNewestDurable(const std::string& dir) {
  tier::Env* env = tier::Env::Default();
  MEMENTO_ASSIGN_OR_RETURN(int64_t step, tier::LatestCompleteVersion(env, dir));
  MEMENTO_ASSIGN_OR_RETURN(tier::VersionIndex index, tier::LoadIndex(env, dir, step));
  for (const auto& [name, t] : index.tensors) {
    for (const tier::PieceRecord& p : t.pieces) {
      if (p.length == 0) continue;
      const std::string path = dir + "/" + tier::VersionDirName(step) + "/" + p.file;
      int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) return ErrnoError("open " + path, errno);
      const off_t at = static_cast<off_t>(p.file_offset + p.length / 2);
      uint8_t b = 0;
      bool done = pread(fd, &b, 1, at) == 1;
      b ^= 0x5a;
      done = done && pwrite(fd, &b, 1, at) == 1;
      close(fd);
      if (!done) return InternalError("cannot flip a byte of " + path);
      return "flipped a byte of piece '" + p.key + "' (tensor '" + name + "') in version " +
             std::to_string(step) + " (" + path + ")";
    }
  }
  return NotFoundError("durable version " + std::to_string(step) + " in " + dir + " has no data");
}

}  // namespace

void Launcher::State::FireInjections() {
  const int64_t reached = ReachedStep();
  // Taken once, before the first kill of this round: several injections at
  // one step fire together, and each kill waits for its processes to die.
  std::string lag;
  for (size_t k = 0; k < injections.size(); ++k) {
    const Injection& inj = injections[k];
    if (fired[k] || inj.recovery >= 0 || reached < inj.step) continue;
    // One loss at a time: after a store restart, the next injection waits
    // until commits resumed (so "a node loss after the store restart"
    // really recovers from a commit made on the fresh store). A corruption
    // is no loss: it fires at its step and joins the next failure (held
    // back here, one given beside a kill-store and a kill at the same step
    // missed the kill's recovery and waited for a later failure).
    const bool corruption =
        inj.kind == InjectKind::kCorruptRank || inj.kind == InjectKind::kCorruptDurable;
    if (!corruption && (StoreDown() || store_restarted_at.has_value())) continue;
    fired[k] = true;
    injected_at = Now();
    // With the newest commit and how long commits have been quiet: how far
    // they lagged behind the job when it failed (scripts/chaos.py bounds the
    // steps lost below that commit and the lag apart).
    if (lag.empty()) {
      lag = "; committed " + std::to_string(Committed()) + ", commits quiet for " +
            Seconds3(commit_history.QuietSeconds()) + " s";
    }
    Say("injecting " + inj.ToString() + " (job at step " + std::to_string(reached) + lag + ")");
    if (inj.kind == InjectKind::kKillStore) {
      // Not a failure of the training: nothing to recover, nothing to time.
      injected_at.reset();
      KillStore(inj.ToString(), -1, reached);
    } else if (inj.kind == InjectKind::kKillRank) {
      trainers[static_cast<size_t>(inj.target)].Kill(SIGKILL).IgnoreError();
      injected_rank = inj.target;
    } else if (inj.kind == InjectKind::kCorruptDurable) {
      // Applied when a recovery next falls back to the durable tier.
      corrupt_durable_pending = true;
      injected_at.reset();
    } else if (inj.kind == InjectKind::kCorruptRank) {
      // Applied when the next failure has stopped the trainers, to the
      // newest committed version (the one that recovery then restores):
      // corruption at rest that only the recovery's verification can find.
      pending_corruptions.push_back(inj.target);
      injected_at.reset();
    } else {
      KillAgentOrNode(inj);
    }
  }
}

void Launcher::State::KillAgentOrNode(const Injection& inj) {
  Subprocess& a = agents[static_cast<size_t>(inj.target)];
  a.Kill(SIGKILL).IgnoreError();
  if (inj.kind != InjectKind::kKillNode) return;
  for (int r = 0; r < world; ++r) {
    if (NodeOf(r) == inj.target) trainers[static_cast<size_t>(r)].Kill(SIGKILL).IgnoreError();
  }
  // The host is gone with its memory: nothing of the root survives.
  (void)a.Wait(Deadline::AfterSeconds(10));
  for (int r = 0; r < world; ++r) {
    if (NodeOf(r) == inj.target) {
      (void)trainers[static_cast<size_t>(r)].Wait(Deadline::AfterSeconds(10));
    }
  }
  RemoveAll(Root(inj.target));
  node_lost[static_cast<size_t>(inj.target)] = true;
  if (network) {
    // The host is off the network too.
    Status st = network->SetNodeLink(inj.target, false);
    if (!st.ok()) Say("kill-node: taking the link down: " + st.ToString());
  }
}

Result<std::string> Launcher::State::FireRecoveryInjections(int recovery) {
  std::string killed;
  for (size_t k = 0; k < injections.size(); ++k) {
    const Injection& inj = injections[k];
    if (fired[k] || inj.recovery != recovery || inj.in_transfer || inj.in_durable_load) continue;
    fired[k] = true;
    Say("injecting " + inj.ToString());
    if (inj.kind == InjectKind::kKillStore) {
      KillStore(inj.ToString(), recovery, known_committed);
      std::this_thread::sleep_for(std::chrono::duration<double>(o.store_down_s));
      MEMENTO_RETURN_IF_ERROR(RestartStore());
      continue;
    }
    // kill-agent / kill-node: the agent is dead (reaped) when this returns,
    // so the recovery's round fails and the next one restarts or replaces it.
    Injection kill = inj;
    if (kill.target == Injection::kLeader) {
      auto leader = store->Get(RecoveryLeaderKey(o.job), Deadline::AfterSeconds(5));
      auto node = leader.ok() ? coord::ParseNodeName(leader->value) : Result<int>(leader.status());
      if (!node.ok() || *node < 0 || *node >= o.nodes) {
        Say(inj.ToString() + ": no recovery leader elected (" + node.status().ToString() +
            "); nothing killed");
        continue;
      }
      kill.target = *node;
      Say(inj.ToString() + ": node " + std::to_string(kill.target) + " leads");
    }
    KillAgentOrNode(kill);
    (void)agents[static_cast<size_t>(kill.target)].Wait(Deadline::AfterSeconds(10));
    killed += (killed.empty() ? "" : ", ") + inj.ToString();
  }
  if (killed.empty()) return killed;
  return "injected " + killed;
}

void Launcher::State::FireTransferInjections(int recovery, bool moved) {
  for (size_t k = 0; k < injections.size(); ++k) {
    const Injection& inj = injections[k];
    if (fired[k] || inj.recovery != recovery || !inj.in_transfer) continue;
    fired[k] = true;
    if (!moved) {
      Say(inj.ToString() + " did not fire: recovery " + std::to_string(recovery) +
          " moved no bytes (nothing to rebuild from memory)");
      continue;
    }
    Say("injecting " + inj.ToString() + " (recovery " + std::to_string(recovery) +
        "'s rebuild is moving bytes)");
    KillAgentOrNode(inj);
    (void)agents[static_cast<size_t>(inj.target)].Wait(Deadline::AfterSeconds(10));
  }
}

void Launcher::State::FireDurableLoadInjection(int recovery, int node) {
  for (size_t k = 0; k < injections.size(); ++k) {
    const Injection& inj = injections[k];
    if (fired[k] || inj.recovery != recovery || !inj.in_durable_load || inj.target != node) {
      continue;
    }
    fired[k] = true;
    Say("injecting " + inj.ToString() + " (recovery " + std::to_string(recovery) +
        "'s durable load request to node " + std::to_string(node) + " is going out)");
    KillAgentOrNode(inj);
    (void)agents[static_cast<size_t>(node)].Wait(Deadline::AfterSeconds(10));
    return;  // one per load request: the next try fires the next one
  }
}

Status Launcher::State::KillLeaderMidRecovery(int recovery) {
  size_t k = 0;
  while (k < injections.size() && (fired[k] || injections[k].recovery != recovery ||
                                   injections[k].target != Injection::kLeader)) {
    ++k;
  }
  if (k == injections.size() || StoreDown() || !plan.has_value()) return Status::Ok();
  const std::string down = DeadAgents();
  const int64_t committed = Committed();
  if (down.empty() || committed < 0) return Status::Ok();
  const Injection& inj = injections[k];
  // A dead leader would hold the key until its lease expires.
  auto key = store->Get(RecoveryLeaderKey(o.job), Deadline::AfterSeconds(5));
  if (key.ok() && key->lease != 0) {
    auto node = coord::ParseNodeName(key->value);
    if (node.ok() && *node >= 0 && *node < o.nodes &&
        !agents[static_cast<size_t>(*node)].running()) {
      store->RevokeLease(key->lease, Deadline::AfterSeconds(5)).IgnoreError();
    }
  }
  // The dead agents' endpoints go now (as StartAgent would drop them), so
  // the leader waits for their agents instead of failing inventory rounds.
  coord::JobKeys keys(o.job);
  for (int i = 0; i < o.nodes; ++i) {
    if (agents[static_cast<size_t>(i)].running()) continue;
    auto kv = store->Get(keys.Node(coord::NodeName(i)), Deadline::AfterSeconds(5));
    if (kv.ok() && kv->lease != 0) {
      store->RevokeLease(kv->lease, Deadline::AfterSeconds(5)).IgnoreError();
    }
  }
  // What RecoverByAgents does before its request.
  ApplyPendingCorruptions(committed, {});
  ApplyPendingDurableCorruption();
  MEMENTO_ASSIGN_OR_RETURN(
      filed_request, RequestRecovery(*store, o.job, Deadline::AfterSeconds(5), agents_epoch_floor));
  Say("recovery " + std::to_string(recovery) + " asked of the agents' recovery leader (request " +
      std::to_string(filed_request) + ", the agents of node(s)" + down + " still down)");
  const Deadline deadline = Deadline::AfterSeconds(o.recovery_timeout_s);
  for (;;) {
    auto view = ReadRecoveryView(*store, o.job, Deadline::AfterSeconds(5));
    if (view.ok() && view->has_status && view->status.id == filed_request) {
      const RecoveryStatus& st = view->status;
      if (st.final()) {
        Say(inj.ToString() + ": request " + std::to_string(filed_request) + " ended (" + st.state +
            ") before the leader could be killed; nothing killed");
        fired[k] = true;
        return Status::Ok();
      }
      auto node = coord::ParseNodeName(st.leader);
      if (node.ok() && *node >= 0 && *node < o.nodes &&
          agents[static_cast<size_t>(*node)].running()) {
        fired[k] = true;
        Injection kill = inj;
        kill.target = *node;
        Say("injecting " + inj.ToString() + ": " + st.leader + ", the leader of request " +
            std::to_string(filed_request) + " (" + st.state + ")");
        KillAgentOrNode(kill);
        (void)agents[static_cast<size_t>(kill.target)].Wait(Deadline::AfterSeconds(10));
        return Status::Ok();
      }
    }
    if (deadline.expired()) {
      return DeadlineExceededError("no recovery leader took up request " +
                                   std::to_string(filed_request) + " within --recovery-timeout " +
                                   Seconds3(o.recovery_timeout_s) + " s (" + inj.ToString() + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void Launcher::State::ApplyPendingCorruptions(int64_t committed,
                                              const std::vector<int>& lost_nodes) {
  for (int rank : pending_corruptions) {
    const int node = NodeOf(rank);
    if (node_lost[static_cast<size_t>(node)] ||
        std::find(lost_nodes.begin(), lost_nodes.end(), node) != lost_nodes.end()) {
      Say("corrupt-rank:" + std::to_string(rank) + " did not fire: node " + std::to_string(node) +
          " lost its memory in this failure (nothing of rank " + std::to_string(rank) +
          " left to corrupt)");
      continue;
    }
    auto slots = CorruptSlot(Root(node), rank, committed);
    Say(slots.ok() ? "flipped a byte in " + *slots + " of rank " + std::to_string(rank) +
                         " (committed step " + std::to_string(committed) + ")"
                   : "corrupt-rank: " + slots.status().ToString());
  }
  pending_corruptions.clear();
}

void Launcher::State::ReportUnappliedCorruptions() {
  for (int rank : pending_corruptions) {
    Say("corrupt-rank:" + std::to_string(rank) +
        " did not fire: no failure stopped the trainers after it was injected");
  }
  pending_corruptions.clear();
  if (corrupt_durable_pending) {
    Say("corrupt-durable did not fire: no recovery looked at the durable tier after it was "
        "injected");
  }
  corrupt_durable_pending = false;
  for (size_t k = 0; k < injections.size(); ++k) {
    if (fired[k] || !injections[k].in_durable_load) continue;
    Say(injections[k].ToString() + " did not fire: recovery " +
        std::to_string(injections[k].recovery) + " loaded no durable version on node " +
        std::to_string(injections[k].target) + " (or had no more load tries)");
  }
}

void Launcher::State::ApplyPendingDurableCorruption() {
  if (!corrupt_durable_pending) return;
  corrupt_durable_pending = false;
  auto what = CorruptNewestDurable(o.durable_dir);
  Say(what.ok() ? "corrupt-durable: " + *what : "corrupt-durable: " + what.status().ToString());
}

}  // namespace memento::launch
