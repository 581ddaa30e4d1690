#include "topo/plan.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <unordered_map>

#include "common/check.h"
#include "common/human.h"

namespace memento::topo {
namespace {

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

std::string Str(int v) { return std::to_string(v); }

// Replicated tensors of a sharding group laid out as one stream, every tensor
// starting at a multiple of kPieceAlignment, so that cuts at multiples of
// kPieceAlignment never split an element (REFT 4.1, global parameter sharding).
struct StreamTensor {
  const TensorMeta* meta;
  uint64_t start;
  uint64_t bytes;
};

// Real bytes of stream range [a, b) as tensor segments.
std::vector<Segment> SegmentsOf(const std::vector<StreamTensor>& ts, uint64_t a, uint64_t b,
                                uint64_t* bytes) {
  std::vector<Segment> out;
  *bytes = 0;
  for (const StreamTensor& t : ts) {
    const uint64_t lo = std::max(a, t.start);
    const uint64_t hi = std::min(b, t.start + t.bytes);
    if (lo >= hi) continue;
    out.push_back(Segment{t.meta->name, lo - t.start, hi - lo});
    *bytes += hi - lo;
  }
  return out;
}

// Orders nodes so that neighbours lie in different racks where labels allow:
// round-robin over racks in order of first appearance. Unlabelled: unchanged.
std::vector<int> RackInterleave(const Topology& topo, const std::vector<int>& nodes) {
  std::vector<std::string> racks;
  std::vector<std::vector<int>> by_rack;
  for (int n : nodes) {
    const std::string rack(topo.Rack(n));
    auto it = std::find(racks.begin(), racks.end(), rack);
    if (it == racks.end()) {
      racks.push_back(rack);
      by_rack.push_back({n});
    } else {
      by_rack[it - racks.begin()].push_back(n);
    }
  }
  if (racks.size() <= 1) return nodes;
  std::vector<int> out;
  out.reserve(nodes.size());
  for (size_t i = 0; out.size() < nodes.size(); ++i) {
    for (auto& r : by_rack) {
      if (i < r.size()) out.push_back(r[i]);
    }
  }
  return out;
}

bool SameTensorShape(const TensorMeta& a, const TensorMeta& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape;
}

// Protection level a scheme gives (before capping by the number of nodes).
int SchemeLevel(const Policy& p) {
  switch (p.scheme) {
    case Scheme::kNone:
      return 0;
    case Scheme::kReplicate:
      return 1;
    case Scheme::kXor:
      return 1;
    case Scheme::kRs:
      return p.f;
    case Scheme::kPeer:
      return p.m - 1;
    case Scheme::kAuto:
      return 1;
  }
  return 0;
}

class Planner {
 public:
  Planner(const Topology& topo, const Inventory& inv, const Policy& policy)
      : topo_(topo), inv_(inv), policy_(policy) {}

  Result<Plan> Run();

 private:
  uint32_t AddPiece(Piece p) {
    p.id = static_cast<uint32_t>(plan_.pieces.size());
    plan_.pieces.push_back(std::move(p));
    return plan_.pieces.back().id;
  }
  void AddCopy(uint32_t piece, int node, CopyKind kind, int producer_rank) {
    Copy c;
    c.id = static_cast<uint32_t>(plan_.copies.size());
    c.piece = piece;
    c.node = node;
    c.kind = kind;
    c.producer_rank = producer_rank;
    plan_.copies.push_back(c);
  }
  // What protects a sharding group's state, built up by its steps.
  struct GroupProtection {
    std::string scheme;
    std::string note;
    int repl_level = 1 << 20;  // no replicated state: no limit from it
    int dp_level = 1 << 20;    // no dp shards: no limit from them
    uint64_t repl_bytes = 0;
  };
  // One sharding group, in steps (below).
  Status PlanShardingGroup(int pp_i, int tp_i);
  void GroupRing(int pp_i, int tp_i, Group* group, std::vector<int>* ring_rank);
  Result<std::vector<const TensorMeta*>> ReplicatedTensors(const std::vector<int>& ranks);
  void PlanReplicatedState(int g, const std::vector<const TensorMeta*>& repl,
                           const std::vector<int>& ring, const std::vector<int>& ring_rank,
                           GroupProtection* out);
  std::vector<uint32_t> AddRankPieces(int g, const std::vector<int>& ranks);
  void ProtectDpShards(const std::vector<uint32_t>& dp_pieces, const std::vector<int>& ring,
                       const std::vector<int>& ring_rank, GroupProtection* out);
  void BuildStripes(int group, const std::vector<int>& ring, const std::vector<uint32_t>& pieces,
                    const std::vector<int>& primary_rank, bool xor_code, int f);
  void PlanPeerGroups();
  void Aggregate();

