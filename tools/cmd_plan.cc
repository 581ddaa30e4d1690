// `memento plan layout`: the placement plan for a topology and policy, and
// what a failure set would need (docs/planner.md).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/byte_flag.h"
#include "common/human.h"
#include "model/auto_plan.h"
#include "model/layout_svg.h"
#include "recover/recover.h"
#include "tools/command.h"
#include "tools/json_output.h"
#include "tools/plan_reliability.h"
#include "topo/plan.h"
#include "topo/plan_json.h"

namespace memento::tools {
namespace {

struct LayoutOptions {
  int dp = 8, tp = 4, pp = 4, zero = 1, ranks_per_node = 4, racks = 0;
  std::string policy = "xor";
  std::string local_copy = "sharded";
  std::string fail;
  uint64_t param_bytes = uint64_t{512} << 20;  // replicated bytes per rank
  int64_t optimizer_bytes = -1;                // per rank; -1: 6 x params / dp under ZeRO-1
  uint64_t private_bytes = 4096;
  uint64_t host_budget = 0;
  uint64_t copy_budget = 0;
  uint64_t network_budget = 0;
  // auto: the reliability model's inputs (per node-day / rack-day).
  double hw_rate = 1e-4, sw_rate = 1e-5, rack_rate = 0, shape = 1;
  std::vector<std::string> bench_files;
  bool json = false;
  bool full_plan = false;
  std::string svg;  // write the placement picture here
};

Result<std::vector<int>> ParseNodeList(const std::string& text, int num_nodes) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v >= num_nodes) {
      return InvalidArgumentError("--fail: '" + item + "' is not a node id in [0, " +
                                  std::to_string(num_nodes) + ")");
    }
    out.push_back(static_cast<int>(v));
  }
  return out;
}

