// Garbage collection of node roots (`memento gc`, `memento agent
// --remove-on-exit`; docs/node_store.md, "Garbage collection").
//
// A node root (<base>/<job>/node<N> by default) outlives its agent on
// purpose: a restarted agent adopts the slots, so nothing removes a root by
// default. A finished or abandoned job's roots stay in shared memory until
// an operator runs `memento gc`, which removes only roots that nobody can
// still use:
//   - no process holds the root's agent.lock (the running agent flock's it
//     for its whole life; the lock dies with the process),
//   - nobody answers on its agent.sock,
//   - no process maps one of its files (a trainer of a dead agent still
//     holds its state there and a restarted agent may adopt it).
// Removal takes agent.lock first and re-checks under it, so an agent that
// starts on the root meanwhile either holds the lock (the root is kept) or
// fails to take it while the root is removed.
//
// Thread safety: free functions.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "memento/status.h"

namespace memento::shm {

// The default base of all roots: /dev/shm/memento.
std::string DefaultRootBase();

// What `memento gc` learned about one node root.
struct NodeRootState {
  std::string root;
  bool live = false;
  // Why the root is live ("agent pid 12 holds agent.lock", "files mapped by
  // pid 34", "agent.sock answers") or, for a dead one, what was found ("agent
  // pid 56 is gone; agent.lock is free; agent.sock does not answer").
  std::string why;
  pid_t agent_pid = -1;          // the last agent's pid (from agent.lock), -1 when unknown
  bool agent_pid_alive = false;  // that pid exists (it may have been reused)
  std::vector<pid_t> mapped_by;  // processes that map a file of the root
  uint64_t bytes = 0;            // memory its files hold (allocated blocks)
};

// Node roots under `base`: every directory `base/<job>/<dir>` (and `base/<dir>`)
// that holds an agent.lock, an agent.sock or a rank<R>.slot<S> file, sorted.
// NotFound when `base` does not exist.
Result<std::vector<std::string>> FindNodeRoots(const std::string& base);

// Probes one root without changing it.
Result<NodeRootState> ProbeNodeRoot(const std::string& root);

// Removes `root` if it is dead (see above), holding its agent.lock while it
// checks and removes. Returns the bytes freed. FailedPrecondition, naming
// why, when the root is live; nothing is then changed.
Result<uint64_t> RemoveDeadNodeRoot(const std::string& root);

// Removes every file under `root` and the directory itself, unchecked: for
// an agent that holds the root's lock and removes its own root on exit.
// Returns the bytes freed.
Result<uint64_t> RemoveNodeRootTree(const std::string& root);

// Processes (of this uid) that map a file under `dir`, from /proc/*/maps.
std::vector<pid_t> ProcessesMapping(const std::string& dir);

}  // namespace memento::shm