  const Topology& topo_;
  const Inventory& inv_;
  const Policy policy_;
  Plan plan_;
  // Pieces that training does not replicate on another node: protected by
  // peer copies (Gemini group placement).
  std::vector<uint32_t> peer_pieces_;
  std::vector<bool> sg_uses_peer_;  // by sharding group id
};

// The sharding group of (pp_i, tp_i): its DP ranks, and its ring of
// distinct nodes (rack-interleaved) with the lowest-dp rank on each.
void Planner::GroupRing(int pp_i, int tp_i, Group* group, std::vector<int>* ring_rank) {
  std::vector<int> first_nodes;
  std::map<int, int> primary_of_node;  // node -> lowest-dp rank on it
  for (int d = 0; d < topo_.dp; ++d) {
    const int r = topo_.Rank(d, tp_i, pp_i);
    group->ranks.push_back(r);
    const int node = topo_.rank_node[r];
    if (primary_of_node.emplace(node, r).second) first_nodes.push_back(node);
  }
  const std::vector<int> ring = RackInterleave(topo_, first_nodes);
  group->nodes = ring;
  const int n = static_cast<int>(ring.size());
  ring_rank->assign(n, 0);
  for (int i = 0; i < n; ++i) (*ring_rank)[i] = primary_of_node[ring[i]];
}

// The replicated tensors of a sharding group (rank `ranks[0]`'s, in
// inventory order), after checking that every DP rank registers the same
// ones. ZeRO-3: nothing is replicated by training.
Result<std::vector<const TensorMeta*>> Planner::ReplicatedTensors(const std::vector<int>& ranks) {
  const int r0 = ranks[0];
  auto is_replicated = [&](const TensorMeta& t) {
    return t.state_class == StateClass::kReplicated && topo_.zero_stage != 3;
  };
  std::vector<const TensorMeta*> repl;
  for (const TensorMeta& t : inv_[r0]) {
    if (is_replicated(t)) repl.push_back(&t);
  }
  for (int r : ranks) {
    std::vector<const TensorMeta*> mine;
    for (const TensorMeta& t : inv_[r]) {
      if (is_replicated(t)) mine.push_back(&t);
      if (t.state_class == StateClass::kDpSharded && topo_.zero_stage == 0) {
        return InvalidArgumentError("rank " + Str(r) + " tensor '" + t.name +
                                    "' is dp_sharded but zero_stage=0 (expected 1 or 3)");
      }
    }
    if (mine.size() != repl.size()) {
      return InvalidArgumentError("rank " + Str(r) + " has " + Str(static_cast<int>(mine.size())) +
                                  " replicated tensors but its DP replica rank " + Str(r0) +
                                  " has " + Str(static_cast<int>(repl.size())) +
                                  " (replicated state must be identical across DP ranks)");
    }
    for (size_t i = 0; i < mine.size(); ++i) {
      if (!SameTensorShape(*mine[i], *repl[i])) {
        return InvalidArgumentError(
            "rank " + Str(r) + " replicated tensor '" + mine[i]->name + "' " +
            std::string(DTypeName(mine[i]->dtype)) + ShapeToString(mine[i]->shape) +
            " differs from rank " + Str(r0) + "'s '" + repl[i]->name + "' " +
            std::string(DTypeName(repl[i]->dtype)) + ShapeToString(repl[i]->shape));
      }
    }
  }
  return repl;
}

// Replicated state: n pieces, piece i on ring node i (global parameter
// sharding), protected by the policy; sets scheme, note and the level.
void Planner::PlanReplicatedState(int g, const std::vector<const TensorMeta*>& repl,
                                  const std::vector<int>& ring, const std::vector<int>& ring_rank,
                                  GroupProtection* out) {
  const int n = static_cast<int>(ring.size());
  const bool protect = policy_.scheme != Scheme::kNone;
  std::vector<StreamTensor> stream;
  uint64_t end = 0;
  for (const TensorMeta* t : repl) {
    const uint64_t start = AlignUp(end, kPieceAlignment);
    stream.push_back(StreamTensor{t, start, t->nbytes()});
    end = start + t->nbytes();
  }
  const uint64_t stream_len = AlignUp(end, kPieceAlignment);
  std::vector<uint32_t> repl_pieces;
  if (!repl.empty()) {
    const uint64_t nominal = AlignUp(CeilDiv(stream_len, n), kPieceAlignment);
    for (int i = 0; i < n; ++i) {
      Piece p;
      p.key = "sg" + Str(g) + "/r" + Str(i);
      p.kind = PieceKind::kReplicatedShard;
      p.group = g;
      p.rank = ring_rank[i];
      p.node = ring[i];
      const uint64_t a = std::min(stream_len, nominal * i);
      const uint64_t b = std::min(stream_len, nominal * (i + 1));
      p.segments = SegmentsOf(stream, a, b, &p.bytes);
      out->repl_bytes += p.bytes;
      repl_pieces.push_back(AddPiece(std::move(p)));
    }
  }
  std::string& scheme = out->scheme;
  std::string& note = out->note;
  int& repl_level = out->repl_level;
  if (!repl.empty()) {
    if (n == 1) {
      note = topo_.dp == 1 ? "dp=1: replicated state exists once, on node " + Str(ring[0])
                           : "all " + Str(topo_.dp) + " DP replicas are on node " + Str(ring[0]) +
                                 ": replicated state has no copy on another node";
      if (protect) {
        note += ", protected by peer copies over the network";
        peer_pieces_.push_back(repl_pieces[0]);
        scheme = "peer";
        repl_level = -1;  // filled in from the peer group
      } else {
        scheme = "none";
        repl_level = 0;
      }
    } else if (!protect) {
      scheme = "none";
      repl_level = 0;
    } else if (policy_.local_copy == LocalCopy::kFull) {
      // Every node keeps the whole state of its group: any n-1 failures.
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) {
          if (j != i) AddCopy(repl_pieces[j], ring[i], CopyKind::kLocalFull, ring_rank[i]);
        }
      }
      scheme = "local_full";
      repl_level = n - 1;
    } else if (policy_.scheme == Scheme::kReplicate || policy_.scheme == Scheme::kPeer) {
      // REFT ARC: piece i also on ring nodes i+1 .. i+c-1, copied from their own replica.
      const int c = std::min(policy_.scheme == Scheme::kPeer ? policy_.m : 2, n);
      for (int i = 0; i < n; ++i) {
        for (int t = 1; t < c; ++t) {
          const int j = (i + t) % n;
          AddCopy(repl_pieces[i], ring[j], CopyKind::kArc, ring_rank[j]);
        }
      }
      scheme = c == 2 ? "arc" : "arc:" + Str(c);
      repl_level = c - 1;
      if (c < (policy_.scheme == Scheme::kPeer ? policy_.m : 2)) {
        note = "only " + Str(n) + " nodes: " + Str(c) + " copies";
      }
    } else {
      const bool xor_code = policy_.scheme == Scheme::kXor || policy_.scheme == Scheme::kAuto;
      const int f = std::min(xor_code ? 1 : policy_.f, n - 1);
      if (!xor_code && f < policy_.f) {
        note = "rs:" + Str(policy_.f) + " requested but the group spans only " + Str(n) +
               " nodes: tolerates " + Str(f);
      }
      BuildStripes(g, ring, repl_pieces, ring_rank, xor_code, f);
      scheme = xor_code ? "xor" : "rs:" + Str(f);
      repl_level = f;
    }
  }
}

