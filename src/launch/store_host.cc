#include "launch/store_host.h"

#include <unistd.h>

#include <csignal>
#include <fstream>
#include <thread>

#include "common/log.h"
#include "net/socket.h"

namespace memento::launch {

std::string_view StoreModeName(StoreMode mode) {
  switch (mode) {
    case StoreMode::kInProcess:
      return "in-process";
    case StoreMode::kProcess:
      return "process";
    case StoreMode::kExternal:
      return "external";
  }
  return "?";
}

Result<std::unique_ptr<StoreHost>> StoreHost::Start(StoreHostOptions options,
                                                    const net::JobToken& token, Deadline deadline) {
  std::unique_ptr<StoreHost> h(new StoreHost(std::move(options)));
  const StoreHostOptions& o = h->options_;
  switch (o.mode) {
    case StoreMode::kInProcess: {
      MEMENTO_ASSIGN_OR_RETURN(h->server_,
                               coord::EmbeddedStoreServer::Start(o.listen_host, 0, token));
      h->port_ = h->server_->port();
      h->url_ = "tcp://" + o.listen_host + ":" + std::to_string(h->port_);
      h->store_ = &h->server_->store();
      return h;
    }
    case StoreMode::kProcess: {
      if (o.memento_binary.empty() || o.port_file.empty()) {
        return InvalidArgumentError("the store process needs the memento binary and a port file");
      }
      MEMENTO_RETURN_IF_ERROR(h->SpawnProcess(0, deadline));
      h->url_ = "tcp://" + o.listen_host + ":" + std::to_string(h->port_);
      auto client = std::make_unique<coord::StoreClient>(o.listen_host, h->port_, token);
      Status st = client->Ping(deadline);
      if (!st.ok()) {
        return UnavailableError("the store process on " + h->url_ +
                                " does not answer: " + st.ToString() + "; " + o.log_path + ":\n" +
                                TailFile(o.log_path, 1500));
      }
      h->client_ = std::move(client);
      h->store_ = h->client_.get();
      return h;
    }
    case StoreMode::kExternal: {
      MEMENTO_ASSIGN_OR_RETURN(h->client_, coord::OpenStore(o.url, o.token_path, deadline));
      h->url_ = o.url;
      h->store_ = h->client_.get();
      return h;
    }
  }
  return InvalidArgumentError("unknown store mode");
}

Status StoreHost::SpawnProcess(int port, Deadline deadline) {
  const StoreHostOptions& o = options_;
  for (;;) {
    unlink(o.port_file.c_str());
    SpawnOptions so;
    so.argv = {
        o.memento_binary, "store",      "--listen",    o.listen_host + ":" + std::to_string(port),
        "--token-file",   o.token_path, "--port-file", o.port_file};
    so.log_path = o.log_path;
    MEMENTO_ASSIGN_OR_RETURN(process_, Subprocess::Spawn(so));
    killed_ = false;
    // The store writes its port file (atomically) once it listens.
    for (;;) {
      std::ifstream f(o.port_file);
      int p = 0;
      if (f >> p && p > 0) {
        port_ = p;
        return Status::Ok();
      }
      if (auto st = process_.Poll()) {
        const std::string tail = TailFile(o.log_path, 1500);
        // A restart on a fixed port races with the kernel releasing it.
        if (port != 0 && tail.find("in use") != std::string::npos && !deadline.expired()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          break;  // spawn again
        }
        return UnavailableError("the store process exited (" + st->ToString() +
                                ") before it listened; " + o.log_path + ":\n" + tail);
      }
      if (deadline.expired()) {
        process_.Terminate(1.0);
        return DeadlineExceededError("the store process did not listen in time (no " + o.port_file +
                                     "); " + o.log_path + ":\n" + TailFile(o.log_path, 1500));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

Status StoreHost::Kill() {
  if (options_.mode != StoreMode::kProcess) {
    return FailedPreconditionError("the store runs " + std::string(StoreModeName(options_.mode)) +
                                   ": only a store process (--store-process) can be killed");
  }
  if (!process_.running()) return FailedPreconditionError("the store process is not running");
  MEMENTO_RETURN_IF_ERROR(process_.Kill(SIGKILL));
  auto st = process_.Wait(Deadline::AfterSeconds(10));
  if (!st.ok()) return st.status().WithContext("reaping the killed store process");
  killed_ = true;
  return Status::Ok();
}

Status StoreHost::Restart(Deadline deadline) {
  if (options_.mode != StoreMode::kProcess) {
    return FailedPreconditionError("only a store process (--store-process) can be restarted");
  }
  if (process_.running()) return FailedPreconditionError("the store process is still running");
  MEMENTO_RETURN_IF_ERROR(SpawnProcess(port_, deadline));
  // The client reconnects by itself; wait until the new store answers.
  auto* client = static_cast<coord::StoreClient*>(client_.get());
  Status st = client->Ping(deadline);
  if (!st.ok()) {
    return UnavailableError("the restarted store on " + url_ +
                            " does not answer: " + st.ToString());
  }
  return Status::Ok();
}

std::optional<ExitStatus> StoreHost::PollExited() {
  if (options_.mode != StoreMode::kProcess || killed_ || process_.pid() <= 0) return std::nullopt;
  if (!process_.running()) return process_.exit_status();
  return process_.Poll();
}

void StoreHost::Stop() {
  if (server_) server_->Stop();
  if (process_.running()) process_.Terminate(5.0);
}

}  // namespace memento::launch
