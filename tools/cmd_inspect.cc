// `memento inspect`: what a tier holds, or the state of a live cluster.
//
//   --store tcp://H:P --job J   the cluster (docs/inspect.md): membership
//                           table (node, alive, signal, step, age, endpoint),
//                           committed step, restore target, topology and
//                           every recovery record with its time breakdown
//
// `memento inspect --tier TIER TARGET [--json]`:
//
//   --tier durable DIR      versions in a durable-tier directory (step, state,
//                           nodes, size, tensors, creation time); a version
//                           whose COMMIT, index, manifests or file sizes are
//                           wrong is BROKEN (exit 1), never latest complete
//   --tier memory ROOT...   slots under node roots on this host (rank, slot,
//                           state, step, intact) and the newest step every
//                           rank holds intact; --no-verify reads headers only;
//                           each root's background scrub report
//                           (<root>/scrub.json: passes, corrupt versions);
//                           and per root the bytes of one version held in T0
//                           and T1 and copied per snapshot, measured as
//                           `memento launch` does (launch::MeasureNodeMemory);
//                           with --store and --job at the committed step and
//                           next to the plan's bytes (REFT's formula)
//
// Each tier is one entry of Inspectors().
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agent/memory_tier.h"
#include "common/clock.h"
#include "coord/cluster_view.h"
#include "coord/commit.h"
#include "coord/keys.h"
#include "coord/store.h"
#include "fmt/format.h"
#include "launch/job_recovery.h"
#include "launch/node_memory.h"
#include "tier/env.h"
#include "tier/format.h"
#include "tier/reader.h"
#include "tier/verify.h"
#include "tools/command.h"
#include "tools/json_output.h"