// Rank-unique state: dp_sharded (ZeRO-1 optimizer shards; all of it under
// ZeRO-3) and private. One piece per rank and kind; returns the dp pieces.
std::vector<uint32_t> Planner::AddRankPieces(int g, const std::vector<int>& ranks) {
  const bool protect = policy_.scheme != Scheme::kNone;
  std::vector<uint32_t> dp_pieces;
  for (int d = 0; d < topo_.dp; ++d) {
    const int r = ranks[d];
    const int node = topo_.rank_node[r];
    for (PieceKind kind : {PieceKind::kDpShard, PieceKind::kPrivate}) {
      Piece p;
      bool any = false;
      for (const TensorMeta& t : inv_[r]) {
        const bool mine =
            kind == PieceKind::kPrivate
                ? t.state_class == StateClass::kPrivate
                : (t.state_class == StateClass::kDpSharded ||
                   (t.state_class == StateClass::kReplicated && topo_.zero_stage == 3));
        if (!mine) continue;
        any = true;
        p.segments.push_back(Segment{t.name, 0, t.nbytes()});
        p.bytes += t.nbytes();
      }
      if (!any) continue;
      p.kind = kind;
      p.key = "rank" + Str(r) + (kind == PieceKind::kPrivate ? "/priv" : "/dp");
      p.group = kind == PieceKind::kPrivate ? -1 : g;
      p.rank = r;
      p.node = node;
      const uint32_t id = AddPiece(std::move(p));
      if (kind == PieceKind::kDpShard) {
        dp_pieces.push_back(id);
      } else if (protect) {
        peer_pieces_.push_back(id);
      }
    }
  }
  return dp_pieces;
}

