#include "launch/netns.h"

#include <unistd.h>

#include <cstdio>
#include <random>

#include "common/log.h"
#include "common/subprocess.h"

namespace memento::launch {

namespace {

// Runs `ip ARGS...`; its output (stdout + stderr) in *out. An error naming
// the command and its output when it fails.
Status RunIp(const std::string& ip, const std::string& log, const std::vector<std::string>& args,
             std::string* out = nullptr) {
  unlink(log.c_str());
  SpawnOptions so;
  so.argv = {ip};
  so.argv.insert(so.argv.end(), args.begin(), args.end());
  so.log_path = log;
  auto p = Subprocess::Spawn(so);
  if (!p.ok()) return p.status();
  auto st = p->Wait(Deadline::AfterSeconds(30));
  std::string text = TailFile(log, 4000);
  unlink(log.c_str());
  if (out != nullptr) *out = text;
  std::string cmd = "ip";
  for (const std::string& a : args) cmd += " " + a;
  if (!st.ok()) return st.status().WithContext(cmd);
  if (!st->ok()) {
    return UnavailableError(cmd + " failed (" + st->ToString() + "): " + text);
  }
  return Status::Ok();
}

}  // namespace

std::string NodeNetwork::Unsupported() {
  if (geteuid() != 0) {
    return "--netns needs root (it creates network namespaces, veth pairs and a bridge); "
           "run memento launch as root or leave out --netns";
  }
  auto ip = FindExecutable("ip");
  if (!ip.ok()) {
    return "--netns needs the `ip` command of iproute2, which is not on PATH "
           "(apt-get install iproute2)";
  }
  return "";
}

Result<std::unique_ptr<NodeNetwork>> NodeNetwork::Create(int nodes) {
  if (std::string why = Unsupported(); !why.empty()) return FailedPreconditionError(why);
  if (nodes < 1 || nodes > 200) {
    return InvalidArgumentError("--netns supports 1..200 nodes, got " + std::to_string(nodes));
  }
  std::unique_ptr<NodeNetwork> n(new NodeNetwork());
  MEMENTO_ASSIGN_OR_RETURN(n->ip_, FindExecutable("ip"));
  n->nodes_ = nodes;
  n->ns_made_.assign(static_cast<size_t>(nodes), false);
  std::random_device rd;
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ static_cast<uint64_t>(getpid()));
  // Interface names are at most 15 bytes: "mv" + 6 + "n" + 3 digits.
  char tag[16];
  std::snprintf(tag, sizeof(tag), "%06x", static_cast<unsigned>(rng() & 0xffffff));
  n->tag_ = tag;
  n->bridge_ = "mb" + n->tag_;
  const std::string log = "/tmp/memento-netns-" + n->tag_ + ".log";

  // A /24 in 10.0.0.0/8 that no address or route of this machine touches.
  std::string addrs, routes;
  MEMENTO_RETURN_IF_ERROR(RunIp(n->ip_, log, {"-o", "-4", "addr", "show"}, &addrs));
  MEMENTO_RETURN_IF_ERROR(RunIp(n->ip_, log, {"-4", "route", "show"}, &routes));
  bool found = false;
  for (int tries = 0; tries < 1000 && !found; ++tries) {
    n->subnet_a_ = 16 + static_cast<int>(rng() % 224);
    n->subnet_b_ = static_cast<int>(rng() % 256);
    const std::string prefix =
        "10." + std::to_string(n->subnet_a_) + "." + std::to_string(n->subnet_b_) + ".";
    const std::string net8 = "10.0.0.0/8";
    found = addrs.find(prefix) == std::string::npos && routes.find(prefix) == std::string::npos &&
            routes.find(net8) == std::string::npos;
  }
  if (!found) return UnavailableError("--netns: no free 10.x.y.0/24 subnet on this machine");

