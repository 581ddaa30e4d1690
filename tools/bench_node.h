// Shared set-up of the node-local benchmarks (`memento bench snapshot`,
// `memento bench restore`): a real agent serving in a thread of the bench
// process on a private root under /dev/shm, warm buffers, and the state a
// bench registers.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "agent/agent.h"
#include "common/clock.h"
#include "memento/client.h"

namespace memento::tools {

// Anonymous memory of `n` bytes filled with `fill`, touched so that no page
// fault is timed. Unmapped on destruction; data() is null when mmap failed.
// kShared: shared memory (a memfd, the same shmem pages as a tmpfs slot),
// for baselines that write where a snapshot writes.
class WarmBuffer {
 public:
  enum Kind { kPrivate, kShared };
  WarmBuffer(size_t n, uint8_t fill, Kind kind = kPrivate) : n_(n) {
    void* p = MAP_FAILED;
    if (kind == kPrivate) {
      p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1,
               0);
    } else {
      int fd = memfd_create("memento-bench", 0);
      if (fd < 0) return;
      if (ftruncate(fd, static_cast<off_t>(n)) == 0) {
        p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      }
      close(fd);
    }
    if (p == MAP_FAILED) return;
    std::memset(p, fill, n);
    data_ = static_cast<uint8_t*>(p);
  }
  ~WarmBuffer() {
    if (data_) munmap(data_, n_);
  }
  WarmBuffer(const WarmBuffer&) = delete;
  WarmBuffer& operator=(const WarmBuffer&) = delete;
  uint8_t* data() const { return data_; }

 private:
  size_t n_;
  uint8_t* data_ = nullptr;
};

// Best of `reps` plain memcpy's of `n` bytes: the baseline of the benches.
inline double BestMemcpySeconds(uint8_t* dst, const uint8_t* src, size_t n, int reps) {
  double best = 1e9;
  for (int r = 0; r < reps; ++r) {
    Stopwatch sw;
    std::memcpy(dst, src, n);
    best = std::min(best, sw.Seconds());
  }
  return best;
}

// Registers `size` bytes at `base` as four tensors, as a model's parameters
// and optimizer state would be.
inline Status RegisterQuarters(Client& c, uint8_t* base, uint64_t size) {
  uint64_t quarter = size / 4;
  for (int i = 0; i < 4; ++i) {
    uint64_t n = i < 3 ? quarter : size - 3 * quarter;
    TensorMeta m{
        "t" + std::to_string(i), DType::kUInt8, {static_cast<int64_t>(n)}, StateClass::kReplicated};
    MEMENTO_RETURN_IF_ERROR(c.RegisterTensor(m, base + i * quarter));
  }
  return Status::Ok();
}

// An agent of job "bench", node 0, serving in a thread on a fresh root under
// /dev/shm. Stopping it joins the thread and removes the root.
class BenchNode {
 public:
  static Result<std::unique_ptr<BenchNode>> Start() {
    char tmpl[] = "/dev/shm/memento-bench-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return ErrnoError("mkdtemp /dev/shm/memento-bench-*", errno);
    std::unique_ptr<BenchNode> node(new BenchNode(tmpl));
    agent::AgentOptions options;
    options.job_id = "bench";
    options.node = 0;
    options.root = node->root();
    auto agent = agent::Agent::Start(options);
    if (!agent.ok()) return agent.status();  // ~BenchNode removes the directory
    node->agent_ = std::move(*agent);
    node->serve_ = std::thread([n = node.get()] { n->agent_->Serve().IgnoreError(); });
    return node;
  }
  ~BenchNode() {
    if (agent_) {
      agent_->Stop();
      serve_.join();
    }
    std::error_code ec;
    std::filesystem::remove_all(base_, ec);
  }
  BenchNode(const BenchNode&) = delete;
  BenchNode& operator=(const BenchNode&) = delete;

  std::string root() const { return base_ + "/node0"; }
  ClientOptions ClientOptionsFor(int threads, uint64_t chunk) const {
    ClientOptions o;
    o.job_id = "bench";
    o.agent_dir = root();
    o.copy_threads = threads;
    o.chunk_bytes = chunk;
    // Exactly `threads` copy: with "idle" a waiting Fence()/Restore() would
    // copy on the bench's own thread too.
    o.copy_priority = CopyPriority::kNormal;
    return o;
  }

 private:
  explicit BenchNode(std::string base) : base_(std::move(base)) {}
  std::string base_;
  std::unique_ptr<agent::Agent> agent_;
  std::thread serve_;
};

}  // namespace memento::tools
