// Failure injection for `memento launch --inject ...` (docs/launch.md).
//
//   kill-rank:R@step=N    SIGKILL trainer rank R once the job reaches step N
//                         (a software failure: its node's memory survives)
//   kill-agent:I@step=N   SIGKILL node I's agent (its shared memory survives;
//                         a new agent adopts it)
//   kill-node:I@step=N    SIGKILL node I's agent and trainers and delete its
//                         root: the host is lost with everything in it
//   corrupt-rank:R@step=N flip one byte in the data of rank R's T0 slot that
//                         holds the newest committed step, once the next
//                         failure has stopped the trainers (silent corruption
//                         at rest: recovery must detect it and rebuild the rank)
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

enum class InjectKind : uint8_t { kKillRank = 0, kKillAgent = 1, kKillNode = 2, kCorruptRank = 3 };

// "kill-rank", "kill-agent", "kill-node", "corrupt-rank"
std::string_view InjectKindName(InjectKind kind);

struct Injection {
  InjectKind kind = InjectKind::kKillRank;
  int target = 0;                // rank (kill-rank, corrupt-rank) or node index
  int64_t step = 0;              // fires when the job reaches this step
  std::string ToString() const;  // "kill-rank:3@step=40"
};

// Parses a comma-separated list (empty text: no injection). InvalidArgument
// naming the bad entry otherwise. Targets are checked against the job's
// size: ranks < world_size, nodes < num_nodes.
[[nodiscard]] Result<std::vector<Injection>> ParseInjections(std::string_view text, int world_size,
                                                             int num_nodes);

}  // namespace memento::launch
