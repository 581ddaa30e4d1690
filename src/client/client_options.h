// ClientOptions before a client is made (Client::Connect): the checks of
// every field, and the client's edge, where the environment variables a
// trainer's user sets become options (docs/architecture.md, "Settings and
// test hooks"); nothing below Connect reads the environment.
//
// Thread safety: free functions of their arguments, except that
// ResolveClientOptions may select the process's copy kernel
// (snap::SelectCopyKernel).
#pragma once

#include <string>

#include "memento/client.h"
#include "memento/status.h"

namespace memento::client {

// InvalidArgument naming the first field out of range (rank, chunk_bytes,
// copy_threads, copy_priority, schedule, the HAS pipeline, the job id).
[[nodiscard]] Status ValidateClientOptions(const ClientOptions& options);

struct ResolvedClientOptions {
  ClientOptions options;
  std::string agent_dir;  // where agent.sock is
};

// Applies the environment: MEMENTO_PARITY_IN (client, agent: client_parity
// false; another value: InvalidArgument naming it), the copy kernel
// (ClientOptions::copy_kernel, else MEMENTO_COPY_KERNEL; see client.h), and
// the agent directory (agent_dir, else MEMENTO_RUN_DIR, else the node's
// default root).
[[nodiscard]] Result<ResolvedClientOptions> ResolveClientOptions(const ClientOptions& options);

}  // namespace memento::client