// Protection of the dp shards (REFT AOR, else peer copies); adds to the
// scheme and note and sets the level.
void Planner::ProtectDpShards(const std::vector<uint32_t>& dp_pieces, const std::vector<int>& ring,
                              const std::vector<int>& ring_rank, GroupProtection* out) {
  const int n = static_cast<int>(ring.size());
  const int level = SchemeLevel(policy_);
  const bool protect = policy_.scheme != Scheme::kNone;
  std::string& scheme = out->scheme;
  std::string& note = out->note;
  int& dp_level = out->dp_level;
  if (!dp_pieces.empty()) {
    const bool aor = topo_.zero_stage == 1 && n >= 2 && protect && policy_.scheme != Scheme::kPeer;
    if (aor) {
      // REFT AOR: the shards of ring node i are kept current on ring nodes
      // i+1 .. i+c by recomputing the optimizer step on the host.
      const int c = std::min(level, n - 1);
      std::map<int, int> pos;
      for (int i = 0; i < n; ++i) pos[ring[i]] = i;
      for (uint32_t id : dp_pieces) {
        const int i = pos[plan_.pieces[id].node];
        for (int t = 1; t <= c; ++t) {
          const int j = (i + t) % n;
          AddCopy(id, ring[j], CopyKind::kAor, ring_rank[j]);
        }
      }
      scheme += std::string(scheme.empty() ? "" : "+") + (c == 1 ? "aor" : "aor:" + Str(c));
      dp_level = c;
    } else if (protect) {
      for (uint32_t id : dp_pieces) peer_pieces_.push_back(id);
      if (scheme != "peer") scheme += std::string(scheme.empty() ? "" : "+") + "peer";
      dp_level = -1;
      const std::string why =
          topo_.zero_stage == 3
              ? "ZeRO-3 state has no inherent redundancy: optimizer and parameter shards are "
                "protected by peer copies over the network"
          : n == 1 ? "AOR needs DP peers on another node: optimizer shards are protected by "
                     "peer copies over the network"
                   : "optimizer shards are protected by peer copies over the network";
      note += std::string(note.empty() ? "" : "; ") + why;
    } else {
      scheme += std::string(scheme.empty() ? "" : "+") + "none";
      dp_level = 0;
    }
  }
}

