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
//
// `--aor-rs N`: what AOR costs where the trainer reduce-scatters its
// gradients (issue 15; docs/reft.md section 5): a holder then lacks its
// peer's gradient slice, which must travel before the host AdamW step can
// bring the replica of the peer's optimizer shard (N fp32 elements, two
// moments: 8N bytes) forward. Measured in the same run, best of R each:
//   copy     the network copy AOR replaces: PushCopy of the 8N-byte shard
//   aor_rs   PushCopy of the 4N-byte gradient slice over the same transport,
//            then opt::AorReplica::Advance of the N elements (the host
//            AdamW, the kernel the agent runs)
// with the per-element and per-byte figures of each.
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
#include "opt/adamw.h"
#include "opt/aor.h"
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
  double aor_rs_elems = 0;  // --aor-rs: elements of the optimizer shard (0: off)
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

// Two nodes' stores, redundancy stores and peer services under a fresh
// /dev/shm directory, serving `plan`; the services stop before the directory
// is removed (members are destroyed in reverse order).
struct TwoNodes {
  struct Node {
    std::unique_ptr<shm::NodeStore> store;
    std::unique_ptr<agent::ShmRedundancyStore> red;
    std::unique_ptr<agent::PeerService> service;
  };
  TempTree tree;
  std::vector<Node> nodes;
};

Result<std::unique_ptr<TwoNodes>> StartTwoNodes(
    const topo::Plan& plan, std::shared_ptr<const agent::ClusterPlan> cluster_plan,
    const net::JobToken& token, size_t connections_per_peer) {
  std::string tmpl = "/dev/shm/memento-bench-peer-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) return ErrnoError("mkdtemp " + tmpl, errno);
  auto two = std::make_unique<TwoNodes>();
  two->tree.path = tmpl;
  std::vector<TwoNodes::Node>& nodes = two->nodes;
  nodes.resize(2);
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
    o.connections_per_peer = connections_per_peer;
    MEMENTO_ASSIGN_OR_RETURN(nodes[n].service, agent::PeerService::Start(std::move(o), token));
  }
  return two;
}

