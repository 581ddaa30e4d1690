#include "launch/recovery_leader.h"

#include <algorithm>
#include <set>

#include "common/clock.h"
#include "common/log.h"
#include "coord/commit.h"
#include "coord/keys.h"
#include "coord/membership.h"
#include "fmt/format.h"
#include "launch/job_recovery.h"
#include "tier/env.h"
#include "tier/reader.h"
#include "tier/verify.h"

namespace memento::launch {

using nlohmann::json;

namespace {
constexpr double kStoreCallS = 5;
constexpr auto kPoll = std::chrono::milliseconds(200);
}  // namespace

Result<RecoveryLeaderMode> ParseRecoveryLeaderMode(const std::string& s) {
  if (s == "off") return RecoveryLeaderMode::kOff;
  if (s == "request") return RecoveryLeaderMode::kRequest;
  if (s == "auto") return RecoveryLeaderMode::kAuto;
  return InvalidArgumentError(
      fmt::format("--recovery-leader '{}': expected off, request or auto", s));
}

std::string RecoveryLeaderKey(const std::string& job) {
  return coord::JobKeys(job).prefix() + "recovery_leader";
}
std::string RecoveryRequestKey(const std::string& job) {
  return coord::JobKeys(job).prefix() + "recovery_request";
}
std::string RecoveryStatusKey(const std::string& job) {
  return coord::JobKeys(job).prefix() + "recovery_status";
}
std::string RecoveryEpochFloorKey(const std::string& job) {
  return coord::JobKeys(job).prefix() + "recovery_epoch_floor";
}

json RecoveryStatus::ToJson() const {
  json j = {{"id", id},           {"state", state},       {"leader", leader},
            {"trigger", trigger}, {"takeover", takeover}, {"restore_step", restore_step},
            {"epoch", epoch},     {"source", source},     {"message", message}};
  if (!recovery.is_null()) j["recovery"] = recovery;
  if (!durable_skipped.empty()) j["durable_skipped"] = durable_skipped;
  return j;
}

Result<RecoveryStatus> RecoveryStatus::FromJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j["id"].is_number_integer() ||
      !j.contains("state") || !j["state"].is_string()) {
    return InvalidArgumentError(
        "recovery status is not a JSON object with an integer id and a "
        "state: " +
        text.substr(0, 200));
  }
  RecoveryStatus s;
  s.id = j["id"].get<int64_t>();
  s.state = j["state"].get<std::string>();
  s.leader = j.value("leader", "");
  s.trigger = j.value("trigger", "");
  s.takeover = j.value("takeover", false);
  s.restore_step = j.value("restore_step", int64_t{-1});
  s.epoch = j.value("epoch", uint64_t{0});
  s.source = j.value("source", "");
  s.message = j.value("message", "");
  if (j.contains("recovery")) s.recovery = j["recovery"];
  if (j.contains("durable_skipped") && j["durable_skipped"].is_array()) {
    for (const json& e : j["durable_skipped"]) {
      if (e.is_string()) s.durable_skipped.push_back(e.get<std::string>());
    }
  }
  return s;
}

Result<RecoveryView> ReadRecoveryView(coord::Store& store, const std::string& job,
                                      Deadline deadline) {
  RecoveryView v;
  auto leader = store.Get(RecoveryLeaderKey(job), deadline);
  if (leader.ok()) {
    v.leader = leader->value;
  } else if (leader.status().code() != StatusCode::kNotFound) {
    return leader.status();
  }
  auto req = store.Get(RecoveryRequestKey(job), deadline);
  if (req.ok()) {
    char* end = nullptr;
    v.requested = std::strtoll(req->value.c_str(), &end, 10);
    if (end == req->value.c_str() || *end != '\0' || v.requested < 0) {
      return InvalidArgumentError(fmt::format("{} holds '{}', not a request count",
                                              RecoveryRequestKey(job), req->value.substr(0, 40)));
    }
  } else if (req.status().code() != StatusCode::kNotFound) {
    return req.status();
  }
  auto st = store.Get(RecoveryStatusKey(job), deadline);
  if (st.ok()) {
    MEMENTO_ASSIGN_OR_RETURN(v.status, RecoveryStatus::FromJson(st->value));
    v.has_status = true;
  } else if (st.status().code() != StatusCode::kNotFound) {
    return st.status();
  }
  return v;
}

