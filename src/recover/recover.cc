// Recovery planner (REFT 4.3 / 4.4 "distributed in-memory loading"): which
// committed version memory can restore, and where each byte of every rank that
// lost its T0 slot comes from. docs/recovery.md.
#include "recover/recover.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/checksum.h"
#include "common/human.h"
#include "fmt/format.h"
#include "recover/recipe.h"
#include "topo/plan_json.h"

namespace memento::recover {
namespace {

std::string JoinInts(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// What the live nodes hold of one version, as per-id flags.
struct StepView {
  int64_t step = -1;
  std::vector<bool> has_version;  // node -> its inventory lists the step
  std::vector<bool> rank_ok;      // rank -> T0 slot of step listed intact on its node
  std::vector<bool> copy_ok;      // Copy id -> listed by its node (under this plan)
  std::vector<bool> parity_ok;    // Parity id -> listed by its node (under this plan)
  std::vector<int> lost_nodes;    // not live, or without any holding of step
};

StepView ViewOf(const topo::Plan& plan, const std::vector<const NodeInventory*>& by_node,
                uint64_t plan_hash, int64_t step) {
  const int num_nodes = static_cast<int>(plan.nodes.size());
  StepView v;
  v.step = step;
  v.has_version.assign(num_nodes, false);
  v.rank_ok.assign(plan.ranks.size(), false);
  v.copy_ok.assign(plan.copies.size(), false);
  v.parity_ok.assign(plan.parities.size(), false);
  for (int n = 0; n < num_nodes; ++n) {
    const NodeInventory* inv = by_node[n];
    const VersionHolding* h = nullptr;
    if (inv != nullptr) {
      for (const VersionHolding& vh : inv->versions) {
        if (vh.step == step) h = &vh;
      }
    }
    if (h == nullptr) {
      v.lost_nodes.push_back(n);
      continue;
    }
    v.has_version[n] = true;
    // Only what the node listed, and only where it belongs by the plan: a
    // rank of another node, or an entry the plan puts elsewhere, is ignored.
    for (int r : h->ranks) {
      if (r >= 0 && r < static_cast<int>(plan.ranks.size()) && plan.topology.rank_node[r] == n) {
        v.rank_ok[r] = true;
      }
    }
    // Redundancy made under another plan addresses other bytes: unusable.
    if (inv->plan_hash != plan_hash) continue;
    for (uint32_t c : h->copies) {
      if (c < plan.copies.size() && plan.copies[c].node == n) v.copy_ok[c] = true;
    }
    for (uint32_t p : h->parities) {
      if (p < plan.parities.size() && plan.parities[p].node == n) v.parity_ok[p] = true;
    }
  }
  return v;
}

// Per-plan indexes the planner needs for every step.
struct PlanIndex {
  std::vector<std::vector<uint32_t>> copies_of;  // piece -> Copy ids
  struct Member {
    uint32_t stripe;
    int index;
  };
  std::vector<std::vector<Member>> blocks_of;       // piece -> its data blocks in stripes
  std::vector<std::vector<uint32_t>> group_pieces;  // sharding group -> replicated pieces
  std::vector<std::vector<uint32_t>> rank_pieces;   // rank -> its dp_shard / private pieces

  explicit PlanIndex(const topo::Plan& plan) {
    copies_of.resize(plan.pieces.size());
    blocks_of.resize(plan.pieces.size());
    group_pieces.resize(plan.groups.size());
    rank_pieces.resize(plan.ranks.size());
    for (const topo::Copy& c : plan.copies) copies_of[c.piece].push_back(c.id);
    for (const topo::Stripe& s : plan.stripes) {
      for (int i = 0; i < s.k; ++i) blocks_of[s.data[i].piece].push_back(Member{s.id, i});
    }
    for (const topo::Piece& p : plan.pieces) {
      if (p.kind == topo::PieceKind::kReplicatedShard) {
        group_pieces[p.group].push_back(p.id);
      } else {
        rank_pieces[p.rank].push_back(p.id);
      }
    }
  }
};

// The pieces whose bytes make up `rank`'s whole state, in plan order.
std::vector<uint32_t> PiecesOfRank(const topo::Plan& plan, const PlanIndex& index, int rank) {
  std::vector<uint32_t> out = index.group_pieces[plan.ranks[rank].group];
  for (uint32_t p : index.rank_pieces[rank]) out.push_back(p);
  std::sort(out.begin(), out.end());
  return out;
}

// Finds sources for pieces at one step. Never names a byte range that a live
// node did not list: a piece is read from its primary only when Piece::rank's
// T0 slot is listed intact there, a copy or parity only when listed.
class SourcePlanner {
 public:
  SourcePlanner(const topo::Plan& plan, const PlanIndex& index, const StepView& view)
      : plan_(plan), index_(index), view_(view) {}

  bool PieceReadable(uint32_t piece) const { return view_.rank_ok[plan_.pieces[piece].rank]; }

  // A whole-piece source: the primary, else a listed copy (one on
  // `prefer_node` first: a local read). False when none.
  bool WholeSource(uint32_t piece, int prefer_node, SourceRange* out) const {
    const topo::Piece& p = plan_.pieces[piece];
    if (PieceReadable(piece)) {
      *out = SourceRange{p.node, ByteSource{SourceKind::kPiece, piece}, 0, p.bytes};
      return true;
    }
    const topo::Copy* best = nullptr;
    for (uint32_t c : index_.copies_of[piece]) {
      if (!view_.copy_ok[c]) continue;
      if (best == nullptr || (plan_.copies[c].node == prefer_node && best->node != prefer_node)) {
        best = &plan_.copies[c];
      }
    }
    if (best == nullptr) return false;
    *out = SourceRange{best->node, ByteSource{SourceKind::kCopy, best->id}, 0, p.bytes};
    return true;
  }

  // The part that rebuilds `piece` for a rank on `target_node`, or false with
  // the reason.
  bool Part(uint32_t piece, int target_node, PiecePart* part, std::string* why) const {
    const topo::Piece& p = plan_.pieces[piece];
    part->piece = piece;
    part->key = p.key;
    part->bytes = p.bytes;
    if (WholeSource(piece, target_node, &part->read)) {
      part->op = PiecePart::Op::kRead;
      return true;
    }
    part->op = PiecePart::Op::kDecode;
    if (index_.blocks_of[piece].empty()) {
      *why = "no listed copy, and no parity covers it";
      return false;
    }
    for (const PlanIndex::Member& m : index_.blocks_of[piece]) {
      const topo::Stripe& s = plan_.stripes[m.stripe];
      const topo::StripeBlock& target = s.data[m.index];
      if (target.length == 0) continue;
      DecodeBlock block;
      block.stripe = s.id;
      block.target = m.index;
      block.offset = target.offset;
      block.length = target.length;
      for (int i = 0; i < s.k + s.f && static_cast<int>(block.inputs.size()) < s.k; ++i) {
        if (i == m.index) continue;
        DecodeInput in;
        in.index = i;
        if (i < s.k) {
          const topo::StripeBlock& b = s.data[i];
          if (b.length == 0) {
            in.zero = true;
          } else {
            SourceRange whole;
            if (!WholeSource(b.piece, target_node, &whole)) continue;
            in.range = whole;
            in.range.offset = b.offset;
            in.range.length = b.length;
          }
        } else {
          const uint32_t par = s.parities[i - s.k];
          if (!view_.parity_ok[par]) continue;
          in.range = SourceRange{plan_.parities[par].node, ByteSource{SourceKind::kParity, par}, 0,
                                 s.block_bytes};
        }
        block.inputs.push_back(in);
      }
      if (static_cast<int>(block.inputs.size()) < s.k) {
        *why = fmt::format("stripe {} keeps only {} of the {} blocks needed", s.id,
                           block.inputs.size(), s.k);
        return false;
      }
      part->blocks.push_back(std::move(block));
    }
    return true;
  }

 private:
  const topo::Plan& plan_;
  const PlanIndex& index_;
  const StepView& view_;
};

struct Cost {
  uint64_t read_bytes = 0;     // every byte read through a ByteReader
  uint64_t network_bytes = 0;  // of those, from another node than the rebuilding one
  uint64_t decode_bytes = 0;   // bytes rebuilt by decoding
  uint64_t reused_bytes = 0;   // decode inputs taken from pieces fetched whole (not read)
};

// (node, piece) pairs some recipe of `recipes` reads whole into a slot on
// that node: the executor takes decode inputs that are these pieces (or
// copies of them) from the slot instead of reading them again
// (ExecuteOptions::reuse_fetched_inputs).
std::set<std::pair<int, uint32_t>> WholeReads(const std::vector<Recipe>& recipes) {
  std::set<std::pair<int, uint32_t>> out;
  for (const Recipe& r : recipes) {
    for (const PiecePart& p : r.parts) {
      if (p.op == PiecePart::Op::kRead) out.insert({r.node, p.piece});
    }
  }
  return out;
}

// `fetched`: (node, piece) already counted; the executor fetches a piece
// once per node however many of its ranks need it. `whole`: WholeReads.
void AddCost(const topo::Plan& plan, const Recipe& r,
             const std::set<std::pair<int, uint32_t>>& whole,
             std::set<std::pair<int, uint32_t>>* fetched, Cost* c) {
  auto add = [&](const SourceRange& s) {
    c->read_bytes += s.length;
    if (s.node != r.node) c->network_bytes += s.length;
  };
  auto piece_of = [&](const SourceRange& s) -> int64_t {
    if (s.source.kind == SourceKind::kPiece) return s.source.id;
    if (s.source.kind == SourceKind::kCopy && s.source.id < plan.copies.size()) {
      return plan.copies[s.source.id].piece;
    }
    return -1;
  };
  for (const PiecePart& p : r.parts) {
    if (!fetched->insert({r.node, p.piece}).second) continue;
    if (p.op == PiecePart::Op::kRead) {
      add(p.read);
      continue;
    }
    for (const DecodeBlock& b : p.blocks) {
      c->decode_bytes += b.length;
      for (const DecodeInput& in : b.inputs) {
        if (in.zero) continue;
        const int64_t piece = piece_of(in.range);
        if (piece >= 0 && whole.count({r.node, static_cast<uint32_t>(piece)})) {
          c->reused_bytes += in.range.length;
        } else {
          add(in.range);
        }
      }
    }
  }
}

// Outcome of trying one step.
struct Attempt {
  bool ok = false;
  std::vector<Recipe> recipes;
  std::vector<int> rebuild;                // ranks to rebuild
  std::vector<std::string> unrecoverable;  // "sg0/r1 (node 1)" ...
  std::vector<std::string> details;        // why, per unrecoverable piece
};

Attempt TryStep(const topo::Plan& plan, const PlanIndex& index, const StepView& view) {
  Attempt a;
  SourcePlanner planner(plan, index, view);
  std::set<uint32_t> failed_pieces;
  for (const topo::RankPlan& rp : plan.ranks) {
    if (view.rank_ok[rp.rank]) continue;
    a.rebuild.push_back(rp.rank);
    Recipe recipe;
    recipe.step = view.step;
    recipe.rank = rp.rank;
    recipe.node = rp.node;
    for (uint32_t piece : PiecesOfRank(plan, index, rp.rank)) {
      if (plan.pieces[piece].bytes == 0) continue;
      PiecePart part;
      std::string why;
      if (planner.Part(piece, rp.node, &part, &why)) {
        recipe.parts.push_back(std::move(part));
      } else if (failed_pieces.insert(piece).second) {
        const topo::Piece& p = plan.pieces[piece];
        a.unrecoverable.push_back(fmt::format("{} (node {})", p.key, p.node));
        a.details.push_back(fmt::format("{} ({}, {}): {}", p.key, topo::PieceKindName(p.kind),
                                        HumanBytes(p.bytes), why));
      }
    }
    a.recipes.push_back(std::move(recipe));
  }
  a.ok = failed_pieces.empty();
  if (!a.ok) a.recipes.clear();
  // Grouped by node (then rank), as the executor runs one node's at a time.
  std::stable_sort(a.recipes.begin(), a.recipes.end(),
                   [](const Recipe& x, const Recipe& y) { return x.node < y.node; });
  return a;
}

std::string Join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

// ---- JSON helpers -----------------------------------------------------------

nlohmann::json RangeToJson(const SourceRange& r) {
  return {{"node", r.node},
          {"kind", SourceKindName(r.source.kind)},
          {"id", r.source.id},
          {"offset", r.offset},
          {"length", r.length}};
}

Result<SourceKind> KindFromName(const std::string& s) {
  if (s == "piece") return SourceKind::kPiece;
  if (s == "copy") return SourceKind::kCopy;
  if (s == "parity") return SourceKind::kParity;
  return InvalidArgumentError("recipe: unknown source kind '" + s +
                              "' (expected piece, copy or parity)");
}

Result<SourceRange> RangeFromJson(const nlohmann::json& j) {
  SourceRange r;
  r.node = j.at("node").get<int>();
  MEMENTO_ASSIGN_OR_RETURN(r.source.kind, KindFromName(j.at("kind").get<std::string>()));
  r.source.id = j.at("id").get<uint32_t>();
  r.offset = j.at("offset").get<uint64_t>();
  r.length = j.at("length").get<uint64_t>();
  return r;
}

}  // namespace

uint64_t PlanHash(const topo::Plan& plan) {
  const std::string text = topo::PlanToJson(plan).dump();
  return Checksum(text.data(), text.size());
}

nlohmann::json RecipeToJson(const Recipe& recipe) {
  nlohmann::json parts = nlohmann::json::array();
  for (const PiecePart& p : recipe.parts) {
    nlohmann::json jp = {{"piece", p.piece}, {"key", p.key}, {"bytes", p.bytes}};
    if (p.op == PiecePart::Op::kRead) {
      jp["op"] = "read";
      jp["read"] = RangeToJson(p.read);
    } else {
      jp["op"] = "decode";
      nlohmann::json blocks = nlohmann::json::array();
      for (const DecodeBlock& b : p.blocks) {
        nlohmann::json inputs = nlohmann::json::array();
        for (const DecodeInput& in : b.inputs) {
          if (in.zero) {
            inputs.push_back({{"index", in.index}, {"zero", true}});
          } else {
            nlohmann::json ji = RangeToJson(in.range);
            ji["index"] = in.index;
            inputs.push_back(std::move(ji));
          }
        }
        blocks.push_back({{"stripe", b.stripe},
                          {"target", b.target},
                          {"offset", b.offset},
                          {"length", b.length},
                          {"inputs", std::move(inputs)}});
      }
      jp["blocks"] = std::move(blocks);
    }
    parts.push_back(std::move(jp));
  }
  return {{"step", recipe.step},
          {"rank", recipe.rank},
          {"node", recipe.node},
          {"parts", std::move(parts)}};
}

Result<Recipe> RecipeFromJson(const nlohmann::json& j) {
  Recipe r;
  try {
    r.step = j.at("step").get<int64_t>();
    r.rank = j.at("rank").get<int>();
    r.node = j.at("node").get<int>();
    for (const auto& jp : j.at("parts")) {
      PiecePart p;
      p.piece = jp.at("piece").get<uint32_t>();
      p.key = jp.at("key").get<std::string>();
      p.bytes = jp.at("bytes").get<uint64_t>();
      const std::string op = jp.at("op").get<std::string>();
      if (op == "read") {
        p.op = PiecePart::Op::kRead;
        MEMENTO_ASSIGN_OR_RETURN(p.read, RangeFromJson(jp.at("read")));
      } else if (op == "decode") {
        p.op = PiecePart::Op::kDecode;
        for (const auto& jb : jp.at("blocks")) {
          DecodeBlock b;
          b.stripe = jb.at("stripe").get<uint32_t>();
          b.target = jb.at("target").get<int>();
          b.offset = jb.at("offset").get<uint64_t>();
          b.length = jb.at("length").get<uint64_t>();
          for (const auto& ji : jb.at("inputs")) {
            DecodeInput in;
            in.index = ji.at("index").get<int>();
            in.zero = ji.value("zero", false);
            if (!in.zero) {
              MEMENTO_ASSIGN_OR_RETURN(in.range, RangeFromJson(ji));
            }
            b.inputs.push_back(in);
          }
          p.blocks.push_back(std::move(b));
        }
      } else {
        return InvalidArgumentError("recipe part '" + p.key + "': unknown op '" + op +
                                    "' (expected read or decode)");
      }
      r.parts.push_back(std::move(p));
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("malformed recovery recipe: ") + e.what());
  }
  return r;
}

Result<Decision> Decide(const topo::Plan& plan, const std::vector<NodeInventory>& live,
                        int64_t committed) {
  return Decide(plan, PlanHash(plan), live, committed);
}

Result<Decision> Decide(const topo::Plan& plan, uint64_t plan_hash,
                        const std::vector<NodeInventory>& live, int64_t committed) {
  const int num_nodes = static_cast<int>(plan.nodes.size());
  if (plan.ranks.size() != plan.topology.rank_node.size()) {
    return InvalidArgumentError(fmt::format("plan has {} ranks but its topology maps {}",
                                            plan.ranks.size(), plan.topology.rank_node.size()));
  }
  std::vector<const NodeInventory*> by_node(num_nodes, nullptr);
  std::set<int64_t> steps;
  for (const NodeInventory& inv : live) {
    if (inv.node < 0 || inv.node >= num_nodes) {
      return InvalidArgumentError(
          fmt::format("inventory of node {}: the plan has nodes 0..{}", inv.node, num_nodes - 1));
    }
    if (by_node[inv.node] != nullptr) {
      return InvalidArgumentError(fmt::format("two inventories for node {}", inv.node));
    }
    by_node[inv.node] = &inv;
    for (const VersionHolding& v : inv.versions) {
      if (v.step >= 0 && v.step <= committed) steps.insert(v.step);
    }
  }
  std::vector<int> stale;  // live nodes whose redundancy was made under another plan
  for (const NodeInventory* inv : by_node) {
    if (inv == nullptr || inv->plan_hash == plan_hash) continue;
    bool lists_t1 = false;
    for (const VersionHolding& v : inv->versions) {
      lists_t1 |= !v.copies.empty() || !v.parities.empty();
    }
    if (lists_t1) stale.push_back(inv->node);
  }
  const std::string stale_note =
      stale.empty() ? ""
                    : fmt::format("; redundancy of node(s) {} ignored (made under another plan)",
                                  JoinInts(stale));

  const PlanIndex index(plan);
  Decision d;
  std::vector<std::string> skipped;  // newer steps and why not
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const StepView view = ViewOf(plan, by_node, plan_hash, *it);
    Attempt a = TryStep(plan, index, view);
    if (!a.ok) {
      if (d.lost_nodes.empty() && skipped.empty()) d.lost_nodes = view.lost_nodes;
      skipped.push_back(fmt::format("step {}: pieces {} (lost nodes [{}]; {})", *it,
                                    Join(a.unrecoverable, ", "), JoinInts(view.lost_nodes),
                                    Join(a.details, "; ")));
      continue;
    }
    d.from_memory = true;
    d.step = *it;
    d.lost_nodes = view.lost_nodes;
    Cost cost;
    std::set<std::pair<int, uint32_t>> fetched;
    std::map<int, std::vector<int>> by_target;
    const std::set<std::pair<int, uint32_t>> whole = WholeReads(a.recipes);
    for (Recipe& r : a.recipes) {
      AddCost(plan, r, whole, &fetched, &cost);
      by_target[r.node].push_back(r.rank);
      RankAssembly ra;
      ra.rank = r.rank;
      ra.node = r.node;
      ra.recipe = RecipeToJson(r);
      d.assemblies.push_back(std::move(ra));
    }
    std::string what;
    if (a.rebuild.empty()) {
      what = "every rank's T0 slot is intact: nothing to rebuild";
    } else {
      std::vector<std::string> where;
      for (const auto& [node, ranks] : by_target) {
        where.push_back(fmt::format("rank(s) {} on node {}", JoinInts(ranks), node));
      }
      what = fmt::format("rebuild {}; read {} ({} from other nodes), decode {}", Join(where, ", "),
                         HumanBytes(cost.read_bytes), HumanBytes(cost.network_bytes),
                         HumanBytes(cost.decode_bytes));
      // Optimizer shards that come back from a host-recomputed replica
      // (REFT AOR; docs/reft.md section 5): named, as the report's source.
      std::vector<std::string> aor, pushed;
      for (const Recipe& r : a.recipes) {
        for (const PiecePart& p : r.parts) {
          if (p.op == PiecePart::Op::kRead && p.read.source.kind == SourceKind::kCopy &&
              plan.copies[p.read.source.id].kind == topo::CopyKind::kAor) {
            bool recomputed = false;
            const NodeInventory* inv = by_node[p.read.node];
            for (const VersionHolding& v :
                 inv != nullptr ? inv->versions : std::vector<VersionHolding>{}) {
              if (v.step != d.step) continue;
              recomputed = std::find(v.aor_copies.begin(), v.aor_copies.end(), p.read.source.id) !=
                           v.aor_copies.end();
            }
            if (recomputed) {
              aor.push_back(fmt::format("{} from the aor replica on node {}", p.key, p.read.node));
            } else {
              pushed.push_back(fmt::format("{} on node {}", p.key, p.read.node));
            }
          }
        }
      }
      if (!aor.empty()) what += "; source aor replica: " + Join(aor, ", ");
      if (!pushed.empty()) {
        what += "; aor copies received over the network (no confirmed host replica): " +
                Join(pushed, ", ");
      }
      if (cost.reused_bytes > 0) {
        what += fmt::format(" (of its inputs, {} taken from pieces read whole, not read again)",
                            HumanBytes(cost.reused_bytes));
      }
    }
    d.reason = fmt::format("step {} (committed {}): lost nodes [{}]; {}", d.step, committed,
                           JoinInts(d.lost_nodes), what);
    if (!skipped.empty()) d.reason += "; newer " + Join(skipped, "; ");
    d.reason += stale_note;
    return d;
  }
  // Nothing restorable from memory.
  if (steps.empty() && committed >= 0) {
    // No live node holds any version: name what the committed one lacks.
    const StepView view = ViewOf(plan, by_node, plan_hash, committed);
    const Attempt a = TryStep(plan, index, view);
    d.lost_nodes = view.lost_nodes;
    d.reason = fmt::format(
        "not recoverable from memory: no live node holds a version <= committed step {}; "
        "step {}: pieces {} (lost nodes [{}])",
        committed, committed, Join(a.unrecoverable, ", "), JoinInts(view.lost_nodes));
  } else if (steps.empty()) {
    for (int n = 0; n < num_nodes; ++n) {
      if (by_node[n] == nullptr) d.lost_nodes.push_back(n);
    }
    d.reason = fmt::format(
        "not recoverable from memory: no live node holds a version <= committed step {} "
        "(lost nodes [{}])",
        committed, JoinInts(d.lost_nodes));
  } else {
    d.reason = "not recoverable from memory: " + Join(skipped, "; ");
  }
  d.reason += stale_note;
  return d;
}

Result<topo::RecoveryPlan> PlanFailure(const topo::Plan& plan,
                                       const std::vector<int>& failed_nodes) {
  const int num_nodes = static_cast<int>(plan.nodes.size());
  std::vector<bool> failed(num_nodes, false);
  for (int n : failed_nodes) {
    if (n < 0 || n >= num_nodes) {
      return InvalidArgumentError(fmt::format("failed node {} out of range [0, {})", n, num_nodes));
    }
    failed[n] = true;
  }
  topo::RecoveryPlan out;
  for (int n = 0; n < num_nodes; ++n) {
    if (failed[n]) out.failed_nodes.push_back(n);
  }
  // The inventories recovery would get: every surviving node lists all its
  // ranks, copies and parities of one version under this plan.
  constexpr uint64_t kThisPlan = 1;
  constexpr int64_t kStep = 0;
  std::vector<NodeInventory> live;
  for (const topo::NodePlan& np : plan.nodes) {
    if (failed[np.node]) continue;
    NodeInventory inv;
    inv.node = np.node;
    inv.plan_hash = kThisPlan;
    inv.versions.push_back(VersionHolding{kStep, np.ranks, np.copies, np.parities, {}});
    live.push_back(std::move(inv));
  }
  std::vector<const NodeInventory*> by_node(num_nodes, nullptr);
  for (const NodeInventory& inv : live) by_node[inv.node] = &inv;
  const PlanIndex index(plan);
  const StepView view = ViewOf(plan, by_node, kThisPlan, kStep);
  const SourcePlanner planner(plan, index, view);

  out.recoverable = true;
  for (int n : out.failed_nodes) {
    for (uint32_t pid : plan.nodes[n].pieces) {
      const topo::Piece& piece = plan.pieces[pid];
      topo::PieceRecipe recipe;
      recipe.piece = pid;
      recipe.recoverable = true;
      PiecePart part;
      std::string why;
      if (piece.bytes == 0) {
        // Nothing to rebuild.
      } else if (!planner.Part(pid, piece.node, &part, &why)) {
        recipe.recoverable = false;
        recipe.reason = fmt::format("not recoverable from memory: {} ({}, {}): {}", piece.key,
                                    topo::PieceKindName(piece.kind), HumanBytes(piece.bytes), why);
      } else if (part.op == PiecePart::Op::kRead) {
        topo::RecoveryStep step;
        step.kind = topo::RecoveryStep::Kind::kCopy;
        step.node = part.read.node;
        step.copy = part.read.source.kind == SourceKind::kCopy ? part.read.source.id : topo::kNoId;
        step.length = piece.bytes;
        recipe.steps.push_back(step);
        out.copy_bytes += piece.bytes;
      } else {
        for (const DecodeBlock& b : part.blocks) {
          const topo::Stripe& s = plan.stripes[b.stripe];
          topo::RecoveryStep step;
          step.kind = topo::RecoveryStep::Kind::kDecode;
          step.stripe = b.stripe;
          step.target = b.target;
          step.offset = b.offset;
          step.length = b.length;
          for (const DecodeInput& in : b.inputs) {
            topo::BlockSource src;
            src.index = in.index;
            src.zero = in.zero;
            if (in.index < s.k) {
              const topo::StripeBlock& blk = s.data[in.index];
              src.piece = blk.piece;
              src.offset = blk.offset;
              src.length = blk.length;
              if (!in.zero) src.node = in.range.node;
            } else {
              const topo::Parity& par = plan.parities[in.range.source.id];
              src.parity = par.id;
              src.node = par.node;
              src.length = par.bytes;
            }
            step.inputs.push_back(src);
          }
          out.decode_bytes += step.length;
          recipe.steps.push_back(std::move(step));
        }
      }
      out.recoverable &= recipe.recoverable;
      out.recipes.push_back(std::move(recipe));
    }
  }
  return out;
}

nlohmann::json DecisionToJson(const Decision& d) {
  nlohmann::json assemblies = nlohmann::json::array();
  for (const RankAssembly& a : d.assemblies) {
    assemblies.push_back({{"rank", a.rank}, {"node", a.node}, {"recipe", a.recipe}});
  }
  return {{"from_memory", d.from_memory},
          {"step", d.step},
          {"lost_nodes", d.lost_nodes},
          {"assemblies", std::move(assemblies)},
          {"reason", d.reason}};
}

Result<Decision> DecisionFromJson(const nlohmann::json& j) {
  Decision d;
  try {
    d.from_memory = j.at("from_memory").get<bool>();
    d.step = j.at("step").get<int64_t>();
    d.lost_nodes = j.at("lost_nodes").get<std::vector<int>>();
    d.reason = j.at("reason").get<std::string>();
    for (const auto& ja : j.at("assemblies")) {
      RankAssembly a;
      a.rank = ja.at("rank").get<int>();
      a.node = ja.at("node").get<int>();
      a.recipe = ja.at("recipe");
      d.assemblies.push_back(std::move(a));
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("malformed recovery decision: ") + e.what());
  }
  return d;
}

nlohmann::json AssemblyStatsToJson(const AssemblyStats& s) {
  return {{"ranks", s.ranks},           {"bytes", s.bytes},       {"read_bytes", s.read_bytes},
          {"transfer_s", s.transfer_s}, {"decode_s", s.decode_s}, {"write_s", s.write_s},
          {"total_s", s.total_s}};
}

}  // namespace memento::recover
