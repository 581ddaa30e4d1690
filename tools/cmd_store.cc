// `memento store`: hosts the embedded coordination store (docs/coordination.md).
//
//   memento store --listen 127.0.0.1:7070 --token-file job.token
//       [--port-file F] [--job J --nodes n0,n1,n2] [--max-request 64M --max-buffered 256M]
//   memento store status --store tcp://127.0.0.1:7070 --job J [--token-file F] [--json]
//
// The server prints "listening HOST:PORT" on stdout once it accepts
// connections (with --listen HOST:0 the chosen port; also written to
// --port-file) and runs until SIGTERM or SIGINT. With --job and --nodes it
// also runs the job's commit coordinator next to the store. --max-request
// and --max-buffered cap what one connection, and all together, may make
// the store hold (docs/transport.md, "Memory caps").
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "common/byte_flag.h"
#include "common/clock.h"
#include "common/log.h"
#include "coord/cluster_view.h"
#include "coord/commit.h"
#include "coord/embedded_store.h"
#include "fmt/format.h"
#include "net/socket.h"
#include "tools/command.h"
#include "tools/environment.h"
#include "tools/json_output.h"

namespace memento::tools {
namespace {

struct StoreArgs {
  std::string listen = "127.0.0.1:0";
  std::string token_file;
  std::string port_file;
  std::string job;
  std::string nodes;
  coord::StoreServerLimits limits;
  // status
  std::string url;
  bool json = false;
};

std::set<std::string> SplitNodes(const std::string& s) {
  std::set<std::string> out;
  std::stringstream in(s);
  std::string n;
  while (std::getline(in, n, ',')) {
    if (!n.empty()) out.insert(n);
  }
  return out;
}

Status RunStore(const StoreArgs& a) {
  InitLogging("store", LogOptionsFromEnvironment());
  if (a.limits.max_request_bytes < (uint64_t{1} << 20)) {
    return InvalidArgumentError(
        fmt::format("--max-request {} is below 1 MiB", a.limits.max_request_bytes));
  }
  if (a.limits.max_buffered_bytes < a.limits.max_request_bytes) {
    return InvalidArgumentError(
        fmt::format("--max-buffered {} is below --max-request {}: one request could never be held",
                    a.limits.max_buffered_bytes, a.limits.max_request_bytes));
  }
  Result<net::HostPort> listen = net::ParseHostPort(a.listen, net::PortUse::kListen);
  if (!listen.ok()) return listen.status().WithContext("--listen");
  MEMENTO_ASSIGN_OR_RETURN(net::JobToken token, net::JobToken::Load(a.token_file));
  std::set<std::string> nodes = SplitNodes(a.nodes);
  if (a.job.empty() != nodes.empty()) {
    return InvalidArgumentError(
        "--job and --nodes go together (the commit coordinator needs both)");
  }
  if (!a.job.empty()) MEMENTO_RETURN_IF_ERROR(coord::ValidateName("job", a.job));
  for (const auto& n : nodes) MEMENTO_RETURN_IF_ERROR(coord::ValidateName("node", n));

  // Whoever started us may close our stdout after reading the port line.
  signal(SIGPIPE, SIG_IGN);
  // Block the stop signals before any thread starts, so only sigwait sees them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  MEMENTO_ASSIGN_OR_RETURN(
      auto server, coord::EmbeddedStoreServer::Start(listen->host, listen->port, token, a.limits));
  std::unique_ptr<coord::CommitCoordinator> coordinator;
  if (!a.job.empty()) {
    MEMENTO_ASSIGN_OR_RETURN(coordinator,
                             coord::CommitCoordinator::Start(&server->store(), a.job, nodes,
                                                             Deadline::AfterSeconds(10)));
  }
  if (!a.port_file.empty()) {
    std::string tmp = a.port_file + ".tmp";
    {
      std::ofstream f(tmp);
      f << server->port() << "\n";
      if (!f) return ErrnoError("write " + tmp, errno);
    }
    if (rename(tmp.c_str(), a.port_file.c_str()) != 0) return ErrnoError("rename " + tmp, errno);
  }
  std::printf("listening %s:%d\n", listen->host.c_str(), server->port());
  std::fflush(stdout);
  MEMENTO_LOG_INFO("store: listening on {}:{}{}", listen->host, server->port(),
                   a.job.empty() ? "" : " (commit coordinator for job " + a.job + ")");
  int sig = 0;
  sigwait(&set, &sig);
  MEMENTO_LOG_INFO("store: signal {}, shutting down", sig);
  coordinator.reset();
  server->Stop();
  return Status::Ok();
}

Status RunStatus(const StoreArgs& a) {
  MEMENTO_RETURN_IF_ERROR(coord::ValidateName("job", a.job));
  Deadline d = Deadline::AfterSeconds(10);
  MEMENTO_ASSIGN_OR_RETURN(auto store, coord::OpenStore(a.url, a.token_file, d));
  MEMENTO_ASSIGN_OR_RETURN(coord::ClusterSnapshot snap,
                           coord::ReadClusterSnapshot(*store, a.job, d));
  if (a.json) {
    PrintJson("memento.store.status/1",
              nlohmann::json::parse(coord::FormatClusterJson(snap, WallNanos())));
  } else {
    std::fputs(coord::FormatClusterTable(snap, WallNanos()).c_str(), stdout);
  }
  return Status::Ok();
}

void Setup(CLI::App& app, CommandContext& ctx) {
  auto args = std::make_shared<StoreArgs>();
  auto* cmd = app.add_subcommand("store", "Host the embedded coordination store");
  cmd->add_option("--listen", args->listen, "HOST:PORT to listen on (port 0 = any free port)");
  cmd->add_option("--token-file", args->token_file,
                  "job token file (mode 0600); default: $MEMENTO_JOB_TOKEN");
  cmd->add_option("--port-file", args->port_file, "write the listening port to this file");
  cmd->add_option("--job", args->job, "also run the commit coordinator of this job");
  cmd->add_option("--nodes", args->nodes, "comma-separated node names of the job");
  cmd->add_option("--max-request", args->limits.max_request_bytes,
                  "largest request one connection may send (what one connection can make the "
                  "store hold); larger frames close the connection")
      ->transform(ByteSize())
      ->default_val("64M");
  cmd->add_option("--max-buffered", args->limits.max_buffered_bytes,
                  "most bytes of received requests all connections together may make the store "
                  "hold; a request beyond it is dropped unread and answered ResourceExhausted")
      ->transform(ByteSize())
      ->default_val("256M");
  auto* status = cmd->add_subcommand("status", "Show nodes, signals and the committed step");
  status->add_option("--store", args->url, "store URL (tcp://HOST:PORT or etcd://HOST:PORT[,...])")
      ->required();
  status->add_option("--job", args->job, "job name")->required();
  status->add_option("--token-file", args->token_file,
                     "job token file (mode 0600); default: $MEMENTO_JOB_TOKEN");
  status->add_flag("--json", args->json, "print JSON instead of a table");
  status->callback([args, &ctx] { ctx.exit_code = ReportStatus(RunStatus(*args)); });
  cmd->callback([args, status, &ctx] {
    if (status->parsed()) return;
    ctx.exit_code = ReportStatus(RunStore(*args));
  });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_COMMAND(store, memento::tools::Setup);
