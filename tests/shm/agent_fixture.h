// Test support shared by the client tests: a real agent serving in a thread of
// the test process (real Unix socket, real shared memory) and a small
// deterministic training state of every state class.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "agent/agent.h"
#include "common/check.h"
#include "common/checksum.h"
#include "memento/client.h"

namespace memento::testing {

// The options of a node-local agent of `job` on `root` (node 0, no cluster;
// `budget_bytes` 0: no budget). Fields set by name: the others keep their
// defaults (a positional {"job", 0, root, 0} left the later ones unset).
inline agent::AgentOptions LocalAgent(const std::string& job, const std::string& root,
                                      uint64_t budget_bytes = 0) {
  agent::AgentOptions o;
  o.job_id = job;
  o.root = root;
  o.budget_bytes = budget_bytes;
  return o;
}

class AgentThread {
 public:
  explicit AgentThread(agent::AgentOptions o) {
    auto a = agent::Agent::Start(o);
    MEMENTO_CHECK_OK(a.status());
    agent_ = std::move(*a);
    thread_ = std::thread([this] { MEMENTO_CHECK_OK(agent_->Serve()); });
  }
  ~AgentThread() {
    agent_->Stop();
    thread_.join();
  }
  AgentThread(const AgentThread&) = delete;
  AgentThread& operator=(const AgentThread&) = delete;

  agent::Agent& agent() { return *agent_; }

 private:
  std::unique_ptr<agent::Agent> agent_;
  std::thread thread_;
};

// Parameters (replicated), a ZeRO-1 shard (dp_sharded) and an RNG blob
// (private), filled from a seed.
struct State {
  std::vector<float> w;
  std::vector<int64_t> counts;
  uint8_t rng[32];

  explicit State(size_t n = 300000) : w(n), counts(1000) { std::memset(rng, 0, sizeof(rng)); }
  void Fill(uint64_t seed) {
    std::mt19937_64 g(seed);
    for (auto& x : w) x = static_cast<float>(g() % 100000) / 7.0f;
    for (auto& x : counts) x = static_cast<int64_t>(g());
    for (auto& x : rng) x = g() & 0xff;
  }
  uint64_t Digest() const {
    return Checksum(w.data(), w.size() * 4) ^ Checksum(counts.data(), counts.size() * 8) * 3 ^
           Checksum(rng, sizeof(rng)) * 7;
  }
  uint64_t Bytes() const { return w.size() * 4 + counts.size() * 8 + sizeof(rng); }
  Status Register(Client& c) {
    MEMENTO_RETURN_IF_ERROR(c.RegisterTensor(
        {"w", DType::kFloat32, {static_cast<int64_t>(w.size())}, StateClass::kReplicated},
        w.data()));
    MEMENTO_RETURN_IF_ERROR(c.RegisterTensor(
        {"counts", DType::kInt64, {10, 100}, StateClass::kDpSharded}, counts.data()));
    return c.RegisterBlob("rng", rng, sizeof(rng));
  }
};

}  // namespace memento::testing
