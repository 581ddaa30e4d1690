// Helper process for the durable-tier integration tests.
//
//   tier_persist_helper loop DIR START      persist versions START, START+1, ...
//                                           forever through two Persisters (node
//                                           0 and node 1 of one job); prints
//                                           "committed <step>" after each one
//   tier_persist_helper write DIR STEP      persist one version; exit 0 on success
//   tier_persist_helper sample DIR          write version 1 plus the expected
//                                           bytes of every piece (expected.json)
//                                           for the independent Python reader
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/log.h"
#include "tests/tier/pattern.h"
#include "tier/persister.h"
#include "tier/writer.h"

using namespace memento;
using namespace memento::tier;
using memento::tier::testing::PatternJob;

namespace {

int Loop(const std::string& dir, int64_t start) {
  std::unique_ptr<Persister> p[PatternJob::kNodes];
  for (int n = 0; n < PatternJob::kNodes; ++n) {
    PersisterOptions o;
    o.root = dir;
    o.retention.keep_last = 3;
    o.retry_initial_s = 0.01;
    auto r = Persister::Start(o);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
      return 1;
    }
    p[n] = std::move(*r);
  }
  for (int64_t step = start;; ++step) {
    auto job = std::make_shared<PatternJob>(static_cast<uint64_t>(step));
    for (int n = 0; n < PatternJob::kNodes; ++n) {
      p[n]->Offer(step, [job, n]() -> Result<VersionView> {
        VersionView v = job->View(n);
        v.pin = job;
        return v;
      });
    }
    for (auto& pp : p) pp->WaitIdle(Deadline::Infinite());
    if (p[0]->stats().last_persisted_step == step) {
      std::printf("committed %lld\n", static_cast<long long>(step));
      std::fflush(stdout);
    }
  }
}

int WriteOne(const std::string& dir, int64_t step) {
  PatternJob job(static_cast<uint64_t>(step));
  auto r1 = WriteNodePart(Env::Default(), dir, job.View(1), {});
  if (!r1.ok()) {
    std::fprintf(stderr, "node 1: %s\n", r1.status().ToString().c_str());
    return 1;
  }
  auto r0 = WriteVersion(Env::Default(), dir, job.View(0), {}, Deadline::AfterSeconds(30));
  if (!r0.ok()) {
    std::fprintf(stderr, "node 0: %s\n", r0.status().ToString().c_str());
    return 1;
  }
  return 0;
}

int Sample(const std::string& dir) {
  if (WriteOne(dir, 1) != 0) return 1;
  PatternJob job(1);
  ::mkdir((dir + "/expected").c_str(), 0755);
  nlohmann::json pieces = nlohmann::json::array();
  for (int n = 0; n < PatternJob::kNodes; ++n) {
    VersionView v = job.View(n);
    for (const auto& e : v.entries) {
      const bool global = e.meta.state_class == StateClass::kDpSharded && e.meta.global_numel > 0;
      uint64_t tensor_offset =
          e.offset + (global ? e.meta.shard_offset * DTypeSize(e.meta.dtype) : 0);
      std::string bin = "expected/" + std::to_string(pieces.size()) + ".bin";
      std::ofstream f(dir + "/" + bin, std::ios::binary);
      f.write(static_cast<const char*>(e.data), static_cast<std::streamsize>(e.length));
      pieces.push_back({{"node", n},
                        {"name", e.meta.name},
                        {"dtype", std::string(DTypeName(e.meta.dtype))},
                        {"tensor_offset", tensor_offset},
                        {"length", e.length},
                        {"bin", bin}});
    }
  }
  std::ofstream(dir + "/expected.json") << pieces.dump(1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  InitLogging("persist-helper");
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "loop" && argc == 4) return Loop(argv[2], std::atoll(argv[3]));
  if (mode == "write" && argc == 4) return WriteOne(argv[2], std::atoll(argv[3]));
  if (mode == "sample" && argc == 3) return Sample(argv[2]);
  std::fprintf(stderr, "usage: %s loop DIR START | write DIR STEP | sample DIR\n", argv[0]);
  return 2;
}
