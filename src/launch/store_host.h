// Where `memento launch` keeps the job's coordination store (docs/launch.md,
// "The store"):
//
//   kInProcess  coord::EmbeddedStoreServer inside the launcher (the default)
//   kProcess    a child `memento store --listen HOST:PORT` process; the store
//               host can then be lost for real: Kill() sends SIGKILL, Restart()
//               starts a fresh, EMPTY store on the same address
//   kExternal   a store someone else runs (`--store tcp://H:P`); never started,
//               stopped or killed by the launcher
//
// store() is the launcher's view in every mode: the MemoryStore itself
// in-process, otherwise a coord::StoreClient that reconnects to whatever
// answers on the address (across restarts).
//
// Thread safety: store() from any thread (the Store is thread-safe); every
// other method from the thread that called Start() (the child process gets
// SIGKILL when that thread exits: PR_SET_PDEATHSIG).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/subprocess.h"
#include "coord/embedded_store.h"
#include "coord/store.h"
#include "memento/deadline.h"
#include "memento/status.h"
#include "net/job_token.h"

namespace memento::launch {

enum class StoreMode : uint8_t { kInProcess = 0, kProcess = 1, kExternal = 2 };
std::string_view StoreModeName(StoreMode mode);  // "in-process", "process", "external"

struct StoreHostOptions {
  StoreMode mode = StoreMode::kInProcess;
  std::string url;                        // kExternal: tcp://HOST:PORT
  std::string listen_host = "127.0.0.1";  // kInProcess, kProcess
  std::string memento_binary;             // kProcess: runs `memento store`
  std::string token_path;                 // the job token file (every mode but kInProcess reads it)
  std::string log_path;                   // kProcess: the store's stdout + stderr (appended)
  std::string port_file;                  // kProcess: where the store writes its port
};

class StoreHost {
 public:
  // Starts (or, kExternal, connects to) the store and checks that it answers
  // before `deadline`. Errors: InvalidArgument (bad URL), Unavailable (the
  // store process exited or does not answer; the message has its log tail).
  [[nodiscard]] static Result<std::unique_ptr<StoreHost>> Start(StoreHostOptions options,
                                                                const net::JobToken& token,
                                                                Deadline deadline);
  ~StoreHost() { Stop(); }
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;

  coord::Store& store() { return *store_; }
  // tcp://HOST:PORT: what agents and trainers are given.
  const std::string& url() const { return url_; }
  StoreMode mode() const { return options_.mode; }
  // kProcess: the store process's pid while it runs, else -1.
  pid_t pid() const { return process_.unreaped() ? process_.pid() : -1; }

  // kProcess only (FailedPrecondition otherwise): SIGKILL the store process
  // and reap it. Everything it held is gone.
  [[nodiscard]] Status Kill();
  // kProcess only: starts a fresh, empty store process on the same address
  // (the old one must be dead: killed, or PollExited() said so) and waits
  // until it answers. Retries while the port is still taken until `deadline`.
  [[nodiscard]] Status Restart(Deadline deadline);
  // kProcess: how the store process ended when it exited without Kill()
  // (reaps it); nullopt while it runs, after Kill(), and in other modes.
  std::optional<ExitStatus> PollExited();
  // Stops the store (kInProcess: server; kProcess: SIGTERM, then SIGKILL).
  void Stop();

 private:
  explicit StoreHost(StoreHostOptions options) : options_(std::move(options)) {}
  // kProcess: spawns `memento store` on port `port` (0: any) and waits for
  // its port file; sets port_.
  Status SpawnProcess(int port, Deadline deadline);

  const StoreHostOptions options_;
  std::unique_ptr<coord::EmbeddedStoreServer> server_;  // kInProcess
  Subprocess process_;                                  // kProcess
  bool killed_ = false;                                 // kProcess: Kill() ended it
  int port_ = 0;
  std::string url_;
  std::unique_ptr<coord::Store> client_;  // kProcess, kExternal
  coord::Store* store_ = nullptr;         // server_->store() or client_
};

}  // namespace memento::launch
