// The agent's peer service: serves src/net/peer_protocol.h to other agents
// and the launcher over the authenticated RPC transport (src/net), and the
// ClusterReader that recovery reads bytes through (recover::ByteReader).
// docs/cluster.md has the flow; docs/peer_service.md the thread model.
//
//   kPeerInventory          T0 ranks per step (node store) + T1 entries
//                           (redundancy store), newest first.
//   kPeerRead               bytes of a piece (T0 slot, copied and re-checked
//                           against a concurrent overwrite) or of a copy /
//                           parity (sent straight from shared memory).
//   kPeerReadStream         the same bytes as digest frames straight from
//                           shared memory (the recovery data path).
//   kPeerPush               a peer copy in parts, written into the
//                           redundancy store, finished (checksummed) at the end.
//   kPeerRecover            rebuilds T0 slots (recover::ExecuteAssemblies).
//   kPeerSetRestoreTarget   tells the agent the step the cluster restores.
//   kPeerLoadDurable        loads a durable version into T0 and targets it.
//
// Thread safety: PeerService runs each connection's requests on that
// connection's thread (net::RpcServer), so the callbacks in the options are
// called from several threads at once and must be thread-safe. ClusterReader
// is thread-safe (a small pool of connections per peer).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "agent/piece_reader.h"
#include "agent/redundancy.h"
#include "common/mutex.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "net/job_token.h"
#include "net/rpc.h"
#include "recover/recipe.h"
#include "recover/source.h"
#include "shm/node_store.h"
#include "topo/plan.h"

namespace memento::agent {

// The plan the cluster acts on, with the tensor inventory it was made from
// and its hash (recover::PlanHash). Immutable once built; shared.
struct ClusterPlan {
  topo::Plan plan;
  topo::Inventory inventory;
  uint64_t hash = 0;
};
std::shared_ptr<const ClusterPlan> MakeClusterPlan(topo::Plan plan, topo::Inventory inventory);

// Returns the current plan, or FailedPrecondition "no plan yet".
using PlanSource = std::function<Result<std::shared_ptr<const ClusterPlan>>()>;

// The plan from `source`, waiting while it answers FailedPrecondition (an
// agent that just restarted has no plan until it has read the topology and
// the ranks' inventories again) for at most `wait_s` seconds and never past
// `deadline` less a margin of a tenth of the time left (so that a caller
// that waits with the same deadline receives the answer). Any other error
// is returned at once; after the wait, FailedPrecondition saying how long it
// waited. docs/reft.md section 1, "Restore after an agent restart".
Result<std::shared_ptr<const ClusterPlan>> WaitForPlan(const PlanSource& source, double wait_s,
                                                       Deadline deadline);
// How long a piece request (kPeerRead / kPeerReadStream of a T0 piece) and
// an `assemble` wait for a plan by default.
inline constexpr double kDefaultPlanWaitS = 30;
// "host:port" of node `node`'s peer service; NotFound / Unavailable when unknown.
using EndpointSource = std::function<Result<std::string>(int node)>;

// Largest byte count one kPeerRead may ask for (ClusterReader splits larger
// reads); below the transport's frame limit.
inline constexpr uint64_t kMaxPeerReadBytes = uint64_t{64} << 20;
// Largest payload of one kPeerPush part.
inline constexpr uint64_t kMaxPushPartBytes = uint64_t{8} << 20;
// Defaults of PeerServiceOptions::max_request_bytes / max_buffered_bytes.
inline constexpr uint64_t kDefaultPeerMaxRequestBytes = uint64_t{64} << 20;
inline constexpr uint64_t kDefaultPeerMaxBufferedBytes = uint64_t{256} << 20;
// Largest data frame of a kPeerReadStream reply of copy / parity bytes
// (hashed, then sent while still in cache).
inline constexpr uint64_t kPeerStreamPartBytes = uint64_t{1} << 20;

// ---- reading bytes anywhere in the cluster ---------------------------------

struct ClusterReaderOptions {
  int node = -1;                          // this node
  PieceReader* pieces = nullptr;          // this node's T0; not owned, outlives the reader
  RedundancyStore* redundancy = nullptr;  // this node's T1; not owned, outlives the reader
  PlanSource plan;
  EndpointSource endpoint_of;
  size_t connections_per_peer = 4;
  // Remote reads through kPeerRead (staged, re-checked copy; one frame per
  // request) instead of kPeerReadStream: the data path before streaming,
  // for comparisons (`memento bench recover --data-path legacy`).
  bool legacy_reads = false;
  // Streamed reads received through a per-connection buffer and copied into
  // place (net::RpcClient::set_staged_receive); their digests then vouch for
  // that buffer only, so the executor re-verifies every chunk
  // (recover::ExecuteOptions::trust_arrival_digests = false).
  bool staged_receive = false;
};

// recover::ByteReader for an agent: its own node from memory (PieceReader,
// RedundancyStore), other nodes through their peer service (kPeerRead,
// received with RpcClient::CallInto straight into the destination).
// Connections are pooled per peer (at most connections_per_peer); a broken
// one is dropped and the next call reconnects (endpoint asked again, so a
// restarted peer on another port is found). A failed call on a pooled
// connection is retried once on a fresh one.
class ClusterReader final : public recover::ByteReader {
 public:
  ClusterReader(ClusterReaderOptions options, net::JobToken token);
  ~ClusterReader() override;
  Status Read(int node, const recover::ReadRequest& req, void* dst, Deadline deadline) override
      EXCLUDES(mu_);
  // Remote reads report the digests of the frames they arrived in (T0
  // pieces: the source slot's chunk checksums).
  Status ReadWithDigests(int node, const recover::ReadRequest& req, void* dst, Deadline deadline,
                         const DigestFn& on_digest) override EXCLUDES(mu_);
  // Drops every pooled connection (peers restarted, tests).
  void Reset() EXCLUDES(mu_);

