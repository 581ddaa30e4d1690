#include "model/reliability.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "topo/plan.h"

namespace memento::model {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Probability that more than `f` of the nodes are lost (count distribution by
// dynamic programming; a sum of non-negative terms, so tiny tails keep their
// precision).
double MdsLoss(int f, const std::vector<double>& q) {
  const int n = static_cast<int>(q.size());
  if (f >= n) return 0.0;
  std::vector<double> dist(n + 1, 0.0);
  dist[0] = 1.0;
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j >= 1; --j) dist[j] = dist[j] * (1 - q[i]) + dist[j - 1] * q[i];
    dist[0] *= (1 - q[i]);
  }
  double tail = 0;
  for (int j = n; j > f; --j) tail += dist[j];
  return std::min(1.0, tail);
}

// Probability that some `r` ring-consecutive nodes are all lost. Conditions
// on the run of lost nodes starting at ring position 0 (length a < r, node a
// up), runs a linear DP over the rest with an absorbing "lost" state, and
// joins the trailing run to the leading one across the wrap.
double RingLoss(int r, const std::vector<double>& q) {
  const int n = static_cast<int>(q.size());
  if (r <= 0) return 1.0;
  if (r > n) return 0.0;
  double lost = 1.0;  // the first r nodes all lost
  for (int i = 0; i < r; ++i) lost *= q[i];
  double lead = 1.0;  // P(nodes 0..a-1 lost)
  std::vector<double> run(r), next(r);
  for (int a = 0; a < r && a < n; ++a) {
    const double pa = lead * (1 - q[a]);
    lead *= q[a];
    if (pa == 0) continue;
    std::fill(run.begin(), run.end(), 0.0);
    run[0] = pa;
    double absorbed = 0;
    for (int i = a + 1; i < n; ++i) {
      std::fill(next.begin(), next.end(), 0.0);
      for (int b = 0; b < r; ++b) {
        if (run[b] == 0) continue;
        next[0] += run[b] * (1 - q[i]);
        if (b + 1 >= r) {
          absorbed += run[b] * q[i];
        } else {
          next[b + 1] += run[b] * q[i];
        }
      }
      run.swap(next);
    }
    lost += absorbed;
    for (int b = std::max(0, r - a); b < r; ++b) lost += run[b];
  }
  return std::min(1.0, lost);
}

double GroupLoss(const GroupRule& rule, const std::vector<double>& q) {
  return rule.kind == GroupRule::Kind::kMds ? MdsLoss(rule.tolerate, q) : RingLoss(rule.copies, q);
}

double LogSurvive(double loss) { return loss >= 1.0 ? -kInf : std::log1p(-loss); }

Result<int> ParsePositive(const std::string& text, const std::string& what) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 1 || v > 1000000) {
    return InvalidArgumentError("policy '" + what + "': '" + text + "' is not a positive count");
  }
  return static_cast<int>(v);
}

}  // namespace

double Weibull::Survival(double t) const {
  if (rate <= 0 || t <= 0) return 1.0;
  return std::exp(-rate * std::pow(t, shape));
}

double Weibull::Cdf(double t) const {
  if (rate <= 0 || t <= 0) return 0.0;
  return -std::expm1(-rate * std::pow(t, shape));
}

double Weibull::Mean() const {
  if (rate <= 0) return kInf;
  return std::pow(rate, -1.0 / shape) * std::tgamma(1.0 + 1.0 / shape);
}

double Weibull::Sample(std::mt19937_64& rng) const {
  if (rate <= 0) return kInf;
  std::exponential_distribution<double> e(1.0);
  return std::pow(e(rng) / rate, 1.0 / shape);
}

std::string GroupRule::Describe() const {
  if (kind == Kind::kMds) return "any " + std::to_string(tolerate) + " lost";
  return "lost when " + std::to_string(copies) + " ring-consecutive nodes are";
}

Result<GroupRule> RuleForPolicy(const std::string& policy, int n) {
  GroupRule rule;  // mds 0
  if (n < 1) return InvalidArgumentError("group of " + std::to_string(n) + " nodes");
  if (policy == "none" || policy == "durable") return rule;
  if (policy == "xor") {
    rule.tolerate = n >= 2 ? 1 : 0;
    return rule;
  }
  if (policy.rfind("rs:", 0) == 0) {
    MEMENTO_ASSIGN_OR_RETURN(int f, ParsePositive(policy.substr(3), policy));
    rule.tolerate = std::min(f, n - 1);
    return rule;
  }
  if (policy == "replicate" || policy.rfind("peer:", 0) == 0) {
    int m = 2;
    if (policy != "replicate") {
      MEMENTO_ASSIGN_OR_RETURN(m, ParsePositive(policy.substr(5), policy));
    }
    if (n < 2 || m < 2) return rule;
    rule.kind = GroupRule::Kind::kRing;
    rule.copies = std::min(m, n);
    return rule;
  }
  return InvalidArgumentError("policy '" + policy +
                              "': expected none, replicate, xor, rs:F, peer:M or durable");
}

