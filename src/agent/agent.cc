#include "agent/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "agent/thread_cpu.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/thread_cpu.h"
#include "fmt/format.h"
#include "shm/root_gc.h"
#include "shm/slot_format.h"

namespace memento::agent {

using nlohmann::json;

namespace {
// The longest a `target` op waits for a running recovery (the client gives
// the call 60 s).
constexpr double kTargetWaitS = 50;
}  // namespace

Agent::~Agent() {
  metrics_.reset();  // its threads read everything below
  Stop();
  {
    MutexLock l(&mu_);
    stopping_ = true;
    for (int fd : conn_fds_) shutdown(fd, SHUT_RDWR);
  }
  verify_cv_.SignalAll();
  for (auto& t : conn_threads_) t.thread.join();
  if (verifier_.joinable()) verifier_.join();
  scrubber_.reset();
  if (aor_ != nullptr) aor_->StopThread();  // its thread calls into job_member_
  job_member_.reset();  // first: it drives durable_ in cluster mode (commits, epoch)
  aor_.reset();
  durable_.reset();  // no connection thread can offer a version any more
  if (listen_fd_ >= 0) close(listen_fd_);
  if (options_.remove_on_exit && stopped_cleanly_.load() && lock_fd_ >= 0) {
    // Still holding agent.lock: no other agent can be adopting the root.
    auto freed = shm::RemoveNodeRootTree(root_);
    if (freed.ok()) {
      MEMENTO_LOG_INFO("removed {} ({} bytes freed; --remove-on-exit)", root_, *freed);
      // The job's directory of the default layout, once its last node is gone.
      if (root_ == shm::DefaultNodeRoot(options_.job_id, options_.node)) {
        rmdir(root_.substr(0, root_.rfind('/')).c_str());
      }
    } else {
      MEMENTO_LOG_WARN("--remove-on-exit: {}", freed.status().ToString());
    }
  }
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
  for (int fd : stop_pipe_) {
    if (fd >= 0) close(fd);
  }
}

Result<std::unique_ptr<Agent>> Agent::Start(const AgentOptions& options,
                                            const DurableOptions& durable) {
  std::unique_ptr<Agent> agent(new Agent());
  agent->options_ = options;
  agent->root_ =
      options.root.empty() ? shm::DefaultNodeRoot(options.job_id, options.node) : options.root;
  if (options.job_id.empty()) return InvalidArgumentError("--job must name the job");
  MEMENTO_RETURN_IF_ERROR(shm::MakePrivateDir(agent->root_));
  // One agent per root: a second one would hand the same slots out twice.
  std::string lock_path = agent->root_ + "/agent.lock";
  agent->lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (agent->lock_fd_ < 0) return ErrnoError("open " + lock_path, errno);
  if (flock(agent->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {0};
    ssize_t n = pread(agent->lock_fd_, pid, sizeof(pid) - 1, 0);
    (void)n;
    return AlreadyExistsError(fmt::format("another agent (pid {}) already serves {}",
                                          std::strtol(pid, nullptr, 10), agent->root_));
  }
  std::string pid = std::to_string(getpid()) + "\n";
  if (ftruncate(agent->lock_fd_, 0) != 0 ||
      pwrite(agent->lock_fd_, pid.data(), pid.size(), 0) < 0) {
    MEMENTO_LOG_WARN("could not write the pid into {}", lock_path);
  }
  shm::NodeStoreOptions so{agent->root_, options.job_id, options.node, options.budget_bytes};
  MEMENTO_ASSIGN_OR_RETURN(agent->store_, shm::NodeStore::Open(so));
  MEMENTO_ASSIGN_OR_RETURN(agent->listen_fd_, shm::ListenUnix(shm::AgentSocketPath(agent->root_)));
  if (durable.dir.empty()) {
    // No durable stream, so no durable hold: a word left by an earlier agent
    // would only make trainers skip until its deadline.
    unlink(shm::DurableWordPath(agent->root_).c_str());
  } else {
    MEMENTO_ASSIGN_OR_RETURN(
        agent->durable_, DurableStreamer::Start(durable, options.job_id, options.node, agent->root_,
                                                agent->store_.get()));
  }
  if (!options.cluster.store_url.empty()) {
    MEMENTO_ASSIGN_OR_RETURN(
        agent->job_member_,
        JobMember::Start(options.cluster, options.job_id, options.node, agent->root_,
                         agent->store_.get(), agent->durable_.get()));
  } else if (unlink(shm::CommitWordPath(agent->root_).c_str()) == 0) {
    // A single-node agent on a root that a cluster agent used: without the
    // file the trainers go back to the single-node slot rule.
    MEMENTO_LOG_INFO("removed the commit word of an earlier cluster-mode agent");
  }
  {
    JobMember* jm = agent->job_member_.get();
    AorHolder::SeedSource seed = [jm](const AorRange& r,
                                      int64_t step) -> Result<AorHolder::SeedBytes> {
      if (jm == nullptr) return UnavailableError("no cluster: nothing to seed a replica from");
      return jm->AorSeed(r, step);
    };
    AorHolder::OnAdvanced advanced = [jm](const AorRange& r, int64_t step,
                                          const opt::AorReplica& rep) {
      if (jm != nullptr) jm->OnAorAdvanced(r, step, rep);
    };
    // The ranks' own shard checksums, read from their staging files by the
    // holder's watchers: published to the store off the training path.
    AorHolder::OnChecksum sums = nullptr;
    if (jm != nullptr) {
      sums = [jm](int rank, int64_t step, uint64_t sum) {
        return jm->OnShardChecksum(rank, step, sum);
      };
    }
    agent->aor_ = std::make_unique<AorHolder>(agent->root_, std::move(seed), std::move(advanced),
                                              std::move(sums));
    if (jm != nullptr) {
      jm->SetAorHolder(agent->aor_.get());
      // The replicas count in the node's --budget (docs/node_store.md).
      agent->aor_->SetRoomCheck(
          [jm](uint64_t more, const std::string& why) { return jm->CheckNodeRoom(more, why); });
    }
  }
  if (pipe2(agent->stop_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) return ErrnoError("pipe", errno);
  agent->verifier_ = std::thread([a = agent.get()] {
    NameThisThread("verifier");
    a->VerifierLoop();
  });
  ScrubOptions scrub;
  scrub.bytes_per_s = options.scrub_bytes_per_s;
  scrub.interval_s = options.scrub_interval_s;
  scrub.status_path = agent->root_ + "/scrub.json";
  agent->scrubber_ = Scrubber::Start(scrub, agent->store_.get());
  if (!options.metrics_listen.empty()) {
    Agent* a = agent.get();
    MEMENTO_ASSIGN_OR_RETURN(agent->metrics_, MetricsServer::Start(options.metrics_listen,
                                                                   [a] { return a->Metrics(); }));
  }
  MEMENTO_LOG_INFO("agent for job {} node {} serving {} (budget {} bytes, {} bytes adopted)",
                   options.job_id, options.node, shm::AgentSocketPath(agent->root_),
                   options.budget_bytes, agent->store_->allocated_bytes());
  return agent;
}

void Agent::Stop() {
  if (stop_pipe_[1] >= 0) {
    char c = 1;
    ssize_t n = write(stop_pipe_[1], &c, 1);
    (void)n;
  }
}

Status Agent::Serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    int r = poll(fds, 2, -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("poll", errno);
    }
    if (fds[1].revents != 0) break;
    if (fds[0].revents == 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      return ErrnoError("accept", errno);
    }
    {
      MutexLock l(&mu_);
      conn_fds_.push_back(fd);
    }
    // Join the threads of connections that ended (trainers come and go).
    for (auto it = conn_threads_.begin(); it != conn_threads_.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = conn_threads_.erase(it);
      } else {
        ++it;
      }
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    conn_threads_.push_back({std::thread([this, fd, done] {
                               NameThisThread("trainer-conn");
                               HandleConnection(fd);
                               done->store(true);
                             }),
                             done});
  }
  MEMENTO_LOG_INFO("agent stopping; slots stay in {}", root_);
  {
    MutexLock l(&mu_);
    stopping_ = true;
    for (int fd : conn_fds_) shutdown(fd, SHUT_RDWR);
  }
  verify_cv_.SignalAll();
  for (auto& t : conn_threads_) t.thread.join();
  conn_threads_.clear();
  {
    // What the agent's CPU went to (docs/bench_overhead.md, "--cluster"):
    // one JSON object after this prefix, read by `memento bench overhead`.
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    nlohmann::json cpu = {
        {"process_cpu_s",
         static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
             static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6},
        {"seal_slots_cpu_s", static_cast<double>(seal_alloc_cpu_ns_.load()) * 1e-9},
        {"scrub_cpu_s", scrubber_ != nullptr ? scrubber_->Stats().cpu_s : 0.0}};
    if (job_member_ != nullptr) {
      const JobMemberStats s = job_member_->stats();
      cpu["t1_produce_cpu_s"] = s.produce_cpu_s;
      cpu["commit_cpu_s"] = s.commit_cpu_s;
      cpu["t0_verify_cpu_s"] = s.t0_verify_cpu_s;
      cpu["report_cpu_s"] = s.report_cpu_s;
      cpu["preallocate_cpu_s"] = s.preallocate_cpu_s;
      cpu["produced"] = s.produced;
      cpu["steady_process_cpu_s"] = s.steady_process_cpu_s;
      cpu["steady_versions"] = s.steady_versions;
      cpu["steady_cpu_s_per_version"] =
          s.steady_versions > 0 ? s.steady_process_cpu_s / static_cast<double>(s.steady_versions)
                                : 0.0;
    }
    MEMENTO_LOG_INFO("agent cpu by activity: {}", cpu.dump());
    // Every CPU-second of the process by thread (common/thread_cpu.h), the
    // whole run: what the activities above leave out shows here.
    const ThreadCpuReport threads = ThreadCpuByName();
    nlohmann::json by_thread = nlohmann::json::object();
    for (const auto& [name, seconds] : threads.by_name) by_thread[name] = seconds;
    by_thread["exited-unnamed"] = threads.unnamed_exited_s;
    MEMENTO_LOG_INFO("agent cpu by thread: {}", by_thread.dump());
    if (job_member_ != nullptr) {
      // The steady part, per version: from this node's first COMPLETED
      // report to now (the stop, so the last steps' work after the newest
      // report and the stop itself are in it: an upper bound), divided by
      // the versions reported after the first.
      const JobMemberStats s = job_member_->stats();
      if (s.produced >= 2) {
        nlohmann::json per_version = nlohmann::json::object();
        const double versions = static_cast<double>(s.produced - 1);
        for (auto it = by_thread.begin(); it != by_thread.end(); ++it) {
          auto first = s.thread_cpu_at_first_report.find(it.key());
          const double before = first == s.thread_cpu_at_first_report.end() ? 0.0 : first->second;
          per_version[it.key()] = (it->get<double>() - before) / versions;
        }
        MEMENTO_LOG_INFO("agent cpu by thread per version after the first: {}", per_version.dump());
      }
    }
  }
  stopped_cleanly_.store(true);
  return Status::Ok();
}

void Agent::HandleConnection(int fd) {
  int rank = -1;
  auto cred = shm::GetPeerCred(fd);
  Status denied;
  if (!cred.ok()) {
    denied = cred.status();
  } else if (cred->uid != geteuid()) {
    denied = PermissionDeniedError(
        fmt::format("client pid {} runs as uid {}, but this agent serves uid {} only", cred->pid,
                    cred->uid, geteuid()));
  }
  if (!denied.ok()) {
    MEMENTO_LOG_WARN("refused a connection: {}", denied.ToString());
    shm::SendJson(fd, shm::StatusToJson(denied), Deadline::AfterSeconds(1)).IgnoreError();
  } else {
    for (;;) {
      auto body = shm::RecvFrameWithin(fd, shm::kFrameTimeoutS);
      if (!body.ok()) {
        if (body.status().code() != StatusCode::kUnavailable) {
          // The framing is lost (a half-sent or oversized message): say why
          // and close; other connections are not affected.
          MEMENTO_LOG_WARN("dropping the connection of pid {}{}: {}", cred->pid,
                           rank >= 0 ? fmt::format(" (rank {})", rank) : "",
                           body.status().ToString());
          shm::SendJson(fd, shm::StatusToJson(body.status()), Deadline::AfterSeconds(1))
              .IgnoreError();
        }
        break;
      }
      auto req = ParseAgentRequest(*body);
      json reply;
      if (!req.ok()) {
        // A whole frame arrived, so the stream is still in step: answer the
        // error and serve the next message.
        MEMENTO_LOG_WARN("pid {}: {}", cred->pid, req.status().ToString());
        reply = shm::StatusToJson(req.status());
      } else {
        reply = Handle(*req, cred->pid, &rank);
      }
      if (!shm::SendJson(fd, reply, Deadline::AfterSeconds(10)).ok()) break;
    }
  }
  if (rank >= 0) MEMENTO_LOG_INFO("rank {} disconnected", rank);
  bool stopping = false;
  {
    MutexLock l(&mu_);
    stopping = stopping_;
  }
  if (rank >= 0 && job_member_ != nullptr && !stopping) job_member_->OnTrainerGone(rank);
  MutexLock l(&mu_);
  auto owner = rank_owner_.find(rank);
  if (owner != rank_owner_.end() && cred.ok() && owner->second == cred->pid) {
    rank_owner_.erase(owner);
  }
  for (auto it = conn_fds_.begin(); it != conn_fds_.end(); ++it) {
    if (*it == fd) {
      conn_fds_.erase(it);
      break;
    }
  }
  close(fd);
}

json Agent::Handle(const AgentRequest& req, pid_t peer_pid, int* conn_rank) {
  try {
    return HandleChecked(req, peer_pid, conn_rank);
  } catch (const std::exception& e) {
    // Every field was checked by ParseAgentRequest; this is a bug, not bad
    // input, but it must not take the agent down.
    MEMENTO_LOG_ERROR("'{}' request of rank {}: {}", AgentOpName(req.op), req.rank, e.what());
    return shm::StatusToJson(InternalError(
        fmt::format("'{}' request failed in the agent: {}", AgentOpName(req.op), e.what())));
  }
}

json Agent::HandleChecked(const AgentRequest& req, pid_t peer_pid, int* conn_rank) {
  const int rank = req.rank;
  if (*conn_rank >= 0 && req.op != AgentOp::kPing && rank != *conn_rank) {
    return shm::StatusToJson(InvalidArgumentError(
        fmt::format("'{}' request names rank {}, but this connection said hello as rank {}",
                    AgentOpName(req.op), rank, *conn_rank)));
  }
  switch (req.op) {
    case AgentOp::kHello: {
      if (req.protocol != shm::kProtocolVersion) {
        return shm::StatusToJson(FailedPreconditionError(fmt::format(
            "protocol version {} (this agent speaks {})", req.protocol, shm::kProtocolVersion)));
      }
      if (req.job != options_.job_id) {
        return shm::StatusToJson(
            NotFoundError(fmt::format("unknown job '{}': the agent at {} serves job '{}' (node {})",
                                      req.job, root_, options_.job_id, options_.node)));
      }
      {
        MutexLock l(&mu_);
        auto it = rank_owner_.find(rank);
        // A process that died has closed its socket, but its connection
        // thread may not have noticed yet: only a live owner blocks.
        if (it != rank_owner_.end() && it->second != peer_pid && kill(it->second, 0) == 0) {
          return shm::StatusToJson(AlreadyExistsError(
              fmt::format("rank {} of job '{}' is already connected from pid {} (pid {} asked); "
                          "two trainers must not share a rank",
                          rank, options_.job_id, it->second, peer_pid)));
        }
        rank_owner_[rank] = peer_pid;
      }
      *conn_rank = rank;
      MEMENTO_LOG_INFO("rank {} connected (pid {})", rank, peer_pid);
      return shm::ToJson(shm::HelloReply{options_.node, root_, getpid()});
    }
    case AgentOp::kPing:
      return shm::StatusToJson(Status::Ok());
    case AgentOp::kSeal: {
      if (job_member_ != nullptr) {
        if (!req.has_manifest) {
          return shm::StatusToJson(FailedPreconditionError(
              "this agent runs in cluster mode and needs the rank's tensors (a client of this "
              "version sends them with seal)"));
        }
        // Checked before anything is allocated for it.
        auto tensors = shm::ParseManifest(req.manifest);
        if (!tensors.ok()) {
          return shm::StatusToJson(
              InvalidArgumentError(fmt::format("'seal' request of rank {}: field 'manifest': {}",
                                               rank, tensors.status().message())));
        }
      }
      const double cpu0 = ThreadCpuSeconds();
      auto paths = store_->EnsureSlots(rank, req.bytes);
      seal_alloc_cpu_ns_.fetch_add(static_cast<int64_t>((ThreadCpuSeconds() - cpu0) * 1e9));
      if (!paths.ok()) {
        MEMENTO_LOG_ERROR("rank {}: {}", rank, paths.status().ToString());
        return shm::StatusToJson(paths.status());
      }
      MEMENTO_LOG_INFO("rank {} sealed: 2 slots of {} bytes", rank, req.bytes);
      if (job_member_ != nullptr) job_member_->OnSeal(rank, req.manifest);
      return shm::ToJson(shm::SealReply{*paths});
    }
    case AgentOp::kComplete: {
      MEMENTO_LOG_DEBUG("rank {} completed step {} in slot {}", rank, req.step, req.slot);
      RecordSnapshot(rank, req.slot, req.step);
      if (options_.verify_on_complete) EnqueueVerify(rank, req.slot);
      // Cluster mode: the durable stream follows the cluster's commits instead.
      if (durable_ && !job_member_) durable_->OnComplete(rank, req.step);
      if (job_member_) job_member_->OnComplete(rank, req.slot, req.step);
      return shm::StatusToJson(Status::Ok());
    }
    case AgentOp::kSkipped: {
      MutexLock l(&mu_);
      ++snapshot_stats_.skipped;
    }
      if (job_member_) job_member_->OnSkipped(rank, req.step);
      return shm::StatusToJson(Status::Ok());
    case AgentOp::kTarget: {
      if (job_member_ == nullptr) {
        return shm::StatusToJson(FailedPreconditionError(
            "op 'target' needs an agent in cluster mode (--store); this one runs alone"));
      }
      if (options_.await_recovery) {
        // Under the client's 60 s limit on this call, so that the trainer
        // reads why instead of a timeout.
        Status st = options_.await_recovery(Deadline::AfterSeconds(kTargetWaitS));
        if (!st.ok()) return shm::StatusToJson(st);
      }
      return shm::ToJson(shm::TargetReply{job_member_->RestoreTarget()});
    }
    case AgentOp::kAssemble: {
      if (job_member_ == nullptr) {
        return shm::StatusToJson(FailedPreconditionError(
            "op 'assemble' needs an agent in cluster mode (--store): a slot of plan pieces is "
            "written only there; this one runs alone"));
      }
      auto staged = job_member_->Assemble(rank, req.step);
      if (!staged.ok()) {
        MEMENTO_LOG_ERROR("rank {}: {}", rank, staged.status().ToString());
        return shm::StatusToJson(staged.status());
      }
      return shm::ToJson(*staged);
    }
    case AgentOp::kVerify: {
      Status st = store_->Verify(rank, req.slot);
      if (!st.ok()) MEMENTO_LOG_ERROR("rank {} slot {}: {}", rank, req.slot, st.ToString());
      return shm::ToJson(shm::VerifyReply{st});
    }
    case AgentOp::kPlan: {
      // A single-node agent has no cluster plan: its ranks save whole
      // tensors (docs/reft.md section 1).
      if (job_member_ == nullptr) return shm::ToJson(shm::PlanReply{});
      auto ranges = job_member_->SaveRanges(rank, req.client_parity, req.step);
      if (!ranges.ok()) return shm::StatusToJson(ranges.status());
      return shm::ToJson(*ranges);
    }
    case AgentOp::kAorRegister: {
      // The ranges this rank's gradients feed (docs/reft.md section 5); a
      // single-node agent has no plan and no replicas.
      std::vector<AorRange> ranges;
      const std::string encoding = shm::OptimizerEncoding(req);
      if (job_member_ != nullptr) {
        auto decoded = opt::DecodeOptimizer(encoding);
        if (!decoded.ok()) {
          return shm::StatusToJson(InvalidArgumentError(
              fmt::format("'aor_register' request of rank {}: field 'optimizer': {}", rank,
                          decoded.status().message())));
        }
        auto r = job_member_->AorRanges(rank, (*decoded)->num_state());
        if (!r.ok()) return shm::StatusToJson(r.status());
        ranges = std::move(*r);
      }
      auto reply = aor_->Register(rank, encoding, req.numel, std::move(ranges));
      if (!reply.ok()) {
        MEMENTO_LOG_ERROR("rank {}: {}", rank, reply.status().ToString());
        return shm::StatusToJson(reply.status());
      }
      return shm::ToJson(*reply);
    }
    case AgentOp::kAorCapture: {
      const float lr = req.has_lr ? static_cast<float>(req.lr) : std::nanf("");
      // Queued for the AOR thread: the trainer does not wait for the host
      // step (docs/reft.md section 5).
      Status st = aor_->Submit(rank, req.step, lr);
      if (!st.ok()) MEMENTO_LOG_WARN("rank {}: {}", rank, st.ToString());
      return shm::StatusToJson(st);
    }
    case AgentOp::kAorChecksum: {
      if (job_member_ == nullptr) return shm::StatusToJson(Status::Ok());  // nobody to check
      Status st = job_member_->OnShardChecksum(rank, req.step, req.checksum);
      if (!st.ok())
        MEMENTO_LOG_WARN("rank {}: publishing its shard checksum: {}", rank, st.ToString());
      return shm::StatusToJson(st);
    }
    case AgentOp::kList: {
      shm::ListReply list;
      auto inv = store_->Inventory(rank);
      for (const auto& s : inv) {
        if (s.state != shm::SlotState::kComplete || s.verified) continue;
        Status st = store_->Verify(rank, s.slot);  // a list answers with checked facts
        if (!st.ok()) MEMENTO_LOG_WARN("rank {} slot {}: {}", rank, s.slot, st.ToString());
      }
      inv = store_->Inventory(rank);
      for (const auto& s : inv) {
        if (s.state != shm::SlotState::kComplete) continue;
        list.versions.push_back({s.step, s.slot, s.intact, s.data_bytes, s.error});
      }
      std::sort(
          list.versions.begin(), list.versions.end(),
          [](const shm::VersionEntry& a, const shm::VersionEntry& b) { return a.step > b.step; });
      return shm::ToJson(list);
    }
  }
  return shm::StatusToJson(InternalError("unhandled op"));
}

void Agent::RecordSnapshot(int rank, int slot, int64_t step) {
  // The sizes and times the trainer wrote into the slot's header: read
  // here rather than sent again (the header is the record of the write).
  uint64_t bytes = 0;
  double seconds = 0;
  bool measured = false;
  if (auto seg = store_->SlotSegment(rank, slot);
      seg != nullptr && seg->size() >= sizeof(shm::SlotHeader)) {
    shm::SlotHeader h;
    std::memcpy(&h, seg->data(), sizeof(h));
    if (h.magic == shm::kSlotMagic && h.step == step && h.complete_wall_ns >= h.begin_wall_ns) {
      bytes = h.data_bytes;
      seconds = static_cast<double>(h.complete_wall_ns - h.begin_wall_ns) / 1e9;
      measured = true;
    }
  }
  if (!measured) {
    MEMENTO_LOG_DEBUG("rank {} slot {}: header does not hold step {}; snapshot not measured", rank,
                      slot, step);
  }
  MutexLock l(&mu_);
  ++snapshot_stats_.snapshots;
  snapshot_stats_.bytes += bytes;
  if (measured) {
    snapshot_stats_.seconds += seconds;
    snapshot_stats_.last_seconds = seconds;
  }
  int64_t& newest = snapshot_stats_.rank_step.emplace(rank, -1).first->second;
  newest = std::max(newest, step);
}

SnapshotStats Agent::snapshot_stats() {
  MutexLock l(&mu_);
  return snapshot_stats_;
}

std::string Agent::metrics_address() const {
  return metrics_ != nullptr ? metrics_->address() : std::string();
}

void Agent::EnqueueVerify(int rank, int slot) {
  {
    MutexLock l(&mu_);
    verify_queue_.emplace_back(rank, slot);
  }
  verify_cv_.Signal();
}

void Agent::VerifierLoop() {
  for (;;) {
    std::pair<int, int> item;
    {
      MutexLock l(&mu_);
      while (verify_queue_.empty() && !stopping_) verify_cv_.Wait(&l);
      if (stopping_) return;
      item = verify_queue_.front();
      verify_queue_.pop_front();
    }
    Status st = store_->Verify(item.first, item.second);
    if (st.code() == StatusCode::kDataLoss) {
      MEMENTO_LOG_ERROR("rank {} slot {}: {}", item.first, item.second, st.ToString());
    } else if (!st.ok()) {
      MEMENTO_LOG_DEBUG("rank {} slot {}: {}", item.first, item.second, st.ToString());
    }
  }
}

}  // namespace memento::agent