  // Everything made so far is undone by the destructor when a step fails.
  auto ip = [&](std::vector<std::string> args) { return RunIp(n->ip_, log, args); };
  MEMENTO_RETURN_IF_ERROR(ip({"link", "add", n->bridge_, "type", "bridge"}));
  n->bridge_made_ = true;
  MEMENTO_RETURN_IF_ERROR(ip({"addr", "add", n->BridgeAddress() + "/24", "dev", n->bridge_}));
  MEMENTO_RETURN_IF_ERROR(ip({"link", "set", n->bridge_, "up"}));
  for (int i = 0; i < nodes; ++i) {
    const std::string ns = n->Namespace(i);
    MEMENTO_RETURN_IF_ERROR(ip({"netns", "add", ns}));
    n->ns_made_[static_cast<size_t>(i)] = true;
    MEMENTO_RETURN_IF_ERROR(
        ip({"link", "add", n->HostVeth(i), "type", "veth", "peer", "name", n->NodeVeth(i)}));
    MEMENTO_RETURN_IF_ERROR(ip({"link", "set", n->NodeVeth(i), "netns", ns}));
    MEMENTO_RETURN_IF_ERROR(ip({"link", "set", n->HostVeth(i), "master", n->bridge_}));
    MEMENTO_RETURN_IF_ERROR(ip({"link", "set", n->HostVeth(i), "up"}));
    MEMENTO_RETURN_IF_ERROR(
        ip({"-n", ns, "addr", "add", n->NodeAddress(i) + "/24", "dev", n->NodeVeth(i)}));
    MEMENTO_RETURN_IF_ERROR(ip({"-n", ns, "link", "set", n->NodeVeth(i), "up"}));
    MEMENTO_RETURN_IF_ERROR(ip({"-n", ns, "link", "set", "lo", "up"}));
    // The root namespace's other addresses (an external store) via the bridge.
    MEMENTO_RETURN_IF_ERROR(ip({"-n", ns, "route", "add", "default", "via", n->BridgeAddress()}));
  }
  return n;
}

std::string NodeNetwork::Address(int host) const {
  return "10." + std::to_string(subnet_a_) + "." + std::to_string(subnet_b_) + "." +
         std::to_string(host);
}

std::string NodeNetwork::Namespace(int node) const {
  return "mn" + tag_ + "n" + std::to_string(node);
}
std::string NodeNetwork::HostVeth(int node) const {
  return "mv" + tag_ + "n" + std::to_string(node);
}
std::string NodeNetwork::NodeVeth(int node) const {
  return "mp" + tag_ + "n" + std::to_string(node);
}

std::vector<std::string> NodeNetwork::ExecPrefix(int node) const {
  return {ip_, "netns", "exec", Namespace(node)};
}

Status NodeNetwork::SetNodeLink(int node, bool up) {
  if (node < 0 || node >= nodes_) return InvalidArgumentError("no node " + std::to_string(node));
  return RunIp(ip_, "/tmp/memento-netns-" + tag_ + ".log",
               {"link", "set", HostVeth(node), up ? "up" : "down"});
}

std::string NodeNetwork::Describe() const {
  return "bridge " + bridge_ + " " + BridgeAddress() + "/24, " + std::to_string(nodes_) +
         " namespace(s) " + Namespace(0) + (nodes_ > 1 ? ".." + std::to_string(nodes_ - 1) : "") +
         " (" + NodeAddress(0) + (nodes_ > 1 ? ".." + std::to_string(10 + nodes_ - 1) : "") + ")";
}

void NodeNetwork::Teardown() {
  const std::string log = "/tmp/memento-netns-" + tag_ + ".log";
  // Deleting a namespace deletes the veth inside it and with it its peer.
  for (int i = 0; i < nodes_; ++i) {
    if (!ns_made_[static_cast<size_t>(i)]) continue;
    Status st = RunIp(ip_, log, {"netns", "del", Namespace(i)});
    if (!st.ok()) MEMENTO_LOG_WARN("--netns cleanup: {}", st.ToString());
    ns_made_[static_cast<size_t>(i)] = false;
    // A veth pair that never moved into the namespace is still here.
    if (access(("/sys/class/net/" + HostVeth(i)).c_str(), F_OK) == 0) {
      RunIp(ip_, log, {"link", "del", HostVeth(i)}).IgnoreError();
    }
  }
  if (bridge_made_) {
    Status st = RunIp(ip_, log, {"link", "del", bridge_});
    if (!st.ok()) MEMENTO_LOG_WARN("--netns cleanup: {}", st.ToString());
    bridge_made_ = false;
  }
}

}  // namespace memento::launch
