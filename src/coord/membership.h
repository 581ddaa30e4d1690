// Membership: which nodes of a job are alive and what each one is doing
// (REFT 4.4 workflow: HEALTHY, SNAP, COMPLETED, UNHEALTHY, OFFLINE).
//
// Each agent Join()s with a lease and a heartbeat thread that keeps it alive.
// A node whose lease expires (agent or host died, network cut) reads as
// OFFLINE. A node reports UNHEALTHY itself when its trainer died. When the
// store forgets the lease (it restarted empty), the heartbeat re-registers
// the node, restores its last signal and calls `on_reregister` so the agent
// can republish what the store lost (commit records: RepublishCommits).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "coord/keys.h"
#include "coord/store.h"

namespace memento::coord {

enum class NodeSignal : uint8_t {
  kHealthy = 0,    // up, idle or training
  kSnap = 1,       // writing a snapshot of `step`
  kCompleted = 2,  // pieces and redundancy of `step` are in memory and verified
  kUnhealthy = 3,  // the node is up but its trainer died or failed
  kOffline = 4,    // the node's lease expired (derived; never written by a live node)
};
std::string_view NodeSignalName(NodeSignal s);
[[nodiscard]] Result<NodeSignal> ParseNodeSignal(std::string_view s);

// What a node last reported. Stored as text: "<SIGNAL> <step> <wall_ns> <detail>".
struct SignalRecord {
  NodeSignal signal = NodeSignal::kHealthy;
  int64_t step = -1;
  int64_t wall_ns = 0;
  std::string detail;
  std::string Encode() const;
  [[nodiscard]] static Result<SignalRecord> Decode(const std::string& s);
};

struct NodeState {
  std::string node;
  bool alive = false;  // holds a live lease
  std::string endpoint;
  SignalRecord record;  // record.signal is kOffline when !alive
};

struct MembershipOptions {
  std::string job;
  std::string node;
  std::string endpoint;  // how peers reach this node's agent ("host:port")
  double ttl_s = 3.0;
  double heartbeat_interval_s = 0;  // 0 = ttl_s / 3
  // Called on the heartbeat thread after re-registering with a store that
  // had lost this node's lease (typically RepublishCommits). Retried on the
  // next heartbeat until it returns OK. Must not call Membership methods that
  // wait for the heartbeat thread (the destructor, Leave).
  std::function<Status()> on_reregister;
};

// Thread safety: SetSignal from any thread; Leave and the destructor from one.
class Membership {
 public:
  // Grants a lease, registers the node (signal HEALTHY) and starts the heartbeat.
  // `store` must outlive the Membership.
  [[nodiscard]] static Result<std::unique_ptr<Membership>> Join(Store* store,
                                                                MembershipOptions options,
                                                                Deadline deadline);
  // Stops the heartbeat; the lease then expires on its own (a crash looks the same).
  ~Membership();

  // Records this node's signal (persisted in the store; restored on re-registration).
  [[nodiscard]] Status SetSignal(NodeSignal signal, int64_t step, std::string detail,
                                 Deadline deadline) EXCLUDES(mu_);
  // Graceful exit: stops the heartbeat and revokes the lease (node reads OFFLINE at once).
  [[nodiscard]] Status Leave(Deadline deadline);

  LeaseId lease() EXCLUDES(mu_);
  // Completed re-registrations (including a successful on_reregister).
  uint64_t reregistrations() const { return reregistrations_.load(); }

 private:
  Membership(Store* store, MembershipOptions options);
  Status Register(Deadline deadline) EXCLUDES(mu_);
  void HeartbeatLoop();
  void StopHeartbeat() EXCLUDES(mu_);

  Store* const store_;
  const MembershipOptions options_;
  const JobKeys keys_;
  Mutex mu_;
  CondVar stop_cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  LeaseId lease_ GUARDED_BY(mu_) = 0;
  SignalRecord record_ GUARDED_BY(mu_);
  std::atomic<uint64_t> reregistrations_{0};
  std::thread heartbeat_;
};

// Every node that ever registered (has a signal record) or is registered,
// sorted by name; nodes without a live lease read OFFLINE.
[[nodiscard]] Result<std::vector<NodeState>> ReadClusterState(Store& store, const std::string& job,
                                                              Deadline deadline);

}  // namespace memento::coord