Status Planner::PlanShardingGroup(int pp_i, int tp_i) {
  const int g = pp_i * topo_.tp + tp_i;
  Group group;
  group.id = g;
  group.kind = GroupKind::kShardingGroup;
  group.pp = pp_i;
  group.tp = tp_i;
  group.name = "sg" + Str(g) + " (pp=" + Str(pp_i) + " tp=" + Str(tp_i) + ")";
  std::vector<int> ring_rank;
  GroupRing(pp_i, tp_i, &group, &ring_rank);
  const std::vector<int>& ring = group.nodes;
  MEMENTO_ASSIGN_OR_RETURN(std::vector<const TensorMeta*> repl, ReplicatedTensors(group.ranks));
  const bool protect = policy_.scheme != Scheme::kNone;
  GroupProtection prot;
  PlanReplicatedState(g, repl, ring, ring_rank, &prot);
  const std::vector<uint32_t> dp_pieces = AddRankPieces(g, group.ranks);
  ProtectDpShards(dp_pieces, ring, ring_rank, &prot);
  std::string& scheme = prot.scheme;
  std::string& note = prot.note;
  const int repl_level = prot.repl_level;
  const int dp_level = prot.dp_level;
  const uint64_t repl_bytes = prot.repl_bytes;
  if (scheme.empty()) scheme = protect ? "-" : "none";
  group.scheme = scheme;
  group.carries_data = repl_bytes > 0 || !dp_pieces.empty();
  // -1 (peer-protected) is resolved once the peer groups exist.
  int lvl = 1 << 20;
  bool uses_peer = false;
  for (int v : {repl_level, dp_level}) {
    if (v == -1) {
      uses_peer = true;
    } else {
      lvl = std::min(lvl, v);
    }
  }
  group.protection = lvl;
  sg_uses_peer_.push_back(uses_peer);
  if (!protect) note = note.empty() ? "policy none: no redundancy" : note;
  group.note = note;
  plan_.groups.push_back(std::move(group));
  return Status::Ok();
}

void Planner::BuildStripes(int group, const std::vector<int>& ring,
                           const std::vector<uint32_t>& pieces,
                           const std::vector<int>& primary_rank, bool xor_code, int f) {
  // Rotated stripes like RAID-5/6 (REFT 4.2 AEC, generalised to f parities):
  // stripe s keeps its parities on ring nodes s .. s+f-1 and takes one
  // sub-block from each of the other k = n - f pieces. Every node is parity
  // in f stripes and data in k, so it holds f blocks of W / (n k) beside its
  // own piece of W / n (REFT: W / (n (n - 1)) for XOR).
  const int n = static_cast<int>(ring.size());
  const int k = n - f;
  uint64_t nominal = 0;
  for (uint32_t id : pieces) nominal = std::max(nominal, plan_.pieces[id].bytes);
  const uint64_t b = AlignUp(CeilDiv(nominal, k), kPieceAlignment);
  if (b == 0) return;
  std::vector<int> next_sub(n, 0);
  for (int s = 0; s < n; ++s) {
    Stripe st;
    st.id = static_cast<uint32_t>(plan_.stripes.size());
    st.group = group;
    st.xor_code = xor_code;
    st.k = k;
    st.f = f;
    st.block_bytes = b;
    std::vector<bool> is_parity(n, false);
    for (int t = 0; t < f; ++t) is_parity[(s + t) % n] = true;
    for (int i = 0; i < n; ++i) {
      if (is_parity[i]) continue;
      const uint64_t piece_bytes = plan_.pieces[pieces[i]].bytes;
      const uint64_t off = std::min(piece_bytes, b * next_sub[i]);
      const uint64_t len = std::min(piece_bytes, b * (next_sub[i] + 1)) - off;
      ++next_sub[i];
      st.data.push_back(StripeBlock{pieces[i], off, len});
    }
    for (int t = 0; t < f; ++t) {
      const int i = (s + t) % n;
      Parity par;
      par.id = static_cast<uint32_t>(plan_.parities.size());
      par.stripe = st.id;
      par.index = t;
      par.node = ring[i];
      par.producer_rank = primary_rank[i];
      par.bytes = b;
      st.parities.push_back(par.id);
      plan_.parities.push_back(par);
    }
    plan_.stripes.push_back(std::move(st));
  }
}

