#include "topo/plan_json.h"

#include <string>
#include <utility>

#include "common/json_reader.h"
#include "topo/topology_json.h"

namespace memento::topo {

using nlohmann::json;

namespace {

json SegmentsToJson(const std::vector<Segment>& segs) {
  json a = json::array();
  for (const Segment& s : segs)
    a.push_back({{"tensor", s.tensor}, {"offset", s.offset}, {"length", s.length}});
  return a;
}

template <typename T>
json Ids(const std::vector<T>& v) {
  return json(v);
}

}  // namespace

json PlanToJson(const Plan& plan) {
  json j;
  j["topology"] = TopologyToJson(plan.topology);
  j["policy"] = {{"scheme", PolicyName(plan.policy)},
                 {"local_copy", plan.policy.local_copy == LocalCopy::kFull ? "full" : "sharded"},
                 {"host_bytes_per_node", plan.policy.host_bytes_per_node},
                 {"copy_bytes_per_node", plan.policy.copy_bytes_per_node},
                 {"network_bytes_per_node", plan.policy.network_bytes_per_node}};
  j["reason"] = plan.reason;
  j["protection"] = plan.protection;
  j["notes"] = plan.notes;
  j["total_state_bytes"] = plan.total_state_bytes;
  j["total_held_bytes"] = plan.total_held_bytes;
  json pieces = json::array();
  for (const Piece& p : plan.pieces) {
    pieces.push_back({{"id", p.id},
                      {"key", p.key},
                      {"kind", PieceKindName(p.kind)},
                      {"group", p.group},
                      {"rank", p.rank},
                      {"node", p.node},
                      {"bytes", p.bytes},
                      {"segments", SegmentsToJson(p.segments)}});
  }
  j["pieces"] = std::move(pieces);
  json copies = json::array();
  for (const Copy& c : plan.copies) {
    copies.push_back({{"id", c.id},
                      {"piece", c.piece},
                      {"node", c.node},
                      {"kind", CopyKindName(c.kind)},
                      {"producer_rank", c.producer_rank}});
  }
  j["copies"] = std::move(copies);
  json stripes = json::array();
  for (const Stripe& s : plan.stripes) {
    json data = json::array();
    for (const StripeBlock& b : s.data) {
      data.push_back({{"piece", b.piece}, {"offset", b.offset}, {"length", b.length}});
    }
    stripes.push_back({{"id", s.id},
                       {"group", s.group},
                       {"code", s.xor_code ? "xor" : "rs"},
                       {"k", s.k},
                       {"f", s.f},
                       {"block_bytes", s.block_bytes},
                       {"data", std::move(data)},
                       {"parities", s.parities}});
  }
  j["stripes"] = std::move(stripes);
  json parities = json::array();
  for (const Parity& p : plan.parities) {
    parities.push_back({{"id", p.id},
                        {"stripe", p.stripe},
                        {"index", p.index},
                        {"node", p.node},
                        {"producer_rank", p.producer_rank},
                        {"bytes", p.bytes}});
  }
  j["parities"] = std::move(parities);
  json groups = json::array();
  for (const Group& g : plan.groups) {
    groups.push_back({{"id", g.id},
                      {"kind", g.kind == GroupKind::kShardingGroup ? "sharding" : "peer"},
                      {"name", g.name},
                      {"pp", g.pp},
                      {"tp", g.tp},
                      {"ranks", g.ranks},
                      {"nodes", g.nodes},
                      {"scheme", g.scheme},
                      {"protection", g.protection},
                      {"carries_data", g.carries_data},
                      {"note", g.note}});
  }
  j["groups"] = std::move(groups);
  json nodes = json::array();
  for (const NodePlan& n : plan.nodes) {
    nodes.push_back({{"node", n.node},
                     {"rack", n.rack},
                     {"ranks", n.ranks},
                     {"pieces", n.pieces},
                     {"copies", n.copies},
                     {"parities", n.parities},
                     {"piece_bytes", n.piece_bytes},
                     {"copy_bytes", n.copy_bytes},
                     {"parity_bytes", n.parity_bytes},
                     {"network_bytes", n.network_bytes},
                     {"total_bytes", n.total_bytes()}});
  }
  j["nodes"] = std::move(nodes);
  json ranks = json::array();
  for (const RankPlan& r : plan.ranks) {
    ranks.push_back({{"rank", r.rank},
                     {"node", r.node},
                     {"group", r.group},
                     {"pieces", r.pieces},
                     {"copies", r.copies},
                     {"parities", r.parities}});
  }
  j["ranks"] = std::move(ranks);
  return j;
}

namespace {

bool ParsePieceKind(const std::string& s, PieceKind* out) {
  if (s == "replicated") {
    *out = PieceKind::kReplicatedShard;
  } else if (s == "dp_shard") {
    *out = PieceKind::kDpShard;
  } else if (s == "private") {
    *out = PieceKind::kPrivate;
  } else {
    return false;
  }
  return true;
}

bool ParseCopyKind(const std::string& s, CopyKind* out) {
  if (s == "arc") {
    *out = CopyKind::kArc;
  } else if (s == "local_full") {
    *out = CopyKind::kLocalFull;
  } else if (s == "aor") {
    *out = CopyKind::kAor;
  } else if (s == "peer") {
    *out = CopyKind::kPeer;
  } else {
    return false;
  }
  return true;
}

std::string At(const char* array, size_t i) {
  return std::string(array) + "[" + std::to_string(i) + "]";
}

// Every field is checked by the reader (JsonReader): a missing field or one
// of the wrong type is InvalidArgument naming it; nothing throws.
Result<Plan> ReadPlan(const json& j) {
  JsonReader r("plan JSON");
  Plan p;
  const json& topology_json = r.Object(j, "topology");
  MEMENTO_RETURN_IF_ERROR(r.status());
  Result<Topology> topology = TopologyFromJson(topology_json);
  if (!topology.ok()) return InvalidArgumentError("plan JSON: " + topology.status().message());
  p.topology = std::move(*topology);
  const json& pol = r.Object(j, "policy");
  r.SetContext("policy");
  std::string scheme, local_copy;
  if (r.Get(pol, "scheme", &scheme)) {
    Result<Policy> parsed = ParsePolicy(scheme);
    if (!parsed.ok()) return InvalidArgumentError("plan JSON: " + parsed.status().message());
    p.policy = *parsed;
  }
  r.Get(pol, "local_copy", &local_copy);
  p.policy.local_copy = local_copy == "full" ? LocalCopy::kFull : LocalCopy::kSharded;
  r.Get(pol, "host_bytes_per_node", &p.policy.host_bytes_per_node);
  r.Get(pol, "copy_bytes_per_node", &p.policy.copy_bytes_per_node);
  r.GetOptional(pol, "network_bytes_per_node", &p.policy.network_bytes_per_node);
  r.SetContext("");
  r.Get(j, "reason", &p.reason);
  r.Get(j, "protection", &p.protection);
  r.Get(j, "notes", &p.notes);
  r.Get(j, "total_state_bytes", &p.total_state_bytes);
  r.Get(j, "total_held_bytes", &p.total_held_bytes);
  size_t i = 0;
  for (const json& e : r.Array(j, "pieces")) {
    r.SetContext(At("pieces", i++));
    Piece x;
    std::string kind;
    r.Get(e, "id", &x.id);
    r.Get(e, "key", &x.key);
    if (r.Get(e, "kind", &kind) && !ParsePieceKind(kind, &x.kind)) {
      r.Fail("unknown piece kind '" + kind + "'");
    }
    r.Get(e, "group", &x.group);
    r.Get(e, "rank", &x.rank);
    r.Get(e, "node", &x.node);
    r.Get(e, "bytes", &x.bytes);
    for (const json& sg : r.Array(e, "segments")) {
      Segment seg;
      r.Get(sg, "tensor", &seg.tensor);
      r.Get(sg, "offset", &seg.offset);
      r.Get(sg, "length", &seg.length);
      x.segments.push_back(std::move(seg));
    }
    p.pieces.push_back(std::move(x));
  }
  i = 0;
  for (const json& e : r.Array(j, "copies")) {
    r.SetContext(At("copies", i++));
    Copy c;
    std::string kind;
    r.Get(e, "id", &c.id);
    r.Get(e, "piece", &c.piece);
    r.Get(e, "node", &c.node);
    if (r.Get(e, "kind", &kind) && !ParseCopyKind(kind, &c.kind)) {
      r.Fail("unknown copy kind '" + kind + "'");
    }
    r.Get(e, "producer_rank", &c.producer_rank);
    p.copies.push_back(c);
  }
  i = 0;
  for (const json& e : r.Array(j, "stripes")) {
    r.SetContext(At("stripes", i++));
    Stripe s;
    std::string code;
    r.Get(e, "id", &s.id);
    r.Get(e, "group", &s.group);
    r.Get(e, "code", &code);
    s.xor_code = code == "xor";
    r.Get(e, "k", &s.k);
    r.Get(e, "f", &s.f);
    r.Get(e, "block_bytes", &s.block_bytes);
    for (const json& b : r.Array(e, "data")) {
      StripeBlock block;
      r.Get(b, "piece", &block.piece);
      r.Get(b, "offset", &block.offset);
      r.Get(b, "length", &block.length);
      s.data.push_back(block);
    }
    r.Get(e, "parities", &s.parities);
    p.stripes.push_back(std::move(s));
  }
  i = 0;
  for (const json& e : r.Array(j, "parities")) {
    r.SetContext(At("parities", i++));
    Parity x;
    r.Get(e, "id", &x.id);
    r.Get(e, "stripe", &x.stripe);
    r.Get(e, "index", &x.index);
    r.Get(e, "node", &x.node);
    r.Get(e, "producer_rank", &x.producer_rank);
    r.Get(e, "bytes", &x.bytes);
    p.parities.push_back(x);
  }
  i = 0;
  for (const json& e : r.Array(j, "groups")) {
    r.SetContext(At("groups", i++));
    Group g;
    std::string kind;
    r.Get(e, "id", &g.id);
    r.Get(e, "kind", &kind);
    g.kind = kind == "sharding" ? GroupKind::kShardingGroup : GroupKind::kPeerGroup;
    r.Get(e, "name", &g.name);
    r.Get(e, "pp", &g.pp);
    r.Get(e, "tp", &g.tp);
    r.Get(e, "ranks", &g.ranks);
    r.Get(e, "nodes", &g.nodes);
    r.Get(e, "scheme", &g.scheme);
    r.Get(e, "protection", &g.protection);
    r.Get(e, "carries_data", &g.carries_data);
    r.Get(e, "note", &g.note);
    p.groups.push_back(std::move(g));
  }
  i = 0;
  for (const json& e : r.Array(j, "nodes")) {
    r.SetContext(At("nodes", i++));
    NodePlan n;
    r.Get(e, "node", &n.node);
    r.Get(e, "rack", &n.rack);
    r.Get(e, "ranks", &n.ranks);
    r.Get(e, "pieces", &n.pieces);
    r.Get(e, "copies", &n.copies);
    r.Get(e, "parities", &n.parities);
    r.Get(e, "piece_bytes", &n.piece_bytes);
    r.Get(e, "copy_bytes", &n.copy_bytes);
    r.Get(e, "parity_bytes", &n.parity_bytes);
    r.Get(e, "network_bytes", &n.network_bytes);
    p.nodes.push_back(std::move(n));
  }
  i = 0;
  for (const json& e : r.Array(j, "ranks")) {
    r.SetContext(At("ranks", i++));
    RankPlan x;
    r.Get(e, "rank", &x.rank);
    r.Get(e, "node", &x.node);
    r.Get(e, "group", &x.group);
    r.Get(e, "pieces", &x.pieces);
    r.Get(e, "copies", &x.copies);
    r.Get(e, "parities", &x.parities);
    p.ranks.push_back(std::move(x));
  }
  MEMENTO_RETURN_IF_ERROR(r.status());
  return p;
}

// Ids must index their arrays, or consumers would read out of bounds.
Status CheckIds(const Plan& p) {
  auto bad = [](const std::string& what, size_t i) {
    return InvalidArgumentError("plan JSON: " + what + " " + std::to_string(i) +
                                " refers to a missing or misnumbered entry");
  };
  for (size_t i = 0; i < p.pieces.size(); ++i) {
    if (p.pieces[i].id != i || p.pieces[i].node < 0 ||
        p.pieces[i].node >= static_cast<int>(p.nodes.size()))
      return bad("piece", i);
  }
  for (size_t i = 0; i < p.copies.size(); ++i) {
    if (p.copies[i].id != i || p.copies[i].piece >= p.pieces.size() || p.copies[i].node < 0 ||
        p.copies[i].node >= static_cast<int>(p.nodes.size()))
      return bad("copy", i);
  }
  for (size_t i = 0; i < p.parities.size(); ++i) {
    if (p.parities[i].id != i || p.parities[i].stripe >= p.stripes.size() ||
        p.parities[i].node < 0 || p.parities[i].node >= static_cast<int>(p.nodes.size()))
      return bad("parity", i);
  }
  for (size_t i = 0; i < p.stripes.size(); ++i) {
    const Stripe& s = p.stripes[i];
    if (s.id != i || static_cast<int>(s.data.size()) != s.k ||
        static_cast<int>(s.parities.size()) != s.f)
      return bad("stripe", i);
    for (const StripeBlock& b : s.data) {
      if (b.piece >= p.pieces.size()) return bad("stripe", i);
    }
    for (uint32_t par : s.parities) {
      if (par >= p.parities.size()) return bad("stripe", i);
    }
  }
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    for (uint32_t x : p.nodes[i].pieces)
      if (x >= p.pieces.size()) return bad("node", i);
    for (uint32_t x : p.nodes[i].copies)
      if (x >= p.copies.size()) return bad("node", i);
    for (uint32_t x : p.nodes[i].parities)
      if (x >= p.parities.size()) return bad("node", i);
  }
  return Status::Ok();
}

}  // namespace

