// Failure injection for `memento launch --inject ...` (docs/launch.md).
//
//   kill-rank:R@step=N    SIGKILL trainer rank R once the job reaches step N
//                         (a software failure: its node's memory survives)
//   kill-agent:I@step=N   SIGKILL node I's agent (its shared memory survives;
//                         a new agent adopts it)
//   kill-node:I@step=N    SIGKILL node I's agent and trainers and delete its
//                         root: the host is lost with everything in it
//   corrupt-rank:R@step=N flip one byte in the data of rank R's T0 slot that
//                         holds the newest committed step (and of a slot of a
//                         newer complete step: the launcher's view of the
//                         commit can lag the recovery's), once the next
//                         failure has stopped the trainers (silent corruption
//                         at rest: recovery must detect it and rebuild the rank;
//                         not held back by a store kill; one that cannot apply
//                         says "did not fire")
//   corrupt-durable@step=N  flip one byte in a data piece of the newest
//                         complete durable version when a recovery next falls
//                         back to the durable tier (--durable-dir): corruption
//                         at rest that only the fallback's verification finds;
//                         the fallback must use an older version that verifies
//   kill-store@step=N     SIGKILL the coordination store process (`memento
//                         launch --store-process`) and, after --store-down-s,
//                         start a fresh, EMPTY one on the same address: the
//                         store host is lost; agents re-register and refill it
//   kill-store@recovery=K the same, during recovery K (0-based): after the
//                         agents were restarted, before the inventory round
//   kill-agent:I@recovery=K, kill-node:I@recovery=K
//                         the same kills during recovery K, at the same point:
//                         the recovery starts over with node I's agent
//                         restarted on its root (kill-agent) or replaced on an
//                         empty one (kill-node: its data is one more loss)
//   kill-agent:leader@recovery=K, kill-node:leader@recovery=K
//                         `memento launch --recovery-by agents` only: the
//                         node whose agent leads the agents' recoveries.
//                         When recovery K waits for a lost node's
//                         replacement, the launcher files the request first
//                         and kills the leader while it waits (the leader
//                         lost mid-recovery: another agent takes the request
//                         over); otherwise the node leading at that point
//                         (kill-rank and corrupt-rank take only '@step=N': no
//                         trainer runs during a recovery)
//   kill-agent:I@transfer=K, kill-node:I@transfer=K
//                         the same kills while recovery K moves bytes: the
//                         launcher fires them right after it sent the rebuild
//                         requests (kPeerRecover) to the rebuilding agents,
//                         while their transfers from the peers run (not with
//                         --recovery-by agents). A recovery that rebuilds
//                         nothing (no node's data lost) moves no bytes: the
//                         injection does not fire, and the launcher says so
//   kill-agent:I@durable=K, kill-node:I@durable=K
//                         the same kills during recovery K's durable-tier
//                         load (--durable-dir, not with --recovery-by
//                         agents): fired as node I's load request goes out
//                         (its agent connected), so the request is lost
//                         mid-call; the launcher restarts (kill-agent) or
//                         replaces (kill-node) that agent and loads the same
//                         version again. Each load try fires the next one
//                         not yet fired: three of them make every try fail.
//                         A recovery that does not fall back to the durable
//                         tier never fires them
//
// Several injections are separated by commas. "The job reaches step N" means
// the newest committed step, or the step a node last signalled, is >= N.
// Each injection fires once.
//
// Thread safety: plain values; the parser is pure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memento/status.h"

namespace memento::launch {

enum class InjectKind : uint8_t {
  kKillRank = 0,
  kKillAgent = 1,
  kKillNode = 2,
  kCorruptRank = 3,
  kKillStore = 4,
  kCorruptDurable = 5,
};

// "kill-rank", "kill-agent", "kill-node", "corrupt-rank", "kill-store",
// "corrupt-durable"
std::string_view InjectKindName(InjectKind kind);

struct Injection {
  // target of kill-agent|kill-node:leader@recovery=K.
  static constexpr int kLeader = -1;
  InjectKind kind = InjectKind::kKillRank;
  // rank (kill-rank, corrupt-rank) or node index (kLeader: the recovery
  // leader's node, resolved when it fires); 0 for kill-store, corrupt-durable
  int target = 0;
  int64_t step = 0;  // fires when the job reaches this step (when recovery < 0)
  // kill-store, kill-agent, kill-node: fires during recovery number
  // `recovery` instead (0-based).
  int recovery = -1;
  // kill-agent, kill-node @transfer=K: during recovery `recovery`, while its
  // rebuild moves bytes (instead of before its inventory).
  bool in_transfer = false;
  // kill-agent, kill-node @durable=K: during recovery `recovery`'s load of a
  // durable version, as node `target`'s load request goes out.
  bool in_durable_load = false;
  // "kill-rank:3@step=40", "kill-node:1@recovery=0", "kill-agent:2@transfer=0",
  // "kill-agent:3@durable=0"
  std::string ToString() const;
};

// Parses a comma-separated list (empty text: no injection). InvalidArgument
// naming the bad entry otherwise. Targets are checked against the job's
// size: ranks < world_size, nodes < num_nodes.
[[nodiscard]] Result<std::vector<Injection>> ParseInjections(std::string_view text, int world_size,
                                                             int num_nodes);

}  // namespace memento::launch
