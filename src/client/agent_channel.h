// The trainer's connection to its node's agent: the Unix socket agent.sock
// in the agent's directory, JSON frames (shm/protocol.h). Only small control
// messages cross it; no byte of state does.
//
// Thread safety: every method may be called from any thread (the trainer's,
// a copy worker's); one request/response runs at a time.
#pragma once

#include <string>

#include "common/mutex.h"
#include "memento/client.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "shm/agent_messages.h"
#include "shm/protocol.h"

namespace memento::client {

class AgentChannel {
 public:
  AgentChannel(const ClientOptions& options, std::string dir);
  ~AgentChannel();
  AgentChannel(const AgentChannel&) = delete;
  AgentChannel& operator=(const AgentChannel&) = delete;

  // Connects and says hello. Unavailable (no agent or a stale socket),
  // NotFound (no agent directory: unknown job), PermissionDenied (the agent
  // runs as another uid), each naming the path. A rank still held by a
  // trainer process that just died is released by the agent within moments,
  // so AlreadyExists is retried until the deadline too.
  Status Connect(Deadline deadline) EXCLUDES(mu_);

  // One request/response; reconnects once (waiting at most reconnect_s, and
  // never longer than connect_timeout_s) when the agent went away: it may
  // have been restarted, and slots live on in shared memory. An error reply
  // is returned as its Status; an ok reply is returned whole, for the
  // Parse...Reply of its op (shm/agent_messages.h).
  Result<nlohmann::json> Call(const shm::AgentRequest& request, Deadline deadline,
                              double reconnect_s = 2.0) EXCLUDES(mu_);

  // The agent's directory.
  const std::string& dir() const { return dir_; }

 private:
  Status ConnectLocked(Deadline deadline) REQUIRES(mu_);
  Status ConnectOnce(Deadline deadline) REQUIRES(mu_);

  const ClientOptions options_;
  const std::string dir_;
  Mutex mu_;
  int fd_ GUARDED_BY(mu_) = -1;
};

}  // namespace memento::client