void Planner::PlanPeerGroups() {
  const int num_nodes = topo_.num_nodes();
  if (policy_.scheme == Scheme::kNone) return;
  int m = policy_.scheme == Scheme::kPeer ? policy_.m
          : policy_.scheme == Scheme::kRs ? policy_.f + 1
                                          : 2;
  const int wanted = m;
  m = std::min(m, num_nodes);
  std::vector<int> all(num_nodes);
  std::iota(all.begin(), all.end(), 0);
  const std::vector<int> order = RackInterleave(topo_, all);
  // Gemini group placement: disjoint groups of m nodes; a remainder joins the
  // last group, which then places each node's copies on its next m-1 ring peers.
  const int num_groups = std::max(1, num_nodes / std::max(m, 1));
  std::vector<int> group_of_node(num_nodes, 0), pos_in_group(num_nodes, 0);
  const int first_peer_group = static_cast<int>(plan_.groups.size());
  for (int gi = 0; gi < num_groups; ++gi) {
    Group group;
    group.id = first_peer_group + gi;
    group.kind = GroupKind::kPeerGroup;
    group.name = "peer" + Str(gi);
    const int lo = gi * m;
    const int hi = gi == num_groups - 1 ? num_nodes : lo + m;
    for (int i = lo; i < hi; ++i) {
      group_of_node[order[i]] = group.id;
      pos_in_group[order[i]] = i - lo;
      group.nodes.push_back(order[i]);
    }
    group.scheme = "peer:" + Str(m);
    group.protection = m - 1;
    if (m < wanted) {
      group.note = Str(wanted) + " copies requested but only " + Str(num_nodes) +
                   " node(s) exist: " + Str(m) + " copies";
    }
    if (num_nodes == 1) group.note = "single node: no other failure domain to hold a copy";
    plan_.groups.push_back(std::move(group));
  }
  for (uint32_t id : peer_pieces_) {
    const int node = plan_.pieces[id].node;
    Group& group = plan_.groups[group_of_node[node]];
    const int size = static_cast<int>(group.nodes.size());
    const int pos = pos_in_group[node];
    for (int t = 1; t < m; ++t) {
      AddCopy(id, group.nodes[(pos + t) % size], CopyKind::kPeer, -1);
    }
    group.carries_data = true;
  }
  const int peer_level = m - 1;
  for (Group& g : plan_.groups) {
    if (g.kind == GroupKind::kShardingGroup && sg_uses_peer_[g.id]) {
      g.protection = std::min(g.protection, peer_level);
    }
  }
}

void Planner::Aggregate() {
  const int num_nodes = topo_.num_nodes();
  plan_.nodes.resize(num_nodes);
  for (int i = 0; i < num_nodes; ++i) {
    plan_.nodes[i].node = i;
    plan_.nodes[i].rack = std::string(topo_.Rack(i));
  }
  plan_.ranks.resize(topo_.num_ranks());
  for (int r = 0; r < topo_.num_ranks(); ++r) {
    RankPlan& rp = plan_.ranks[r];
    rp.rank = r;
    rp.node = topo_.rank_node[r];
    rp.group = topo_.PpIndex(r) * topo_.tp + topo_.TpIndex(r);
    plan_.nodes[rp.node].ranks.push_back(r);
  }
  for (const Piece& p : plan_.pieces) {
    plan_.nodes[p.node].pieces.push_back(p.id);
    plan_.nodes[p.node].piece_bytes += p.bytes;
    plan_.ranks[p.rank].pieces.push_back(p.id);
    plan_.total_state_bytes += p.bytes;
  }
  for (const Copy& c : plan_.copies) {
    const uint64_t bytes = plan_.pieces[c.piece].bytes;
    plan_.nodes[c.node].copies.push_back(c.id);
    plan_.nodes[c.node].copy_bytes += bytes;
    if (c.kind == CopyKind::kPeer) plan_.nodes[c.node].network_bytes += bytes;
    if (c.producer_rank >= 0) plan_.ranks[c.producer_rank].copies.push_back(c.id);
  }
  for (const Parity& p : plan_.parities) {
    plan_.nodes[p.node].parities.push_back(p.id);
    plan_.nodes[p.node].parity_bytes += p.bytes;
    plan_.ranks[p.producer_rank].parities.push_back(p.id);
  }
  for (const NodePlan& n : plan_.nodes) plan_.total_held_bytes += n.total_bytes();
  int level = 1 << 20;
  for (const Group& g : plan_.groups) {
    if (g.carries_data) level = std::min(level, g.protection);
    if (!g.note.empty()) plan_.notes.push_back(g.name + ": " + g.note);
  }
  plan_.protection = level == (1 << 20) ? num_nodes : level;
}