Status AwaitRecoveryIdle(coord::Store& store, const std::string& job, Deadline deadline) {
  for (;;) {
    MEMENTO_ASSIGN_OR_RETURN(RecoveryView v,
                             ReadRecoveryView(store, job, Deadline::AfterSeconds(10)));
    const int64_t last = v.has_status ? v.status.id : 0;
    const bool running = v.has_status && !v.status.final();
    if (v.leader.empty() || (v.requested <= last && !running)) return Status::Ok();
    if (deadline.expired()) {
      return UnavailableError(fmt::format(
          "recovery {} of job '{}' is still {} (leader {}); the step to restore is not known yet, "
          "try again (`memento recover --job {} --wait` waits for it)",
          std::max(v.requested, last), job, running ? v.status.state : std::string("requested"),
          v.leader, job));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

namespace {
// The floor's value; `kv` is the key as read (NotFound: 0).
Result<uint64_t> ParseEpochFloor(const std::string& job, const Result<coord::KeyValue>& kv) {
  if (!kv.ok()) {
    if (kv.status().code() == StatusCode::kNotFound) return uint64_t{0};
    return kv.status();
  }
  char* end = nullptr;
  const uint64_t floor = std::strtoull(kv->value.c_str(), &end, 10);
  if (end == kv->value.c_str() || *end != '\0' || kv->value[0] == '-') {
    return InvalidArgumentError(fmt::format("{} holds '{}', not an epoch",
                                            RecoveryEpochFloorKey(job), kv->value.substr(0, 40)));
  }
  return floor;
}
}  // namespace

Result<uint64_t> ReadRecoveryEpochFloor(coord::Store& store, const std::string& job,
                                        Deadline deadline) {
  return ParseEpochFloor(job, store.Get(RecoveryEpochFloorKey(job), deadline));
}

Result<int64_t> RequestRecovery(coord::Store& store, const std::string& job, Deadline deadline,
                                uint64_t epoch_floor) {
  // Raised (never lowered) before the request: a leader that sees the
  // request sees the floor.
  while (epoch_floor > 0) {
    auto kv = store.Get(RecoveryEpochFloorKey(job), deadline);
    MEMENTO_ASSIGN_OR_RETURN(uint64_t current, ParseEpochFloor(job, kv));
    if (kv.ok() && current >= epoch_floor) break;
    const std::optional<std::string> expected =
        kv.ok() ? std::optional<std::string>(kv->value) : std::nullopt;
    MEMENTO_ASSIGN_OR_RETURN(coord::CasResult cas,
                             store.CompareAndSwap(RecoveryEpochFloorKey(job), expected,
                                                  std::to_string(epoch_floor), deadline));
    if (cas.swapped) break;
    if (deadline.expired()) {
      return DeadlineExceededError("raising " + RecoveryEpochFloorKey(job) + " to " +
                                   std::to_string(epoch_floor));
    }
  }
  return store.Add(RecoveryRequestKey(job), 1, deadline);
}

// ---- the leader ------------------------------------------------------------------

Result<std::unique_ptr<RecoveryLeader>> RecoveryLeader::Start(
    const RecoveryLeaderOptions& options) {
  if (options.mode == RecoveryLeaderMode::kOff) return std::unique_ptr<RecoveryLeader>();
  std::unique_ptr<RecoveryLeader> l(new RecoveryLeader());
  l->options_ = options;
  l->name_ = coord::NodeName(options.node);
  MEMENTO_ASSIGN_OR_RETURN(net::JobToken token, net::JobToken::Load(options.token_file));
  l->token_ = std::make_unique<net::JobToken>(std::move(token));
  MEMENTO_ASSIGN_OR_RETURN(l->store_, coord::OpenStore(options.store_url, options.token_file,
                                                       Deadline::AfterSeconds(30)));
  RecoveryLeader* self = l.get();
  l->thread_ = std::thread([self] { self->Run(); });
  l->keepalive_ = std::thread([self] { self->KeepAliveLoop(); });
  return l;
}

RecoveryLeader::~RecoveryLeader() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
  if (keepalive_.joinable()) keepalive_.join();
  {
    MutexLock l(&coord_mu_);
    coordinator_.reset();
  }
  const coord::LeaseId lease = lease_.load();
  if (lease != 0) {
    // Steps down at once: another agent need not wait for the lease to expire.
    store_->RevokeLease(lease, Deadline::AfterSeconds(2)).IgnoreError();
  }
}

bool RecoveryLeader::Stopping() {
  MutexLock l(&mu_);
  return stop_;
}

bool RecoveryLeader::SleepFor(std::chrono::milliseconds d) {
  MutexLock l(&mu_);
  if (!stop_) cv_.WaitUntil(&l, Now() + d);
  return !stop_;
}

// The lease must live through a long RecoverJob: kept alive on its own thread.
void RecoveryLeader::KeepAliveLoop() {
  const auto every = std::chrono::milliseconds(
      std::max<int64_t>(100, static_cast<int64_t>(options_.lease_ttl_s * 1000 / 3)));
  while (SleepFor(every)) {
    const coord::LeaseId lease = lease_.load();
    if (lease == 0) continue;
    Status st = store_->KeepAlive(lease, Deadline::AfterSeconds(options_.lease_ttl_s));
    if (st.code() == StatusCode::kNotFound) {
      // Expired (a stalled process, a store restarted empty): no longer
      // leader, unless Campaign already holds the key under a newer lease
      // (the store restarted between this read of lease_ and the call).
      coord::LeaseId expected = lease;
      if (lease_.compare_exchange_strong(expected, 0) && leading_.exchange(false)) {
        MEMENTO_LOG_WARN("recovery leader: lost the lease; standing for election again");
      }
    }
  }
}

void RecoveryLeader::Campaign() {
  if (lease_.load() == 0) {
    auto lease = store_->GrantLease(options_.lease_ttl_s, Deadline::AfterSeconds(kStoreCallS));
    if (!lease.ok()) return;
    lease_.store(*lease);
  }
  if (leading_.load()) return;
  auto cas = store_->CompareAndSwap(RecoveryLeaderKey(options_.job), std::nullopt, name_,
                                    Deadline::AfterSeconds(kStoreCallS), lease_.load());
  if (!cas.ok()) {
    if (cas.status().code() == StatusCode::kNotFound) lease_.store(0);  // the lease expired
    return;
  }
  // The key already names this node under its current lease: it leads (a
  // leadership the keep-alive thread gave up for an older lease).
  const bool mine = !cas->swapped && cas->current.has_value() && cas->current->value == name_ &&
                    cas->current->lease == lease_.load();
  if (cas->swapped || mine) {
    leading_.store(true);
    members_known_ = false;
    MEMENTO_LOG_INFO("recovery leader: {} leads the recoveries of job {}", name_, options_.job);
  }
}

bool RecoveryLeader::StillLeader() {
  if (!leading_.load() || Stopping()) return false;
  auto kv = store_->Get(RecoveryLeaderKey(options_.job), Deadline::AfterSeconds(kStoreCallS));
  const bool mine = kv.ok() && kv->value == name_ && kv->lease == lease_.load();
  if (!mine && kv.ok()) leading_.store(false);
  return mine;
}

void RecoveryLeader::Publish(const RecoveryStatus& st) {
  // A deposed leader must not overwrite its successor's record.
  if (!StillLeader()) return;
  auto r = store_->Set(RecoveryStatusKey(options_.job), st.ToJson().dump(),
                       Deadline::AfterSeconds(kStoreCallS));
  if (!r.ok())
    MEMENTO_LOG_WARN("recovery {}: cannot publish its status: {}", st.id, r.status().ToString());
  MEMENTO_LOG_INFO("recovery {}: {}{}", st.id, st.state,
                   st.message.empty() ? "" : " (" + st.message + ")");
}

void RecoveryLeader::WatchMembership() {
  coord::JobKeys keys(options_.job);
  auto list = store_->List(keys.NodesPrefix(), Deadline::AfterSeconds(kStoreCallS));
  if (!list.ok()) return;
  std::set<std::string> now;
  for (const auto& kv : list->kvs) now.insert(kv.key.substr(keys.NodesPrefix().size()));
  std::vector<std::string> lost;
  if (members_known_) {
    for (const std::string& n : members_) {
      if (now.count(n) == 0) lost.push_back(n);
    }
  } else {
    // A new leader does not know what its predecessor saw: once the job has
    // committed, a node of the topology that is absent is lost (e.g. the
    // previous leader's own node).
    auto committed =
        coord::ReadLatestCommit(*store_, options_.job, Deadline::AfterSeconds(kStoreCallS));
    auto topology = ReadTopology(*store_, options_.job, Deadline::AfterSeconds(kStoreCallS));
    if (committed.ok() && *committed >= 0 && topology.ok()) {
      for (int n = 0; n < topology->topology.num_nodes(); ++n) {
        if (now.count(coord::NodeName(n)) == 0) lost.push_back(coord::NodeName(n));
      }
    }
  }
  members_ = now;
  members_known_ = true;
  if (lost.empty()) return;
  auto view = ReadRecoveryView(*store_, options_.job, Deadline::AfterSeconds(kStoreCallS));
  // A request still open covers this loss too (it waits for every agent).
  if (view.ok() && view->requested > 0 &&
      !(view->has_status && view->status.id == view->requested && view->status.final())) {
    return;
  }
  auto id = RequestRecovery(*store_, options_.job, Deadline::AfterSeconds(kStoreCallS));
  if (!id.ok()) return;
  std::string names;
  for (const std::string& n : lost) names += (names.empty() ? "" : ",") + n;
  pending_trigger_ = names + " lost";
  MEMENTO_LOG_INFO("recovery leader: {} lost; recovery {} requested", names, *id);
}

bool RecoveryLeader::coordinating() {
  MutexLock l(&coord_mu_);
  return coordinator_ != nullptr;
}

void RecoveryLeader::CoordinateCommits() {
  MutexLock l(&coord_mu_);
  if (!leading_.load()) {
    if (coordinator_ != nullptr) {
      coordinated_ =
          std::max(coordinated_, coord::CommitId{coordinator_->epoch(), coordinator_->committed()});
      coordinator_.reset();
      MEMENTO_LOG_INFO("commit coordinator: {} no longer leads; stopped", name_);
    }
    return;
  }
  if (coordinator_ != nullptr) return;
  auto topology = ReadTopology(*store_, options_.job, Deadline::AfterSeconds(kStoreCallS));
  if (!topology.ok()) return;  // not published yet: the next poll looks again
  std::set<std::string> members;
  for (int n = 0; n < topology->topology.num_nodes(); ++n) members.insert(coord::NodeName(n));
  if (coordinated_.step >= 0) {
    auto moved = coord::PublishCommit(*store_, options_.job, coordinated_.step, WallNanos(),
                                      Deadline::AfterSeconds(kStoreCallS), coordinated_.epoch);
    if (!moved.ok()) return;
  }
  auto c = coord::CommitCoordinator::Start(store_.get(), options_.job, std::move(members),
                                           Deadline::AfterSeconds(kStoreCallS));
  if (!c.ok()) {
    MEMENTO_LOG_WARN("commit coordinator: cannot start: {}", c.status().ToString());
    return;
  }
  coordinator_ = std::move(*c);
  MEMENTO_LOG_INFO("commit coordinator: {} coordinates the commits of job {} ({} node(s))", name_,
                   options_.job, topology->topology.num_nodes());
}

void RecoveryLeader::Run() {
  while (SleepFor(std::chrono::duration_cast<std::chrono::milliseconds>(kPoll))) {
    Campaign();
    if (options_.coordinate_commits) CoordinateCommits();
    if (!leading_.load()) continue;
    if (options_.mode == RecoveryLeaderMode::kAuto) WatchMembership();
    auto view = ReadRecoveryView(*store_, options_.job, Deadline::AfterSeconds(kStoreCallS));
    if (!view.ok()) continue;
    const int64_t done_id = view->has_status ? view->status.id : 0;
    if (view->requested > done_id ||
        (view->requested > 0 && view->requested == done_id && !view->status.final())) {
      RunRecovery(view->requested, view->has_status ? &view->status : nullptr);
    }
  }
}

void RecoveryLeader::RunRecovery(int64_t id, const RecoveryStatus* previous) {
  RecoveryStatus st;
  st.id = id;
  st.leader = name_;
  const bool resumed = previous != nullptr && previous->id == id;
  st.takeover = resumed && !previous->final();
  st.trigger = resumed ? previous->trigger
                       : (pending_trigger_.empty() ? std::string("request") : pending_trigger_);
  pending_trigger_.clear();
  if (st.takeover) {
    MEMENTO_LOG_INFO("recovery {}: taking over from {} (left it {})", id, previous->leader,
                     previous->state);
  }
  const Deadline deadline = Deadline::AfterSeconds(options_.recovery_timeout_s);
  auto fail = [&](const std::string& why) {
    st.state = "failed";
    st.message = why;
    Publish(st);
  };
  st.state = "waiting";
  st.message = "waiting for every node's agent";
  Publish(st);
  auto topology = ReadTopology(*store_, options_.job, Deadline::AfterSeconds(kStoreCallS));
  if (!topology.ok()) return fail("no topology: " + topology.status().ToString());
  const int num_nodes = topology->topology.num_nodes();
  // Every node's agent (a replacement joins with an empty root).
  for (;;) {
    if (!StillLeader()) return;  // the next leader runs it
    auto eps = ReadEndpoints(*store_, options_.job, num_nodes, Deadline::AfterSeconds(kStoreCallS));
    std::string missing;
    if (eps.ok()) {
      for (int n = 0; n < num_nodes; ++n) {
        if ((*eps)[static_cast<size_t>(n)].empty()) missing += " " + coord::NodeName(n);
      }
    } else {
      missing = " (" + eps.status().ToString() + ")";
    }
    if (missing.empty()) break;
    if (deadline.expired()) {
      return fail(fmt::format("the agents of{} did not come back within {} s", missing,
                              options_.recovery_timeout_s));
    }
    if (!SleepFor(std::chrono::duration_cast<std::chrono::milliseconds>(kPoll))) return;
  }
  st.state = "running";
  st.message.clear();
  Publish(st);
  // RecoverJob asks every agent for its inventory: an agent that is still
  // starting (no plan yet) or one that dies meanwhile fails a round; try
  // again until the deadline.
  Status last = Status::Ok();
  // The recovery's epoch (the commits' and then the durable tier's,
  // docs/coordination.md "Epochs"): chosen once, before the first restore
  // target is sent.
  uint64_t epoch = 0;
  // The restored step is the new epoch's first commit: the steps trained
  // again after it commit, even those an abandoned history had committed.
  auto start_epoch = [&](int64_t step) {
    // The durable epoch first (parts written from now on carry it), then the
    // epoch's first commit.
    Status s = SetEpoch(*store_, options_.job, epoch, Deadline::AfterSeconds(kStoreCallS));
    if (s.ok()) {
      s = StartCommitEpoch(*store_, options_.job, epoch, step, Deadline::AfterSeconds(kStoreCallS));
    }
    if (!s.ok()) {
      MEMENTO_LOG_WARN("recovery {}: cannot start commit epoch {} at step {}: {}", id, epoch, step,
                       s.ToString());
    }
    return s;
  };
  for (;;) {
    if (!StillLeader()) return;
    auto plan = PlanFromStore(*store_, options_.job, Deadline::AfterSeconds(kStoreCallS));
    auto committed =
        coord::ReadLatestCommit(*store_, options_.job, Deadline::AfterSeconds(kStoreCallS));
    if (plan.ok() && committed.ok() && *committed < 0) {
      st.state = "done";
      st.source = "none";
      st.message = "nothing committed yet: the trainers start from scratch";
      Publish(st);
      return;
    }
    if (plan.ok() && committed.ok() && epoch == 0) {
      // Above the store's epoch, commit/latest's and the floor of whoever
      // filed a request (the launcher's newest epoch survives a store that
      // restarted empty).
      auto floor =
          ReadRecoveryEpochFloor(*store_, options_.job, Deadline::AfterSeconds(kStoreCallS));
      auto e = floor.ok()
                   ? NextEpoch(*store_, options_.job, Deadline::AfterSeconds(kStoreCallS), *floor)
                   : Result<uint64_t>(floor.status());
      if (e.ok()) {
        epoch = *e;
      } else {
        last = e.status().WithContext("choosing the epoch");
      }
    }
    if (plan.ok() && committed.ok() && epoch > 0) {
      RecoverOptions ro;
      ro.job = options_.job;
      ro.num_nodes = num_nodes;
      ro.committed = *committed;
      ro.epoch = epoch;
      auto rec = RecoverJob(*store_, *plan, *token_, ro, deadline);
      if (rec.ok() && rec->decision.from_memory) {
        if (Status s = start_epoch(rec->decision.step); !s.ok()) {
          return fail("cannot start commit epoch: " + s.ToString());
        }
        st.state = "done";
        st.source = "memory";
        st.restore_step = rec->decision.step;
        st.epoch = epoch;
        st.message = rec->decision.reason;
        st.recovery = rec->ToJson();
        Publish(st);
        return;
      }
      if (rec.ok()) {
        // Memory cannot rebuild any committed version: the durable tier,
        // newest complete version first; one that fails verification or
        // loading is skipped and named (as `memento launch
        // --recovery-by launcher` does: FallBackToDurableTier).
        std::string why = "memory cannot rebuild any committed version: " + rec->decision.reason;
        if (options_.durable_dir.empty()) return fail(why + " (no --durable-dir to fall back to)");
        st.durable_skipped.clear();
        std::vector<tier::VersionSummary> list;
        if (auto versions = tier::ListVersions(tier::Env::Default(), options_.durable_dir);
            versions.ok()) {
          list = std::move(*versions);
        } else {
          st.durable_skipped.push_back("cannot list " + options_.durable_dir + ": " +
                                       versions.status().ToString());
        }
        for (auto it = list.rbegin(); it != list.rend(); ++it) {
          if (!it->complete) continue;
          tier::VersionCheck check =
              tier::VerifyVersion(tier::Env::Default(), options_.durable_dir, it->step);
          std::string skipped;
          if (!check.ok) {
            skipped = "fails verification: " +
                      (check.problems.empty() ? std::string("?") : check.problems[0]);
            if (check.problems.size() > 1) {
              skipped += fmt::format(" (and {} more)", check.problems.size() - 1);
            }
          } else {
            std::vector<int> missing;
            auto load = LoadDurableOnEveryNode(*store_, *token_, options_.job, num_nodes,
                                               options_.durable_dir, it->step, deadline, epoch,
                                               options_.agent_wait_s, &missing);
            if (!load.ok() && !missing.empty()) {
              // Not the version's fault: an older one needs the same agents.
              std::string nodes;
              for (int n : missing) nodes += (nodes.empty() ? "" : ", ") + coord::NodeName(n);
              return fail(fmt::format(
                  "{}; loading durable version {} waited {} s for the agent of {} in vain "
                  "(--agent-wait; no older version tried, each needs every node's agent): {}",
                  why, it->step, options_.agent_wait_s, nodes, load.status().ToString()));
            }
            if (load.ok()) {
              if (Status s = start_epoch(it->step); !s.ok()) {
                return fail(why + "; cannot start commit epoch: " + s.ToString());
              }
              st.state = "done";
              st.source = "durable";
              st.restore_step = it->step;
              st.epoch = epoch;
              st.message = why;
              if (!st.durable_skipped.empty()) {
                st.message += "; newer durable version(s) skipped: ";
                for (size_t k = 0; k < st.durable_skipped.size(); ++k) {
                  st.message += (k ? "; " : "") + st.durable_skipped[k];
                }
              }
              st.recovery = load->ToJson();
              Publish(st);
              return;
            }
            skipped = "loading it failed: " + load.status().ToString();
          }
          MEMENTO_LOG_WARN("recovery {}: durable version {} skipped: {}; trying an older one", id,
                           it->step, skipped);
          st.durable_skipped.push_back(fmt::format("step {} {}", it->step, skipped));
        }
        if (st.durable_skipped.empty()) {
          return fail(why + "; the durable tier " + options_.durable_dir +
                      " holds no complete version");
        }
        why += "; the durable tier " + options_.durable_dir +
               " holds no version that verifies and loads:";
        for (size_t k = 0; k < st.durable_skipped.size(); ++k) {
          why += (k ? "; " : " ") + st.durable_skipped[k];
        }
        return fail(why);
      }
      last = rec.status();
    } else if (!plan.ok() || !committed.ok()) {
      last = !plan.ok() ? plan.status() : committed.status();
    }
    if (deadline.expired()) return fail("recovery failed: " + last.ToString());
    MEMENTO_LOG_INFO("recovery {}: {}; trying again", id, last.ToString());
    if (!SleepFor(std::chrono::milliseconds(1000))) return;
  }
}

}  // namespace memento::launch
