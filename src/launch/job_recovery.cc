#include "launch/job_recovery.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <thread>

#include "common/clock.h"
#include "common/log.h"
#include "common/tensor_json.h"
#include "coord/commit.h"
#include "coord/keys.h"
#include "model/auto_plan.h"
#include "net/peer_protocol.h"
#include "net/rpc.h"
#include "net/socket.h"

namespace memento::launch {

using nlohmann::json;

Status PublishTopology(coord::Store& store, const std::string& job, const JobTopology& t,
                       Deadline deadline) {
  coord::JobKeys keys(job);
  return store.Set(keys.Topology(), topo::JobTopologyToJson(t).dump(), deadline).status();
}

Status PublishTopologyIfAbsent(coord::Store& store, const std::string& job, const JobTopology& t,
                               Deadline deadline) {
  coord::JobKeys keys(job);
  const std::string mine = topo::JobTopologyToJson(t).dump();
  MEMENTO_ASSIGN_OR_RETURN(coord::CasResult cas,
                           store.CompareAndSwap(keys.Topology(), std::nullopt, mine, deadline));
  if (cas.swapped || !cas.current.has_value()) return Status::Ok();
  // Compared as records, not as text: another writer may order the fields
  // differently.
  auto theirs = topo::ParseJobTopology(cas.current->value);
  if (theirs.ok() && topo::JobTopologyToJson(*theirs) == topo::JobTopologyToJson(t)) {
    return Status::Ok();
  }
  return FailedPreconditionError(
      fmt::format("job '{}' already has another topology at {}: {} (this agent's --topology is {})",
                  job, keys.Topology(), cas.current->value.substr(0, 400), mine));
}

namespace {

Result<json> ParseJson(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(what + " is not JSON: " + text.substr(0, 200));
  return j;
}

}  // namespace

Result<JobTopology> ReadTopology(coord::Store& store, const std::string& job, Deadline deadline) {
  coord::JobKeys keys(job);
  MEMENTO_ASSIGN_OR_RETURN(coord::KeyValue kv, store.Get(keys.Topology(), deadline));
  MEMENTO_ASSIGN_OR_RETURN(json j, ParseJson(kv.value, keys.Topology()));
  return topo::JobTopologyFromJson(j);
}

Result<topo::Inventory> ReadInventory(coord::Store& store, const std::string& job, int world_size,
                                      Deadline deadline) {
  coord::JobKeys keys(job);
  MEMENTO_ASSIGN_OR_RETURN(coord::ListResult list, store.List(keys.InventoryPrefix(), deadline));
  topo::Inventory inv(static_cast<size_t>(world_size));
  std::vector<bool> have(static_cast<size_t>(world_size), false);
  for (const coord::KeyValue& kv : list.kvs) {
    const std::string rank_text = kv.key.substr(keys.InventoryPrefix().size());
    char* end = nullptr;
    long rank = std::strtol(rank_text.c_str(), &end, 10);
    if (rank_text.empty() || *end != '\0' || rank < 0 || rank >= world_size) continue;
    MEMENTO_ASSIGN_OR_RETURN(json j, ParseJson(kv.value, kv.key));
    auto tensors = TensorListFromJson(j);
    if (!tensors.ok()) return tensors.status().WithContext(kv.key);
    inv[static_cast<size_t>(rank)] = std::move(*tensors);
    have[static_cast<size_t>(rank)] = true;
  }
  std::string missing;
  int n_missing = 0;
  for (int r = 0; r < world_size; ++r) {
    if (have[static_cast<size_t>(r)]) continue;
    if (n_missing < 8) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    ++n_missing;
  }
  if (n_missing > 0) {
    return NotFoundError("no inventory yet for " + std::to_string(n_missing) +
                         " rank(s): " + missing + (n_missing > 8 ? ", ..." : ""));
  }
  return inv;
}

Result<topo::Plan> PlanFromStore(coord::Store& store, const std::string& job, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(JobTopology t, ReadTopology(store, job, deadline));
  MEMENTO_ASSIGN_OR_RETURN(topo::Inventory inv,
                           ReadInventory(store, job, t.topology.num_ranks(), deadline));
  return model::MakeJobPlan(t.topology, inv, t.policy);
}

Result<std::vector<std::string>> ReadEndpoints(coord::Store& store, const std::string& job,
                                               int num_nodes, Deadline deadline) {
  coord::JobKeys keys(job);
  MEMENTO_ASSIGN_OR_RETURN(coord::ListResult list, store.List(keys.NodesPrefix(), deadline));
  std::vector<std::string> out(static_cast<size_t>(num_nodes));
  for (const coord::KeyValue& kv : list.kvs) {
    const std::string name = kv.key.substr(keys.NodesPrefix().size());
    Result<int> node = coord::ParseNodeName(name);
    if (node.ok() && *node < num_nodes) out[static_cast<size_t>(*node)] = kv.value;
  }
  return out;
}

// ---- recovery -----------------------------------------------------------------

json JobRecovery::ToJson() const {
  json nodes_j = json::array();
  for (const NodeRecoveryStats& n : nodes) {
    nodes_j.push_back({{"node", n.node},
                       {"ranks", n.ranks},
                       {"bytes", n.bytes},
                       {"transfer_s", n.transfer_s},
                       {"decode_s", n.decode_s},
                       {"write_s", n.write_s},
                       {"total_s", n.total_s}});
  }
  return {{"decision", recover::DecisionToJson(decision)},
          {"committed", committed},
          {"unreachable", unreachable},
          {"nodes", nodes_j},
          {"inventory_plan_s", inventory_plan_s},
          {"transfer_s", transfer_s},
          {"decode_s", decode_s},
          {"write_s", write_s},
          {"rebuild_s", rebuild_s},
          {"total_s", total_s},
          {"rebuilt_bytes", rebuilt_bytes},
          {"verification",
           {{"deferred", deferred_verify},
            {"hashed_bytes", verify_hashed_bytes},
            {"checked_by_receivers_bytes", verify_checked_by_receivers_bytes},
            {"redecided", redecided},
            {"first_attempt", first_attempt}}}};
}

namespace {

Result<std::unique_ptr<net::RpcClient>> ConnectPeer(const std::string& endpoint,
                                                    const net::JobToken& token, Deadline deadline) {
  Result<net::HostPort> hp = net::ParseHostPort(endpoint, net::PortUse::kConnect);
  if (!hp.ok()) return hp.status().WithContext("agent endpoint");
  return net::RpcClient::Connect(hp->host, hp->port, token, deadline);
}

Result<std::string> CallPeer(const std::string& endpoint, const net::JobToken& token,
                             uint32_t method, const std::string& body, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(auto client, ConnectPeer(endpoint, token, deadline));
  return client->Call(method, body, deadline);
}

double NumberOr(const json& j, const char* key, double def) {
  if (j.contains(key) && j[key].is_number()) return j[key].get<double>();
  return def;
}

}  // namespace

namespace {

// kPeerVerifyKept `phase` of `step` on every node in `nodes`, in parallel;
// the replies by node (in `nodes` order).
std::vector<Result<std::string>> VerifyKeptOnNodes(const std::vector<std::string>& endpoints,
                                                   const std::vector<int>& nodes,
                                                   const net::JobToken& token, int64_t step,
                                                   const char* phase, Deadline deadline) {
  std::vector<Result<std::string>> replies(nodes.size(), UnavailableError("not asked"));
  const std::string body = json{{"step", step}, {"phase", phase}}.dump();
  std::vector<std::thread> threads;
  for (size_t k = 0; k < nodes.size(); ++k) {
    threads.emplace_back([&, k] {
      replies[k] = CallPeer(endpoints[static_cast<size_t>(nodes[k])], token, net::kPeerVerifyKept,
                            body, deadline);
    });
  }
  for (auto& t : threads) t.join();
  return replies;
}

// One recovery attempt. `deferred`: the inventories do not hash, the agents
// verify alongside the rebuild (RecoverOptions::deferred_verify); a failure
// of one of those checks sets *check_failed.
Result<JobRecovery> RecoverJobOnce(coord::Store& store, const topo::Plan& plan,
                                   const net::JobToken& token, const RecoverOptions& options,
                                   Deadline deadline, bool deferred, bool* check_failed) {
  Stopwatch total;
  JobRecovery out;
  out.deferred_verify = deferred;
  const int n = options.num_nodes;
  MEMENTO_ASSIGN_OR_RETURN(std::vector<std::string> endpoints,
                           ReadEndpoints(store, options.job, n, deadline));

  // 2. Inventory from every agent, in parallel.
  std::vector<Result<recover::NodeInventory>> answers(static_cast<size_t>(n),
                                                      UnavailableError("not asked"));
  const bool inventory_verify = options.verify && !deferred;
  {
    const std::string body = json{{"verify", inventory_verify}}.dump();
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      if (endpoints[static_cast<size_t>(i)].empty()) {
        answers[static_cast<size_t>(i)] =
            UnavailableError("node " + std::to_string(i) + " has no live agent in the store");
        continue;
      }
      threads.emplace_back([&, i] {
        auto reply =
            CallPeer(endpoints[static_cast<size_t>(i)], token, net::kPeerInventory, body, deadline);
        if (!reply.ok()) {
          answers[static_cast<size_t>(i)] = reply.status();
          return;
        }
        json j = json::parse(*reply, nullptr, false);
        if (j.is_discarded()) {
          answers[static_cast<size_t>(i)] = InvalidArgumentError("inventory reply is not JSON");
          return;
        }
        answers[static_cast<size_t>(i)] = recover::NodeInventoryFromJson(j);
      });
    }
    for (auto& t : threads) t.join();
  }
  // An agent restarted on its root lists the redundancy it adopted before it
  // has loaded the plan again (plan_hash 0 until then): Decide would ignore
  // that redundancy as made under another plan. Ask such a node again until
  // it has the plan (a recovery started the moment its endpoint appeared,
  // e.g. by the agents' leader; at most 20 s, then as it answers).
  {
    const std::string body = json{{"verify", inventory_verify}}.dump();
    auto waiting_for_plan = [](const Result<recover::NodeInventory>& a) {
      if (!a.ok() || a->plan_hash != 0) return false;
      for (const recover::VersionHolding& v : a->versions) {
        if (!v.copies.empty() || !v.parities.empty()) return true;
      }
      return false;
    };
    const Deadline plan_wait = Deadline::AfterSeconds(20);
    for (int i = 0; i < n; ++i) {
      auto& a = answers[static_cast<size_t>(i)];
      if (!waiting_for_plan(a)) continue;
      MEMENTO_LOG_INFO("recovery: node {}'s agent has not loaded the plan yet; asking again", i);
      while (waiting_for_plan(a) && !deadline.expired() && !plan_wait.expired()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        auto reply =
            CallPeer(endpoints[static_cast<size_t>(i)], token, net::kPeerInventory, body, deadline);
        if (!reply.ok()) {
          a = reply.status();
          break;
        }
        json j = json::parse(*reply, nullptr, false);
        a = j.is_discarded() ? Result<recover::NodeInventory>(
                                   InvalidArgumentError("inventory reply is not JSON"))
                             : recover::NodeInventoryFromJson(j);
      }
    }
  }
  out.committed = options.committed;
  for (int i = 0; i < n; ++i) {
    auto& a = answers[static_cast<size_t>(i)];
    if (!a.ok()) {
      const Status& st = a.status();
      if (st.code() == StatusCode::kInvalidArgument &&
          st.message().find("unknown rpc method") != std::string::npos) {
        return FailedPreconditionError(
            "the agent of node " + std::to_string(i) +
            " does not serve the peer inventory (kPeerInventory): " + st.message());
      }
      if (st.code() != StatusCode::kUnavailable && st.code() != StatusCode::kDeadlineExceeded) {
        return st.WithContext("inventory of node " + std::to_string(i));
      }
      MEMENTO_LOG_WARN("recovery: node {} does not answer the inventory: {}", i, st.ToString());
      out.unreachable.push_back(i);
      continue;
    }
    if (a->node != i) {
      return InternalError("node " + std::to_string(i) + "'s agent answers as node " +
                           std::to_string(a->node));
    }
    out.committed = std::max(out.committed, a->committed);
    out.inventories.push_back(std::move(*a));
  }