 private:
  struct Pool {
    std::vector<std::unique_ptr<net::RpcClient>> idle;
    size_t open = 0;  // idle + in use
  };
  Status ReadLocal(const recover::ReadRequest& req, void* dst);
  Status ReadRemote(int node, const recover::ReadRequest& req, void* dst, Deadline deadline,
                    const DigestFn& on_digest);
  // The path before streaming (kPeerRead, one reply frame per request of at
  // most kMaxPeerReadBytes), kept for comparison: `legacy_reads`.
  Status ReadRemoteLegacy(int node, const recover::ReadRequest& req, void* dst, Deadline deadline);
  // An idle client or a new connection (waits while the pool is full).
  Result<std::unique_ptr<net::RpcClient>> Acquire(int node, Deadline deadline, bool* pooled)
      EXCLUDES(mu_);
  void Release(int node, std::unique_ptr<net::RpcClient> client) EXCLUDES(mu_);

  const ClusterReaderOptions options_;
  const net::JobToken token_;
  Mutex mu_;
  CondVar cv_;  // a connection was released or closed (waiters of every peer share it)
  std::map<int, Pool> pools_ GUARDED_BY(mu_);
};

// ---- pushing a peer copy -----------------------------------------------------

// Sends bytes[0, len) as plan Copy `copy_id` of version `step` to the peer
// service at `endpoint` (kPeerPush), in parts of at most kMaxPushPartBytes,
// the last one carrying the xxHash3 of the whole copy (the receiver checks it
// before it finishes the entry). The receiver creates the version if needed.
// Errors: the receiver's Status (InvalidArgument for a wrong size / id /
// step, FailedPrecondition when it has no plan or already finished the
// entry), Unavailable when it cannot be reached.
[[nodiscard]] Status PushCopy(const std::string& endpoint, const net::JobToken& token, int64_t step,
                              uint32_t copy_id, const void* bytes, size_t len, Deadline deadline);
// The same over an existing connection.
[[nodiscard]] Status PushCopy(net::RpcClient& client, int64_t step, uint32_t copy_id,
                              const void* bytes, size_t len, Deadline deadline);

// ---- the service ---------------------------------------------------------------

struct PeerServiceOptions {
  std::string job;
  int node = -1;
  std::string host = "127.0.0.1";         // listen address
  int port = 0;                           // 0: ephemeral (read back with port())
  std::string advertise_host;             // host in the endpoint peers use; "" = host
  shm::NodeStore* store = nullptr;        // this node's T0; not owned, outlives the service
  RedundancyStore* redundancy = nullptr;  // this node's T1; not owned, outlives the service
  PlanSource plan;                        // required
  // A request for a T0 piece that arrives before this node has a plan (its
  // agent restarted a moment ago) waits this long for it (WaitForPlan).
  double plan_wait_s = kDefaultPlanWaitS;
  EndpointSource endpoint_of;          // other nodes' peer services (recovery reads)
  std::function<int64_t()> committed;  // newest committed step, -1 none; may be empty
  // kPeerSetRestoreTarget (and kPeerLoadDurable): the step and the epoch the
  // job's history restarts in (0: none given); FailedPrecondition to the
  // caller when empty.
  std::function<Status(int64_t step, uint64_t epoch)> set_restore_target;
  // Called (no lock held) after a pushed copy was finished in the redundancy
  // store, e.g. to wake the save path waiting for its T1 of `step`. May be empty.
  std::function<void(int64_t step, recover::ByteSource entry)> on_push_finished;
  // The kAor copies of `step` this node recomputed on the host (AOR; the
  // inventory's aor_copies). May be empty.
  std::function<std::vector<uint32_t>(int64_t step)> aor_copies;
  size_t connections_per_peer = 4;
  // What the service's connections may hold in received requests: one
  // request (one connection; a kPeerPush part is at most kMaxPushPartBytes)
  // and all connections together (docs/transport.md, "Memory caps";
  // `memento agent --peer-max-request`, `--peer-max-buffered`).
  uint64_t max_request_bytes = kDefaultPeerMaxRequestBytes;
  uint64_t max_buffered_bytes = kDefaultPeerMaxBufferedBytes;
  // Recovery data path variants, for comparisons only (docs/peer_service.md,
  // docs/recovery.md "Staged receive"; `memento bench recover --data-path
  // legacy --receive staged`). legacy_reads: the data path before streaming.
  // staged_receive: through a reused buffer, every chunk re-verified in the
  // slot at the end, instead of straight into the slot trusting the digests
  // checked there. `memento agent` takes them from MEMENTO_RECOVER_DATA_PATH
  // and MEMENTO_RECOVER_RECEIVE (tools/cmd_agent.cc, the one place).
  bool legacy_reads = false;
  bool staged_receive = false;
};

// What this node's peer service did for recoveries (metrics,
// docs/operating.md): counted in the handlers that do the work.
struct PeerServiceStats {
  int64_t rebuilds = 0;             // kPeerRecover requests that rebuilt ranks here
  int64_t rebuild_failures = 0;     // kPeerRecover requests that failed
  uint64_t rebuilt_bytes = 0;       // bytes written into T0 slots by rebuilds
  uint64_t rebuild_read_bytes = 0;  // bytes the rebuilds read (local memory and peers)
  double transfer_s = 0, decode_s = 0, write_s = 0, rebuild_s = 0;  // summed over rebuilds
  int64_t durable_loads = 0;        // kPeerLoadDurable requests served
  uint64_t durable_load_bytes = 0;  // written into T0 slots
  double durable_load_s = 0;        // summed
  int64_t restore_targets = 0;      // restore targets set (kPeerSetRestoreTarget, durable loads)
  int64_t last_restore_target = -1;
  uint64_t refused = 0;  // connections refused (failed authentication)
};

class PeerService {
 public:
  // Starts serving. InvalidArgument when a required option is missing,
  // Unavailable / ErrnoError when the address cannot be bound.
  [[nodiscard]] static Result<std::unique_ptr<PeerService>> Start(PeerServiceOptions options,
                                                                  net::JobToken token);
  ~PeerService();
  PeerService(const PeerService&) = delete;
  PeerService& operator=(const PeerService&) = delete;

