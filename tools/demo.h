// `memento demo` (docs/demo.md): its options and its three parts, one file
// each (tools/cmd_demo.cc parses the command line and picks one):
//   demo_trainer.cc      the single-node demo's trainer (`memento demo --trainer`)
//   demo_single_node.cc  `memento demo --single-node`: an agent and that trainer,
//                        SIGKILL mid-snapshot, restart, restore, bit-identity
//   demo_multi_node.cc   `memento demo`: the Launcher runs memento-trainer on
//                        4 nodes with failures, then without (launch layer only)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/checksum.h"

namespace memento::tools {

struct DemoArgs {
  uint64_t mib = 256;
  int64_t steps = 20;
  int64_t kill_after = 6;
  int threads = 2;
  bool keep = false;
  bool single_node = false;
  // multi-node demo (--steps defaults to 300 there)
  std::string trainer_bin;
  std::string preset = "small";
  int nodes = 4;
  int dp = 2, pp = 2;
  std::string policy = "xor";
  bool sharded = true;  // --no-sharded: every rank snapshots its whole state
  int64_t kill_rank_at = 100;
  int kill_rank = 3;
  int64_t kill_node_at = 200;
  int kill_node = 1;
  int64_t progress_every = 25;
  std::string store_url;  // empty: the launcher hosts the embedded store
  // trainer mode
  bool trainer = false;
  std::string root;
  std::string progress;
};

// The demo trainer's deterministic state (the orchestrator recomputes its
// digests to check the restored run bit for bit).
inline uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Parameters and two Adam-like moments, every word rewritten every step from
// the previous state; the cursor blob is the step and the RNG.
struct DemoModel {
  struct Cursor {
    int64_t step = 0;
    uint64_t rng = 12345;
  };
  std::vector<uint64_t> params, m, v;
  Cursor cursor;

  explicit DemoModel(uint64_t bytes) {
    size_t words = bytes / 8;
    params.resize(words / 2);
    m.resize(words * 3 / 10);
    v.resize(words - params.size() - m.size());
    for (size_t i = 0; i < params.size(); ++i) params[i] = SplitMix(i);
    for (size_t i = 0; i < m.size(); ++i) m[i] = SplitMix(i + (1ULL << 40));
    for (size_t i = 0; i < v.size(); ++i) v[i] = SplitMix(i + (2ULL << 40));
  }
  void Step() {
    cursor.step += 1;
    cursor.rng = SplitMix(cursor.rng);
    const uint64_t k = cursor.rng | 1;
    for (size_t i = 0; i < m.size(); ++i) m[i] = m[i] * 6364136223846793005ULL + params[i];
    for (size_t i = 0; i < v.size(); ++i) v[i] = (v[i] ^ (v[i] >> 29)) + k;
    for (size_t i = 0; i < params.size(); ++i) params[i] += m[i % m.size()] ^ (k + i);
  }
  uint64_t Digest() const {
    uint64_t h = Checksum(params.data(), params.size() * 8);
    h = ChecksumWithSeed(m.data(), m.size() * 8, h);
    h = ChecksumWithSeed(v.data(), v.size() * 8, h);
    return ChecksumWithSeed(&cursor, sizeof(cursor), h);
  }
};

// `memento demo --trainer`: the trainer process of the single-node demo.
int RunDemoTrainer(const DemoArgs& a);
// `memento demo --single-node`.
int RunSingleNodeDemo(const DemoArgs& a);
// `memento demo` (defined only when the build has src/launch).
int RunMultiNodeDemo(const DemoArgs& a, int64_t steps);

}  // namespace memento::tools
