// `memento launch --netns` (docs/launch.md, "Network namespaces"): every
// simulated node in its own Linux network namespace, so the traffic between
// agents, the store and the trainers crosses real interfaces:
//
//   root namespace:  bridge mb<tag>, 10.A.B.1/24   (store, launcher)
//   node i:          namespace mn<tag>n<i>, veth mp<tag>n<i> = 10.A.B.(10+i)/24
//                    (agent and trainers), its peer mv<tag>n<i> on the bridge
//
// <tag> is unique per launch (pid + random), so parallel launches do not
// clash; 10.A.B.0/24 is chosen so that no interface of the machine has an
// address in it. Needs root and iproute2's `ip`.
//
// NodeNetwork is the cleanup guard: its destructor (and Teardown) deletes the
// namespaces (with their veths) and the bridge, on every exit path of the
// launcher that runs destructors (normal end, failure, SIGINT / SIGTERM
// through Launcher::RequestStop).
//
// Thread safety: one thread (the launcher's supervisor).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "memento/status.h"

namespace memento::launch {

class NodeNetwork {
 public:
  // FailedPrecondition with a clear reason when not root or `ip` is missing;
  // the `ip` error (and nothing left behind) when a step fails.
  [[nodiscard]] static Result<std::unique_ptr<NodeNetwork>> Create(int nodes);
  ~NodeNetwork() { Teardown(); }
  NodeNetwork(const NodeNetwork&) = delete;
  NodeNetwork& operator=(const NodeNetwork&) = delete;

  // Why --netns cannot work here ("" when it can): not root, or no `ip`.
  static std::string Unsupported();

  const std::string& bridge() const { return bridge_; }
  // 10.A.B.1: the store and the launcher listen here.
  std::string BridgeAddress() const { return Address(1); }
  // 10.A.B.(10+node): the node's agent listens here.
  std::string NodeAddress(int node) const { return Address(10 + node); }
  std::string Namespace(int node) const;
  // argv prefix that runs a program in node `node`'s namespace.
  std::vector<std::string> ExecPrefix(int node) const;
  // Takes node `node`'s link down (a lost host) or up again (its replacement).
  [[nodiscard]] Status SetNodeLink(int node, bool up);
  // "bridge mb1a2b3c 10.A.B.1/24, 4 namespaces mn1a2b3cn0..3 (10.A.B.10..13)".
  std::string Describe() const;
  // Deletes the namespaces and the bridge (idempotent; errors are logged).
  void Teardown();

 private:
  NodeNetwork() = default;
  std::string Address(int host) const;
  std::string HostVeth(int node) const;
  std::string NodeVeth(int node) const;

  std::string ip_;   // the `ip` binary
  std::string tag_;  // unique per launch
  std::string bridge_;
  int subnet_a_ = 0, subnet_b_ = 0;
  int nodes_ = 0;
  bool bridge_made_ = false;
  std::vector<bool> ns_made_;
};

}  // namespace memento::launch