namespace {

struct InspectArgs {
  std::string tier = "durable";
  std::vector<std::string> targets;
  std::string target;  // targets[0]
  bool json = false;
  bool verify = true;
  // Cluster mode.
  std::string store_url;
  std::string job;
  std::string token_file;
  double timeout_s = 10;
};

std::string FormatTime(int64_t unix_ns) {
  if (unix_ns <= 0) return "-";
  time_t t = static_cast<time_t>(unix_ns / 1000000000);
  char buf[32];
  std::tm tm;
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Exit status: 0, or 1 when a version with a COMMIT marker is broken (its
// index, a manifest or a data file's size fails QuickCheckVersion): it is
// listed as BROKEN and never named latest complete.
int InspectDurable(const InspectArgs& args) {
  using namespace memento::tier;
  Env* env = Env::Default();
  if (!env->IsDirectory(args.target)) {
    return memento::tools::ReportStatus(
        memento::NotFoundError("durable tier directory '" + args.target + "' does not exist"));
  }
  auto versions = ListVersions(env, args.target);
  if (!versions.ok()) return memento::tools::ReportStatus(versions.status());
  nlohmann::json out = nlohmann::json::array();
  int64_t latest = -1;
  std::vector<std::string> broken;  // "version N: problem"
  for (const auto& v : *versions) {
    nlohmann::json j{{"step", v.step},
                     {"complete", v.complete},
                     {"broken", false},
                     {"state", v.state},
                     {"nodes_done", v.nodes_done}};
    const bool has_commit = env->FileExists(v.dir + "/" + kCommitFileName);
    if (v.complete) {
      // Only a version that passes the quick check (index, manifests, file
      // sizes) is complete; the index is loaded before anything is claimed.
      VersionCheck check = QuickCheckVersion(env, args.target, v.step);
      auto index = check.ok ? LoadIndex(env, args.target, v.step)
                            : memento::Result<VersionIndex>(memento::DataLossError(
                                  check.problems.empty() ? "unreadable" : check.problems[0]));
      if (index.ok()) {
        latest = v.step;
        uint64_t file_bytes = 0;
        for (const auto& n : index->nodes) file_bytes += n.file_size;
        j["job"] = index->job;
        j["num_nodes"] = index->num_nodes;
        j["tensors"] = index->tensors.size();
        j["stored_bytes"] = index->stored_bytes();
        j["file_bytes"] = file_bytes;
        j["created"] = FormatTime(index->created_unix_ns);
        j["topology"] = nlohmann::json::parse(index->topology_json, nullptr, false);
      } else {
        j["complete"] = false;
        j["broken"] = true;
        j["state"] = index.status().ToString();
        j["problems"] = check.problems.empty() ? std::vector<std::string>{index.status().ToString()}
                                               : check.problems;
        broken.push_back("version " + std::to_string(v.step) + ": " +
                         j["state"].get<std::string>());
      }
    } else if (has_commit) {
      // A COMMIT that does not parse or names another step.
      j["broken"] = true;
      broken.push_back("version " + std::to_string(v.step) + ": " + v.state);
    }
    out.push_back(std::move(j));
  }
  const int code = broken.empty() ? 0 : 1;
  auto report_broken = [&] {
    for (const std::string& b : broken) std::fprintf(stderr, "memento: BROKEN %s\n", b.c_str());
    if (!broken.empty()) {
      std::fprintf(stderr,
                   "memento: %zu version(s) with a COMMIT marker are broken (not counted as "
                   "complete); `memento verify %s` checks every byte\n",
                   broken.size(), args.target.c_str());
    }
  };
  if (args.json) {
    nlohmann::json top{{"tier", "durable"}, {"dir", args.target}, {"versions", out}};
    top["latest_complete"] = latest >= 0 ? nlohmann::json(latest) : nlohmann::json(nullptr);
    top["broken"] = broken;
    memento::tools::PrintJson("memento.inspect.durable/1", std::move(top));
    report_broken();
    return code;
  }
  std::printf("durable tier %s: %zu version director%s, latest complete: %s\n", args.target.c_str(),
              out.size(), out.size() == 1 ? "y" : "ies",
              latest >= 0 ? std::to_string(latest).c_str() : "none");
  std::printf("%-12s %-10s %-6s %-8s %-12s %-21s %s\n", "step", "state", "nodes", "tensors", "MiB",
              "created", "job");
  for (const auto& j : out) {
    if (j["complete"].get<bool>()) {
      std::printf("%-12lld %-10s %-6d %-8zu %-12.1f %-21s %s\n",
                  static_cast<long long>(j["step"].get<int64_t>()), "complete",
                  j["num_nodes"].get<int>(), j["tensors"].get<size_t>(),
                  j["stored_bytes"].get<uint64_t>() / 1048576.0,
                  j["created"].get<std::string>().c_str(), j["job"].get<std::string>().c_str());
    } else {
      std::printf("%-12lld %-10s %-6zu %s\n", static_cast<long long>(j["step"].get<int64_t>()),
                  j["broken"].get<bool>() ? "BROKEN" : "INCOMPLETE", j["nodes_done"].size(),
                  j["state"].get<std::string>().c_str());
    }
  }
  std::fflush(stdout);
  report_broken();
  return code;
}

nlohmann::json ReadScrubReport(const std::string& root) {
  std::FILE* f = std::fopen((root + "/scrub.json").c_str(), "r");
  if (f == nullptr) return nullptr;
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  std::fclose(f);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return nlohmann::json{{"error", "unreadable scrub.json"}};
  return j;
}

// "scrub: 12 passes (last 31 s ago, 1.0 GiB at <= 64 MiB/s, agent pid 7), corrupt: none".
std::string FormatScrub(const std::string& root, const nlohmann::json& r) {
  if (r.is_null()) return "scrub " + root + ": no report (scrub off or an older agent)\n";
  if (r.contains("error")) return "scrub " + root + ": " + r["error"].get<std::string>() + "\n";
  auto num = [&](const char* k) { return r.value(k, nlohmann::json(0)).get<double>(); };
  char line[512];
  double last = num("last_pass_end_unix_ns");
  std::string ago =
      last > 0 ? fmt::format("last ended {:.0f} s ago", (memento::WallNanos() - last) / 1e9)
               : std::string("none ended yet");
  std::snprintf(line, sizeof line,
                "scrub %s: %.0f pass%s (%s), %.1f MiB hashed at <= %.1f MiB/s every %g s, agent "
                "pid %.0f, corrupt: %zu\n",
                root.c_str(), num("passes"), num("passes") == 1 ? "" : "es", ago.c_str(),
                num("bytes") / 1048576.0, num("bytes_per_s") / 1048576.0, num("interval_s"),
                num("agent_pid"), r.value("corrupt", nlohmann::json::array()).size());
  std::string out = line;
  for (const auto& c : r.value("corrupt", nlohmann::json::array())) {
    out += fmt::format("  CORRUPT rank {} slot {} step {} (found by pass {}): {}\n",
                       c.value("rank", -1), c.value("slot", -1), c.value("step", -1),
                       c.value("pass", 0), c.value("error", std::string()));
  }
  return out;
}

// The bytes of one version per root (issue 15, docs/inspect.md "Bytes per
// node"): measured by launch::MeasureNodeMemory, as `memento launch` measures
// them for its summary, at the job's committed step when a store is given,
// else the newest step every rank holds intact; with a store also the
// plan's bytes (the plan every agent computes: launch::PlanFromStore).
struct NodeBytes {
  int64_t step = -1;
  std::string step_source;  // "committed" | "newest intact"
  std::optional<memento::topo::Plan> plan;
  std::string formula;  // REFT's formula for the plan's policy; empty without a plan
  std::vector<std::pair<std::string, memento::launch::NodeMemory>> roots;  // root -> bytes
  std::vector<std::pair<std::string, std::string>> unmeasured;             // root -> why
};

// node<N> at the end of a root's path (the launcher's layout); -1 otherwise.
int NodeOfRootName(const std::string& root) {
  std::string base = root;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  base = base.substr(base.rfind('/') + 1);
  if (base.rfind("node", 0) != 0 || base.size() == 4) return -1;
  int n = 0;
  for (size_t i = 4; i < base.size(); ++i) {
    if (base[i] < '0' || base[i] > '9' || n > 100000) return -1;
    n = n * 10 + (base[i] - '0');
  }
  return n;
}

memento::Result<NodeBytes> MeasureRoots(const InspectArgs& args,
                                        const memento::agent::MemoryTierReport& report) {
  using namespace memento;
  NodeBytes out;
  if (report.latest_complete) {
    out.step = *report.latest_complete;
    out.step_source = "newest intact";
  }
  if (!args.store_url.empty()) {
    if (Status st = coord::ValidateName("job", args.job); !st.ok()) return st;
    Deadline deadline = Deadline::AfterSeconds(args.timeout_s);
    MEMENTO_ASSIGN_OR_RETURN(auto store,
                             coord::OpenStore(args.store_url, args.token_file, deadline));
    auto committed = coord::ReadLatestCommit(*store, args.job, deadline);
    if (!committed.ok()) {
      return committed.status().WithContext("the committed step of job '" + args.job + "'");
    }
    out.step = *committed;
    out.step_source = "committed";
    auto plan = launch::PlanFromStore(*store, args.job, deadline);
    if (!plan.ok()) return plan.status().WithContext("the plan of job '" + args.job + "'");
    out.plan = std::move(*plan);
    out.formula = launch::ReftFormula(out.plan->policy);
  }
  for (const std::string& root : args.targets) {
    std::vector<int> ranks;
    for (const auto& r : report.slots) {
      if (r.root == root && std::find(ranks.begin(), ranks.end(), r.rank) == ranks.end()) {
        ranks.push_back(r.rank);
      }
    }
    std::sort(ranks.begin(), ranks.end());
    int node = NodeOfRootName(root);
    if (out.plan && !ranks.empty() && static_cast<size_t>(ranks[0]) < out.plan->ranks.size()) {
      node = out.plan->ranks[static_cast<size_t>(ranks[0])].node;
    }
    if (ranks.empty() || out.step < 0) {
      out.unmeasured.emplace_back(root, ranks.empty() ? "no rank slots" : "no version to measure");
      continue;
    }
    auto m = launch::MeasureNodeMemory(node, root, ranks, out.step);
    if (!m.ok()) {
      out.unmeasured.emplace_back(root, m.status().ToString());
      continue;
    }
    if (out.plan) launch::AddPlanBytes(*out.plan, &*m);
    out.roots.emplace_back(root, *m);
  }
  return out;
}

nlohmann::json NodeBytesJson(const NodeBytes& b) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& [root, m] : b.roots) {
    nlohmann::json j = m.ToJson();
    j["root"] = root;
    nodes.push_back(std::move(j));
  }
  nlohmann::json unmeasured = nlohmann::json::array();
  for (const auto& [root, why] : b.unmeasured) {
    unmeasured.push_back({{"root", root}, {"error", why}});
  }
  return {{"step", b.step >= 0 ? nlohmann::json(b.step) : nlohmann::json(nullptr)},
          {"step_source", b.step_source},
          {"plan", b.plan.has_value()},
          {"formula", b.plan ? nlohmann::json(b.formula) : nlohmann::json(nullptr)},
          {"nodes", nodes},
          {"unmeasured", unmeasured}};
}

std::string FormatNodeBytes(const NodeBytes& b) {
  std::string out;
  if (b.step < 0) return "bytes per node: no version every rank holds intact\n";
  out += fmt::format(
      "bytes per node, step {} ({}; T0 = what the node's ranks copy per snapshot, T1 = the "
      "redundancy it holds for the others{}):\n",
      b.step, b.step_source,
      b.plan ? "; plan = REFT's bytes for the policy, " + b.formula
             : std::string("; the plan's bytes need --store and --job"));
  for (const auto& [root, m] : b.roots) {
    if (b.plan) {
      out += "  " + m.ToString() + "\n";
    } else {
      out += fmt::format(
          "  node{}: T0 {:.2f} MiB + T1 {:.2f} MiB per version (copied per snapshot {:.2f} MiB); "
          "resident {:.2f} MiB\n",
          m.node, m.t0_bytes / 1048576.0, m.t1_bytes / 1048576.0, m.t0_bytes / 1048576.0,
          m.resident_bytes / 1048576.0);
    }
    out += "      " + root + "\n";
  }
  for (const auto& [root, why] : b.unmeasured) out += "  " + root + ": not measured: " + why + "\n";
  return out;
}

int InspectMemory(const InspectArgs& args) {
  auto report = memento::agent::InspectMemoryTier(args.targets, args.verify);
  if (!report.ok()) return memento::tools::ReportStatus(report.status());
  const auto& latest = report->latest_complete;
  nlohmann::json scrub = nlohmann::json::object();
  for (const std::string& root : args.targets) scrub[root] = ReadScrubReport(root);
  auto bytes = MeasureRoots(args, *report);
  if (!bytes.ok()) return memento::tools::ReportStatus(bytes.status());
  if (args.json) {
    nlohmann::json slots = nlohmann::json::array();
    for (const auto& r : report->slots) {
      slots.push_back({{"root", r.root},
                       {"rank", r.rank},
                       {"slot", r.slot},
                       {"state", r.state},
                       {"step", r.step},
                       {"data_bytes", r.data_bytes},
                       {"intact", r.intact},
                       {"error", r.error}});
    }
    nlohmann::json top{{"tier", "memory"},
                       {"roots", args.targets},
                       {"verified_data", args.verify},
                       {"ranks", report->ranks},
                       {"slots", slots},
                       {"scrub", scrub},
                       {"memory", NodeBytesJson(*bytes)}};
    top["latest_complete"] = latest ? nlohmann::json(*latest) : nlohmann::json(nullptr);
    memento::tools::PrintJson("memento.inspect.memory/1", std::move(top));
    return 0;
  }
  std::printf("memory tier: %zu rank%s in %zu root%s, newest step every rank holds intact: %s%s\n",
              report->ranks.size(), report->ranks.size() == 1 ? "" : "s", args.targets.size(),
              args.targets.size() == 1 ? "" : "s",
              latest ? std::to_string(*latest).c_str() : "none",
              args.verify ? "" : " (headers only, data not verified)");
  std::printf("%-6s %-5s %-10s %-12s %-10s %-7s %s\n", "rank", "slot", "state", "step", "MiB",
              "intact", "root / problem");
  for (const auto& r : report->slots) {
    std::printf("%-6d %-5d %-10s %-12lld %-10.1f %-7s %s\n", r.rank, r.slot, r.state.c_str(),
                static_cast<long long>(r.step), r.data_bytes / 1048576.0, r.intact ? "yes" : "no",
                r.intact ? r.root.c_str() : r.error.c_str());
  }
  for (const std::string& root : args.targets) {
    std::fputs(FormatScrub(root, scrub[root]).c_str(), stdout);
  }
  std::fputs(FormatNodeBytes(*bytes).c_str(), stdout);
  return 0;
}

// ---- cluster mode ----

// A store value that should be JSON; a value that is not stays a string (an
// operator still sees it).
nlohmann::json ParseValue(const std::string& v) {
  nlohmann::json j = nlohmann::json::parse(v, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? nlohmann::json(v) : j;
}

// The time breakdown of a recovery record: its "breakdown" object when it
// has one, else every top-level number named *_s, in the phase order of
// docs/cluster.md ("Recovery", step 6) and then the rest.
std::vector<std::pair<std::string, double>> Breakdown(const nlohmann::json& rec) {
  const nlohmann::json* src = &rec;
  if (rec.contains("breakdown") && rec["breakdown"].is_object()) src = &rec["breakdown"];
  static const char* kOrder[] = {"detect",         "stop",      "restart", "restart_agent",
                                 "inventory_plan", "inventory", "plan",    "transfer",
                                 "decode",         "write",     "target",  "load"};
  std::vector<std::pair<std::string, double>> out;
  std::vector<std::string> seen;
  auto take = [&](const std::string& key) {
    if (!src->contains(key) || !(*src)[key].is_number()) return;
    std::string name = key;
    if (name.size() > 2 && name.compare(name.size() - 2, 2, "_s") == 0)
      name.resize(name.size() - 2);
    out.emplace_back(name, (*src)[key].get<double>());
    seen.push_back(key);
  };
  for (const char* k : kOrder) {
    take(std::string(k) + "_s");
    take(k);
  }
  for (auto it = src->begin(); it != src->end(); ++it) {
    const std::string& k = it.key();
    if (std::find(seen.begin(), seen.end(), k) != seen.end() || k == "total_s") continue;
    const bool timed = k.size() > 2 && k.compare(k.size() - 2, 2, "_s") == 0;
    if (it->is_number() && (timed || src != &rec)) take(k);
  }
  return out;
}

// First present field of `rec` among `keys`, as text; "-" when none.
std::string Field(const nlohmann::json& rec, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    if (!rec.contains(k) || rec[k].is_null()) continue;
    const nlohmann::json& v = rec[k];
    if (v.is_string()) return v.get<std::string>();
    return v.dump();
  }
  return "-";
}

// The cluster's state as JSON: FormatClusterJson's object plus "restore",
// "topology", "plan_hash" (null when absent) and "recoveries" (each record
// with its number "n"). *snap gets the membership snapshot.
memento::Result<nlohmann::json> ReadCluster(memento::coord::Store& store, const std::string& job,
                                            memento::Deadline deadline,
                                            memento::coord::ClusterSnapshot* snap) {
  using namespace memento;
  MEMENTO_ASSIGN_OR_RETURN(*snap, coord::ReadClusterSnapshot(store, job, deadline));
  nlohmann::json out = nlohmann::json::parse(coord::FormatClusterJson(*snap, WallNanos()));
  const coord::JobKeys keys(job);
  for (const auto& [name, key] : {std::pair<const char*, std::string>{"restore", keys.Restore()},
                                  {"topology", keys.Topology()},
                                  {"plan_hash", keys.PlanHash()}}) {
    auto kv = store.Get(key, deadline);
    if (kv.ok()) {
      out[name] = ParseValue(kv->value);
    } else if (kv.status().code() == StatusCode::kNotFound) {
      out[name] = nullptr;
    } else {
      return kv.status();
    }
  }
  MEMENTO_ASSIGN_OR_RETURN(coord::ListResult recs, store.List(keys.RecoveryPrefix(), deadline));
  out["recoveries"] = nlohmann::json::array();
  for (const coord::KeyValue& kv : recs.kvs) {
    nlohmann::json rec = ParseValue(kv.value);
    if (!rec.is_object()) rec = nlohmann::json{{"value", rec}};
    auto n = coord::ParseStep(kv.key.substr(keys.RecoveryPrefix().size()));
    rec["n"] = n.ok() ? nlohmann::json(*n) : nlohmann::json(kv.key);
    out["recoveries"].push_back(std::move(rec));
  }
  return out;
}

std::string FormatRecoveries(const nlohmann::json& recoveries) {
  std::string out = "recoveries: " + std::to_string(recoveries.size()) + "\n";
  for (const nlohmann::json& rec : recoveries) {
    char head[640];
    std::snprintf(head, sizeof(head),
                  "  #%s  failure %s  at step %s  committed %s  restored step %s  lost nodes %s  "
                  "total %s s",
                  Field(rec, {"n"}).c_str(), Field(rec, {"cause", "failure", "trigger"}).c_str(),
                  Field(rec, {"failed_step", "step_hit", "at_step"}).c_str(),
                  Field(rec, {"committed"}).c_str(), Field(rec, {"step", "restored_step"}).c_str(),
                  Field(rec, {"lost_nodes"}).c_str(), Field(rec, {"total_s"}).c_str());
    out += head;
    if (rec.contains("rebuilt_bytes") && rec["rebuilt_bytes"].is_number()) {
      char bytes[64];
      std::snprintf(bytes, sizeof(bytes), "  rebuilt %.1f MiB",
                    rec["rebuilt_bytes"].get<double>() / 1048576.0);
      out += bytes;
    }
    out += "\n";
    std::string line = "      ";
    for (const auto& [name, s] : Breakdown(rec)) {
      char part[96];
      std::snprintf(part, sizeof(part), "%s %.3f s  ", name.c_str(), s);
      line += part;
    }
    if (line.size() > 6) out += line + "\n";
    const std::string reason = Field(rec, {"reason", "error"});
    if (reason != "-" && !reason.empty()) out += "      " + reason + "\n";
  }
  return out;
}

int InspectCluster(const InspectArgs& args) {
  using namespace memento;
  if (Status st = coord::ValidateName("job", args.job); !st.ok()) {
    return tools::ReportStatus(st);
  }
  Deadline deadline = Deadline::AfterSeconds(args.timeout_s);
  auto store = coord::OpenStore(args.store_url, args.token_file, deadline);
  if (!store.ok()) return tools::ReportStatus(store.status());
  coord::ClusterSnapshot snap;
  auto report = ReadCluster(**store, args.job, deadline, &snap);
  if (!report.ok()) return tools::ReportStatus(report.status());
  const nlohmann::json& r = *report;
  if (args.json) {
    memento::tools::PrintJson("memento.inspect.cluster/1", r);
    return 0;
  }
  std::fputs(coord::FormatClusterTable(snap, WallNanos()).c_str(), stdout);
  std::printf("restore target: %s\n", r["restore"].is_null()
                                          ? "none"
                                          : ("step " + Field(r["restore"], {"step"}) +
                                             " (attempt " + Field(r["restore"], {"attempt"}) + ")")
                                                .c_str());
  if (!r["topology"].is_null()) {
    const nlohmann::json& t = r["topology"];
    std::printf("topology: dp %s tp %s pp %s zero %s policy %s, rank -> node %s\n",
                Field(t, {"dp"}).c_str(), Field(t, {"tp"}).c_str(), Field(t, {"pp"}).c_str(),
                Field(t, {"zero"}).c_str(), Field(t, {"policy"}).c_str(),
                Field(t, {"rank_node"}).c_str());
  }
  std::fputs(FormatRecoveries(r["recoveries"]).c_str(), stdout);
  return 0;
}

// One inspector per tier name.
const std::map<std::string, std::function<int(const InspectArgs&)>>& Inspectors() {
  static const auto* m = new std::map<std::string, std::function<int(const InspectArgs&)>>{
      {"durable", InspectDurable},
      {"memory", InspectMemory},
  };
  return *m;
}

int RunInspect(InspectArgs& args) {
  if (!args.store_url.empty()) {
    if (args.targets.empty()) return InspectCluster(args);
    if (args.tier != "memory") {
      return memento::tools::ReportStatus(memento::InvalidArgumentError(
          "inspect --store takes targets only with --tier memory (node roots, measured next to "
          "the job's plan); got '" +
          args.targets.front() + "' with --tier " + args.tier));
    }
  }
  if (args.targets.empty()) {
    return memento::tools::ReportStatus(memento::InvalidArgumentError(
        "inspect needs a target (--tier durable DIR, --tier memory ROOT...) or --store URL "
        "--job J"));
  }
  auto it = Inspectors().find(args.tier);
  if (it == Inspectors().end()) {
    return memento::tools::ReportStatus(memento::InvalidArgumentError(
        "inspect --tier " + args.tier + " is not available (tiers: durable, memory)"));
  }
  if (args.tier != "memory" && args.targets.size() != 1) {
    return memento::tools::ReportStatus(
        memento::InvalidArgumentError("inspect --tier " + args.tier + " takes one directory, got " +
                                      std::to_string(args.targets.size())));
  }
  args.target = args.targets.front();
  return it->second(args);
}

void Setup(CLI::App& app, memento::tools::CommandContext& ctx) {
  auto args = std::make_shared<InspectArgs>();
  auto* cmd = app.add_subcommand("inspect", "List what a tier holds, or a live cluster's state");
  cmd->add_option("--tier", args->tier, "Tier to inspect: durable (default) or memory");
  cmd->add_option("target", args->targets,
                  "What to inspect (durable: the directory; memory: node roots such as "
                  "/dev/shm/memento/JOB/node0)");
  cmd->add_option(
      "--store", args->store_url,
      "cluster: the coordination store (tcp://HOST:PORT or etcd://HOST:PORT[,...]); needs --job. "
      "With --tier memory ROOT...: each root's bytes at the job's committed step next to the "
      "plan's (REFT's) bytes");
  cmd->add_option("--job", args->job, "cluster: the job");
  cmd->add_option("--token-file", args->token_file,
                  "cluster: job token file (mode 0600); default: $MEMENTO_JOB_TOKEN");
  cmd->add_option("--timeout", args->timeout_s, "cluster: seconds to wait for the store")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->add_flag("!--no-verify", args->verify,
                "memory: read slot headers only, do not checksum the data");
  cmd->callback([&ctx, args] { ctx.exit_code = RunInspect(*args); });
}

}  // namespace
MEMENTO_REGISTER_COMMAND(inspect, Setup);
