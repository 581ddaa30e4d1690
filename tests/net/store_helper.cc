// net_store_helper HOST:PORT — runs an embedded coordination store until
// killed, authenticated with MEMENTO_JOB_TOKEN. Prints "PORT <n>" on stdout
// once it listens. Used by tests/net/multiprocess_test.cc.
#include <signal.h>
#include <unistd.h>

#include <cstdio>

#include "common/log.h"
#include "coord/embedded_store.h"
#include "net/socket.h"

int main(int argc, char** argv) {
  using namespace memento;
  // Sets up the logger on this thread before any server thread logs.
  InitLogging("store-helper");
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s HOST:PORT\n", argv[0]);
    return 2;
  }
  Result<net::HostPort> hp = net::ParseHostPort(argv[1], net::PortUse::kListen);
  Status s = hp.status();
  auto token = net::JobToken::FromEnv();
  if (!s.ok() || !token.ok()) {
    std::fprintf(stderr, "store_helper: %s\n", (s.ok() ? token.status() : s).ToString().c_str());
    return 2;
  }
  // Our stdout is a pipe the test closes after reading the port: a later
  // write (a sanitizer report, a log line) must not kill the store.
  signal(SIGPIPE, SIG_IGN);
  auto server = coord::EmbeddedStoreServer::Start(hp->host, hp->port, *token);
  if (!server.ok()) {
    std::fprintf(stderr, "store_helper: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("PORT %d\n", (*server)->port());
  std::fflush(stdout);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int sig = 0;
  sigwait(&set, &sig);
  (*server)->Stop();
  return 0;
}