Result<Plan> Planner::Run() {
  MEMENTO_RETURN_IF_ERROR(topo_.Validate());
  if (static_cast<int>(inv_.size()) != topo_.num_ranks()) {
    return InvalidArgumentError("inventory has " + Str(static_cast<int>(inv_.size())) +
                                " ranks, topology has " + Str(topo_.num_ranks()));
  }
  if (policy_.scheme == Scheme::kRs && policy_.f < 1) {
    return InvalidArgumentError("rs:f needs f >= 1, got " + Str(policy_.f));
  }
  if (policy_.scheme == Scheme::kPeer && policy_.m < 2) {
    return InvalidArgumentError("peer:m needs m >= 2 copies, got " + Str(policy_.m));
  }
  for (int r = 0; r < topo_.num_ranks(); ++r) {
    std::vector<std::string_view> names;
    for (const TensorMeta& t : inv_[r]) {
      if (t.name.empty()) return InvalidArgumentError("rank " + Str(r) + ": a tensor has no name");
      for (int64_t d : t.shape) {
        if (d < 0) {
          return InvalidArgumentError("rank " + Str(r) + " tensor '" + t.name + "' has shape " +
                                      ShapeToString(t.shape) + ": dimensions must be >= 0");
        }
      }
      names.push_back(t.name);
    }
    std::sort(names.begin(), names.end());
    auto dup = std::adjacent_find(names.begin(), names.end());
    if (dup != names.end()) {
      return InvalidArgumentError("rank " + Str(r) + " registers tensor '" + std::string(*dup) +
                                  "' twice: names must be unique per rank");
    }
  }
  plan_.topology = topo_;
  plan_.policy = policy_;
  for (int pp_i = 0; pp_i < topo_.pp; ++pp_i) {
    for (int tp_i = 0; tp_i < topo_.tp; ++tp_i) {
      MEMENTO_RETURN_IF_ERROR(PlanShardingGroup(pp_i, tp_i));
    }
  }
  PlanPeerGroups();
  for (Group& g : plan_.groups) {
    // No state in the group: nothing to lose.
    if (g.protection >= (1 << 20)) g.protection = static_cast<int>(g.nodes.size());
  }
  Aggregate();
  return std::move(plan_);
}

}  // namespace

int Topology::num_nodes() const {
  int n = 0;
  for (int node : rank_node) n = std::max(n, node + 1);
  return n;
}

std::string_view Topology::Rack(int node) const {
  if (node < 0 || node >= static_cast<int>(node_rack.size())) return {};
  return node_rack[node];
}

Result<Topology> Topology::Uniform(int dp, int tp, int pp, int zero_stage, int ranks_per_node) {
  if (ranks_per_node < 1) {
    return InvalidArgumentError("ranks_per_node=" + Str(ranks_per_node) + " must be >= 1");
  }
  Topology t;
  t.dp = dp;
  t.tp = tp;
  t.pp = pp;
  t.zero_stage = zero_stage;
  if (dp < 1 || tp < 1 || pp < 1) {
    return InvalidArgumentError("dp=" + Str(dp) + " tp=" + Str(tp) + " pp=" + Str(pp) +
                                ": every size must be >= 1");
  }
  const int64_t ranks = int64_t{dp} * tp * pp;
  if (ranks > (1 << 24)) return InvalidArgumentError("too many ranks: " + std::to_string(ranks));
  t.rank_node.resize(ranks);
  for (int r = 0; r < ranks; ++r) t.rank_node[r] = r / ranks_per_node;
  MEMENTO_RETURN_IF_ERROR(t.Validate());
  return t;
}

Status Topology::Validate() const {
  if (dp < 1 || tp < 1 || pp < 1) {
    return InvalidArgumentError("dp=" + Str(dp) + " tp=" + Str(tp) + " pp=" + Str(pp) +
                                ": every size must be >= 1");
  }
  if (zero_stage != 0 && zero_stage != 1 && zero_stage != 3) {
    return InvalidArgumentError("zero_stage=" + Str(zero_stage) + ": expected 0, 1 or 3");
  }
  if (static_cast<int64_t>(rank_node.size()) != int64_t{dp} * tp * pp) {
    return InvalidArgumentError(
        "rank -> node map has " + std::to_string(rank_node.size()) +
        " entries, expected dp*tp*pp=" + std::to_string(int64_t{dp} * tp * pp));
  }
  std::vector<bool> used(num_nodes(), false);
  for (size_t r = 0; r < rank_node.size(); ++r) {
    if (rank_node[r] < 0) {
      return InvalidArgumentError("rank " + std::to_string(r) + " is on node " + Str(rank_node[r]) +
                                  ": node ids must be >= 0");
    }
    used[rank_node[r]] = true;
  }
  for (size_t n = 0; n < used.size(); ++n) {
    if (!used[n]) {
      return InvalidArgumentError("node " + std::to_string(n) +
                                  " runs no rank: node ids must be dense 0..num_nodes-1");
    }
  }
  if (!node_rack.empty() && static_cast<int>(node_rack.size()) != num_nodes()) {
    return InvalidArgumentError("node_rack has " + std::to_string(node_rack.size()) +
                                " labels, expected one per node (" + Str(num_nodes()) + ")");
  }
  return Status::Ok();
}

