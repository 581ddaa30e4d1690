// `memento demo` at small size (the multi-node demo of docs/demo.md): 4 real
// agents in cluster mode, a real DP 2 x PP 2 ZeRO-1 memento-trainer job, a
// trainer SIGKILLed and a whole node lost (agent killed, shared memory
// deleted), recovery from the peers' memory, and a failure-free run of the
// same job. The final parameters must be bit-identical; the report must name
// both failures with their steps and breakdown.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace {

std::pair<int, std::string> RunShell(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, out};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(DemoClusterTest, CrashAndNodeLossEndBitIdentical) {
  const std::string cmd = std::string(MEMENTO_CLI_BINARY) +
                          " demo --trainer-bin " MEMENTO_TRAINER_BINARY
                          " --preset tiny --steps 40 --kill-rank 3 --kill-rank-at 12"
                          " --kill-node 1 --kill-node-at 25 --progress-every 10";
  auto [rc, out] = RunShell(cmd);
  EXPECT_EQ(rc, 0) << out;
  for (const char* want :
       {"== run 1: with failures ==", "== run 2: the same job without failures ==",
        "progress step 10 loss", "1. rank 3 (node 3) failed", "2. node 1 lost", "node(s) lost: 1",
        "snapshot overhead per step", "bytes protected per node", "node3: T0",
        "RESULT: the final parameters ARE bit-identical"}) {
    EXPECT_NE(out.find(want), std::string::npos) << "missing '" << want << "' in\n" << out;
  }
}

}  // namespace