Result<Structure> UniformStructure(const std::string& policy, int num_nodes, int group_size,
                                   int racks) {
  if (num_nodes < 1) {
    return InvalidArgumentError("--nodes " + std::to_string(num_nodes) + ": expected >= 1");
  }
  if (group_size < 1 || num_nodes % group_size != 0) {
    return InvalidArgumentError("--group-size " + std::to_string(group_size) +
                                ": expected a divisor of --nodes " + std::to_string(num_nodes));
  }
  if (racks < 0 || racks > num_nodes) {
    return InvalidArgumentError("--racks " + std::to_string(racks) + ": expected 0.." +
                                std::to_string(num_nodes));
  }
  Structure s;
  s.policy = policy;
  s.in_memory = policy != "durable";
  s.num_nodes = num_nodes;
  s.num_racks = racks;
  MEMENTO_ASSIGN_OR_RETURN(GroupRule rule, RuleForPolicy(policy, group_size));
  if (racks > 0) {
    const int per = (num_nodes + racks - 1) / racks;
    s.node_rack.resize(num_nodes);
    for (int i = 0; i < num_nodes; ++i) s.node_rack[i] = i / per;
    s.num_racks = (num_nodes + per - 1) / per;  // racks that hold nodes
  }
  const int num_groups = num_nodes / group_size;
  s.groups.resize(num_groups);
  for (int g = 0; g < num_groups; ++g) {
    s.groups[g].rule = rule;
    s.groups[g].nodes.resize(group_size);
    for (int j = 0; j < group_size; ++j) {
      s.groups[g].nodes[j] = racks > 0 ? g + j * num_groups : g * group_size + j;
    }
  }
  return s;
}

Result<Structure> StructureFromPlan(const topo::Plan& plan) {
  Structure s;
  s.policy = topo::PolicyName(plan.policy);
  if (plan.policy.local_copy == topo::LocalCopy::kFull) s.policy += "+full";
  s.num_nodes = plan.topology.num_nodes();
  std::map<std::string, int> rack_ids;
  for (int n = 0; n < s.num_nodes; ++n) {
    const std::string rack(plan.topology.Rack(n));
    if (!rack.empty()) rack_ids.emplace(rack, static_cast<int>(rack_ids.size()));
  }
  if (!rack_ids.empty()) {
    s.num_racks = static_cast<int>(rack_ids.size());
    s.node_rack.resize(s.num_nodes);
    for (int n = 0; n < s.num_nodes; ++n) {
      const std::string rack(plan.topology.Rack(n));
      if (rack.empty()) {
        // An unlabelled node is its own failure domain.
        s.node_rack[n] = s.num_racks++;
      } else {
        s.node_rack[n] = rack_ids[rack];
      }
    }
  }
  std::vector<int> node_group(s.num_nodes, -1);
  std::set<std::vector<int>> seen;
  for (const auto& g : plan.groups) {
    if (g.kind != topo::GroupKind::kShardingGroup || g.nodes.empty()) continue;
    std::vector<int> sorted = g.nodes;
    std::sort(sorted.begin(), sorted.end());
    if (!seen.insert(sorted).second) continue;
    const int id = static_cast<int>(s.groups.size());
    for (int n : g.nodes) {
      if (node_group[n] != -1) {
        return FailedPreconditionError("sharding group " + g.name + " shares node " +
                                       std::to_string(n) +
                                       " with another group of different nodes: the "
                                       "reliability model needs disjoint groups");
      }
      node_group[n] = id;
    }
    const int n = static_cast<int>(g.nodes.size());
    GroupRule rule;
    if (plan.policy.local_copy == topo::LocalCopy::kFull) {
      rule.tolerate = n - 1;
    } else {
      MEMENTO_ASSIGN_OR_RETURN(rule, RuleForPolicy(topo::PolicyName(plan.policy), n));
    }
    const int guaranteed = rule.kind == GroupRule::Kind::kMds ? rule.tolerate : rule.copies - 1;
    if (guaranteed != g.protection) {
      return FailedPreconditionError("sharding group " + g.name + " is protected against " +
                                     std::to_string(g.protection) + " failures (" + g.note +
                                     ") but the model's rule (" + rule.Describe() + ") gives " +
                                     std::to_string(guaranteed));
    }
    s.groups.push_back({g.nodes, rule});
  }
  // Peer groups (Gemini placement: private and unshared state copied to the
  // next m-1 nodes of the group's ring) lose data when m ring-consecutive
  // nodes are lost; kept as a group of its own unless the sharding groups
  // already imply it.
  const size_t sharding_groups = s.groups.size();
  for (const auto& g : plan.groups) {
    if (g.kind != topo::GroupKind::kPeerGroup || !g.carries_data || g.nodes.empty()) continue;
    // Each node's pieces go to its next m-1 peers on the group's ring.
    int m = 2;  // replicate, xor
    if (plan.policy.scheme == topo::Scheme::kPeer) m = plan.policy.m;
    if (plan.policy.scheme == topo::Scheme::kRs) m = plan.policy.f + 1;
    const int size = static_cast<int>(g.nodes.size());
    m = std::min(m, size);
    // Implied when losing any m ring-consecutive nodes (the peer group's
    // minimal fatal sets) already kills a sharding group.
    bool implied = true;
    for (int start = 0; start < size && implied; ++start) {
      std::vector<int> window;
      for (int k = 0; k < m; ++k) window.push_back(g.nodes[(start + k) % size]);
      bool kills = false;
      for (size_t sg = 0; sg < sharding_groups && !kills; ++sg) {
        const auto& grp = s.groups[sg];
        std::vector<double> qv(grp.nodes.size(), 0.0);
        for (size_t i = 0; i < grp.nodes.size(); ++i) {
          if (std::count(window.begin(), window.end(), grp.nodes[i])) qv[i] = 1.0;
        }
        kills = GroupLoss(grp.rule, qv) >= 1.0;
      }
      implied = kills;
    }
    if (implied) continue;
    GroupRule rule;
    rule.kind = GroupRule::Kind::kRing;
    rule.copies = m;
    s.groups.push_back({g.nodes, rule});
    s.exact = false;
  }
  return s;
}

