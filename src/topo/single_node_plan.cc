#include "topo/single_node_plan.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "fmt/format.h"

namespace memento::topo {
namespace {

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Bytes [a, b) of the concatenation of `segments`, as segments.
std::vector<Segment> CutSegments(const std::vector<Segment>& segments, uint64_t a, uint64_t b) {
  std::vector<Segment> out;
  uint64_t pos = 0;
  for (const Segment& s : segments) {
    const uint64_t lo = std::max(a, pos);
    const uint64_t hi = std::min(b, pos + s.length);
    if (lo < hi) out.push_back(Segment{s.tensor, s.offset + (lo - pos), hi - lo});
    pos += s.length;
  }
  return out;
}

// `whole` (a group's one replicated piece) as one piece per DP rank of
// `group`, appended to `out`.
void SplitAmongRanks(const Piece& whole, const Group& group, std::vector<Piece>* out) {
  const int d = static_cast<int>(group.ranks.size());
  const uint64_t nominal = AlignUp((whole.bytes + d - 1) / d, kPieceAlignment);
  for (int i = 0; i < d; ++i) {
    const uint64_t a = std::min(whole.bytes, nominal * i);
    const uint64_t b = std::min(whole.bytes, nominal * (i + 1));
    Piece p = whole;
    p.key = fmt::format("sg{}/r{}", whole.group, i);
    p.rank = group.ranks[i];
    p.bytes = b - a;
    p.segments = CutSegments(whole.segments, a, b);
    out->push_back(std::move(p));
  }
}

}  // namespace

Result<Plan> MakeSingleNodePlan(const Topology& topology, const Inventory& inventory) {
  if (topology.num_nodes() != 1) {
    return InvalidArgumentError(
        fmt::format("a single-node plan needs every rank on one node; rank_node names {} nodes",
                    topology.num_nodes()));
  }
  Policy none;
  none.scheme = Scheme::kNone;
  MEMENTO_ASSIGN_OR_RETURN(Plan plan, MakePlan(topology, inventory, none));
  MEMENTO_CHECK(plan.copies.empty() && plan.stripes.empty() && plan.parities.empty());
  std::vector<Piece> pieces;
  for (const Piece& p : plan.pieces) {
    if (p.kind == PieceKind::kReplicatedShard && plan.groups[p.group].ranks.size() > 1) {
      SplitAmongRanks(p, plan.groups[p.group], &pieces);
    } else {
      pieces.push_back(p);
    }
  }
  for (NodePlan& n : plan.nodes) n.pieces.clear();
  for (RankPlan& r : plan.ranks) r.pieces.clear();
  for (size_t i = 0; i < pieces.size(); ++i) {
    Piece& p = pieces[i];
    p.id = static_cast<uint32_t>(i);
    plan.nodes[p.node].pieces.push_back(p.id);
    plan.ranks[p.rank].pieces.push_back(p.id);
  }
  plan.pieces = std::move(pieces);
  if (topology.dp > 1) {
    plan.notes.push_back(fmt::format(
        "single node: each sharding group's replicated state is cut into {} pieces, one per DP "
        "rank; no redundancy",
        topology.dp));
  }
  return plan;
}

}  // namespace memento::topo