  // 3. Plan.
  MEMENTO_ASSIGN_OR_RETURN(out.decision, recover::Decide(plan, out.inventories, out.committed));
  out.inventory_plan_s = total.Seconds();
  if (!out.decision.from_memory) {
    out.total_s = total.Seconds();
    return out;
  }

  // 3b. Deferred verification: every node that answered starts hashing what
  // nobody else checks, alongside the rebuild.
  std::vector<int> verifiers;
  if (deferred) {
    for (const recover::NodeInventory& inv : out.inventories) verifiers.push_back(inv.node);
    auto began =
        VerifyKeptOnNodes(endpoints, verifiers, token, out.decision.step, "begin", deadline);
    for (size_t k = 0; k < verifiers.size(); ++k) {
      if (!began[k].ok()) {
        *check_failed = true;
        return began[k].status().WithContext("deferred verification on node " +
                                             std::to_string(verifiers[k]));
      }
    }
  }
  Status rebuild_status;

  // 4. Execute: kPeerRecover to every node with assemblies, in parallel.
  const uint64_t plan_hash = recover::PlanHash(plan);
  std::map<int, std::vector<recover::RankAssembly>> by_node;
  for (const recover::RankAssembly& a : out.decision.assemblies) by_node[a.node].push_back(a);
  Stopwatch rebuild;
  {
    std::vector<int> order;
    for (const auto& [node, list] : by_node) order.push_back(node);
    std::vector<Result<std::string>> replies(order.size(), UnavailableError("not asked"));
    std::vector<std::thread> threads;
    for (size_t k = 0; k < order.size(); ++k) {
      const int node = order[k];
      if (node < 0 || node >= n || endpoints[static_cast<size_t>(node)].empty()) {
        replies[k] = UnavailableError("node " + std::to_string(node) + " has no live agent");
        continue;
      }
      // The assemblies in the decision's own JSON form (recover::DecisionToJson).
      recover::Decision part;
      part.from_memory = true;
      part.step = out.decision.step;
      part.assemblies = by_node[node];
      json body = {{"step", out.decision.step},
                   {"plan_hash", plan_hash},
                   {"assemblies", recover::DecisionToJson(part).at("assemblies")}};
      threads.emplace_back([&, k, node, text = body.dump()] {
        // A replacement agent answers FailedPrecondition until it has computed
        // the plan from the store (moments after it joined): retry for a while.
        Stopwatch waited;
        while (true) {
          replies[k] = CallPeer(endpoints[static_cast<size_t>(node)], token, net::kPeerRecover,
                                text, deadline);
          if (replies[k].ok() || replies[k].status().code() != StatusCode::kFailedPrecondition ||
              deadline.expired() || waited.Seconds() > 15) {
            break;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      });
    }
    if (options.on_transfer && !threads.empty()) options.on_transfer();
    for (auto& t : threads) t.join();
    for (size_t k = 0; k < order.size(); ++k) {
      if (!replies[k].ok()) {
        if (rebuild_status.ok()) {
          rebuild_status =
              replies[k].status().WithContext("recovery on node " + std::to_string(order[k]));
        }
        continue;
      }
      json j = json::parse(*replies[k], nullptr, false);
      NodeRecoveryStats s;
      s.node = order[k];
      if (!j.is_discarded() && j.is_object()) {
        if (j.contains("ranks") && j["ranks"].is_array()) {
          s.ranks = j["ranks"].get<std::vector<int>>();
        }
        s.bytes = j.value("bytes", uint64_t{0});
        s.transfer_s = NumberOr(j, "transfer_s", 0);
        s.decode_s = NumberOr(j, "decode_s", 0);
        s.write_s = NumberOr(j, "write_s", 0);
        s.total_s = NumberOr(j, "total_s", 0);
      }
      out.transfer_s = std::max(out.transfer_s, s.transfer_s);
      out.decode_s = std::max(out.decode_s, s.decode_s);
      out.write_s = std::max(out.write_s, s.write_s);
      out.rebuilt_bytes += s.bytes;
      out.nodes.push_back(std::move(s));
    }
  }
  out.rebuild_s = rebuild.Seconds();
  if (deferred) {
    // Every node's check must pass before the target is set.
    auto finished =
        VerifyKeptOnNodes(endpoints, verifiers, token, out.decision.step, "finish", deadline);
    Status verify_status;
    for (size_t k = 0; k < verifiers.size(); ++k) {
      if (!finished[k].ok()) {
        if (verify_status.ok()) {
          verify_status = finished[k].status().WithContext("deferred verification on node " +
                                                           std::to_string(verifiers[k]));
        }
        continue;
      }
      json j = json::parse(*finished[k], nullptr, false);
      if (!j.is_discarded() && j.is_object()) {
        out.verify_hashed_bytes += j.value("hashed_bytes", uint64_t{0});
        out.verify_checked_by_receivers_bytes += j.value("trusted_bytes", uint64_t{0});
      }
    }
    // A byte that failed its checksum on the way (the rebuilding agent's
    // check of what it received) or at rest (a node's own check).
    const StatusCode rc = rebuild_status.code();
    if (!verify_status.ok() || rc == StatusCode::kDataLoss || rc == StatusCode::kAborted) {
      if (!verify_status.ok() && !rebuild_status.ok()) {
        MEMENTO_LOG_WARN("recovery: the rebuild failed too: {}", rebuild_status.ToString());
      }
      // What was rebuilt may have been decoded from a bad input (a parity
      // sent before its node's check found it corrupt), with checksums
      // computed from the bad bytes: torn on every rebuilding node before
      // the next decision can count on it.
      for (const auto& [node, list] : by_node) {
        if (node < 0 || node >= n || endpoints[static_cast<size_t>(node)].empty()) continue;
        std::vector<int> ranks;
        for (const recover::RankAssembly& a : list) ranks.push_back(a.rank);
        auto d = CallPeer(
            endpoints[static_cast<size_t>(node)], token, net::kPeerVerifyKept,
            json{{"step", out.decision.step}, {"phase", "discard"}, {"ranks", ranks}}.dump(),
            deadline);
        if (!d.ok()) {
          return d.status().WithContext(
              fmt::format("discarding the slots rebuilt on node {} after a failed check ({})", node,
                          (verify_status.ok() ? rebuild_status : verify_status).ToString()));
        }
      }
      *check_failed = true;
      return verify_status.ok() ? rebuild_status : verify_status;
    }
  }
  if (!rebuild_status.ok()) return rebuild_status;

  // 5. Target: every agent answers its trainers' restore query with this step.
  json target_j = {{"step", out.decision.step}};
  if (options.epoch > 0) target_j["epoch"] = options.epoch;
  const std::string target = target_j.dump();
  for (int i = 0; i < n; ++i) {
    if (endpoints[static_cast<size_t>(i)].empty()) continue;
    auto r = CallPeer(endpoints[static_cast<size_t>(i)], token, net::kPeerSetRestoreTarget, target,
                      deadline);
    if (!r.ok()) return r.status().WithContext("set restore target on node " + std::to_string(i));
  }
  out.total_s = total.Seconds();
  return out;
}

}  // namespace

Result<JobRecovery> RecoverJob(coord::Store& store, const topo::Plan& plan,
                               const net::JobToken& token, const RecoverOptions& options,
                               Deadline deadline) {
  if (!options.verify || !options.deferred_verify) {
    return RecoverJobOnce(store, plan, token, options, deadline, /*deferred=*/false, nullptr);
  }
  Stopwatch total;
  bool check_failed = false;
  Result<JobRecovery> first =
      RecoverJobOnce(store, plan, token, options, deadline, /*deferred=*/true, &check_failed);
  if (first.ok() || !check_failed || deadline.expired()) return first;
  // Nothing was set: no restore target, and a slot being rebuilt stays
  // incomplete. Decide again on inventories that hash every slot and entry
  // (the failed one is left out, or was recorded corrupt by its node).
  MEMENTO_LOG_WARN("recovery: {}; deciding again on inventories verified now",
                   first.status().ToString());
  Result<JobRecovery> again =
      RecoverJobOnce(store, plan, token, options, deadline, /*deferred=*/false, nullptr);
  if (!again.ok()) return again;
  again->redecided = true;
  again->first_attempt = first.status().ToString();
  again->total_s = total.Seconds();
  return again;
}

json DurableLoad::ToJson() const {
  json nodes_j = json::array();
  for (const NodeDurableLoad& n : nodes) {
    nodes_j.push_back({{"node", n.node},
                       {"ranks", n.ranks},
                       {"bytes", n.bytes},
                       {"read_bytes", n.read_bytes},
                       {"read_s", n.read_s},
                       {"write_s", n.write_s},
                       {"total_s", n.total_s}});
  }
  return {{"step", step},
          {"dir", dir},
          {"nodes", nodes_j},
          {"bytes", bytes},
          {"read_bytes", read_bytes},
          {"read_s", read_s},
          {"write_s", write_s},
          {"total_s", total_s}};
}

Result<DurableLoad> LoadDurableOnEveryNode(coord::Store& store, const net::JobToken& token,
                                           const std::string& job, int num_nodes,
                                           const std::string& dir, int64_t step, Deadline deadline,
                                           uint64_t epoch, double agent_wait_s,
                                           std::vector<int>* missing) {
  Stopwatch total;
  DurableLoad out;
  out.step = step;
  out.dir = dir;
  MEMENTO_ASSIGN_OR_RETURN(std::vector<std::string> endpoints,
                           ReadEndpoints(store, job, num_nodes, deadline));
  json body_j = {{"dir", dir}, {"step", step}};
  if (epoch > 0) body_j["epoch"] = epoch;
  const std::string body = body_j.dump();
  std::vector<Result<std::string>> replies(static_cast<size_t>(num_nodes),
                                           UnavailableError("not asked"));
  std::vector<char> gone(static_cast<size_t>(num_nodes), 0);  // waited for in vain
  std::vector<std::thread> threads;
  for (int i = 0; i < num_nodes; ++i) {
    threads.emplace_back([&, i] {
      const size_t k = static_cast<size_t>(i);
      std::string endpoint = endpoints[k];
      Stopwatch unplanned;  // FailedPrecondition (no plan yet) retries of this agent
      Stopwatch missing_for, said;
      bool waiting = false;
      for (;;) {
        Status absent = Status::Ok();  // why the agent counts as missing
        if (endpoint.empty()) {
          absent =
              UnavailableError("node " + std::to_string(i) + " has no live agent in the store");
        } else {
          // A stale entry's address may accept and never answer: connecting
          // is bounded apart from the load itself.
          const Deadline connect_by(std::min(deadline.when(), Deadline::AfterSeconds(10).when()));
          auto client = ConnectPeer(endpoint, token, connect_by);
          if (!client.ok() && client.status().code() != StatusCode::kUnavailable &&
              client.status().code() != StatusCode::kDeadlineExceeded) {
            replies[k] = client.status();  // e.g. the token refused: no missing agent
            return;
          }
          if (!client.ok()) {
            absent = client.status();
          } else {
            replies[k] = (*client)->Call(net::kPeerLoadDurable, body, deadline);
            const Result<std::string>& r = replies[k];
            if (r.ok()) return;
            if (r.status().code() == StatusCode::kFailedPrecondition && !deadline.expired() &&
                unplanned.Seconds() <= 15) {
              std::this_thread::sleep_for(std::chrono::milliseconds(20));
              continue;
            }
            if (r.status().code() != StatusCode::kUnavailable) return;
            absent = r.status();  // lost mid-call
          }
        }
        if (!waiting) {
          waiting = true;
          missing_for.Reset();
          said.Reset();
          if (agent_wait_s > 0) {
            MEMENTO_LOG_WARN(
                "loading durable version {}: waiting up to {} s for node {}'s agent to register "
                "({})",
                step, agent_wait_s, i, absent.ToString());
          }
        } else if (said.Seconds() >= 5) {
          said.Reset();
          MEMENTO_LOG_INFO(
              "loading durable version {}: still waiting for node {}'s agent ({:.0f} s "
              "of {} s; {})",
              step, i, missing_for.Seconds(), agent_wait_s, absent.ToString());
        }
        if (missing_for.Seconds() >= agent_wait_s || deadline.expired()) {
          replies[k] = agent_wait_s > 0 ? UnavailableError(fmt::format(
                                              "node {}'s agent did not come back within {} s: {}",
                                              i, agent_wait_s, absent.ToString()))
                                        : Result<std::string>(absent);
          gone[k] = 1;
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        auto now = ReadEndpoints(store, job, num_nodes, Deadline::AfterSeconds(5));
        if (now.ok() && (*now)[k] != endpoint) {
          endpoint = (*now)[k];
          unplanned.Reset();
          if (!endpoint.empty()) {
            MEMENTO_LOG_INFO("loading durable version {}: node {}'s agent registered at {}", step,
                             i, endpoint);
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  if (missing != nullptr) {
    for (int i = 0; i < num_nodes; ++i) {
      if (gone[static_cast<size_t>(i)]) missing->push_back(i);
    }
  }
  for (int i = 0; i < num_nodes; ++i) {
    const Result<std::string>& r = replies[static_cast<size_t>(i)];
    if (!r.ok()) {
      return r.status().WithContext("loading durable version " + std::to_string(step) +
                                    " on node " + std::to_string(i));
    }
    json j = json::parse(*r, nullptr, false);
    NodeDurableLoad n;
    n.node = i;
    if (!j.is_discarded() && j.is_object()) {
      if (j.contains("ranks") && j["ranks"].is_array())
        n.ranks = j["ranks"].get<std::vector<int>>();
      n.bytes = j.value("bytes", uint64_t{0});
      n.read_bytes = j.value("read_bytes", uint64_t{0});
      n.read_s = NumberOr(j, "read_s", 0);
      n.write_s = NumberOr(j, "write_s", 0);
      n.total_s = NumberOr(j, "total_s", 0);
    }
    out.bytes += n.bytes;
    out.read_bytes += n.read_bytes;
    out.read_s = std::max(out.read_s, n.read_s);
    out.write_s = std::max(out.write_s, n.write_s);
    out.nodes.push_back(std::move(n));
  }
  out.total_s = total.Seconds();
  return out;
}

Result<uint64_t> NextEpoch(coord::Store& store, const std::string& job, Deadline deadline,
                           uint64_t floor) {
  const std::string key = coord::JobKeys(job).Epoch();
  uint64_t epoch = 0;
  auto kv = store.Get(key, deadline);
  if (kv.ok()) {
    char* end = nullptr;
    epoch = std::strtoull(kv->value.c_str(), &end, 10);
    if (end == kv->value.c_str() || *end != '\0') {
      return InvalidArgumentError(key + " holds '" + kv->value.substr(0, 40) + "', not a number");
    }
  } else if (kv.status().code() != StatusCode::kNotFound) {
    return kv.status();
  }
  auto latest = coord::ReadLatestCommitId(store, job, deadline);
  if (latest.ok()) {
    epoch = std::max(epoch, latest->epoch);
  } else if (latest.status().code() != StatusCode::kNotFound) {
    return latest.status();
  }
  return std::max(epoch, floor) + 1;
}

Status SetEpoch(coord::Store& store, const std::string& job, uint64_t epoch, Deadline deadline) {
  return store.Set(coord::JobKeys(job).Epoch(), std::to_string(epoch), deadline).status();
}

Result<uint64_t> BumpEpoch(coord::Store& store, const std::string& job, Deadline deadline,
                           uint64_t floor) {
  MEMENTO_ASSIGN_OR_RETURN(uint64_t epoch, NextEpoch(store, job, deadline, floor));
  MEMENTO_RETURN_IF_ERROR(SetEpoch(store, job, epoch, deadline));
  return epoch;
}

Status StartCommitEpoch(coord::Store& store, const std::string& job, uint64_t epoch, int64_t step,
                        Deadline deadline) {
  if (epoch == 0 || step < 0) {
    return InvalidArgumentError(fmt::format(
        "commit epoch {} at step {}: the epoch must be > 0 and the step >= 0", epoch, step));
  }
  MEMENTO_ASSIGN_OR_RETURN(bool moved,
                           coord::PublishCommit(store, job, step, WallNanos(), deadline, epoch));
  if (moved) MEMENTO_LOG_INFO("job {}: commit epoch {} starts at step {}", job, epoch, step);
  return Status::Ok();
}

}  // namespace memento::launch
