#include "topo/plan_json.h"

#include <string>
#include <utility>

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

PieceKind ParsePieceKind(const std::string& s) {
  if (s == "replicated") return PieceKind::kReplicatedShard;
  if (s == "dp_shard") return PieceKind::kDpShard;
  if (s == "private") return PieceKind::kPrivate;
  throw std::invalid_argument("unknown piece kind '" + s + "'");
}

CopyKind ParseCopyKind(const std::string& s) {
  if (s == "arc") return CopyKind::kArc;
  if (s == "local_full") return CopyKind::kLocalFull;
  if (s == "aor") return CopyKind::kAor;
  if (s == "peer") return CopyKind::kPeer;
  throw std::invalid_argument("unknown copy kind '" + s + "'");
}

Plan PlanFromJsonOrThrow(const json& j) {
  Plan p;
  Result<Topology> topology = TopologyFromJson(j.at("topology"));
  if (!topology.ok()) throw std::invalid_argument(topology.status().message());
  p.topology = std::move(*topology);
  const json& pol = j.at("policy");
  Result<Policy> parsed = ParsePolicy(pol.at("scheme").get<std::string>());
  if (!parsed.ok()) throw std::invalid_argument(parsed.status().message());
  p.policy = *parsed;
  p.policy.local_copy = pol.at("local_copy") == "full" ? LocalCopy::kFull : LocalCopy::kSharded;
  p.policy.host_bytes_per_node = pol.at("host_bytes_per_node");
  p.policy.copy_bytes_per_node = pol.at("copy_bytes_per_node");
  p.policy.network_bytes_per_node = pol.value("network_bytes_per_node", uint64_t{0});
  p.reason = j.at("reason");
  p.protection = j.at("protection");
  p.notes = j.at("notes").get<std::vector<std::string>>();
  p.total_state_bytes = j.at("total_state_bytes");
  p.total_held_bytes = j.at("total_held_bytes");
  for (const json& e : j.at("pieces")) {
    Piece x;
    x.id = e.at("id");
    x.key = e.at("key");
    x.kind = ParsePieceKind(e.at("kind"));
    x.group = e.at("group");
    x.rank = e.at("rank");
    x.node = e.at("node");
    x.bytes = e.at("bytes");
    for (const json& s : e.at("segments")) {
      x.segments.push_back(Segment{s.at("tensor"), s.at("offset"), s.at("length")});
    }
    p.pieces.push_back(std::move(x));
  }
  for (const json& e : j.at("copies")) {
    Copy c;
    c.id = e.at("id");
    c.piece = e.at("piece");
    c.node = e.at("node");
    c.kind = ParseCopyKind(e.at("kind"));
    c.producer_rank = e.at("producer_rank");
    p.copies.push_back(c);
  }
  for (const json& e : j.at("stripes")) {
    Stripe s;
    s.id = e.at("id");
    s.group = e.at("group");
    s.xor_code = e.at("code") == "xor";
    s.k = e.at("k");
    s.f = e.at("f");
    s.block_bytes = e.at("block_bytes");
    for (const json& b : e.at("data")) {
      s.data.push_back(StripeBlock{b.at("piece"), b.at("offset"), b.at("length")});
    }
    s.parities = e.at("parities").get<std::vector<uint32_t>>();
    p.stripes.push_back(std::move(s));
  }
  for (const json& e : j.at("parities")) {
    Parity x;
    x.id = e.at("id");
    x.stripe = e.at("stripe");
    x.index = e.at("index");
    x.node = e.at("node");
    x.producer_rank = e.at("producer_rank");
    x.bytes = e.at("bytes");
    p.parities.push_back(x);
  }
  for (const json& e : j.at("groups")) {
    Group g;
    g.id = e.at("id");
    g.kind = e.at("kind") == "sharding" ? GroupKind::kShardingGroup : GroupKind::kPeerGroup;
    g.name = e.at("name");
    g.pp = e.at("pp");
    g.tp = e.at("tp");
    g.ranks = e.at("ranks").get<std::vector<int>>();
    g.nodes = e.at("nodes").get<std::vector<int>>();
    g.scheme = e.at("scheme");
    g.protection = e.at("protection");
    g.carries_data = e.at("carries_data");
    g.note = e.at("note");
    p.groups.push_back(std::move(g));
  }
  for (const json& e : j.at("nodes")) {
    NodePlan n;
    n.node = e.at("node");
    n.rack = e.at("rack");
    n.ranks = e.at("ranks").get<std::vector<int>>();
    n.pieces = e.at("pieces").get<std::vector<uint32_t>>();
    n.copies = e.at("copies").get<std::vector<uint32_t>>();
    n.parities = e.at("parities").get<std::vector<uint32_t>>();
    n.piece_bytes = e.at("piece_bytes");
    n.copy_bytes = e.at("copy_bytes");
    n.parity_bytes = e.at("parity_bytes");
    n.network_bytes = e.at("network_bytes");
    p.nodes.push_back(std::move(n));
  }
  for (const json& e : j.at("ranks")) {
    RankPlan r;
    r.rank = e.at("rank");
    r.node = e.at("node");
    r.group = e.at("group");
    r.pieces = e.at("pieces").get<std::vector<uint32_t>>();
    r.copies = e.at("copies").get<std::vector<uint32_t>>();
    r.parities = e.at("parities").get<std::vector<uint32_t>>();
    p.ranks.push_back(std::move(r));
  }
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
  try {
    Plan p = PlanFromJsonOrThrow(doc);
    MEMENTO_RETURN_IF_ERROR(CheckIds(p));
    return p;
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("plan JSON: ") + e.what());
  }
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
