// `memento bench peer [--bytes N] [--chunk C] [--threads T] [--repeat R]`:
// the agent-to-agent data path of recovery and of Gemini peer copies. Two
// peer services in this process on loopback, each with a node store and a
// redundancy store under a private /dev/shm directory; node 1 holds a copy
// of N bytes.
//
//   read   node 0's ClusterReader reads the copy from node 1 (kPeerRead: sent
//          from shared memory, received with CallInto straight into place),
//          C bytes per request, T requests in flight.
//   push   PushCopy of N bytes to node 1 (8 MiB parts, checksummed there).
//   baselines, measured in the same run: memcpy of the same bytes, and the
//          framed, authenticated transport alone (net::MeasureFramedTcp).
//
// Prints one JSON object (gigabits per second, best of R runs each).
#include <ftw.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "agent/peer_service.h"
#include "agent/redundancy_shm.h"
#include "common/byte_flag.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/log.h"
#include "net/throughput.h"
#include "shm/node_store.h"
#include "tools/command.h"
#include "tools/environment.h"
#include "tools/json_output.h"

namespace memento::tools {
namespace {

struct Args {
  double bytes = 256 << 20;
  double chunk = 16 << 20;
  int threads = 4;
  int repeat = 3;
};

// Removes a directory tree (best effort) when it goes out of scope.
struct TempTree {
  std::string path;
  ~TempTree() {
    if (path.empty()) return;
    nftw(
        path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return remove(p); },
        16, FTW_DEPTH | FTW_PHYS);
  }
};

double Gbps(uint64_t bytes, double seconds) { return seconds > 0 ? bytes * 8 / seconds / 1e9 : 0; }

TensorMeta Meta(std::string name, DType dtype, int64_t numel, StateClass cls) {
  TensorMeta t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = {numel};
  t.state_class = cls;
  return t;
}

Status Run(const Args& a) {
  // Logs on stderr, warnings only: stdout carries the one JSON object.
  InitLogging("bench", LogOptionsFromEnvironment());
  spdlog::set_level(spdlog::level::warn);
  if (a.bytes < 1 || a.chunk < 1 || a.threads < 1 || a.repeat < 1) {
    return InvalidArgumentError("--bytes, --chunk, --threads and --repeat must be >= 1");
  }
  const uint64_t bytes = static_cast<uint64_t>(a.bytes);
  const uint64_t chunk =
      std::min<uint64_t>(static_cast<uint64_t>(a.chunk), agent::kMaxPeerReadBytes);
  MEMENTO_ASSIGN_OR_RETURN(net::JobToken token, net::JobToken::Generate());

  // dp=2 on two nodes; each rank's private state (N bytes) gets a peer copy
  // on the other node.
  MEMENTO_ASSIGN_OR_RETURN(topo::Topology topology, topo::Topology::Uniform(2, 1, 1, 0, 1));
  topo::Inventory inv(2);
  for (auto& r : inv) {
    r.push_back(Meta("w", DType::kFloat32, 1024, StateClass::kReplicated));
    r.push_back(Meta("rng", DType::kUInt8, static_cast<int64_t>(bytes), StateClass::kPrivate));
  }
  MEMENTO_ASSIGN_OR_RETURN(topo::Policy policy, topo::ParsePolicy("xor"));
  MEMENTO_ASSIGN_OR_RETURN(topo::Plan plan, topo::MakePlan(topology, inv, policy));
  const topo::Copy* copy = nullptr;
  for (const topo::Copy& c : plan.copies) {
    if (c.node == 1 && plan.pieces[c.piece].bytes == bytes) copy = &c;
  }
  if (copy == nullptr)
    return InternalError("bench peer: the plan has no copy of the private state");
  const uint32_t copy_id = copy->id;
  auto cluster_plan = agent::MakeClusterPlan(plan, inv);

  std::string tmpl = "/dev/shm/memento-bench-peer-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) return ErrnoError("mkdtemp " + tmpl, errno);
  TempTree tree{tmpl};
  struct Node {
    std::unique_ptr<shm::NodeStore> store;
    std::unique_ptr<agent::ShmRedundancyStore> red;
    std::unique_ptr<agent::PeerService> service;
  };
  std::vector<Node> nodes(2);
  for (int n = 0; n < 2; ++n) {
    const std::string root = tmpl + "/node" + std::to_string(n);
    MEMENTO_ASSIGN_OR_RETURN(nodes[n].store, shm::NodeStore::Open({root, "bench", n, 0}));
    MEMENTO_ASSIGN_OR_RETURN(nodes[n].red, agent::ShmRedundancyStore::OpenShm(root, n));
    MEMENTO_RETURN_IF_ERROR(nodes[n].red->SetPlan(plan));
    agent::PeerServiceOptions o;
    o.job = "bench";
    o.node = n;
    o.store = nodes[n].store.get();
    o.redundancy = nodes[n].red.get();
    o.plan = [cluster_plan]() -> Result<std::shared_ptr<const agent::ClusterPlan>> {
      return cluster_plan;
    };
    o.endpoint_of = [&nodes](int peer) -> Result<std::string> {
      if (peer < 0 || peer > 1 || !nodes[peer].service) return NotFoundError("no such node");
      return nodes[peer].service->endpoint();
    };
    o.connections_per_peer = static_cast<size_t>(a.threads);
    MEMENTO_ASSIGN_OR_RETURN(nodes[n].service, agent::PeerService::Start(std::move(o), token));
  }

  // The source bytes (warm), and a destination buffer (pre-faulted).
  std::vector<uint8_t> src(bytes), dst(bytes);
  for (uint64_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  std::memset(dst.data(), 1, dst.size());

  double best_read = 0, best_push = 0, best_memcpy = 0, best_framed = 0;
  const std::string endpoint1 = nodes[1].service->endpoint();
  for (int r = 0; r < a.repeat; ++r) {
    const int64_t step = r + 1;
    // push
    Stopwatch push_watch;
    MEMENTO_RETURN_IF_ERROR(agent::PushCopy(endpoint1, token, step, copy_id, src.data(), bytes,
                                            Deadline::AfterSeconds(600)));
    best_push = std::max(best_push, Gbps(bytes, push_watch.Seconds()));
    // read, T requests in flight
    std::atomic<uint64_t> next{0};
    std::atomic<bool> failed{false};
    Status first_error;
    Mutex err_mu;
    Stopwatch read_watch;
    std::vector<std::thread> workers;
    for (int t = 0; t < a.threads; ++t) {
      workers.emplace_back([&] {
        for (;;) {
          const uint64_t off = next.fetch_add(chunk);
          if (off >= bytes || failed.load()) return;
          const uint64_t len = std::min(chunk, bytes - off);
          recover::ReadRequest req{step, {recover::SourceKind::kCopy, copy_id}, off, len};
          Status s = nodes[0].service->reader().Read(1, req, dst.data() + off,
                                                     Deadline::AfterSeconds(600));
          if (!s.ok()) {
            failed = true;
            MutexLock l(&err_mu);
            first_error = s;
            return;
          }
        }
      });
    }
    for (auto& w : workers) w.join();
    const double read_s = read_watch.Seconds();
    if (failed.load()) return first_error;
    if (std::memcmp(dst.data(), src.data(), bytes) != 0) {
      return DataLossError("bench peer: the bytes read back differ from the ones pushed");
    }
    best_read = std::max(best_read, Gbps(bytes, read_s));
    nodes[1].red->DropBelow(step + 1);
    // baselines
    std::memset(dst.data(), 0, dst.size());
    Stopwatch copy_watch;
    std::memcpy(dst.data(), src.data(), bytes);
    best_memcpy = std::max(best_memcpy, Gbps(bytes, copy_watch.Seconds()));
    MEMENTO_ASSIGN_OR_RETURN(
        net::ThroughputResult framed,
        net::MeasureFramedTcp(bytes, std::min<uint64_t>(chunk, 16 << 20), token));
    best_framed = std::max(best_framed, framed.gbps);
  }
  for (auto& n : nodes) n.service->Stop();

  nlohmann::json j;
  j["bench"] = "peer";
  j["bytes"] = bytes;
  j["chunk_bytes"] = chunk;
  j["threads"] = a.threads;
  j["repeat"] = a.repeat;
  j["read_gbps"] = best_read;
  j["push_gbps"] = best_push;
  j["framed_tcp_gbps"] = best_framed;
  j["memcpy_gbps"] = best_memcpy;
  j["read_vs_framed_tcp"] = best_framed > 0 ? best_read / best_framed : 0.0;
  j["push_vs_framed_tcp"] = best_framed > 0 ? best_push / best_framed : 0.0;
  j["read_vs_memcpy"] = best_memcpy > 0 ? best_read / best_memcpy : 0.0;
  memento::tools::PrintJson("memento.bench.peer/1", std::move(j));
  return Status::Ok();
}

void Setup(CLI::App& bench, CommandContext& ctx) {
  auto args = std::make_shared<Args>();
  auto* cmd = bench.add_subcommand(
      "peer", "Agent-to-agent reads and pushes of redundancy over loopback, vs the transport");
  cmd->add_option("--bytes", args->bytes, "bytes of the copy (default 256 MiB)")
      ->transform(ByteSize());
  cmd->add_option("--chunk", args->chunk, "bytes per read request (default 16 MiB, max 64 MiB)")
      ->transform(ByteSize());
  cmd->add_option("--threads", args->threads, "read requests in flight (default 4)");
  cmd->add_option("--repeat", args->repeat, "runs; the best is reported (default 3)");
  cmd->callback([args, &ctx] { ctx.exit_code = ReportStatus(Run(*args)); });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_BENCH(peer, memento::tools::Setup);
