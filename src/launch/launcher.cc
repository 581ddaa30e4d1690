#include "launch/launcher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "common/clock.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "coord/commit.h"
#include "coord/embedded_store.h"
#include "coord/keys.h"
#include "coord/membership.h"
#include "launch/cluster.h"
#include "launch/commit_history.h"
#include "launch/netns.h"
#include "launch/store_host.h"
#include "net/job_token.h"
#include "recover/recover.h"
#include "shm/node_store.h"
#include "shm/slot.h"
#include "shm/slot_format.h"
#include "tier/discovery.h"
#include "tier/env.h"
#include "tier/reader.h"
#include "tier/verify.h"

namespace memento::launch {

using nlohmann::json;

// ---- reports ------------------------------------------------------------------

json RecoveryReport::ToJson() const {
  return {{"n", n},
          {"attempt", attempt},
          {"cause", cause},
          {"committed", committed},
          {"step", step},
          {"lost_nodes", lost_nodes},
          {"detect_s", detect_s},
          {"restart_s", restart_s},
          {"inventory_plan_s", inventory_plan_s},
          {"transfer_s", transfer_s},
          {"decode_s", decode_s},
          {"write_s", write_s},
          {"total_s", total_s},
          {"rebuilt_bytes", rebuilt_bytes},
          {"source", source},
          {"steps_lost", steps_lost},
          {"load_s", load_s},
          {"read_bytes", read_bytes},
          {"epoch", epoch},
          {"durable_skipped", durable_skipped},
          {"reason", reason}};
}

std::string RecoveryReport::ToString() const {
  char buf[512];
  if (step < 0 && source == "scratch") {
    std::snprintf(buf, sizeof(buf), "recovery %d: restarted from scratch in %.3f s (%s)", n,
                  total_s, reason.c_str());
    return buf;
  }
  if (step < 0) {
    // Nothing was restored and the trainers were not restarted (exit 3).
    return "recovery " + std::to_string(n) + ": FAILED, nothing restored, the job ends (" + reason +
           ")";
  }
  if (source == "durable") {
    std::snprintf(buf, sizeof(buf),
                  "recovery %d: restored from the durable tier at step %lld, %lld steps lost "
                  "(committed %lld) in %.3f s: detect %.3f, restart %.3f, inventory+plan %.3f, "
                  "load %.3f s; %llu bytes read",
                  n, static_cast<long long>(step), static_cast<long long>(steps_lost),
                  static_cast<long long>(committed), total_s, detect_s, restart_s, inventory_plan_s,
                  load_s, static_cast<unsigned long long>(read_bytes));
    return buf;
  }
  std::snprintf(buf, sizeof(buf),
                "recovery %d: restored step %lld (committed %lld) in %.3f s: detect %.3f, "
                "restart %.3f, inventory+plan %.3f, transfer %.3f, decode %.3f, write %.3f s; "
                "%llu bytes rebuilt",
                n, static_cast<long long>(step), static_cast<long long>(committed), total_s,
                detect_s, restart_s, inventory_plan_s, transfer_s, decode_s, write_s,
                static_cast<unsigned long long>(rebuilt_bytes));
  return buf;
}

json StoreRestartReport::ToJson() const {
  return {{"n", n},
          {"cause", cause},
          {"recovery", recovery},
          {"reached_step", reached_step},
          {"committed_before", committed_before},
          {"down_s", down_s},
          {"republished_s", republished_s},
          {"resumed_s", resumed_s},
          {"resumed_step", resumed_step}};
}

std::string StoreRestartReport::ToString() const {
  auto after = [](double secs) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.3f s after", secs);
    return std::string(b);
  };
  char head[256];
  std::snprintf(head, sizeof(head), "store restart %d: %s at step %lld (committed %lld)", n,
                cause.c_str(), static_cast<long long>(reached_step),
                static_cast<long long>(committed_before));
  std::string out = head;
  if (recovery >= 0) out += " during recovery " + std::to_string(recovery);
  char down[64];
  std::snprintf(down, sizeof(down), "; down %.3f s", down_s);
  out += down;
  out += "; commit republished " + (republished_s >= 0 ? after(republished_s) : "never");
  out += "; commits resumed " +
         (resumed_s >= 0 ? after(resumed_s) + " (step " + std::to_string(resumed_step) + ")"
                         : std::string("never"));
  return out;
}

json LaunchSummary::ToJson() const {
  json r = json::array();
  for (const RecoveryReport& x : recoveries) r.push_back(x.ToJson());
  json sr = json::array();
  for (const StoreRestartReport& x : store_restarts) sr.push_back(x.ToJson());
  json mem = json::array();
  for (const NodeMemory& x : memory) mem.push_back(x.ToJson());
  return {{"success", success},          {"exit_code", exit_code},
          {"attempts", attempts},        {"committed", final_committed},
          {"commits", commits.ToJson()}, {"unprotected_steps", commits.unprotected_steps},
          {"failures", failures},        {"recoveries", r},
          {"store_restarts", sr},        {"memory", mem},
          {"message", message}};
}

std::string LaunchSummary::ToString() const {
  std::string s = "memento launch: " + std::string(success ? "job finished" : "job FAILED") +
                  " after " + std::to_string(attempts) + " attempt(s); newest committed step " +
                  std::to_string(final_committed) + "\n";
  if (!message.empty()) s += "  " + message + "\n";
  s += "  " + commits.ToString() + "\n";
  if (commits.unprotected_steps > 0) {
    s += "  WARNING: " + std::to_string(commits.unprotected_steps) +
         " step(s) ran UNPROTECTED: a node could not write their redundancy (" +
         commits.unprotected_reason +
         "); a node loss then had nothing in memory to rebuild from. Give the agents more "
         "memory (--agent-arg=--budget=..., a larger /dev/shm) or use --require-protection to "
         "fail instead\n";
  }
  s += "  failures: " + std::to_string(failures.size()) + "\n";
  for (const std::string& f : failures) s += "    - " + f + "\n";
  s += "  recoveries: " + std::to_string(recoveries.size()) + "\n";
  for (const RecoveryReport& r : recoveries) s += "    - " + r.ToString() + "\n";
  if (!store_restarts.empty()) {
    s += "  store restarts: " + std::to_string(store_restarts.size()) + "\n";
    for (const StoreRestartReport& r : store_restarts) s += "    - " + r.ToString() + "\n";
  }
  if (!memory.empty()) {
    s += "  host memory per node (one version; plan = REFT's bytes for the policy):\n";
    for (const NodeMemory& m : memory) s += "    - " + m.ToString() + "\n";
  }
  return s;
}

// ---- options ------------------------------------------------------------------