Status RunLayout(const LayoutOptions& o) {
  MEMENTO_ASSIGN_OR_RETURN(topo::Policy policy, topo::ParsePolicy(o.policy));
  if (o.local_copy == "full") {
    policy.local_copy = topo::LocalCopy::kFull;
  } else if (o.local_copy != "sharded") {
    return InvalidArgumentError("--local-copy '" + o.local_copy + "': expected full or sharded");
  }
  policy.host_bytes_per_node = o.host_budget;
  policy.copy_bytes_per_node = o.copy_budget;
  policy.network_bytes_per_node = o.network_budget;
  model::AutoInputs auto_in;
  if (policy.scheme == topo::Scheme::kAuto) {
    for (auto [name, v] : {std::pair<const char*, double>{"--hw-rate", o.hw_rate},
                           {"--sw-rate", o.sw_rate},
                           {"--rack-rate", o.rack_rate}}) {
      if (!(v >= 0) || std::isinf(v)) {
        return InvalidArgumentError(std::string(name) + " " + std::to_string(v) +
                                    ": expected a rate >= 0");
      }
    }
    if (!(o.shape > 0) || std::isinf(o.shape)) {
      return InvalidArgumentError("--shape " + std::to_string(o.shape) + ": expected > 0");
    }
    auto_in.rates.hardware = {o.hw_rate, o.shape};
    auto_in.rates.software = {o.sw_rate, o.shape};
    auto_in.rates.rack = {o.rack_rate, o.shape};
    for (const auto& path : o.bench_files) {
      MEMENTO_RETURN_IF_ERROR(ApplyBenchFile(path, auto_in.figures));
    }
  } else if (o.host_budget || o.copy_budget || o.network_budget || !o.bench_files.empty() ||
             o.hw_rate != 1e-4 || o.sw_rate != 1e-5 || o.rack_rate != 0 || o.shape != 1) {
    return InvalidArgumentError(
        "--host-budget, --copy-budget, --network-budget, --bench and the failure rates are "
        "inputs of --policy auto only (got --policy " +
        o.policy + ")");
  }
  MEMENTO_ASSIGN_OR_RETURN(topo::Topology topology,
                           topo::Topology::Uniform(o.dp, o.tp, o.pp, o.zero, o.ranks_per_node));
  const int num_nodes = topology.num_nodes();
  if (o.racks > 0) {
    // Consecutive nodes share a rack: nodes_per_rack = ceil(nodes / racks).
    const int per = (num_nodes + o.racks - 1) / o.racks;
    topology.node_rack.resize(num_nodes);
    for (int n = 0; n < num_nodes; ++n) topology.node_rack[n] = "rack" + std::to_string(n / per);
  }
  // A synthetic inventory: bf16 parameters, fp32 Adam state (master, m, v:
  // 12 bytes per parameter, sharded over DP under ZeRO-1), and an RNG blob.
  const uint64_t opt =
      o.optimizer_bytes >= 0 ? static_cast<uint64_t>(o.optimizer_bytes) : o.param_bytes * 6 / o.dp;
  topo::Inventory inv(topology.num_ranks());
  for (auto& tensors : inv) {
    TensorMeta p;
    p.name = "params";
    p.dtype = DType::kBFloat16;
    p.shape = {static_cast<int64_t>(o.param_bytes / 2)};
    p.state_class = StateClass::kReplicated;
    tensors.push_back(p);
    if (o.zero != 0) {
      TensorMeta s;
      s.name = "optimizer";
      s.dtype = DType::kFloat32;
      s.shape = {static_cast<int64_t>(opt / 4)};
      s.state_class = StateClass::kDpSharded;
      tensors.push_back(s);
    }
    TensorMeta r;
    r.name = "rng";
    r.dtype = DType::kUInt8;
    r.shape = {static_cast<int64_t>(o.private_bytes)};
    r.state_class = StateClass::kPrivate;
    tensors.push_back(r);
  }
  model::Recommendation ranking;
  MEMENTO_ASSIGN_OR_RETURN(topo::Plan plan,
                           model::MakeJobPlan(topology, inv, policy, auto_in, &ranking));
  std::vector<int> failed;
  const bool has_fail = !o.fail.empty();
  if (has_fail) {
    MEMENTO_ASSIGN_OR_RETURN(failed, ParseNodeList(o.fail, num_nodes));
  }
  topo::RecoveryPlan rec;
  if (has_fail) {
    MEMENTO_ASSIGN_OR_RETURN(rec, recover::PlanFailure(plan, failed));
  }

  if (!o.svg.empty()) {
    std::ofstream out(o.svg, std::ios::trunc);
    out << model::RenderLayoutSvg(plan, has_fail ? &rec : nullptr);
    out.close();
    if (!out) return InvalidArgumentError("--svg " + o.svg + ": cannot write the file");
  }

  uint64_t max_total = 0, min_total = ~uint64_t{0};
  for (const auto& n : plan.nodes) {
    max_total = std::max(max_total, n.total_bytes());
    min_total = std::min(min_total, n.total_bytes());
  }
  const double overhead =
      plan.total_state_bytes ? static_cast<double>(plan.total_held_bytes - plan.total_state_bytes) /
                                   static_cast<double>(plan.total_state_bytes)
                             : 0.0;
  // Sharding groups summarised by scheme.
  std::map<std::string, std::pair<int, int>> schemes;  // scheme -> (groups, min protection)
  for (const auto& g : plan.groups) {
    if (g.kind != topo::GroupKind::kShardingGroup) continue;
    auto [it, fresh] = schemes.emplace(g.scheme, std::make_pair(0, g.protection));
    it->second.first++;
    it->second.second = std::min(it->second.second, g.protection);
  }

  // Whole-rack failures (when racks are labelled): does each one recover?
  std::map<std::string, std::vector<int>> racks;
  for (int n = 0; n < num_nodes; ++n) {
    if (!topology.Rack(n).empty()) racks[std::string(topology.Rack(n))].push_back(n);
  }
  std::vector<std::string> fatal_racks;
  for (const auto& [rack, nodes] : racks) {
    MEMENTO_ASSIGN_OR_RETURN(topo::RecoveryPlan r, recover::PlanFailure(plan, nodes));
    if (!r.recoverable) fatal_racks.push_back(rack);
  }

  if (o.json) {
    nlohmann::json j;
    if (!racks.empty()) {
      j["racks"] = racks.size();
      j["rack_failure_recoverable"] = fatal_racks.empty();
      j["unrecoverable_racks"] = fatal_racks;
    }
    j["topology"] = {{"dp", o.dp},
                     {"tp", o.tp},
                     {"pp", o.pp},
                     {"zero_stage", o.zero},
                     {"ranks", topology.num_ranks()},
                     {"nodes", num_nodes},
                     {"ranks_per_node", o.ranks_per_node}};
    j["policy"] = topo::PolicyName(plan.policy);
    j["local_copy"] = o.local_copy;
    if (!plan.reason.empty()) j["reason"] = plan.reason;
    if (!ranking.ranked.empty()) {
      nlohmann::json r = nlohmann::json::array();
      for (const auto& e : ranking.ranked) {
        r.push_back(
            {{"policy", e.policy},
             {"goodput", e.best_goodput},
             {"durable_interval_s", e.best_interval_s},
             {"safe_interval_s", std::isinf(e.safe_interval_s) ? nlohmann::json(nullptr)
                                                               : nlohmann::json(e.safe_interval_s)},
             {"host_bytes_per_node", e.cost.host_bytes},
             {"copy_bytes_per_node", e.cost.copy_bytes},
             {"network_bytes_per_node", e.cost.network_bytes},
             {"fits", e.cost.fits},
             {"why_not", e.cost.why_not}});
      }
      j["auto_ranking"] = std::move(r);
    }
    j["protection"] = plan.protection;
    j["state_bytes"] = plan.total_state_bytes;
    j["held_bytes"] = plan.total_held_bytes;
    j["redundancy_overhead"] = overhead;
    nlohmann::json nodes = nlohmann::json::array();
    for (const auto& n : plan.nodes) {
      nodes.push_back({{"node", n.node},
                       {"piece_bytes", n.piece_bytes},
                       {"copy_bytes", n.copy_bytes},
                       {"parity_bytes", n.parity_bytes},
                       {"network_bytes", n.network_bytes},
                       {"total_bytes", n.total_bytes()}});
    }
    j["per_node"] = std::move(nodes);
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& g : plan.groups) {
      groups.push_back({{"name", g.name},
                        {"scheme", g.scheme},
                        {"nodes", g.nodes},
                        {"protection", g.protection},
                        {"note", g.note}});
    }
    j["groups"] = std::move(groups);
    j["notes"] = plan.notes;
    if (has_fail) {
      j["fail"] = rec.failed_nodes;
      j["recoverable"] = rec.recoverable;
      j["recovery"] = topo::RecoveryToJson(plan, rec);
    }
    if (o.full_plan) j["plan"] = topo::PlanToJson(plan);
    memento::tools::PrintJson("memento.plan.layout/1", std::move(j));
    return Status::Ok();
  }

  std::printf("topology   dp=%d tp=%d pp=%d zero=%d: %d ranks on %d nodes (%d per node)\n", o.dp,
              o.tp, o.pp, o.zero, topology.num_ranks(), num_nodes, o.ranks_per_node);
  std::printf("policy     %s (local copy %s)\n", topo::PolicyName(plan.policy).c_str(),
              o.local_copy.c_str());
  if (!plan.reason.empty()) std::printf("auto       %s\n", plan.reason.c_str());
  for (const auto& e : ranking.ranked) {
    std::printf("  %-10s goodput %.5f, durable version every %.3g h, host %s per node%s%s\n",
                e.policy.c_str(), e.best_goodput, e.best_interval_s / 3600,
                HumanBytes(static_cast<uint64_t>(e.cost.host_bytes)).c_str(),
                e.cost.fits ? "" : ": excluded, ", e.cost.why_not.c_str());
  }
  std::printf("protection any %d node failure(s) recover from memory\n", plan.protection);
  std::printf("state      %s unique, %s held in host memory (redundancy overhead %.1f%%)\n",
              HumanBytes(plan.total_state_bytes).c_str(), HumanBytes(plan.total_held_bytes).c_str(),
              overhead * 100);
  std::printf("per node   %s .. %s\n", HumanBytes(min_total).c_str(),
              HumanBytes(max_total).c_str());
  const int show = std::min<int>(num_nodes, 8);
  std::printf("  %-6s %12s %12s %12s %12s %12s\n", "node", "pieces", "copies", "parity", "network",
              "total");
  for (int i = 0; i < show; ++i) {
    const auto& n = plan.nodes[i];
    std::printf("  %-6d %12s %12s %12s %12s %12s\n", n.node, HumanBytes(n.piece_bytes).c_str(),
                HumanBytes(n.copy_bytes).c_str(), HumanBytes(n.parity_bytes).c_str(),
                HumanBytes(n.network_bytes).c_str(), HumanBytes(n.total_bytes()).c_str());
  }
  if (show < num_nodes) std::printf("  ... %d more nodes\n", num_nodes - show);
  for (const auto& [scheme, v] : schemes) {
    std::printf("groups     %d sharding group(s) with %s, protection %d\n", v.first, scheme.c_str(),
                v.second);
  }
  if (!racks.empty()) {
    std::string bad;
    for (const auto& r : fatal_racks) bad += (bad.empty() ? "" : ", ") + r;
    std::printf("racks      %zu; loss of any one whole rack: %s\n", racks.size(),
                fatal_racks.empty() ? "recoverable" : ("NOT recoverable for " + bad).c_str());
  }
  for (const auto& note : plan.notes) std::printf("note       %s\n", note.c_str());
  if (has_fail) {
    std::string set;
    for (int n : rec.failed_nodes) set += (set.empty() ? "" : ",") + std::to_string(n);
    std::printf("fail {%s}: %s\n", set.c_str(),
                rec.recoverable ? "recoverable from memory" : "NOT recoverable from memory");
    std::printf("  %zu lost pieces, %s copied, %s decoded\n", rec.recipes.size(),
                HumanBytes(rec.copy_bytes).c_str(), HumanBytes(rec.decode_bytes).c_str());
    int shown = 0;
    for (const auto& r : rec.recipes) {
      if (shown++ >= 12) {
        std::printf("  ...\n");
        break;
      }
      const auto& piece = plan.pieces[r.piece];
      if (!r.recoverable) {
        std::printf("  %-14s %s\n", piece.key.c_str(), r.reason.c_str());
      } else if (r.steps.empty()) {
        std::printf("  %-14s empty\n", piece.key.c_str());
      } else if (r.steps[0].kind == topo::RecoveryStep::Kind::kCopy) {
        std::printf("  %-14s copy from node %d\n", piece.key.c_str(), r.steps[0].node);
      } else {
        std::string from;
        for (const auto& in : r.steps[0].inputs) {
          if (!in.zero) from += (from.empty() ? "" : ",") + std::to_string(in.node);
        }
        std::printf("  %-14s decode %zu block(s), first from nodes {%s}\n", piece.key.c_str(),
                    r.steps.size(), from.c_str());
      }
    }
  }
  return Status::Ok();
}