double GroupSurvival(const GroupRule& rule, const std::vector<double>& q) {
  return 1.0 - GroupLoss(rule, q);
}

namespace {
double SurvivalImpl(const Structure& s, const FailureRates& rates, double t, double* gap);
}  // namespace

Result<double> Survival(const Structure& s, const FailureRates& rates, double t) {
  return SurvivalImpl(s, rates, t, nullptr);
}

double RackEnumerationGap(const Structure& s, const FailureRates& rates, double t) {
  double gap = 0;
  SurvivalImpl(s, rates, t, &gap);
  return gap;
}

namespace {
double SurvivalImpl(const Structure& s, const FailureRates& rates, double t, double* gap) {
  if (gap) *gap = 0;
  if (t <= 0) return 1.0;
  const double hw =
      rates.hardware.rate > 0 ? rates.hardware.rate * std::pow(t, rates.hardware.shape) : 0;
  const double sw =
      rates.software.rate > 0 ? rates.software.rate * std::pow(t, rates.software.shape) : 0;
  const double rack_f = rates.rack.Cdf(t);
  const bool racks = s.num_racks > 0 && rack_f > 0;
  if (!s.in_memory) {
    // Eq. 6: every node survives hardware and software, every rack survives.
    double log_s = -static_cast<double>(s.num_nodes) * (hw + sw);
    if (racks) log_s -= s.num_racks * rates.rack.rate * std::pow(t, rates.rack.shape);
    return std::exp(log_s);
  }
  const double q = rates.hardware.Cdf(t);
  // Base: no rack lost. Groups with equal (rule, size) share a value.
  std::map<std::tuple<int, int, int, size_t>, double> cache;
  auto base_log = [&](const Structure::Group& g) {
    auto key = std::make_tuple(static_cast<int>(g.rule.kind), g.rule.tolerate, g.rule.copies,
                               g.nodes.size());
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    const double v = LogSurvive(GroupLoss(g.rule, std::vector<double>(g.nodes.size(), q)));
    cache.emplace(key, v);
    return v;
  };
  double log0 = 0;
  std::vector<double> group_log(s.groups.size());
  for (size_t i = 0; i < s.groups.size(); ++i) {
    group_log[i] = base_log(s.groups[i]);
    log0 += group_log[i];
  }
  if (!racks) return std::exp(log0);

  // Rack-failure sets by size j, until P(more than j racks lost) < 1e-7.
  // Groups with the same rule and the same racks in ring order behave alike
  // for every rack set: evaluate one per such signature and weight it.
  if (std::isinf(log0)) return 0.0;
  const int R = s.num_racks;
  std::map<std::tuple<int, int, int, std::vector<int>>, int> sig_of;
  std::vector<int> sig_count, sig_rep;
  std::vector<std::vector<int>> rack_sigs(R);
  for (size_t i = 0; i < s.groups.size(); ++i) {
    const auto& g = s.groups[i];
    std::vector<int> racks;
    for (int n : g.nodes) racks.push_back(s.node_rack[n]);
    auto [it, fresh] = sig_of.emplace(
        std::make_tuple(static_cast<int>(g.rule.kind), g.rule.tolerate, g.rule.copies, racks),
        static_cast<int>(sig_count.size()));
    if (fresh) {
      sig_count.push_back(0);
      sig_rep.push_back(static_cast<int>(i));
      std::sort(racks.begin(), racks.end());
      racks.erase(std::unique(racks.begin(), racks.end()), racks.end());
      for (int r : racks) rack_sigs[r].push_back(it->second);
    }
    ++sig_count[it->second];
  }
  double per_rack = 0;
  for (const auto& v : rack_sigs) per_rack += static_cast<double>(v.size());
  per_rack = std::max(1.0, per_rack / R);
  const double log_f = std::log(rack_f);
  const double log_ok = std::log1p(-rack_f);
  double total = 0, covered = 0;
  double sets = 0, work = 0;
  std::vector<char> rack_lost(R, 0), sig_seen(sig_count.size(), 0);
  std::vector<int> touched;
  std::vector<double> qv;
  for (int j = 0; j <= R; ++j) {
    const double log_c = std::lgamma(R + 1.0) - std::lgamma(j + 1.0) - std::lgamma(R - j + 1.0);
    const double mass_j = std::exp(log_c + j * log_f + (R - j) * log_ok);
    sets += std::exp(log_c);
    work += std::exp(log_c) * j * per_rack;
    if (j > 0 && (sets > 1e6 || work > 1e7)) {
      // Too many sets: stop here; what is left out counts as lost.
      if (gap) *gap = std::max(0.0, 1.0 - covered);
      break;
    }
    const double p_set = std::exp(j * log_f + (R - j) * log_ok);
    // Enumerate j-subsets of racks in lexicographic order.
    std::vector<int> idx(j);
    for (int i = 0; i < j; ++i) idx[i] = i;
    while (true) {
      double log_s = log0;
      touched.clear();
      for (int r : idx) {
        rack_lost[r] = 1;
        for (int sg : rack_sigs[r]) {
          if (!sig_seen[sg]) sig_seen[sg] = 1, touched.push_back(sg);
        }
      }
      for (int sg : touched) {
        sig_seen[sg] = 0;
        const auto& grp = s.groups[sig_rep[sg]];
        qv.assign(grp.nodes.size(), q);
        for (size_t k = 0; k < grp.nodes.size(); ++k) {
          if (rack_lost[s.node_rack[grp.nodes[k]]]) qv[k] = 1.0;
        }
        log_s += sig_count[sg] * (LogSurvive(GroupLoss(grp.rule, qv)) - group_log[sig_rep[sg]]);
      }
      for (int r : idx) rack_lost[r] = 0;
      total += p_set * std::exp(log_s);
      // next combination
      int i = j - 1;
      while (i >= 0 && idx[i] == R - j + i) --i;
      if (i < 0) break;
      ++idx[i];
      for (int k = i + 1; k < j; ++k) idx[k] = idx[k - 1] + 1;
    }
    covered += mass_j;
    if (1.0 - covered < 1e-7) {
      if (gap) *gap = std::max(0.0, 1.0 - covered);
      break;
    }
  }
  return std::min(1.0, total);
}
}  // namespace

Result<double> TimeToThreshold(const Structure& s, const FailureRates& rates, double threshold) {
  if (!(threshold > 0 && threshold < 1)) {
    return InvalidArgumentError("--threshold " + std::to_string(threshold) +
                                ": expected a probability in (0, 1)");
  }
  double lo = 0, hi = 1e-6;
  while (true) {
    MEMENTO_ASSIGN_OR_RETURN(double v, Survival(s, rates, hi));
    if (v < threshold) break;
    if (hi > 1e9) return kInf;
    lo = hi;
    hi *= 4;
  }
  while ((hi - lo) > 1e-9 * hi) {
    const double mid = 0.5 * (lo + hi);
    MEMENTO_ASSIGN_OR_RETURN(double v, Survival(s, rates, mid));
    (v >= threshold ? lo : hi) = mid;
  }
  return lo;
}

double ReftEq5(double ps, double pre, int k, int n) {
  const double group = std::pow(ps, n) + n * (1 - ps) * std::pow(ps, n - 1);
  return std::pow(group, static_cast<double>(k) / n) * std::pow(pre, k);
}

double ReftEq6(double ps, double ptr, int k) { return std::pow(ps, k) * std::pow(ptr, k); }

}  // namespace memento::model