Result<std::unique_ptr<Launcher>> Launcher::Create(LaunchOptions o) {
  if (o.nodes < 1)
    return InvalidArgumentError("--nodes must be >= 1, got " + std::to_string(o.nodes));
  if (o.ranks_per_node < 1) {
    return InvalidArgumentError("--ranks-per-node must be >= 1, got " +
                                std::to_string(o.ranks_per_node));
  }
  if (o.tp < 1 || o.pp < 1 || o.dp < 0) {
    return InvalidArgumentError("--dp, --tp and --pp must be >= 1");
  }
  const int world = o.nodes * o.ranks_per_node;
  if (o.dp == 0) {
    if (world % (o.tp * o.pp) != 0) {
      return InvalidArgumentError("world size " + std::to_string(world) +
                                  " (nodes x ranks-per-node) is not a multiple of tp x pp = " +
                                  std::to_string(o.tp * o.pp));
    }
    o.dp = world / (o.tp * o.pp);
  }
  if (o.dp * o.tp * o.pp != world) {
    return InvalidArgumentError("dp x tp x pp = " + std::to_string(o.dp * o.tp * o.pp) +
                                " but nodes x ranks-per-node = " + std::to_string(world));
  }
  MEMENTO_RETURN_IF_ERROR(
      topo::Topology::Uniform(o.dp, o.tp, o.pp, o.zero, o.ranks_per_node).status());
  MEMENTO_RETURN_IF_ERROR(topo::ParsePolicy(o.policy).status());
  if (o.trainer.empty()) return InvalidArgumentError("no trainer command (give it after --)");
  if (o.max_restarts < 0) return InvalidArgumentError("--max-restarts must be >= 0");
  if (o.job.empty()) o.job = "launch-" + std::to_string(getpid());
  MEMENTO_RETURN_IF_ERROR(coord::ValidateName("job", o.job));
  if (o.run_dir.empty()) o.run_dir = "/dev/shm/memento-launch/" + o.job;
  if (o.memento_binary.empty()) {
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) return ErrnoError("readlink /proc/self/exe", errno);
    o.memento_binary.assign(buf, static_cast<size_t>(n));
  }
  auto inj = ParseInjections(o.inject, world, o.nodes);
  if (!inj.ok()) return inj.status();
  if (!o.store_url.empty() && o.store_process) {
    return InvalidArgumentError("--store " + o.store_url +
                                " (an external store) and --store-process exclude each other");
  }
  if (!(o.store_down_s >= 0)) return InvalidArgumentError("--store-down-s must be >= 0");
  for (const Injection& i : *inj) {
    if (i.kind != InjectKind::kKillStore) continue;
    if (!o.store_url.empty()) {
      return InvalidArgumentError("injection " + i.ToString() + ": the store " + o.store_url +
                                  " is external; the launcher can only kill a store process "
                                  "it runs (--store-process)");
    }
    o.store_process = true;  // a store that can be lost needs its own process
  }
  if (o.netns) {
    if (std::string why = NodeNetwork::Unsupported(); !why.empty()) {
      return FailedPreconditionError(why);
    }
    if (o.store_url.rfind("tcp://127.", 0) == 0 || o.store_url.rfind("tcp://localhost", 0) == 0 ||
        o.store_url.rfind("etcd://127.", 0) == 0 || o.store_url.rfind("etcd://localhost", 0) == 0) {
      return InvalidArgumentError("--netns: the store " + o.store_url +
                                  " is on loopback, which the nodes' namespaces cannot reach");
    }
  }
  std::unique_ptr<Launcher> l(new Launcher(std::move(o)));
  l->injections_ = std::move(*inj);
  return l;
}

Launcher::~Launcher() = default;

// ---- the supervisor -------------------------------------------------------------

namespace {

std::string Substitute(std::string arg, const std::map<std::string, std::string>& vars) {
  for (const auto& [name, value] : vars) {
    const std::string pat = "{" + name + "}";
    size_t pos = 0;
    while ((pos = arg.find(pat, pos)) != std::string::npos) {
      arg.replace(pos, pat.size(), value);
      pos += value.size();
    }
  }
  return arg;
}

Status MakeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return InternalError("mkdir -p " + path + ": " + ec.message());
  chmod(path.c_str(), 0700);
  return Status::Ok();
}

void RemoveAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

Status WriteTokenFile(const std::string& path, const net::JobToken& token) {
  unlink(path.c_str());
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("create token file " + path, errno);
  const std::string s = token.secret() + "\n";
  ssize_t w = write(fd, s.data(), s.size());
  int err = errno;
  close(fd);
  if (w != static_cast<ssize_t>(s.size())) return ErrnoError("write token file " + path, err);
  return Status::Ok();
}

void AppendLine(const std::string& path, const std::string& line) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return;
  std::string l = line + "\n";
  (void)!write(fd, l.data(), l.size());
  close(fd);
}

// corrupt-rank: flips one byte in the middle of the data region of the T0
// slot of `rank` under `root` that holds `step` complete. Returns which slot.
Result<int> CorruptSlot(const std::string& root, int rank, int64_t step) {
  std::unique_ptr<shm::Segment> segments[shm::kSlotsPerRank];
  shm::RankSlots slots{};
  for (int s = 0; s < shm::kSlotsPerRank; ++s) {
    auto seg = shm::Segment::Open(shm::SlotPath(root, rank, s), /*writable=*/true);
    if (!seg.ok()) continue;
    segments[s] = std::move(*seg);
    slots[s] = segments[s].get();
  }
  Result<shm::CompleteSlot> found = shm::FindCompleteSlot(slots, step);
  if (!found.ok() || found->info.data_bytes == 0) {
    return NotFoundError("rank " + std::to_string(rank) + " has no complete slot of step " +
                         std::to_string(step) + " under " + root +
                         (found.ok() ? "" : ": " + found.status().message()));
  }
  segments[found->slot]->data()[found->info.data_offset + found->info.data_bytes / 2] ^= 0x5a;
  return found->slot;
}

// corrupt-durable: flips one byte in the middle of the first piece of the
// newest complete durable version under `dir`. Says what it flipped.
Result<std::string> CorruptNewestDurable(const std::string& dir) {
  tier::Env* env = tier::Env::Default();
  MEMENTO_ASSIGN_OR_RETURN(int64_t step, tier::LatestCompleteVersion(env, dir));
  MEMENTO_ASSIGN_OR_RETURN(tier::VersionIndex index, tier::LoadIndex(env, dir, step));
  for (const auto& [name, t] : index.tensors) {
    for (const tier::PieceRecord& p : t.pieces) {
      if (p.length == 0) continue;
      const std::string path = dir + "/" + tier::VersionDirName(step) + "/" + p.file;
      int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) return ErrnoError("open " + path, errno);
      const off_t at = static_cast<off_t>(p.file_offset + p.length / 2);
      uint8_t b = 0;
      bool done = pread(fd, &b, 1, at) == 1;
      b ^= 0x5a;
      done = done && pwrite(fd, &b, 1, at) == 1;
      close(fd);
      if (!done) return InternalError("cannot flip a byte of " + path);
      return "flipped a byte of piece '" + p.key + "' (tensor '" + name + "') in version " +
             std::to_string(step) + " (" + path + ")";
    }
  }
  return NotFoundError("durable version " + std::to_string(step) + " in " + dir + " has no data");
}

