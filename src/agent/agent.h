// The node agent (`memento agent`): owns the job's shared-memory slots on this
// node, serves the node's trainers over a Unix socket, verifies completed
// slots in the background, and adopts the slots left by an earlier agent.
// Protocol and crash-consistency argument: docs/node_store.md. Threads:
// docs/thread_model.md.
//
//   auto agent = Agent::Start(options);   // adopts, locks, listens
//   agent->Serve();                       // until Stop()
//
// Thread safety: Stop() may be called from any thread and from a signal
// handler; everything else from the thread that owns the Agent.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent/aor_holder.h"
#include "agent/durable.h"
#include "agent/job_member.h"
#include "agent/metrics_server.h"
#include "agent/scrub.h"
#include "common/mutex.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "shm/agent_messages.h"
#include "shm/node_store.h"
#include "shm/protocol.h"

namespace memento::agent {

// The client <-> agent messages live below both (shm/agent_messages.h).
using shm::AgentOp;
using shm::AgentOpName;
using shm::AgentRequest;
using shm::ParseAgentRequest;

struct AgentOptions {
  std::string job_id;
  int node = 0;
  // Empty: shm::DefaultNodeRoot(job_id, node).
  std::string root;
  // Bytes all slots of this node may take; 0: what the filesystem holds.
  uint64_t budget_bytes = 0;
  // Verify every completed slot in the background as soon as a trainer
  // reports it. Off by default: that is one more full read of the state per
  // step, competing with training for memory bandwidth; slots are verified
  // anyway on adoption, on a version listing and by every restore.
  bool verify_on_complete = false;
  // Cluster mode (docs/cluster.md) when cluster.store_url is set: store,
  // membership, commits, redundancy (T1) and the peer service.
  JobMemberOptions cluster = {};
  // Background scrub of the slots at rest (agent/scrub.h): at most this many
  // bytes hashed per second (0: off), a pass every `scrub_interval_s`.
  uint64_t scrub_bytes_per_s = uint64_t{64} << 20;
  double scrub_interval_s = 60;
  // Remove the root (slots, socket, lock) when the agent stops cleanly
  // (Stop(), SIGTERM). Off by default: the state must survive the agent so
  // that the next agent adopts it.
  bool remove_on_exit = false;
  // Serve Prometheus metrics at http://<metrics_listen>/metrics ("host:port";
  // port 0: any free port; empty: off). docs/operating.md.
  std::string metrics_listen;
  // Cluster mode: the `target` op (a trainer's Restore() without a step)
  // first calls this, which returns once no recovery of the job is requested
  // or running (OK), or an error (the reply then). `memento agent` sets it
  // to read the agents' recovery leader's keys (launch::ReadRecoveryView),
  // so that a worker restarted by an outside supervisor (torchrun) does not
  // restore before the leader has rebuilt the lost node and published the
  // step (docs/deploy.md, "torchrun across hosts"). Unset: no wait.
  std::function<Status(Deadline)> await_recovery;
};

// What the trainers of this node reported, counted where the agent handles
// their requests (metrics; docs/operating.md).
struct SnapshotStats {
  int64_t snapshots = 0;             // 'complete' requests
  uint64_t bytes = 0;                // data bytes of the completed slots (slot headers)
  double seconds = 0;                // summed write times (header begin -> complete)
  double last_seconds = 0;           // the newest completion's write time
  int64_t skipped = 0;               // 'skipped' requests (the slot was held)
  std::map<int, int64_t> rank_step;  // rank -> newest completed step
};

class Agent {
 public:
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Opens the node store (creating the 0700 root, checking the budget against
  // the shared-memory filesystem, adopting existing slots), takes the root's
  // lock (AlreadyExists when another agent holds it) and listens on
  // <root>/agent.sock, replacing a stale socket.
  // With a non-empty `durable.dir` the agent also streams committed versions
  // to the durable tier (docs/durable_tier.md, "Persisting from live slots").
  static Result<std::unique_ptr<Agent>> Start(const AgentOptions& options,
                                              const DurableOptions& durable = {});

  // Serves trainers until Stop(). Returns OK after a Stop().
  Status Serve();
  // Async-signal-safe.
  void Stop();

  const std::string& root() const { return root_; }
  shm::NodeStore& store() { return *store_; }
  // Null without a durable directory.
  DurableStreamer* durable() { return durable_.get(); }
  // Null without --store.
  JobMember* job_member() { return job_member_.get(); }
  AorHolder& aor() { return *aor_; }
  // Null when the scrub is off.
  Scrubber* scrubber() { return scrubber_.get(); }
  SnapshotStats snapshot_stats() EXCLUDES(mu_);
  // The Prometheus text exposition of this agent's counters (what
  // --metrics-listen serves). Thread-safe.
  std::string Metrics() EXCLUDES(mu_);
  // "host:port" of the metrics endpoint; empty without --metrics-listen.
  std::string metrics_address() const;

 private:
  Agent() = default;
  void HandleConnection(int fd);
  // Answers one checked request (ParseAgentRequest); `conn_rank` is the rank
  // the connection said hello as (-1 before).
  nlohmann::json Handle(const AgentRequest& req, pid_t peer_pid, int* conn_rank);
  nlohmann::json HandleChecked(const AgentRequest& req, pid_t peer_pid, int* conn_rank);
  void VerifierLoop();
  void EnqueueVerify(int rank, int slot) EXCLUDES(mu_);
  // Counts a 'complete' request in snapshot_stats_ (bytes and write time
  // from the slot's header).
  void RecordSnapshot(int rank, int slot, int64_t step) EXCLUDES(mu_);

  AgentOptions options_;
  std::string root_;
  std::unique_ptr<shm::NodeStore> store_;
  int lock_fd_ = -1;
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};

  Mutex mu_;
  CondVar verify_cv_;
  std::deque<std::pair<int, int>> verify_queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<int> conn_fds_ GUARDED_BY(mu_);
  // rank -> pid of the live trainer connected as that rank: two processes
  // writing one rank's slots would corrupt them.
  std::map<int, pid_t> rank_owner_ GUARDED_BY(mu_);
  struct ConnThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<ConnThread> conn_threads_;  // touched by Serve() and ~Agent only
  std::thread verifier_;
  // AOR replicas fed by this node's ranks (docs/reft.md section 5); calls
  // into job_member_, which calls into it: reset after job_member_.
  std::unique_ptr<AorHolder> aor_;
  std::unique_ptr<DurableStreamer> durable_;  // reads store_'s slots; reset first
  std::unique_ptr<JobMember> job_member_;     // reads store_'s slots; reset with durable_
  std::unique_ptr<Scrubber> scrubber_;        // reads store_'s slots; reset first
  std::atomic<bool> stopped_cleanly_{false};  // Serve() returned after Stop()
  // CPU nanoseconds the connection threads spent allocating slots at Seal
  // (EnsureSlots: the kernel zeroing and faulting their pages).
  std::atomic<int64_t> seal_alloc_cpu_ns_{0};
  SnapshotStats snapshot_stats_ GUARDED_BY(mu_);
  std::unique_ptr<MetricsServer> metrics_;  // calls Metrics(); reset before everything else
};

}  // namespace memento::agent