Result<Plan> PlanFromJson(const json& doc) {
  MEMENTO_ASSIGN_OR_RETURN(Plan p, ReadPlan(doc));
  MEMENTO_RETURN_IF_ERROR(CheckIds(p));
  return p;
}

json RecoveryToJson(const Plan& plan, const RecoveryPlan& rec) {
  json j;
  j["failed_nodes"] = rec.failed_nodes;
  j["recoverable"] = rec.recoverable;
  j["copy_bytes"] = rec.copy_bytes;
  j["decode_bytes"] = rec.decode_bytes;
  json recipes = json::array();
  for (const PieceRecipe& r : rec.recipes) {
    const Piece& piece = plan.pieces[r.piece];
    json steps = json::array();
    for (const RecoveryStep& s : r.steps) {
      if (s.kind == RecoveryStep::Kind::kCopy) {
        steps.push_back({{"op", "copy"},
                         {"from_node", s.node},
                         {"copy", s.copy == kNoId ? json(nullptr) : json(s.copy)},
                         {"length", s.length}});
      } else {
        json inputs = json::array();
        for (const BlockSource& b : s.inputs) {
          json in = {{"index", b.index}, {"length", b.length}};
          if (b.zero) {
            in["zero"] = true;
          } else {
            in["node"] = b.node;
          }
          if (b.piece != kNoId) {
            in["piece"] = b.piece;
            in["offset"] = b.offset;
          }
          if (b.parity != kNoId) in["parity"] = b.parity;
          inputs.push_back(std::move(in));
        }
        steps.push_back({{"op", "decode"},
                         {"stripe", s.stripe},
                         {"target", s.target},
                         {"offset", s.offset},
                         {"length", s.length},
                         {"inputs", std::move(inputs)}});
      }
    }
    json e = {{"piece", r.piece},
              {"key", piece.key},
              {"node", piece.node},
              {"bytes", piece.bytes},
              {"recoverable", r.recoverable},
              {"steps", std::move(steps)}};
    if (!r.recoverable) e["reason"] = r.reason;
    recipes.push_back(std::move(e));
  }
  j["recipes"] = std::move(recipes);
  return j;
}

}  // namespace memento::topo
