#include "coord/membership.h"

#include <fmt/format.h>

#include <map>
#include <sstream>

#include "common/clock.h"
#include "common/log.h"
#include "common/thread_cpu.h"

namespace memento::coord {

std::string_view NodeSignalName(NodeSignal s) {
  switch (s) {
    case NodeSignal::kHealthy:
      return "HEALTHY";
    case NodeSignal::kSnap:
      return "SNAP";
    case NodeSignal::kCompleted:
      return "COMPLETED";
    case NodeSignal::kUnhealthy:
      return "UNHEALTHY";
    case NodeSignal::kOffline:
      return "OFFLINE";
  }
  return "UNKNOWN";
}

Result<NodeSignal> ParseNodeSignal(std::string_view s) {
  for (int i = 0; i <= 4; ++i) {
    auto sig = static_cast<NodeSignal>(i);
    if (NodeSignalName(sig) == s) return sig;
  }
  return InvalidArgumentError(
      fmt::format("signal '{}' is not one of HEALTHY, SNAP, COMPLETED, UNHEALTHY, OFFLINE", s));
}

std::string SignalRecord::Encode() const {
  return fmt::format("{} {} {} {}", NodeSignalName(signal), step, wall_ns, detail);
}

Result<SignalRecord> SignalRecord::Decode(const std::string& s) {
  std::istringstream in(s);
  std::string sig;
  SignalRecord r;
  if (!(in >> sig >> r.step >> r.wall_ns)) {
    return InvalidArgumentError(fmt::format("signal record '{}' is malformed", s.substr(0, 80)));
  }
  MEMENTO_ASSIGN_OR_RETURN(r.signal, ParseNodeSignal(sig));
  std::getline(in, r.detail);
  if (!r.detail.empty() && r.detail[0] == ' ') r.detail.erase(0, 1);
  return r;
}

Membership::Membership(Store* store, MembershipOptions options)
    : store_(store), options_(std::move(options)), keys_(options_.job) {}

Result<std::unique_ptr<Membership>> Membership::Join(Store* store, MembershipOptions options,
                                                     Deadline deadline) {
  MEMENTO_RETURN_IF_ERROR(ValidateName("job", options.job));
  MEMENTO_RETURN_IF_ERROR(ValidateName("node", options.node));
  if (!(options.ttl_s > 0)) {
    return InvalidArgumentError(fmt::format("membership ttl {} s must be > 0", options.ttl_s));
  }
  if (options.heartbeat_interval_s <= 0) options.heartbeat_interval_s = options.ttl_s / 3;
  std::unique_ptr<Membership> m(new Membership(store, std::move(options)));
  {
    MutexLock l(&m->mu_);
    m->record_.signal = NodeSignal::kHealthy;
    m->record_.wall_ns = WallNanos();
  }
  MEMENTO_RETURN_IF_ERROR(m->Register(deadline));
  m->heartbeat_ = std::thread([p = m.get()] {
    NameThisThread("heartbeat");
    p->HeartbeatLoop();
  });
  return m;
}

Membership::~Membership() { StopHeartbeat(); }

void Membership::StopHeartbeat() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  stop_cv_.SignalAll();
  if (heartbeat_.joinable()) heartbeat_.join();
}

LeaseId Membership::lease() {
  MutexLock l(&mu_);
  return lease_;
}

Status Membership::Register(Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(LeaseId lease, store_->GrantLease(options_.ttl_s, deadline));
  SignalRecord record;
  {
    MutexLock l(&mu_);
    lease_ = lease;
    record = record_;
  }
  MEMENTO_RETURN_IF_ERROR(
      store_->Set(keys_.Node(options_.node), options_.endpoint, deadline, lease).status());
  return store_->Set(keys_.Signal(options_.node), record.Encode(), deadline).status();
}

Status Membership::SetSignal(NodeSignal signal, int64_t step, std::string detail,
                             Deadline deadline) {
  if (signal == NodeSignal::kOffline) {
    return InvalidArgumentError("OFFLINE is derived from an expired lease; use Leave()");
  }
  SignalRecord r;
  r.signal = signal;
  r.step = step;
  r.wall_ns = WallNanos();
  r.detail = std::move(detail);
  {
    MutexLock l(&mu_);
    record_ = r;
  }
  return store_->Set(keys_.Signal(options_.node), r.Encode(), deadline).status();
}