// --aor-rs: see the file comment.
Status RunAorRs(const Args& a) {
  const uint64_t count = static_cast<uint64_t>(a.aor_rs_elems);
  const uint64_t grad_bytes = count * sizeof(float), shard_bytes = 2 * grad_bytes;
  MEMENTO_ASSIGN_OR_RETURN(net::JobToken token, net::JobToken::Generate());
  // dp=2 on two nodes: rank 0's private state is the gradient slice (its
  // peer copy on node 1 is where the slice travels), rank 1's the optimizer
  // shard (its copy on node 0: the network copy AOR replaces).
  MEMENTO_ASSIGN_OR_RETURN(topo::Topology topology, topo::Topology::Uniform(2, 1, 1, 0, 1));
  topo::Inventory inv(2);
  for (int r = 0; r < 2; ++r) {
    inv[r].push_back(Meta("w", DType::kFloat32, 1024, StateClass::kReplicated));
    inv[r].push_back(Meta(r == 0 ? "grad_slice" : "opt_shard", DType::kFloat32,
                          static_cast<int64_t>(r == 0 ? count : 2 * count), StateClass::kPrivate));
  }
  MEMENTO_ASSIGN_OR_RETURN(topo::Policy policy, topo::ParsePolicy("xor"));
  MEMENTO_ASSIGN_OR_RETURN(topo::Plan plan, topo::MakePlan(topology, inv, policy));
  uint32_t grad_copy = topo::kNoId, shard_copy = topo::kNoId;
  for (const topo::Copy& c : plan.copies) {
    const topo::Piece& piece = plan.pieces[c.piece];
    if (c.node == 1 && piece.rank == 0 && piece.bytes == grad_bytes) grad_copy = c.id;
    if (c.node == 0 && piece.rank == 1 && piece.bytes == shard_bytes) shard_copy = c.id;
  }
  if (grad_copy == topo::kNoId || shard_copy == topo::kNoId) {
    return InternalError("bench peer --aor-rs: the plan has no copies of the private state");
  }
  auto cluster_plan = agent::MakeClusterPlan(plan, inv);
  MEMENTO_ASSIGN_OR_RETURN(
      std::unique_ptr<TwoNodes> two,
      StartTwoNodes(plan, cluster_plan, token, agent::PeerServiceOptions{}.connections_per_peer));
  std::vector<TwoNodes::Node>& nodes = two->nodes;
  // The shard (params, exp_avg, exp_avg_sq) and a gradient, warm.
  std::vector<float> params(count), m(count), v(count), grads(count);
  for (uint64_t i = 0; i < count; ++i) {
    params[i] = 0.01f * static_cast<float>(static_cast<int>(i % 2001) - 1000) / 1000.0f;
    m[i] = 1e-4f * static_cast<float>(i % 7);
    v[i] = 1e-6f * static_cast<float>(1 + i % 5);
    grads[i] = 1e-3f * static_cast<float>(static_cast<int>(i % 97) - 48);
  }
  std::vector<float> shard(2 * count);
  std::memcpy(shard.data(), m.data(), grad_bytes);
  std::memcpy(shard.data() + count, v.data(), grad_bytes);
  opt::AdamWConfig config;
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<opt::AdamW> adamw,
                           opt::AdamW::Create(config, {opt::ParamGroup{0, count, 0.1f}}));
  std::shared_ptr<const opt::Optimizer> optimizer(std::move(adamw));
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<opt::AorReplica> replica,
                           opt::AorReplica::Create(optimizer, 0, count));
  MEMENTO_RETURN_IF_ERROR(
      replica->Seed(0, params.data(), {m.data(), v.data()},
                    opt::ShardChecksum(0, count, params.data(), {m.data(), v.data()})));
  double best_copy = 1e9, best_grad = 1e9, best_step = 1e9, best_total = 1e9;
  for (int r = 0; r < a.repeat; ++r) {
    const int64_t step = r + 1;
    Stopwatch copy_watch;
    MEMENTO_RETURN_IF_ERROR(agent::PushCopy(nodes[0].service->endpoint(), token, step, shard_copy,
                                            shard.data(), shard_bytes,
                                            Deadline::AfterSeconds(600)));
    best_copy = std::min(best_copy, copy_watch.Seconds());
    Stopwatch grad_watch;
    MEMENTO_RETURN_IF_ERROR(agent::PushCopy(nodes[1].service->endpoint(), token, step, grad_copy,
                                            grads.data(), grad_bytes, Deadline::AfterSeconds(600)));
    const double grad_s = grad_watch.Seconds();
    Stopwatch step_watch;
    MEMENTO_RETURN_IF_ERROR(
        replica->Advance(step, optimizer->LearningRate(step), grads.data(), params.data()));
    const double step_s = step_watch.Seconds();
    best_grad = std::min(best_grad, grad_s);
    best_step = std::min(best_step, step_s);
    best_total = std::min(best_total, grad_s + step_s);
    for (auto& n : nodes) n.red->DropBelow(step + 1);
  }
  for (auto& n : nodes) n.service->Stop();
  nlohmann::json j;
  j["bench"] = "peer";
  j["mode"] = "aor-rs";
  j["shard_elems"] = count;
  j["repeat"] = a.repeat;
  j["copy_bytes"] = shard_bytes;
  j["copy_s"] = best_copy;
  j["copy_gbps"] = Gbps(shard_bytes, best_copy);
  j["aor_rs_network_bytes"] = grad_bytes;
  j["aor_rs_grad_push_s"] = best_grad;
  j["aor_rs_grad_push_gbps"] = Gbps(grad_bytes, best_grad);
  j["aor_rs_host_step_s"] = best_step;
  j["aor_rs_host_step_ns_per_elem"] = best_step / static_cast<double>(count) * 1e9;
  j["aor_rs_s"] = best_total;
  j["copy_ns_per_shard_byte"] = best_copy / static_cast<double>(shard_bytes) * 1e9;
  j["aor_rs_ns_per_shard_byte"] = best_total / static_cast<double>(shard_bytes) * 1e9;
  j["aor_rs_vs_copy"] = best_copy > 0 ? best_total / best_copy : 0.0;
  memento::tools::PrintJson("memento.bench.peer/1", std::move(j));
  return Status::Ok();
}

Status Run(const Args& a) {
  // Logs on stderr, warnings only: stdout carries the one JSON object.
  InitLogging("bench", LogOptionsFromEnvironment());
  spdlog::set_level(spdlog::level::warn);
  if (a.bytes < 1 || a.chunk < 1 || a.threads < 1 || a.repeat < 1) {
    return InvalidArgumentError("--bytes, --chunk, --threads and --repeat must be >= 1");
  }
  if (a.aor_rs_elems < 0 || a.aor_rs_elems > double{uint64_t{1} << 31}) {
    return InvalidArgumentError("--aor-rs: elements of the optimizer shard, 1 to 2^31");
  }
  if (a.aor_rs_elems >= 1) return RunAorRs(a);
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

  MEMENTO_ASSIGN_OR_RETURN(
      std::unique_ptr<TwoNodes> two,
      StartTwoNodes(plan, cluster_plan, token, static_cast<size_t>(a.threads)));
  std::vector<TwoNodes::Node>& nodes = two->nodes;

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
  cmd->add_option("--aor-rs", args->aor_rs_elems,
                  "elements N of a ZeRO-1 AdamW shard: compare the network copy of the shard "
                  "(8N bytes) with AOR under a reduce-scatter (the peer's 4N-byte gradient slice "
                  "pushed, then the host AdamW step of N elements); suffixes K, M, G")
      ->transform(ByteSize());
  cmd->callback([args, &ctx] { ctx.exit_code = ReportStatus(Run(*args)); });
}

}  // namespace
}  // namespace memento::tools
MEMENTO_REGISTER_BENCH(peer, memento::tools::Setup);
