#include "client/agent_channel.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "fmt/format.h"

namespace memento::client {

using nlohmann::json;

AgentChannel::AgentChannel(const ClientOptions& options, std::string dir)
    : options_(options), dir_(std::move(dir)) {}

AgentChannel::~AgentChannel() {
  MutexLock l(&mu_);
  if (fd_ >= 0) close(fd_);
}

Status AgentChannel::Connect(Deadline deadline) {
  MutexLock l(&mu_);
  return ConnectLocked(deadline);
}

Status AgentChannel::ConnectLocked(Deadline deadline) {
  for (;;) {
    Status st = ConnectOnce(deadline);
    if (st.code() != StatusCode::kAlreadyExists || deadline.expired()) return st;
    usleep(20000);
  }
}

Status AgentChannel::ConnectOnce(Deadline deadline) {
  std::string path = shm::AgentSocketPath(dir_);
  Status last;
  for (;;) {
    struct stat st;
    if (stat(dir_.c_str(), &st) != 0) {
      last = NotFoundError(fmt::format(
          "unknown job '{}': no agent directory {} (is `memento agent --job {} --node {}` "
          "running?)",
          options_.job_id, dir_, options_.job_id, options_.node));
    } else {
      auto fd = shm::ConnectUnix(path);
      if (fd.ok()) {
        fd_ = *fd;
        break;
      }
      last = fd.status();
      if (last.code() == StatusCode::kNotFound) {
        last = UnavailableError("no agent is running for job '" + options_.job_id + "' in " + dir_ +
                                " (no socket)");
      }
      if (last.code() == StatusCode::kPermissionDenied) return last;
    }
    if (deadline.expired()) return last;
    usleep(20000);
  }
  auto cred = shm::GetPeerCred(fd_);
  if (!cred.ok() || cred->uid != geteuid()) {
    close(fd_);
    fd_ = -1;
    return PermissionDeniedError(
        fmt::format("the agent at {} runs as uid {}, this trainer as uid {}", path,
                    cred.ok() ? static_cast<int64_t>(cred->uid) : -1, geteuid()));
  }
  const json hello = shm::AgentRequestToJson(
      shm::HelloRequest(options_.job_id, options_.rank, options_.world_size));
  // The agent answers at once; give it a second even when the connect
  // deadline is (nearly) spent.
  Deadline hello_deadline =
      deadline.remaining() < std::chrono::seconds(1) ? Deadline::AfterSeconds(1) : deadline;
  Status st = shm::SendJson(fd_, hello, hello_deadline);
  Result<json> reply = st.ok() ? shm::RecvJson(fd_, hello_deadline) : Result<json>(st);
  if (reply.ok())
    st = shm::StatusFromJson(*reply);
  else
    st = reply.status();
  if (!st.ok()) {
    close(fd_);
    fd_ = -1;
    return st;
  }
  return Status::Ok();
}

Result<json> AgentChannel::Call(const shm::AgentRequest& request, Deadline deadline,
                                double reconnect_s) {
  const json msg = shm::AgentRequestToJson(request);
  MutexLock l(&mu_);
  Status st;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (fd_ < 0) {
      st = ConnectLocked(Deadline::AfterSeconds(std::min(options_.connect_timeout_s, reconnect_s)));
      if (!st.ok()) return st;
    }
    st = shm::SendJson(fd_, msg, deadline);
    if (st.ok()) {
      auto reply = shm::RecvJson(fd_, deadline);
      if (reply.ok()) {
        MEMENTO_RETURN_IF_ERROR(shm::StatusFromJson(*reply));
        return *reply;
      }
      st = reply.status();
    }
    if (st.code() != StatusCode::kUnavailable) return st;
    close(fd_);
    fd_ = -1;
  }
  return st;
}

}  // namespace memento::client
