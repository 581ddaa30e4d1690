// Uses the installed public API: vocabulary types, Status, and a Client that
// cannot connect (no agent runs in argv[1]) and says so.
#include <cstdio>
#include <cstring>

#include "memento/client.h"

extern "C" const char* memento_version();

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer AGENT_DIR\n");
    return 2;
  }
  auto dtype = memento::ParseDType("bfloat16");
  if (!dtype.ok() || memento::DTypeName(*dtype) != "BF16" || memento::DTypeSize(*dtype) != 2) {
    std::fprintf(stderr, "consumer: ParseDType(bfloat16) is wrong\n");
    return 1;
  }
  memento::ClientOptions options;
  options.job_id = "consumer";
  options.agent_dir = argv[1];
  options.connect_timeout_s = 0.2;
  auto client = memento::Client::Connect(options);
  if (client.ok()) {
    std::fprintf(stderr, "consumer: Connect to %s succeeded without an agent\n", argv[1]);
    return 1;
  }
  std::printf("version %s; Connect without an agent: %s\n", memento_version(),
              client.status().ToString().c_str());
  return 0;
}