std::string Seconds3(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.3f", s);
  return b;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

struct Launcher::State {
  const LaunchOptions& o;
  // --netns: first member, so it is torn down last (after every child died).
  std::unique_ptr<NodeNetwork> network;
  int world = 0;
  JobTopology topology;
  net::JobToken token;
  std::string token_path, store_url, logs;
  std::unique_ptr<StoreHost> store_host;
  coord::Store* store = nullptr;  // store_host->store(); valid while store_host lives
  // Declared after store_host and before coordinator: it outlives the
  // coordinator that feeds it, and its skip watcher dies before the store.
  CommitHistory commit_history;
  std::unique_ptr<coord::CommitCoordinator> coordinator;
  std::optional<topo::Plan> plan;
  std::vector<Subprocess> agents;
  std::vector<bool> node_lost;
  std::vector<Subprocess> trainers;
  std::vector<bool> trainer_done;
  int attempt = 0;
  std::optional<TimePoint> injected_at;  // the last injected failure
  std::vector<bool> fired;
  std::vector<int> pending_corruptions;  // corrupt-rank targets
  bool corrupt_durable_pending = false;  // corrupt-durable fired
  int64_t unprotected_warned = 0;        // unprotected steps at the last warning
  Stopwatch progress_clock;
  int64_t last_progress_step = -2;
  // The store (docs/launch.md, "The store"). commit/latest only grows, but a
  // restarted store forgets it until the agents republish it: the launcher
  // keeps the newest it saw.
  int64_t known_committed = -1;
  std::optional<TimePoint> store_down_since;    // killed; the fresh one is not started yet
  std::optional<TimePoint> store_restarted_at;  // watching for the commits to come back
  std::vector<StoreRestartReport> store_restarts;
  Stopwatch store_check_clock;
  // What the launcher wrote besides the topology and plan hash, to republish.
  json restore_record;                          // null before the first recovery
  std::map<int, std::string> recovery_records;  // recovery/<n>

  explicit State(const LaunchOptions& options, net::JobToken t) : o(options), token(std::move(t)) {}

  std::string Root(int node) const { return o.run_dir + "/node" + std::to_string(node); }
  // Every node's host bytes next to the plan's (LaunchSummary::memory).
  std::vector<NodeMemory> MeasureMemory(int64_t step) const {
    std::vector<NodeMemory> out;
    for (int n = 0; n < o.nodes; ++n) {
      std::vector<int> ranks;
      const auto& rank_node = topology.topology.rank_node;
      for (size_t r = 0; r < rank_node.size(); ++r) {
        if (rank_node[r] == n) ranks.push_back(static_cast<int>(r));
      }
      auto m = MeasureNodeMemory(n, Root(n), ranks, step);
      if (!m.ok()) {
        MEMENTO_LOG_INFO("host memory of node {} not measured: {}", n, m.status().ToString());
        continue;
      }
      AddPlanBytes(*plan, &*m);
      out.push_back(*m);
    }
    return out;
  }
  // The address node `node`'s agent listens on and its argv prefix (--netns).
  std::string NodeAddress(int node) const {
    return network ? network->NodeAddress(node) : "127.0.0.1";
  }
  std::vector<std::string> InNode(int node, std::vector<std::string> argv) const {
    if (!network) return argv;
    std::vector<std::string> out = network->ExecPrefix(node);
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }
  int NodeOf(int rank) const { return rank / o.ranks_per_node; }

  void Say(const std::string& line) const {
    std::printf("[launch] %s\n", line.c_str());
    std::fflush(stdout);
  }

  bool StoreDown() const { return store_down_since.has_value(); }

  // The newest committed step: commit/latest, or the newest the launcher saw
  // (a restarted store has none until an agent republishes it).
  int64_t Committed() {
    if (StoreDown()) return known_committed;
    auto r = coord::ReadLatestCommit(*store, o.job, Deadline::AfterSeconds(5));
    if (r.ok()) known_committed = std::max(known_committed, *r);
    return known_committed;
  }

  // ---- the store's loss (kill-store) --------------------------------------------

  // Everything the launcher wrote into the store; the topology last (its
  // absence is how CheckStore notices a store that lost everything).
  Status RepublishLauncherKeys(Deadline deadline) {
    coord::JobKeys keys(o.job);
    if (plan.has_value()) {
      MEMENTO_RETURN_IF_ERROR(
          store->Set(keys.PlanHash(), std::to_string(recover::PlanHash(*plan)), deadline).status());
    }
    if (!restore_record.is_null()) {
      MEMENTO_RETURN_IF_ERROR(store->Set(keys.Restore(), restore_record.dump(), deadline).status());
    }
    for (const auto& [n, text] : recovery_records) {
      MEMENTO_RETURN_IF_ERROR(store->Set(keys.Recovery(n), text, deadline).status());
    }
    return PublishTopology(*store, o.job, topology, deadline);
  }

  // SIGKILLs the store process: a store-host loss. It stays down for
  // --store-down-s (RestartStoreIfDue), while the trainers keep training.
  void KillStore(const std::string& cause, int recovery, int64_t reached) {
    StoreRestartReport r;
    r.n = static_cast<int>(store_restarts.size());
    r.cause = cause;
    r.recovery = recovery;
    r.reached_step = reached;
    r.committed_before = Committed();
    if (Status st = store_host->Kill(); !st.ok()) {
      Say("kill-store: " + st.ToString());
      return;
    }
    store_down_since = Now();
    store_restarted_at.reset();
    store_restarts.push_back(r);
    Say("the store process is gone (" + cause + "); commits pause, snapshots go on into T0");
  }

  // Starts the fresh, empty store on the same address and republishes the
  // launcher's keys; the agents notice (their leases are unknown there),
  // register again and republish theirs.
  Status RestartStore() {
    const Deadline deadline = Deadline::AfterSeconds(o.agent_start_timeout_s);
    MEMENTO_RETURN_IF_ERROR(store_host->Restart(deadline).WithContext("restarting the store"));
    const TimePoint up = Now();
    if (!store_restarts.empty() && store_down_since) {
      store_restarts.back().down_s = SecondsBetween(*store_down_since, up);
    }
    store_down_since.reset();
    store_restarted_at = up;
    MEMENTO_RETURN_IF_ERROR(
        RepublishLauncherKeys(deadline).WithContext("republishing the launcher's keys"));
    Say("a fresh, empty store listens on " + store_host->url() +
        "; the launcher's keys are republished, the agents re-register");
    return Status::Ok();
  }

  Status RestartStoreIfDue() {
    if (!StoreDown()) return Status::Ok();
    if (SecondsBetween(*store_down_since, Now()) < o.store_down_s) return Status::Ok();
    return RestartStore();
  }

  // Between restarts: a store process that died on its own is replaced at
  // once; a store that lost the job's keys (an external one restarted) gets
  // the launcher's keys again; after a restart, when commit/latest is back
  // and when a newer step commits.
  Status CheckStore() {
    if (StoreDown()) return Status::Ok();
    if (auto st = store_host->PollExited()) {
      StoreRestartReport r;
      r.n = static_cast<int>(store_restarts.size());
      r.cause = "the store process died (" + st->ToString() + ")";
      r.committed_before = known_committed;
      store_restarts.push_back(r);
      store_down_since = Now();
      Say(r.cause + "; starting a fresh one on the same address");
      return RestartStore();
    }
    if (store_restarted_at && !store_restarts.empty()) {
      StoreRestartReport& r = store_restarts.back();
      auto latest = coord::ReadLatestCommit(*store, o.job, Deadline::AfterSeconds(2));
      if (latest.ok()) {
        known_committed = std::max(known_committed, *latest);
        const double since = SecondsBetween(*store_restarted_at, Now());
        if (r.republished_s < 0 && *latest >= r.committed_before) {
          r.republished_s = since;
          Say("the agents republished commit " + std::to_string(*latest) + " " + Seconds3(since) +
              " s after the store restart");
        }
        if (*latest > r.committed_before) {
          r.resumed_s = since;
          r.resumed_step = *latest;
          store_restarted_at.reset();
          Say("commits resumed: step " + std::to_string(*latest) + " committed " + Seconds3(since) +
              " s after the store restart");
        }
      }
    }
    if (store_check_clock.Seconds() >= 0.25) {
      store_check_clock.Reset();
      auto kv = store->Get(coord::JobKeys(o.job).Topology(), Deadline::AfterSeconds(2));
      if (!kv.ok() && kv.status().code() == StatusCode::kNotFound) {
        Say("the store lost the job's keys (restarted empty?): republishing the launcher's");
        Status st = RepublishLauncherKeys(Deadline::AfterSeconds(10));
        if (!st.ok()) Say("republishing the launcher's keys (will retry): " + st.ToString());
      }
    }
    return Status::Ok();
  }

  // The highest step any node signalled (SNAP / COMPLETED), or committed.
  int64_t ReachedStep() {
    int64_t best = Committed();
    coord::JobKeys keys(o.job);
    auto list = store->List(keys.SignalPrefix(), Deadline::AfterSeconds(5));
    if (list.ok()) {
      for (const auto& kv : list->kvs) {
        auto rec = coord::SignalRecord::Decode(kv.value);
        if (rec.ok() && rec->signal == coord::NodeSignal::kCompleted) {
          best = std::max(best, rec->step);
        }
      }
    }
    return best;
  }

  Status StartCoordinator(Deadline deadline) {
    coordinator.reset();
    std::set<std::string> members;
    for (int i = 0; i < o.nodes; ++i) members.insert(coord::NodeName(i));
    MEMENTO_ASSIGN_OR_RETURN(coordinator,
                             coord::CommitCoordinator::Start(
                                 store, o.job, members, deadline,
                                 [this](int64_t step, const std::vector<int64_t>& superseded) {
                                   commit_history.OnCommit(step, superseded);
                                 }));
    return Status::Ok();
  }

  Status StartAgent(int node, bool fresh_root) {
    const std::string root = Root(node);
    if (fresh_root) RemoveAll(root);
    unlink((root + "/agent.sock").c_str());  // a stale socket would look ready
    // A dead agent's lease would keep its old endpoint in the store for a TTL.
    coord::JobKeys keys(o.job);
    auto kv = store->Get(keys.Node(coord::NodeName(node)), Deadline::AfterSeconds(5));
    if (kv.ok() && kv->lease != 0) {
      store->RevokeLease(kv->lease, Deadline::AfterSeconds(5)).IgnoreError();
    }
    SpawnOptions so;
    so.argv = {o.memento_binary, "agent",
               "--job",          o.job,
               "--node",         std::to_string(node),
               "--root",         root,
               "--store",        store_url,
               "--token-file",   token_path,
               "--listen",       NodeAddress(node) + ":0"};
    if (!o.durable_dir.empty()) {
      so.argv.push_back("--durable-dir");
      so.argv.push_back(o.durable_dir);
    }
    for (const auto& a : o.agent_args) so.argv.push_back(a);
    so.argv = InNode(node, std::move(so.argv));
    if (network && fresh_root) {
      // A replaced host comes back on the network.
      MEMENTO_RETURN_IF_ERROR(network->SetNodeLink(node, true));
    }
    so.log_path = logs + "/agent" + std::to_string(node) + ".log";
    AppendLine(so.log_path, "---- memento launch: agent for node " + std::to_string(node) +
                                (fresh_root ? " on an empty root" : "") + " ----");
    MEMENTO_ASSIGN_OR_RETURN(agents[static_cast<size_t>(node)], Subprocess::Spawn(so));
    node_lost[static_cast<size_t>(node)] = false;
    return Status::Ok();
  }

  // " 1 3": the nodes whose agent is no longer running (reaps them).
  std::string DeadAgents() {
    std::string out;
    for (int i = 0; i < o.nodes; ++i) {
      if (!agents[static_cast<size_t>(i)].running()) out += " " + std::to_string(i);
    }
    return out;
  }

  Status WaitAgentsReady(Deadline deadline) {
    for (int i = 0; i < o.nodes; ++i) {
      const std::string sock = Root(i) + "/agent.sock";
      while (!FileExists(sock)) {
        Subprocess& a = agents[static_cast<size_t>(i)];
        if (auto st = a.Poll()) {
          const std::string log = logs + "/agent" + std::to_string(i) + ".log";
          return UnavailableError("the agent of node " + std::to_string(i) + " exited (" +
                                  st->ToString() + ") before it was ready; " + log + ":\n" +
                                  TailFile(log, 1500));
        }
        if (deadline.expired()) {
          return DeadlineExceededError("the agent of node " + std::to_string(i) +
                                       " did not start listening in time (no " + sock + ")");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    return Status::Ok();
  }

  // Every node's agent has (re)joined the membership with an endpoint.
  Status WaitEndpoints(Deadline deadline) {
    while (true) {
      MEMENTO_ASSIGN_OR_RETURN(auto eps, ReadEndpoints(*store, o.job, o.nodes, deadline));
      std::string missing;
      for (int i = 0; i < o.nodes; ++i) {
        if (eps[static_cast<size_t>(i)].empty()) missing += " " + std::to_string(i);
      }
      if (missing.empty()) return Status::Ok();
      for (int i = 0; i < o.nodes; ++i) {
        if (auto st = agents[static_cast<size_t>(i)].Poll()) {
          return UnavailableError("the agent of node " + std::to_string(i) + " exited (" +
                                  st->ToString() + ") while rejoining");
        }
      }
      if (deadline.expired()) {
        return DeadlineExceededError("agents of nodes" + missing +
                                     " did not join the membership in time");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  Status StartTrainers() {
    const std::string rdzv = o.run_dir + "/rendezvous." + std::to_string(attempt);
    RemoveAll(rdzv);
    MEMENTO_RETURN_IF_ERROR(MakeDirs(rdzv));
    trainers.clear();
    trainers.resize(static_cast<size_t>(world));
    trainer_done.assign(static_cast<size_t>(world), false);
    for (int r = 0; r < world; ++r) {
      const int node = NodeOf(r);
      std::map<std::string, std::string> vars = {{"rank", std::to_string(r)},
                                                 {"node", std::to_string(node)},
                                                 {"world_size", std::to_string(world)},
                                                 {"job", o.job},
                                                 {"run_dir", o.run_dir},
                                                 {"node_dir", Root(node)},
                                                 {"attempt", std::to_string(attempt)},
                                                 {"rendezvous", rdzv},
                                                 {"dp", std::to_string(o.dp)},
                                                 {"tp", std::to_string(o.tp)},
                                                 {"pp", std::to_string(o.pp)}};
      SpawnOptions so;
      for (const std::string& a : o.trainer) so.argv.push_back(Substitute(a, vars));
      so.argv = InNode(node, std::move(so.argv));
      so.env = {"MEMENTO_JOB=" + o.job,
                "MEMENTO_RANK=" + std::to_string(r),
                "MEMENTO_WORLD_SIZE=" + std::to_string(world),
                "MEMENTO_NODE=" + std::to_string(node),
                "MEMENTO_RUN_DIR=" + Root(node),
                "MEMENTO_RENDEZVOUS=" + rdzv,
                "MEMENTO_ATTEMPT=" + std::to_string(attempt),
                "MEMENTO_DP=" + std::to_string(o.dp),
                "MEMENTO_TP=" + std::to_string(o.tp),
                "MEMENTO_PP=" + std::to_string(o.pp),
                "MEMENTO_ZERO=" + std::to_string(o.zero),
                "MEMENTO_STORE=" + store_url,
                "MEMENTO_TOKEN_FILE=" + token_path,
                "MEMENTO_NODE_ADDR=" + NodeAddress(node)};
      so.log_path = logs + "/rank" + std::to_string(r) + ".log";
      AppendLine(so.log_path, "---- memento launch: rank " + std::to_string(r) + " attempt " +
                                  std::to_string(attempt) + " ----");
      auto p = Subprocess::Spawn(so);
      if (!p.ok()) return p.status().WithContext("start trainer rank " + std::to_string(r));
      trainers[static_cast<size_t>(r)] = std::move(*p);
    }
    return Status::Ok();
  }

  void StopTrainers() {
    for (Subprocess& t : trainers) {
      if (t.running()) t.Kill(SIGTERM).IgnoreError();
    }
    for (Subprocess& t : trainers) {
      if (t.pid() > 0) t.Terminate(2.0);
    }
  }

  void StopAgents() {
    for (Subprocess& a : agents) {
      if (a.running()) a.Kill(SIGTERM).IgnoreError();
    }
    for (Subprocess& a : agents) {
      if (a.pid() > 0) a.Terminate(5.0);
    }
  }

  // The durable-tier fallback (docs/recovery.md): memory cannot rebuild any
  // committed version, and `step` is the newest complete durable version.
  // Every node loads it into its T0 (kPeerLoadDurable, in parallel) and
  // targets it; fills the report's durable fields.
  Result<DurableLoad> FallBackToDurable(int64_t step, const std::string& memory_reason,
                                        RecoveryReport* rep) {
    Say("memory cannot rebuild any committed version: " + memory_reason);
    Say("falling back to the durable tier " + o.durable_dir + ": loading step " +
        std::to_string(step) + " on " + std::to_string(o.nodes) + " node(s)");
    MEMENTO_ASSIGN_OR_RETURN(DurableLoad load,
                             LoadDurableCluster(*store, token, o.job, o.nodes, o.durable_dir, step,
                                                Deadline::AfterSeconds(o.recovery_timeout_s)));
    rep->source = "durable";
    rep->step = step;
    rep->steps_lost = std::max<int64_t>(0, rep->committed - step);
    rep->load_s = load.total_s;
    rep->read_bytes = load.read_bytes;
    rep->rebuilt_bytes = load.bytes;
    rep->write_s = load.write_s;
    rep->reason = "restored from the durable tier at step " + std::to_string(step) + ", " +
                  std::to_string(rep->steps_lost) + " steps lost (committed " +
                  std::to_string(rep->committed) + "; memory: " + memory_reason + ")";
    return load;
  }

  void MaybePublishPlan() {
    if (plan.has_value()) return;
    auto p = PlanFromStore(*store, o.job, Deadline::AfterSeconds(5));
    if (!p.ok()) {
      if (p.status().code() != StatusCode::kNotFound) {
        Say("cannot compute the plan: " + p.status().ToString());
      }
      return;
    }
    const uint64_t hash = recover::PlanHash(*p);
    coord::JobKeys keys(o.job);
    auto st = store->Set(keys.PlanHash(), std::to_string(hash), Deadline::AfterSeconds(5));
    if (!st.ok()) {
      Say("cannot publish the plan hash: " + st.status().ToString());
      return;
    }
    if (!o.quiet) {
      Say("plan " + std::to_string(hash) + ": policy " + topo::PolicyName(p->policy) +
          ", protection " + std::to_string(p->protection) + " node failure(s), " +
          std::to_string(p->total_state_bytes) + " state bytes, " +
          std::to_string(p->total_held_bytes) + " bytes held" +
          (p->reason.empty() ? "" : "; " + p->reason));
    }
    plan = std::move(*p);
  }
};

Result<LaunchSummary> Launcher::Run() {
  const LaunchOptions& o = options_;
  LaunchSummary summary;
  // An external embedded store was started with the job's token; etcd has its
  // own authentication, so the agents' token is generated as for a hosted store.
  const bool store_has_token = !o.store_url.empty() && o.store_url.rfind("etcd://", 0) != 0;
  Result<net::JobToken> token = (!o.token_file.empty() || store_has_token)
                                    ? net::JobToken::Load(o.token_file)
                                    : net::JobToken::Generate();
  if (!token.ok()) {
    return token.status().WithContext(o.store_url.empty()
                                          ? "the job token (--token-file)"
                                          : "the job token of the store " + o.store_url +
                                                " (--token-file or MEMENTO_JOB_TOKEN)");
  }
  State s(o, std::move(*token));
  s.world = o.nodes * o.ranks_per_node;
  MEMENTO_ASSIGN_OR_RETURN(s.topology.topology,
                           topo::Topology::Uniform(o.dp, o.tp, o.pp, o.zero, o.ranks_per_node));
  MEMENTO_ASSIGN_OR_RETURN(s.topology.policy, topo::ParsePolicy(o.policy));
  s.topology.policy.host_bytes_per_node = o.host_budget;
  s.topology.policy.copy_bytes_per_node = o.copy_budget;
  s.topology.policy.network_bytes_per_node = o.network_budget;
  s.fired.assign(injections_.size(), false);
  s.agents.resize(static_cast<size_t>(o.nodes));
  s.node_lost.assign(static_cast<size_t>(o.nodes), false);

  MEMENTO_RETURN_IF_ERROR(MakeDirs(o.run_dir));
  s.logs = o.run_dir + "/logs";
  MEMENTO_RETURN_IF_ERROR(MakeDirs(s.logs));
  s.token_path = o.run_dir + "/job.token";
  MEMENTO_RETURN_IF_ERROR(WriteTokenFile(s.token_path, s.token));
  const Deadline setup = Deadline::AfterSeconds(o.agent_start_timeout_s);
  if (o.netns) {
    MEMENTO_ASSIGN_OR_RETURN(s.network, NodeNetwork::Create(o.nodes));
    if (!o.quiet) s.Say("network namespaces: " + s.network->Describe());
  }
  StoreHostOptions sho;
  if (s.network) sho.listen_host = s.network->BridgeAddress();
  sho.mode = !o.store_url.empty() ? StoreMode::kExternal
             : o.store_process    ? StoreMode::kProcess
                                  : StoreMode::kInProcess;
  sho.url = o.store_url;
  sho.memento_binary = o.memento_binary;
  sho.token_path = s.token_path;
  sho.log_path = s.logs + "/store.log";
  sho.port_file = o.run_dir + "/store.port";
  MEMENTO_ASSIGN_OR_RETURN(s.store_host, StoreHost::Start(sho, s.token, setup));
  s.store = &s.store_host->store();
  s.store_url = s.store_host->url();
  if (sho.mode == StoreMode::kExternal) {
    // A job name reused in a long-lived store would inherit old commits.
    auto old = coord::ReadLatestCommit(*s.store, o.job, setup);
    if (old.ok()) {
      return FailedPreconditionError("the store " + o.store_url + " already holds commits of job " +
                                     o.job + " (step " + std::to_string(*old) +
                                     "): choose another --job");
    }
  }
  MEMENTO_RETURN_IF_ERROR(PublishTopology(*s.store, o.job, s.topology, setup));
  MEMENTO_RETURN_IF_ERROR(s.StartCoordinator(setup));
  s.commit_history.WatchSkips(s.store, o.job);
  if (!o.quiet) {
    s.Say("job " + o.job + ": " + std::to_string(o.nodes) + " node(s) x " +
          std::to_string(o.ranks_per_node) + " rank(s), dp " + std::to_string(o.dp) + " tp " +
          std::to_string(o.tp) + " pp " + std::to_string(o.pp) + " zero " + std::to_string(o.zero) +
          ", policy " + o.policy + "; store " + s.store_url + " (" +
          std::string(StoreModeName(sho.mode)) + "); run dir " + o.run_dir);
    for (const Injection& inj : injections_) s.Say("will inject " + inj.ToString());
  }

  // Everything below ends through `finish`, which stops the children.
  auto finish = [&](bool success, int code, std::string message) -> Result<LaunchSummary> {
    s.StopTrainers();
    s.StopAgents();
    summary.final_committed = s.Committed();
    if (s.plan.has_value() && summary.final_committed >= 0) {
      summary.memory = s.MeasureMemory(summary.final_committed);
    }
    summary.store_restarts = s.store_restarts;
    s.coordinator.reset();
    s.commit_history.WatchSkips(nullptr, o.job);
    summary.commits = s.commit_history.Summary();
    s.store_host->Stop();
    if (!o.keep_run_dir) {
      for (int i = 0; i < o.nodes; ++i) RemoveAll(s.Root(i));
      for (int a = 0; a <= s.attempt; ++a) {
        RemoveAll(o.run_dir + "/rendezvous." + std::to_string(a));
      }
      unlink(s.token_path.c_str());
      unlink(sho.port_file.c_str());
    }
    summary.success = success;
    summary.exit_code = code;
    summary.message = std::move(message);
    summary.attempts = s.attempt + 1;
    return summary;
  };

  for (int i = 0; i < o.nodes; ++i) {
    Status st = s.StartAgent(i, /*fresh_root=*/false);
    if (!st.ok()) return finish(false, 1, st.ToString());
  }
  if (Status st = s.WaitAgentsReady(setup); !st.ok()) return finish(false, 1, st.ToString());
  if (!o.quiet) s.Say("agents ready; starting " + std::to_string(s.world) + " trainer(s)");
  if (Status st = s.StartTrainers(); !st.ok()) return finish(false, 1, st.ToString());

  int restarts = 0;
  while (true) {
    if (stop_requested_.load()) return finish(false, 130, "stopped by a signal");
    // The store: restart a killed one when its down time is over; notice one
    // that died or forgot the job. Nothing below waits on a store that is down.
    if (Status st = s.RestartStoreIfDue(); !st.ok()) return finish(false, 1, st.ToString());
    if (Status st = s.CheckStore(); !st.ok()) return finish(false, 1, st.ToString());
    if (!s.StoreDown()) s.MaybePublishPlan();

    // Steps whose redundancy could not be written ran unprotected: loud, and
    // with --require-protection the end of the job.
    if (const auto [n, why] = s.commit_history.Unprotected(); n > s.unprotected_warned) {
      if (s.unprotected_warned == 0) {
        s.Say(
            "WARNING: the job is running UNPROTECTED: a node could not write the redundancy "
            "of a step (" +
            why + ")" +
            (o.require_protection ? ""
                                  : "; going on without protection (--require-protection "
                                    "would end the job)"));
      } else if (n >= 2 * s.unprotected_warned) {
        s.Say("WARNING: " + std::to_string(n) + " step(s) unprotected so far");
      }
      if (s.unprotected_warned == 0 || n >= 2 * s.unprotected_warned) s.unprotected_warned = n;
      if (o.require_protection) {
        return finish(false, kExitUnprotected,
                      "--require-protection: a step could not be protected (" + why +
                          "); the job is stopped");
      }
    }

    // Injections.
    if (!injections_.empty() && !s.StoreDown()) {
      const int64_t reached = s.ReachedStep();
      for (size_t k = 0; k < injections_.size(); ++k) {
        const Injection& inj = injections_[k];
        if (s.fired[k] || inj.recovery >= 0 || reached < inj.step) continue;
        // One loss at a time: after a store restart, the next injection waits
        // until commits resumed (so "a node loss after the store restart"
        // really recovers from a commit made on the fresh store).
        if (s.StoreDown() || s.store_restarted_at.has_value()) continue;
        s.fired[k] = true;
        s.injected_at = Now();
        s.Say("injecting " + inj.ToString() + " (job at step " + std::to_string(reached) + ")");
        if (inj.kind == InjectKind::kKillStore) {
          // Not a failure of the training: nothing to recover, nothing to time.
          s.injected_at.reset();
          s.KillStore(inj.ToString(), -1, reached);
        } else if (inj.kind == InjectKind::kKillRank) {
          s.trainers[static_cast<size_t>(inj.target)].Kill(SIGKILL).IgnoreError();
        } else if (inj.kind == InjectKind::kCorruptDurable) {
          // Applied when a recovery next falls back to the durable tier.
          s.corrupt_durable_pending = true;
          s.injected_at.reset();
        } else if (inj.kind == InjectKind::kCorruptRank) {
          // Applied when the next failure has stopped the trainers, to the
          // newest committed version (the one that recovery then restores):
          // corruption at rest that only the recovery's verification can find.
          s.pending_corruptions.push_back(inj.target);
          s.injected_at.reset();
        } else {
          Subprocess& a = s.agents[static_cast<size_t>(inj.target)];
          a.Kill(SIGKILL).IgnoreError();
          if (inj.kind == InjectKind::kKillNode) {
            for (int r = 0; r < s.world; ++r) {
              if (s.NodeOf(r) == inj.target) {
                s.trainers[static_cast<size_t>(r)].Kill(SIGKILL).IgnoreError();
              }
            }
            // The host is gone with its memory: nothing of the root survives.
            (void)a.Wait(Deadline::AfterSeconds(10));
            for (int r = 0; r < s.world; ++r) {
              if (s.NodeOf(r) == inj.target) {
                (void)s.trainers[static_cast<size_t>(r)].Wait(Deadline::AfterSeconds(10));
              }
            }
            RemoveAll(s.Root(inj.target));
            s.node_lost[static_cast<size_t>(inj.target)] = true;
            if (s.network) {
              // The host is off the network too.
              Status st = s.network->SetNodeLink(inj.target, false);
              if (!st.ok()) s.Say("kill-node: taking the link down: " + st.ToString());
            }
          }
        }
      }
    }

    // Children.
    std::string cause;
    for (int i = 0; i < o.nodes && cause.empty(); ++i) {
      if (auto st = s.agents[static_cast<size_t>(i)].Poll()) {
        cause = s.node_lost[static_cast<size_t>(i)]
                    ? "node " + std::to_string(i) + " lost (agent and trainers killed, memory gone)"
                    : "the agent of node " + std::to_string(i) + " died (" + st->ToString() + ")";
      }
    }
    bool all_done = true;
    for (int r = 0; r < s.world; ++r) {
      if (s.trainer_done[static_cast<size_t>(r)]) continue;
      auto st = s.trainers[static_cast<size_t>(r)].Poll();
      if (!st.has_value()) {
        all_done = false;
        continue;
      }
      if (st->ok()) {
        s.trainer_done[static_cast<size_t>(r)] = true;
        continue;
      }
      all_done = false;
      if (cause.empty()) {
        cause = "rank " + std::to_string(r) + " (node " + std::to_string(s.NodeOf(r)) +
                ") failed: " + st->ToString();
      }
    }
    if (cause.empty() && all_done) {
      if (!o.quiet) s.Say("every trainer finished");
      return finish(true, 0, "every trainer exited 0");
    }

    if (!cause.empty()) {
      // ---- recovery -------------------------------------------------------------
      const TimePoint detected = Now();
      RecoveryReport rep;
      rep.n = static_cast<int>(summary.recoveries.size());
      rep.cause = cause;
      rep.detect_s = s.injected_at ? SecondsBetween(*s.injected_at, detected) : 0.0;
      s.injected_at.reset();
      summary.failures.push_back(cause);
      s.Say("failure: " + cause);
      if (restarts >= o.max_restarts) {
        return finish(false, 1,
                      "giving up: " + std::to_string(summary.failures.size()) +
                          " failure(s), --max-restarts " + std::to_string(o.max_restarts));
      }
      ++restarts;
      s.StopTrainers();
      // Recovery needs the store: a killed one comes back now.
      if (s.StoreDown()) {
        if (Status st = s.RestartStore(); !st.ok()) return finish(false, 1, st.ToString());
      }
      const Deadline agents_deadline = Deadline::AfterSeconds(o.agent_start_timeout_s);
      // An agent killed together with its trainer may still be dying when the
      // trainer's death is noticed (its stale socket and lease look alive):
      // when an agent turns out dead during the recovery, it is restarted on
      // its root and the recovery starts over (at most kRecoveryRounds times).
      constexpr int kRecoveryRounds = 3;
      std::optional<ClusterRecovery> recovered;
      for (int round = 0;; ++round) {
        std::string failed;
        for (int i = 0; i < o.nodes && failed.empty(); ++i) {
          Subprocess& a = s.agents[static_cast<size_t>(i)];
          if (a.running()) continue;  // reaps one that died unnoticed
          const bool lost = s.node_lost[static_cast<size_t>(i)];
          if (lost &&
              std::find(rep.lost_nodes.begin(), rep.lost_nodes.end(), i) == rep.lost_nodes.end()) {
            rep.lost_nodes.push_back(i);
          }
          s.Say(lost ? "replacing node " + std::to_string(i) + " by a fresh agent on an empty root"
                     : "restarting the agent of node " + std::to_string(i) + " on its root" +
                           (a.exit_status() ? " (it " + a.exit_status()->ToString() + ")" : ""));
          if (Status st = s.StartAgent(i, lost); !st.ok()) return finish(false, 1, st.ToString());
        }
        if (Status st = s.WaitAgentsReady(agents_deadline); !st.ok()) failed = st.ToString();
        // kill-store@recovery=N: the store host is lost in the middle of this
        // recovery (agents restarted, inventory round not begun).
        for (size_t k = 0; k < injections_.size() && failed.empty(); ++k) {
          const Injection& inj = injections_[k];
          if (s.fired[k] || inj.kind != InjectKind::kKillStore || inj.recovery != rep.n) continue;
          s.fired[k] = true;
          s.Say("injecting " + inj.ToString());
          s.KillStore(inj.ToString(), rep.n, s.known_committed);
          std::this_thread::sleep_for(std::chrono::duration<double>(o.store_down_s));
          if (Status st = s.RestartStore(); !st.ok()) return finish(false, 1, st.ToString());
        }
        if (failed.empty()) {
          rep.committed = s.Committed();
          if (s.plan.has_value() && rep.committed >= 0) {
            if (Status st = s.WaitEndpoints(agents_deadline); !st.ok()) failed = st.ToString();
          }
        }
        if (failed.empty()) {
          rep.restart_s = SecondsBetween(detected, Now());
          for (int rank : s.pending_corruptions) {
            auto slot = CorruptSlot(s.Root(s.NodeOf(rank)), rank, rep.committed);
            s.Say(slot.ok() ? "flipped a byte in slot " + std::to_string(*slot) + " of rank " +
                                  std::to_string(rank) + " (committed step " +
                                  std::to_string(rep.committed) + ")"
                            : "corrupt-rank: " + slot.status().ToString());
          }
          s.pending_corruptions.clear();
          if (!s.plan.has_value() || rep.committed < 0) break;
          RecoverOptions ro;
          ro.job = o.job;
          ro.num_nodes = o.nodes;
          ro.committed = rep.committed;
          auto rec = RecoverCluster(*s.store, *s.plan, s.token, ro,
                                    Deadline::AfterSeconds(o.recovery_timeout_s));
          if (rec.ok()) {
            // An agent that died meanwhile would fail the restarted trainers.
            if (s.DeadAgents().empty()) {
              recovered = std::move(*rec);
              break;
            }
            failed = "the recovery's decision was made while an agent was dying";
          } else {
            failed = "recovery failed: " + rec.status().ToString();
          }
        }
        const std::string dead = s.DeadAgents();
        if (dead.empty() || round + 1 >= kRecoveryRounds) return finish(false, 1, failed);
        s.Say("the agent(s) of node(s)" + dead + " died during recovery " + std::to_string(rep.n) +
              " (" + failed + "); restarting them and trying again");
      }
      if (recovered.has_value()) {
        const ClusterRecovery* rec = &*recovered;
        rep.reason = rec->decision.reason;
        for (int n : rec->decision.lost_nodes) {
          if (std::find(rep.lost_nodes.begin(), rep.lost_nodes.end(), n) == rep.lost_nodes.end()) {
            rep.lost_nodes.push_back(n);
          }
        }
        // Fallback: the newest durable version that verifies now (every
        // piece's checksum) is loaded by every node into its T0; a newer one
        // that fails verification or loading is skipped, and said why.
        bool from_durable = false;
        if (!rec->decision.from_memory && !o.durable_dir.empty()) {
          if (s.corrupt_durable_pending) {
            s.corrupt_durable_pending = false;
            auto what = CorruptNewestDurable(o.durable_dir);
            s.Say(what.ok() ? "corrupt-durable: " + *what
                            : "corrupt-durable: " + what.status().ToString());
          }
          auto versions = tier::ListVersions(tier::Env::Default(), o.durable_dir);
          if (!versions.ok()) {
            rep.durable_skipped.push_back("cannot list " + o.durable_dir + ": " +
                                          versions.status().ToString());
          } else {
            for (auto it = versions->rbegin(); it != versions->rend() && !from_durable; ++it) {
              if (!it->complete) continue;
              tier::VersionCheck check =
                  tier::VerifyVersion(tier::Env::Default(), o.durable_dir, it->step);
              std::string why;
              if (!check.ok) {
                why = "fails verification: " +
                      (check.problems.empty() ? std::string("?") : check.problems[0]);
                if (check.problems.size() > 1) {
                  why += " (and " + std::to_string(check.problems.size() - 1) + " more)";
                }
              } else {
                Result<DurableLoad> load =
                    s.FallBackToDurable(it->step, rec->decision.reason, &rep);
                if (load.ok()) {
                  from_durable = true;
                  break;
                }
                why = "loading it failed: " + load.status().ToString();
              }
              rep.durable_skipped.push_back("step " + std::to_string(it->step) + " " + why);
              s.Say("durable version " + std::to_string(it->step) + " skipped: " + why +
                    "; trying an older one");
            }
          }
        }
        if (from_durable) {
          if (!rep.durable_skipped.empty()) {
            rep.reason += "; newer durable version(s) skipped: ";
            for (size_t k = 0; k < rep.durable_skipped.size(); ++k) {
              rep.reason += (k ? "; " : "") + rep.durable_skipped[k];
            }
          }
          rep.inventory_plan_s = rec->inventory_plan_s;
        } else if (!rec->decision.from_memory) {
          std::string msg = "memory cannot rebuild any committed version: " + rec->decision.reason;
          if (!o.durable_dir.empty() && !rep.durable_skipped.empty()) {
            msg += "; the durable tier " + o.durable_dir +
                   " holds no version that verifies and loads:";
            for (size_t k = 0; k < rep.durable_skipped.size(); ++k) {
              msg += (k ? "; " : " ") + rep.durable_skipped[k];
            }
          } else if (!o.durable_dir.empty()) {
            tier::DurableVersionSource durable(tier::Env::Default(), o.durable_dir);
            auto latest = durable.LatestComplete(Deadline::AfterSeconds(30));
            if (latest.ok() && latest->has_value()) {
              // Only when it completed after the look-up above.
              msg += "; the durable tier " + o.durable_dir + " holds step " +
                     std::to_string(**latest) + ": restart the job from it";
            } else {
              msg += "; the durable tier " + o.durable_dir + " holds no complete version" +
                     (latest.ok() ? "" : " (" + latest.status().ToString() + ")");
            }
          } else {
            msg += " (no --durable-dir to fall back to)";
          }
          s.Say(msg);
          rep.source = "none";
          rep.reason = msg;
          json record = rep.ToJson();
          record["recovery"] = rec->ToJson();
          record["from_memory"] = false;
          coord::JobKeys keys(o.job);
          s.store->Set(keys.Recovery(rep.n), record.dump(), Deadline::AfterSeconds(5))
              .status()
              .IgnoreError();
          summary.recoveries.push_back(rep);
          return finish(false, 3, msg);
        } else {
          rep.step = rec->decision.step;
          rep.steps_lost = std::max<int64_t>(0, rep.committed - rep.step);
          rep.inventory_plan_s = rec->inventory_plan_s;
          rep.transfer_s = rec->transfer_s;
          rep.decode_s = rec->decode_s;
          rep.write_s = rec->write_s;
          rep.rebuilt_bytes = rec->rebuilt_bytes;
          s.Say("decision: " + rec->decision.reason);
        }
      } else {
        rep.source = "scratch";
        rep.reason = s.plan.has_value() ? "no committed version yet: the trainers start over"
                                        : "not every rank registered its state yet: the "
                                          "trainers start over";
        s.Say(rep.reason);
      }

      // The commit rule starts over from the restored step: reports of later
      // steps from the failed attempt must not count towards new commits.
      {
        coord::JobKeys keys(o.job);
        auto list = s.store->List(keys.CompletedPrefix(), Deadline::AfterSeconds(5));
        s.coordinator.reset();
        if (list.ok()) {
          for (const auto& kv : list->kvs) {
            s.store->Delete(kv.key, Deadline::AfterSeconds(5)).status().IgnoreError();
          }
        }
        if (Status st = s.StartCoordinator(Deadline::AfterSeconds(10)); !st.ok()) {
          return finish(false, 1, st.ToString());
        }
      }

      // A new incarnation of the job's history: durable parts written from
      // now on carry the new epoch, so that node 0 never commits a version
      // from parts of two histories (docs/durable_tier.md, "Cluster mode").
      {
        auto epoch = BumpEpoch(*s.store, o.job, Deadline::AfterSeconds(5));
        if (epoch.ok()) {
          rep.epoch = *epoch;
        } else {
          s.Say("cannot bump the durable epoch: " + epoch.status().ToString());
        }
      }
      ++s.attempt;
      s.commit_history.SetAttempt(s.attempt);
      rep.attempt = s.attempt;
      rep.total_s = SecondsBetween(detected, Now()) + rep.detect_s;
      {
        coord::JobKeys keys(o.job);
        json restore = {{"step", rep.step}, {"attempt", s.attempt}};
        s.restore_record = restore;
        s.recovery_records[rep.n] = rep.ToJson().dump();
        s.store->Set(keys.Restore(), restore.dump(), Deadline::AfterSeconds(5))
            .status()
            .IgnoreError();
        s.store->Set(keys.Recovery(rep.n), rep.ToJson().dump(), Deadline::AfterSeconds(5))
            .status()
            .IgnoreError();
      }
      s.Say(rep.ToString());
      summary.recoveries.push_back(rep);
      if (Status st = s.StartTrainers(); !st.ok()) return finish(false, 1, st.ToString());
      continue;
    }

    if (!o.quiet && s.progress_clock.Seconds() >= 2.0) {
      s.progress_clock.Reset();
      const int64_t c = s.Committed();
      if (c != s.last_progress_step) {
        int running = 0;
        for (Subprocess& t : s.trainers) running += t.running() ? 1 : 0;
        s.Say("attempt " + std::to_string(s.attempt) + ": committed step " + std::to_string(c) +
              ", " + std::to_string(running) + "/" + std::to_string(s.world) +
              " trainer(s) running");
        s.last_progress_step = c;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace memento::launch
