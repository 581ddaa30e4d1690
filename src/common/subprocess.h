// Child processes for the launcher, the benches and the multi-process tests:
// fork + exec with stdout and stderr appended to a log file, extra environment
// variables, real signals, and waits that take a Deadline.
//
//   SpawnOptions o;
//   o.argv = {"/path/to/memento", "agent", "--job", "j"};
//   o.log_path = dir + "/agent0.log";
//   MEMENTO_ASSIGN_OR_RETURN(Subprocess agent, Subprocess::Spawn(o));
//   ...
//   agent.Kill(SIGKILL);                      // a real kill -9
//   auto st = agent.Wait(Deadline::AfterSeconds(5));
//
// A Subprocess owns its child: the destructor kills (SIGKILL) and reaps a
// child that is still running, so no test or launcher leaks processes.
//
// Thread safety: a Subprocess is used from one thread at a time (it is a
// value; move it between threads, do not share it).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "memento/deadline.h"
#include "memento/status.h"

namespace memento {

struct SpawnOptions {
  // argv[0] is the program: an absolute or relative path, or a bare name
  // looked up on PATH.
  std::vector<std::string> argv;
  // "KEY=VALUE" entries added to (or replacing in) this process's environment.
  std::vector<std::string> env;
  // stdout and stderr are appended to this file (created 0600). Empty: the
  // child inherits this process's stdout and stderr.
  std::string log_path;
  // Working directory of the child; empty: this process's.
  std::string cwd;
  // The child gets SIGKILL when the thread that spawned it exits
  // (PR_SET_PDEATHSIG): nothing outlives a crashed launcher or test.
  bool die_with_parent = true;
  // The child leads a new process group (setpgid), so KillGroup reaches its
  // own children too.
  bool new_process_group = false;
};

// How a child ended.
struct ExitStatus {
  int code = -1;   // exit code when it exited, else -1
  int signal = 0;  // the signal that killed it, else 0
  bool ok() const { return signal == 0 && code == 0; }
  // "exit code 3", "killed by signal 9 (Killed)".
  std::string ToString() const;
  static ExitStatus FromWaitStatus(int wait_status);
};

class Subprocess {
 public:
  Subprocess() = default;
  ~Subprocess();
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // Starts the child. Fails with InvalidArgument for an empty argv, NotFound
  // when the program does not exist or is not executable (checked before the
  // fork, so the message names it), ErrnoError for fork or the log file.
  [[nodiscard]] static Result<Subprocess> Spawn(const SpawnOptions& options);

  pid_t pid() const { return pid_; }
  // Whether the child is alive: reaps it first (Poll), so one killed since the last Poll or Wait is
  // ended (a cached flag called it running). Alive until its last thread ended, though /proc shows
  // 'Z' once its main thread did (subprocess_test: ALeaderThatEndedWhileAThreadRunsIsRunning).
  bool running() {
    Poll();
    return pid_ > 0 && !status_.has_value();
  }
  // Whether the child was started and not reaped yet: no system call; a child
  // that died but was not reaped still counts (use running() to find out).
  bool unreaped() const { return pid_ > 0 && !status_.has_value(); }
  // The exit status once reaped.
  const std::optional<ExitStatus>& exit_status() const { return status_; }

  // Reaps the child if it ended; returns its status then, nullopt while it runs.
  std::optional<ExitStatus> Poll();
  // Waits for the child to end. DeadlineExceeded (child still running) when
  // the deadline passes first.
  [[nodiscard]] Result<ExitStatus> Wait(Deadline deadline);
  // Sends `sig` to the child (no-op once it was reaped).
  [[nodiscard]] Status Kill(int sig);
  // Sends `sig` to the child's process group (REQUIRES: new_process_group).
  [[nodiscard]] Status KillGroup(int sig);
  // SIGTERM, up to `grace_s` seconds for it to end, then SIGKILL; always
  // reaps. Returns how it ended.
  ExitStatus Terminate(double grace_s);
  // Gives up ownership: the child is neither killed nor reaped by the destructor.
  pid_t Release();

 private:
  pid_t pid_ = -1;
  bool group_ = false;
  std::optional<ExitStatus> status_;
};

// The last `max_bytes` of a file (log tails for error messages); "" when unreadable.
std::string TailFile(const std::string& path, size_t max_bytes = 2000);

// Resolves a program name like execvp would: a name with a '/' is returned
// as is when executable; a bare name is looked up on PATH. NotFound otherwise.
[[nodiscard]] Result<std::string> FindExecutable(const std::string& name);

}  // namespace memento
