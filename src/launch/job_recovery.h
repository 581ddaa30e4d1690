// The launcher's view of a job in the coordination store, and the
// recovery orchestration of docs/cluster.md ("Recovery", steps 2-6):
//
//   PublishTopology   /memento/<job>/topology (the launcher, before agents start)
//   ReadInventory     every rank's registered tensors (/memento/<job>/inventory/<rank>)
//   PlanFromStore     model::MakeJobPlan(topology, inventory, policy): what every agent computes
//   RecoverJob    inventory (kPeerInventory, verify) from every agent, recover::Decide,
//                     kPeerRecover to the nodes with assemblies, kPeerSetRestoreTarget on all
//
// `memento launch` calls them; `memento bench recover` and tests may too.
//
// Thread safety: free functions; RecoverJob uses its own threads (one per
// node) and the thread-safe Store.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coord/store.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "memento/types.h"
#include "net/job_token.h"
#include "recover/recover.h"
#include "topo/plan.h"
#include "topo/topology_json.h"

namespace memento::launch {

// What `memento launch` publishes at /memento/<job>/topology. Its codec is
// topo::JobTopologyToJson / JobTopologyFromJson (src/topo/topology_json.h);
// node names are coord::NodeName; tensor lists memento::TensorListFromJson
// (src/common/tensor_json.h).
using JobTopology = topo::JobTopology;

[[nodiscard]] Status PublishTopology(coord::Store& store, const std::string& job,
                                     const JobTopology& t, Deadline deadline);
[[nodiscard]] Result<JobTopology> ReadTopology(coord::Store& store, const std::string& job,
                                               Deadline deadline);
// For jobs that no launcher starts (torchrun on every host, `memento agent
// --topology`): publishes `t` unless the job already has a topology. OK when
// it has this one (every node's agent publishes the same record);
// FailedPrecondition quoting both records when it has another (an agent
// started with a different --topology than the job's).
[[nodiscard]] Status PublishTopologyIfAbsent(coord::Store& store, const std::string& job,
                                             const JobTopology& t, Deadline deadline);

// Every rank's tensors from the store. NotFound (naming the missing ranks)
// until every rank of the topology published its inventory.
[[nodiscard]] Result<topo::Inventory> ReadInventory(coord::Store& store, const std::string& job,
                                                    int world_size, Deadline deadline);

// The job's plan as the agents compute it. NotFound while inventories are missing.
[[nodiscard]] Result<topo::Plan> PlanFromStore(coord::Store& store, const std::string& job,
                                               Deadline deadline);

// The endpoints ("host:port") of the live agents, by node index (empty: absent).
[[nodiscard]] Result<std::vector<std::string>> ReadEndpoints(coord::Store& store,
                                                             const std::string& job, int num_nodes,
                                                             Deadline deadline);

// One node's answer to kPeerRecover.
struct NodeRecoveryStats {
  int node = -1;
  std::vector<int> ranks;
  uint64_t bytes = 0;
  double transfer_s = 0, decode_s = 0, write_s = 0, total_s = 0;
};

struct JobRecovery {
  recover::Decision decision;
  std::vector<recover::NodeInventory> inventories;  // the agents that answered
  std::vector<int> unreachable;                     // nodes that did not answer
  std::vector<NodeRecoveryStats> nodes;             // nodes that rebuilt ranks
  int64_t committed = -1;                           // the newest commit known
  // Seconds: inventory + Decide, the slowest node's transfer / decode / write,
  // the kPeerRecover round, and everything (inventory to restore target set).
  double inventory_plan_s = 0;
  double transfer_s = 0, decode_s = 0, write_s = 0;
  double rebuild_s = 0;
  double total_s = 0;
  uint64_t rebuilt_bytes = 0;
  // The survivors' deferred verification (RecoverOptions::deferred_verify):
  // whether this recovery decided on inventories without hashing and
  // verified alongside the rebuild, the bytes the agents hashed for it, and
  // the bytes of whole chunks they streamed that their receivers checked
  // instead. `redecided`: a check failed there, and the recovery decided
  // again on inventories that hash everything (`first_attempt` says why);
  // the figures are then the second attempt's.
  bool deferred_verify = false;
  uint64_t verify_hashed_bytes = 0;
  uint64_t verify_checked_by_receivers_bytes = 0;
  bool redecided = false;
  std::string first_attempt;
  nlohmann::json ToJson() const;
};

struct RecoverOptions {
  std::string job;
  int num_nodes = 0;
  // The newest committed step known to the caller (the store's commit/latest);
  // the agents' CommitLogs may raise it.
  int64_t committed = -1;
  // Checksum every slot and redundancy entry the recovery relies on before
  // the restore target is set (docs/cluster.md).
  bool verify = true;
  // With `verify`: decide on inventories that do not hash (a slot or entry
  // an earlier verification found corrupt is still left out), and verify
  // alongside the rebuild instead (kPeerVerifyKept): each agent hashes what
  // it keeps and what it serves other than whole chunks streamed with their
  // table checksum (their receiver checks those); the restore target is set
  // only when every check passed. When one fails (a survivor's byte, a
  // chunk the rebuilding agent received), the recovery decides again within
  // this call on inventories with `verify: true`, which leave the bad slot or
  // entry out (docs/recovery.md, "The survivors' verification"). false: the
  // inventories hash everything before the decision.
  bool deferred_verify = true;
  // The recovery's new commit epoch (BumpEpoch; 0: none): sent with the
  // restore target, so every agent reports the steps trained after it in
  // that epoch (coord::CommitId). The caller then publishes the restored
  // step as the epoch's first commit (StartCommitEpoch).
  uint64_t epoch = 0;
  // Called on the caller's thread right after the rebuild requests
  // (kPeerRecover) went out, while the agents' transfers run; not called
  // when nothing is rebuilt. `memento launch --inject ...@transfer=K` kills
  // there (launch/inject.h).
  std::function<void()> on_transfer;
};

// Recovery steps 2-5 of docs/cluster.md against the live agents. Returns OK
// with decision.from_memory == false when memory cannot rebuild any committed
// version (decision.reason names the lost pieces); nothing was changed then.
// Errors: an agent that fails kPeerRecover or kPeerSetRestoreTarget (the
// message names the node).
// `token` authenticates the launcher to the agents' peer services.
[[nodiscard]] Result<JobRecovery> RecoverJob(coord::Store& store, const topo::Plan& plan,
                                             const net::JobToken& token,
                                             const RecoverOptions& options, Deadline deadline);

// ---- the durable-tier fallback (docs/recovery.md, "Fallback to the durable tier") ----

// One node's answer to kPeerLoadDurable (agent::DurableLoadStats).
struct NodeDurableLoad {
  int node = -1;
  std::vector<int> ranks;
  uint64_t bytes = 0;       // written into T0 slots
  uint64_t read_bytes = 0;  // read from the durable tier
  double read_s = 0, write_s = 0, total_s = 0;
};

struct DurableLoad {
  int64_t step = -1;
  std::string dir;
  std::vector<NodeDurableLoad> nodes;
  uint64_t bytes = 0, read_bytes = 0;  // summed over the nodes
  double read_s = 0, write_s = 0;      // the slowest node's
  double total_s = 0;                  // wall time, every node in parallel
  nlohmann::json ToJson() const;
};

// kPeerLoadDurable {"dir", "step"} on every node's agent, in parallel (an
// agent without its plan yet, e.g. a replacement, answers FailedPrecondition
// and is asked again for up to 15 s): each one writes complete, verified T0
// slots of `step` for its ranks from the durable version and makes `step`
// its restore target. Errors name the node (the first failure).
// `epoch` as RecoverOptions::epoch.
//
// A node whose agent is missing (no live entry in the store, a stale entry
// that refuses connections, or the connection lost mid-call) is waited for:
// the store is read again until an agent registers for it (a replacement
// host), for up to `agent_wait_s` (and `deadline`), logging every 5 s which
// node it waits for. Past that the error is Unavailable, "node N's agent did
// not come back within W s: <last error>", and the node is appended to
// `*missing` (when given): no version can load without it.
// agent_wait_s 0: one try per node, no wait.
[[nodiscard]] Result<DurableLoad> LoadDurableOnEveryNode(
    coord::Store& store, const net::JobToken& token, const std::string& job, int num_nodes,
    const std::string& dir, int64_t step, Deadline deadline, uint64_t epoch = 0,
    double agent_wait_s = 0, std::vector<int>* missing = nullptr);

// /memento/<job>/epoch: the job's history counter (decimal, absent = 0).
// Every recovery raises it; agents write their durable parts with the
// current value (node 0 commits a version only from markers of its own
// epoch), and it is the recovery's commit epoch (coord::CommitId,
// StartCommitEpoch).
//
// NextEpoch: the value a recovery takes, without writing it: above the
// key's, above the epoch of commit/latest (a store that restarted empty lost
// the key, and the agents republished their newest commit) and above `floor`
// (the newest epoch the caller saw). The recovery sends it with the restore
// targets and writes the key (SetEpoch) once every node loaded the restored
// version, so that no durable part of the abandoned history is written in
// it.
[[nodiscard]] Result<uint64_t> NextEpoch(coord::Store& store, const std::string& job,
                                         Deadline deadline, uint64_t floor = 0);
[[nodiscard]] Status SetEpoch(coord::Store& store, const std::string& job, uint64_t epoch,
                              Deadline deadline);
// NextEpoch, then SetEpoch; returns the new value.
[[nodiscard]] Result<uint64_t> BumpEpoch(coord::Store& store, const std::string& job,
                                         Deadline deadline, uint64_t floor = 0);
// The job's history restarts at `step` in `epoch` (every rank restores
// `step`): commit/latest = step@epoch, the epoch's first commit. The
// coordinators go on in that epoch and the agents' commit followers rewind
// to `step` (docs/coordination.md, "Epochs"). OK too when commit/latest is
// already at or above it.
[[nodiscard]] Status StartCommitEpoch(coord::Store& store, const std::string& job, uint64_t epoch,
                                      int64_t step, Deadline deadline);

}  // namespace memento::launch