void Setup(CLI::App& app, CommandContext& ctx) {
  auto* plan = app.add_subcommand("plan", "Placement plans: who snapshots and protects what");
  plan->require_subcommand(1);
  auto* layout = plan->add_subcommand("layout", "Print the plan summary for a topology");
  auto o = std::make_shared<LayoutOptions>();
  layout->add_option("--dp", o->dp, "data-parallel size")->capture_default_str();
  layout->add_option("--tp", o->tp, "tensor-parallel size")->capture_default_str();
  layout->add_option("--pp", o->pp, "pipeline-parallel size")->capture_default_str();
  layout->add_option("--zero", o->zero, "ZeRO stage: 0, 1 or 3")->capture_default_str();
  layout->add_option("--ranks-per-node", o->ranks_per_node, "ranks per node")
      ->capture_default_str();
  layout->add_option("--racks", o->racks, "label nodes with this many racks (0: none)");
  layout->add_option("--policy", o->policy, "none|replicate|xor|rs:F|peer:M|auto")
      ->capture_default_str();
  layout->add_option("--local-copy", o->local_copy, "sharded|full")->capture_default_str();
  layout->add_option("--fail", o->fail, "failed nodes, e.g. 3,7: what recovery would need");
  layout->add_option("--param-bytes", o->param_bytes, "replicated bytes per rank")
      ->transform(ByteSize())
      ->capture_default_str();
  layout
      ->add_option("--optimizer-bytes", o->optimizer_bytes,
                   "dp_sharded bytes per rank (default 6 x params / dp)")
      ->transform(ByteSize());
  layout->add_option("--private-bytes", o->private_bytes, "private bytes per rank")
      ->transform(ByteSize())
      ->capture_default_str();
  layout->add_option("--host-budget", o->host_budget, "auto: host bytes per node (0: unlimited)")
      ->transform(ByteSize());
  layout
      ->add_option("--copy-budget", o->copy_budget,
                   "auto: device->host bytes per node per snapshot (0: unlimited)")
      ->transform(ByteSize());
  layout
      ->add_option("--network-budget", o->network_budget,
                   "auto: bytes a node receives from peers per snapshot (0: unlimited)")
      ->transform(ByteSize());
  layout
      ->add_option("--hw-rate", o->hw_rate,
                   "auto: node losses (host memory lost) per node-day, Weibull rate")
      ->capture_default_str();
  layout
      ->add_option("--sw-rate", o->sw_rate,
                   "auto: process failures (host memory survives) per node-day")
      ->capture_default_str();
  layout->add_option("--rack-rate", o->rack_rate, "auto: whole-rack losses per rack-day")
      ->capture_default_str();
  layout->add_option("--shape", o->shape, "auto: Weibull shape of the failure times")
      ->capture_default_str();
  layout->add_option("--bench", o->bench_files,
                     "auto: measured speeds, the --json of memento bench recover, persist or "
                     "overhead (repeatable)");
  layout->add_flag("--json", o->json, "print JSON");
  layout->add_flag("--full-plan", o->full_plan, "with --json: include the whole plan");
  layout->add_option("--svg", o->svg,
                     "write the placement as SVG: nodes by sharding group and rack, pieces, "
                     "copies, parity; with --fail the lost nodes and who rebuilds them");
  layout->callback([o, &ctx] { ctx.exit_code = ReportStatus(RunLayout(*o)); });
  SetupPlanReliability(plan, ctx);
}

}  // namespace
}  // namespace memento::tools

MEMENTO_REGISTER_COMMAND(plan, memento::tools::Setup);