Status Membership::Leave(Deadline deadline) {
  StopHeartbeat();
  LeaseId lease = this->lease();
  Status s = store_->RevokeLease(lease, deadline);
  if (s.code() == StatusCode::kNotFound) return Status::Ok();
  return s;
}

void Membership::HeartbeatLoop() {
  auto interval = std::chrono::duration_cast<Duration>(
      std::chrono::duration<double>(options_.heartbeat_interval_s));
  // Re-registration takes several calls; give it up to a TTL.
  Duration register_budget =
      std::chrono::duration_cast<Duration>(std::chrono::duration<double>(options_.ttl_s));
  bool need_register = false;  // the store lost our lease; register again
  bool need_hook = false;      // registered again; on_reregister has not succeeded yet
  for (;;) {
    LeaseId lease;
    {
      MutexLock l(&mu_);
      TimePoint wake = Now() + interval;
      while (!stop_ && Now() < wake) stop_cv_.WaitUntil(&l, wake);
      if (stop_) return;
      lease = lease_;
    }
    if (!need_register && !need_hook) {
      Status s = store_->KeepAlive(lease, Deadline::After(interval));
      if (s.ok()) continue;
      if (s.code() != StatusCode::kNotFound) {
        MEMENTO_LOG_WARN("coord: node {} heartbeat: {}", options_.node, s.ToString());
        continue;
      }
      // The store no longer knows our lease: it restarted, or we were cut
      // off long enough to be declared OFFLINE. Come back.
      MEMENTO_LOG_WARN("coord: node {} lost its lease ({}); re-registering", options_.node,
                       s.message());
      need_register = true;
    }
    if (need_register) {
      // A failed attempt is retried whole on the next tick (a lease it
      // granted and did not use expires on its own).
      Status s = Register(Deadline::After(register_budget));
      if (!s.ok()) {
        MEMENTO_LOG_WARN("coord: node {} re-registration failed (will retry): {}", options_.node,
                         s.ToString());
        continue;
      }
      need_register = false;
      need_hook = true;
    }
    if (need_hook) {
      Status s = options_.on_reregister ? options_.on_reregister() : Status::Ok();
      if (!s.ok()) {
        MEMENTO_LOG_WARN("coord: node {} on_reregister failed (will retry): {}", options_.node,
                         s.ToString());
        continue;
      }
      need_hook = false;
      reregistrations_.fetch_add(1);
      MEMENTO_LOG_INFO("coord: node {} registered again", options_.node);
    }
  }
}

Result<std::vector<NodeState>> ReadClusterState(Store& store, const std::string& job,
                                                Deadline deadline) {
  MEMENTO_RETURN_IF_ERROR(ValidateName("job", job));
  JobKeys keys(job);
  MEMENTO_ASSIGN_OR_RETURN(ListResult nodes, store.List(keys.NodesPrefix(), deadline));
  MEMENTO_ASSIGN_OR_RETURN(ListResult signals, store.List(keys.SignalPrefix(), deadline));
  std::map<std::string, NodeState> by_name;
  for (const auto& kv : nodes.kvs) {
    NodeState& n = by_name[kv.key.substr(keys.NodesPrefix().size())];
    n.alive = true;
    n.endpoint = kv.value;
  }
  for (const auto& kv : signals.kvs) {
    NodeState& n = by_name[kv.key.substr(keys.SignalPrefix().size())];
    auto r = SignalRecord::Decode(kv.value);
    if (r.ok()) {
      n.record = *r;
    } else {
      n.record.detail = r.status().message();
    }
  }
  std::vector<NodeState> out;
  for (auto& [name, n] : by_name) {
    n.node = name;
    if (!n.alive) n.record.signal = NodeSignal::kOffline;
    out.push_back(std::move(n));
  }
  return out;
}

}  // namespace memento::coord