  int port() const { return rpc_.port(); }
  // "advertise_host:port".
  std::string endpoint() const;
  // The node's reader (local memory + peers), also used by kPeerRecover.
  ClusterReader& reader() { return *reader_; }
  PieceReader& pieces() { return *pieces_; }
  // This node's inventory (what kPeerInventory answers).
  recover::NodeInventory Inventory(bool verify);
  // The total receive cap's account (tests).
  const net::MemoryBudget* budget() const { return rpc_.budget(); }
  // Connections refused so far (failed authentication).
  uint64_t refused() const { return rpc_.server() ? rpc_.server()->refused() : 0; }
  PeerServiceStats stats() EXCLUDES(stats_mu_);
  // Stops accepting and closes every connection; idempotent.
  void Stop() { rpc_.Stop(); }

 private:
  PeerService(PeerServiceOptions options, net::JobToken token);
  void RegisterMethods();
  Status HandleRead(std::string_view body, Deadline deadline, const net::RpcServer::ReplyFn& reply);
  Status HandleReadStream(std::string_view body, Deadline deadline,
                          const net::RpcServer::DataFn& data);
  Result<std::string> HandlePush(std::string_view body);
  Result<std::string> HandleRecover(std::string_view body, Deadline deadline);
  Result<std::string> HandleSetRestoreTarget(std::string_view body);
  Result<std::string> HandleLoadDurable(std::string_view body);
  // kPeerVerifyKept: the survivors' deferred verification of a recovery.
  Result<std::string> HandleVerifyKept(std::string_view body) EXCLUDES(kept_run_mu_);
  struct KeptSession;
  // Ends (joins) the session's background pass, if any.
  void EndKeptSession() REQUIRES(kept_run_mu_);

  const PeerServiceOptions options_;
  const net::JobToken token_;
  std::unique_ptr<PieceReader> pieces_;
  std::unique_ptr<ClusterReader> reader_;
  recover::ExecuteOptions exec_options_;  // kPeerRecover; set at Start
  Mutex stats_mu_;
  PeerServiceStats stats_ GUARDED_BY(stats_mu_);
  // kPeerVerifyKept: one session at a time (begin .. finish), serialised by
  // kept_run_mu_; kept_mu_ guards what the serving threads record (the whole
  // chunks streamed with their table checksum while a session of that step
  // is open: (rank, slot generation, chunk index)).
  Mutex kept_run_mu_;
  std::unique_ptr<KeptSession> kept_ GUARDED_BY(kept_run_mu_);
  Mutex kept_mu_;
  int64_t kept_step_ GUARDED_BY(kept_mu_) = -1;  // -1: no session records
  std::set<std::tuple<int, uint64_t, size_t>> sent_whole_ GUARDED_BY(kept_mu_);
  net::RpcServer rpc_;
};

}  // namespace memento::agent