Result<Policy> ParsePolicy(std::string_view text) {
  Policy p;
  auto number = [&](std::string_view s, int* out) {
    if (s.empty() || s.size() > 3) return false;
    int v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + (c - '0');
    }
    *out = v;
    return true;
  };
  if (text == "none") {
    p.scheme = Scheme::kNone;
  } else if (text == "replicate" || text == "arc") {
    p.scheme = Scheme::kReplicate;
  } else if (text == "xor" || text == "aec") {
    p.scheme = Scheme::kXor;
  } else if (text == "auto") {
    p.scheme = Scheme::kAuto;
  } else if (text.substr(0, 3) == "rs:" && number(text.substr(3), &p.f) && p.f >= 1) {
    p.scheme = Scheme::kRs;
  } else if (text.substr(0, 5) == "peer:" && number(text.substr(5), &p.m) && p.m >= 2) {
    p.scheme = Scheme::kPeer;
  } else {
    return InvalidArgumentError("policy '" + std::string(text) +
                                "': expected none, replicate, xor, rs:F (F >= 1), peer:M "
                                "(M >= 2) or auto");
  }
  return p;
}

std::string PolicyName(const Policy& p) {
  std::string s;
  switch (p.scheme) {
    case Scheme::kNone:
      s = "none";
      break;
    case Scheme::kReplicate:
      s = "replicate";
      break;
    case Scheme::kXor:
      s = "xor";
      break;
    case Scheme::kRs:
      s = "rs:" + Str(p.f);
      break;
    case Scheme::kPeer:
      s = "peer:" + Str(p.m);
      break;
    case Scheme::kAuto:
      s = "auto";
      break;
  }
  return s;
}

std::string_view PieceKindName(PieceKind kind) {
  switch (kind) {
    case PieceKind::kReplicatedShard:
      return "replicated";
    case PieceKind::kDpShard:
      return "dp_shard";
    case PieceKind::kPrivate:
      return "private";
  }
  return "?";
}

std::string_view CopyKindName(CopyKind kind) {
  switch (kind) {
    case CopyKind::kArc:
      return "arc";
    case CopyKind::kLocalFull:
      return "local_full";
    case CopyKind::kAor:
      return "aor";
    case CopyKind::kPeer:
      return "peer";
  }
  return "?";
}

NodeCosts MaxNodeCosts(const Plan& plan) {
  NodeCosts out;
  for (const NodePlan& n : plan.nodes) {
    out.host = std::max(out.host, n.total_bytes());
    // Parity is computed on the device from bytes already there: only the
    // pieces, local copies and parity cross PCIe; AOR and peer copies do not.
    uint64_t c = n.piece_bytes + n.parity_bytes;
    for (uint32_t id : n.copies) {
      const Copy& cp = plan.copies[id];
      if (cp.kind == CopyKind::kArc || cp.kind == CopyKind::kLocalFull) {
        c += plan.pieces[cp.piece].bytes;
      }
    }
    out.copy = std::max(out.copy, c);
    out.network = std::max(out.network, n.network_bytes);
  }
  return out;
}

Result<Plan> MakePlan(const Topology& topology, const Inventory& inventory, const Policy& policy) {
  if (policy.scheme == Scheme::kAuto) {
    // One choice for every caller: the launcher, each agent and `plan
    // layout` resolve auto through model::MakeJobPlan (src/model/auto_plan.h).
    return InvalidArgumentError(
        "policy auto is chosen by the reliability model: call model::MakeJobPlan "
        "(src/model/auto_plan.h), not topo::MakePlan");
  }
  return Planner(topology, inventory, policy).Run();
}

}  // namespace memento::topo
