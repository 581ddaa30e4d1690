#include "agent/peer_service.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "agent/durable_cluster.h"
#include "agent/peer_service_internal.h"
#include "agent/redundancy_shm.h"
#include "common/checksum.h"
#include "common/log.h"
#include "common/thread_cpu.h"
#include "net/peer_protocol.h"
#include "recover/recipe.h"
#include "recover/recover.h"

namespace memento::agent {

using recover::ByteSource;
using recover::ReadRequest;
using recover::SourceKind;

Result<nlohmann::json> ParseJson(std::string_view body, const char* what) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return InvalidArgumentError(fmt::format("{}: body is not JSON", what));
  }
  if (!j.is_object())
    return InvalidArgumentError(fmt::format("{}: body is not a JSON object", what));
  return j;
}

std::shared_ptr<const ClusterPlan> MakeClusterPlan(topo::Plan plan, topo::Inventory inventory) {
  auto cp = std::make_shared<ClusterPlan>();
  cp->hash = RedundancyPlanHash(plan);
  cp->plan = std::move(plan);
  cp->inventory = std::move(inventory);
  return cp;
}

Result<std::shared_ptr<const ClusterPlan>> WaitForPlan(const PlanSource& source, double wait_s,
                                                       Deadline deadline) {
  const TimePoint start = Now();
  TimePoint until = start + std::chrono::duration_cast<Duration>(
                                std::chrono::duration<double>(std::max(0.0, wait_s)));
  if (!deadline.infinite()) until = std::min(until, deadline.when() - deadline.remaining() / 10);
  bool waited = false;
  for (;;) {
    Result<std::shared_ptr<const ClusterPlan>> plan = source();
    if (plan.ok() && waited) {
      MEMENTO_LOG_INFO("waited {:.3f} s for this node's plan (its agent had just started)",
                       std::chrono::duration<double>(Now() - start).count());
    }
    if (plan.ok() || plan.status().code() != StatusCode::kFailedPrecondition) return plan;
    if (Now() >= until) {
      if (wait_s <= 0) return plan;
      const double waited_s = std::chrono::duration<double>(Now() - start).count();
      return FailedPreconditionError(
          fmt::format("{} (waited {:.1f} s for it)", plan.status().message(), waited_s));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    waited = true;
  }
}

// ---- PeerService ----------------------------------------------------------------------

PeerService::PeerService(PeerServiceOptions options, net::JobToken token)
    : options_(std::move(options)), token_(std::move(token)) {}

PeerService::~PeerService() {
  Stop();
  MutexLock l(&kept_run_mu_);
  EndKeptSession();
}

std::string PeerService::endpoint() const {
  const std::string& host =
      options_.advertise_host.empty() ? options_.host : options_.advertise_host;
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port());
  return fmt::format("{}:{}", host, port());
}

Result<std::unique_ptr<PeerService>> PeerService::Start(PeerServiceOptions options,
                                                        net::JobToken token) {
  if (options.node < 0) return InvalidArgumentError("peer service: node must be >= 0");
  if (options.store == nullptr || options.redundancy == nullptr) {
    return InvalidArgumentError("peer service: a node store and a redundancy store are required");
  }
  if (!options.plan) return InvalidArgumentError("peer service: a plan source is required");
  std::unique_ptr<PeerService> s(new PeerService(std::move(options), std::move(token)));
  s->pieces_ = std::make_unique<PieceReader>(s->options_.store->options().root, s->options_.job,
                                             s->options_.store);
  ClusterReaderOptions ro;
  ro.node = s->options_.node;
  ro.pieces = s->pieces_.get();
  ro.redundancy = s->options_.redundancy;
  ro.plan = s->options_.plan;
  ro.endpoint_of = s->options_.endpoint_of;
  ro.connections_per_peer = s->options_.connections_per_peer;
  // The recovery data path before streaming, for comparisons only
  // (`memento bench recover --data-path legacy`; docs/peer_service.md).
  if (s->options_.legacy_reads) {
    ro.legacy_reads = true;
    s->exec_options_.read_window_bytes = 0;
    s->exec_options_.reuse_fetched_inputs = false;
    s->exec_options_.reuse_digests = false;
    MEMENTO_LOG_WARN("peer service of node {}: legacy recovery data path (benchmarking)",
                     s->options_.node);
  }
  // Receive path (docs/recovery.md, "Staged receive"): straight into the
  // slot, trusting the digests checked there, unless staged_receive
  // (through a reused buffer, every chunk re-verified in the slot at the end).
  if (s->options_.staged_receive) {
    ro.staged_receive = true;
    s->exec_options_.trust_arrival_digests = false;
    MEMENTO_LOG_INFO("peer service of node {}: staged receive", s->options_.node);
  }
  s->reader_ = std::make_unique<ClusterReader>(std::move(ro), s->token_);
  // Whole chunks streamed with their table checksum while a deferred
  // verification of their step is open: checked by their receiver.
  PeerService* self = s.get();
  s->pieces_->SetWholeChunkObserver(
      [self](int rank, int64_t step, uint64_t generation, size_t chunk) {
        MutexLock l(&self->kept_mu_);
        if (self->kept_step_ == step) self->sent_whole_.emplace(rank, generation, chunk);
      });
  s->RegisterMethods();
  net::ServerOptions so;
  so.host = s->options_.host;
  so.port = s->options_.port;
  so.connection.max_payload = s->options_.max_request_bytes;
  so.max_buffered_bytes = s->options_.max_buffered_bytes;
  so.limit_name = "the peer service's total receive cap, memento agent --peer-max-buffered";
  MEMENTO_RETURN_IF_ERROR(s->rpc_.Start(so, s->token_));
  MEMENTO_LOG_INFO("peer service of node {} (job {}) listening on {}", s->options_.node,
                   s->options_.job, s->endpoint());
  return s;
}

recover::NodeInventory PeerService::Inventory(bool verify) {
  recover::NodeInventory inv;
  inv.node = options_.node;
  inv.endpoint = endpoint();
  auto* shm_red = dynamic_cast<ShmRedundancyStore*>(options_.redundancy);
  if (shm_red != nullptr) {
    inv.plan_hash = shm_red->plan_hash();
  } else if (auto plan = options_.plan(); plan.ok()) {
    inv.plan_hash = (*plan)->hash;
  }
  inv.committed = options_.committed ? options_.committed() : -1;
  std::map<int64_t, recover::VersionHolding, std::greater<>> versions;
  // With `verify`, the T0 slots (on a thread of their own) and the
  // redundancy entries (here) are hashed at the same time.
  std::vector<std::pair<int64_t, std::vector<int>>> t0;
  std::thread t0_thread;
  if (verify) {
    t0_thread = std::thread([&] {
      NameThisThread("inventory-t0");
      t0 = T0Holdings(*options_.store, true);
    });
  } else {
    t0 = T0Holdings(*options_.store, false);
  }
  std::vector<int64_t> red_steps =
      shm_red != nullptr ? shm_red->Versions() : options_.redundancy->CompleteVersions();
  std::vector<std::pair<int64_t, recover::VersionHolding>> holdings;
  for (int64_t step : red_steps) {
    holdings.emplace_back(step, options_.redundancy->Holding(step, verify));
  }
  if (t0_thread.joinable()) t0_thread.join();
  for (auto& [step, ranks] : t0) {
    versions[step].step = step;
    versions[step].ranks = std::move(ranks);
  }
  for (auto& [step, h] : holdings) {
    if (h.copies.empty() && h.parities.empty()) continue;
    recover::VersionHolding& v = versions[step];
    v.step = step;
    v.copies = std::move(h.copies);
    v.parities = std::move(h.parities);
    if (shm_red != nullptr) {
      // An entry resident in a T0 slot is listed only while that slot holds
      // the step (listed in v.ranks, checked above): a slot that failed its
      // check is rebuilt by the same decision, which overwrites the entry's
      // bytes (two corrupted ranks in one failure under rs:2, issue 21).
      const auto where = shm_red->ResidentRanks(step);
      auto unusable = [&](recover::SourceKind kind, uint32_t id) {
        auto f = where.find({kind, id});
        if (f == where.end()) return false;
        if (std::find(v.ranks.begin(), v.ranks.end(), f->second) != v.ranks.end()) return false;
        MEMENTO_LOG_INFO(
            "peer inventory: {} {} of step {} not listed: rank {}'s T0 slot of that "
            "step is not whole",
            recover::SourceKindName(kind), id, v.step, f->second);
        return true;
      };
      v.copies.erase(
          std::remove_if(v.copies.begin(), v.copies.end(),
                         [&](uint32_t id) { return unusable(recover::SourceKind::kCopy, id); }),
          v.copies.end());
      v.parities.erase(
          std::remove_if(v.parities.begin(), v.parities.end(),
                         [&](uint32_t id) { return unusable(recover::SourceKind::kParity, id); }),
          v.parities.end());
    }
    if (options_.aor_copies) {
      for (uint32_t c : options_.aor_copies(step)) {
        if (std::find(v.copies.begin(), v.copies.end(), c) != v.copies.end()) {
          v.aor_copies.push_back(c);
        }
      }
    }
  }
  for (auto& [step, v] : versions) inv.versions.push_back(std::move(v));
  return inv;
}

void PeerService::RegisterMethods() {
  rpc_.Register(
      net::kPeerInventory, [this](std::string_view body, Deadline) -> Result<std::string> {
        bool verify = false;
        if (!body.empty()) {
          MEMENTO_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(body, "inventory request"));
          if (j.contains("verify")) {
            if (!j["verify"].is_boolean()) {
              return InvalidArgumentError("inventory request: 'verify' must be a boolean");
            }
            verify = j["verify"].get<bool>();
          }
        }
        return recover::ToJson(Inventory(verify)).dump();
      });
  rpc_.RegisterParts(net::kPeerRead, [this](std::string_view body, Deadline deadline,
                                            const net::RpcServer::ReplyFn& reply) {
    return HandleRead(body, deadline, reply);
  });
  rpc_.RegisterStream(
      net::kPeerReadStream,
      [this](std::string_view body, Deadline deadline, const net::RpcServer::DataFn& data,
             const net::RpcServer::ReplyFn& reply) -> Status {
        MEMENTO_RETURN_IF_ERROR(HandleReadStream(body, deadline, data));
        return reply(nullptr, 0);
      });
  rpc_.Register(net::kPeerPush,
                [this](std::string_view body, Deadline) { return HandlePush(body); });
  rpc_.Register(net::kPeerRecover, [this](std::string_view body, Deadline deadline) {
    return HandleRecover(body, deadline);
  });
  rpc_.Register(net::kPeerSetRestoreTarget,
                [this](std::string_view body, Deadline) { return HandleSetRestoreTarget(body); });
  rpc_.Register(net::kPeerLoadDurable,
                [this](std::string_view body, Deadline) { return HandleLoadDurable(body); });
  rpc_.Register(net::kPeerVerifyKept,
                [this](std::string_view body, Deadline) { return HandleVerifyKept(body); });
}

Status PeerService::HandleRead(std::string_view body, Deadline deadline,
                               const net::RpcServer::ReplyFn& reply) {
  MEMENTO_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(body, "read request"));
  MEMENTO_ASSIGN_OR_RETURN(ReadRequest req, recover::ReadRequestFromJson(j));
  if (req.length > kMaxPeerReadBytes) {
    return InvalidArgumentError(fmt::format("read request of {} bytes: at most {} per request",
                                            req.length, kMaxPeerReadBytes));
  }
  if (req.source.kind == SourceKind::kPiece) {
    // T0 slots can be overwritten by a trainer: copy, re-check, then send.
    // A restarted agent may not have its plan back yet: waited for.
    MEMENTO_ASSIGN_OR_RETURN(std::shared_ptr<const ClusterPlan> plan,
                             WaitForPlan(options_.plan, options_.plan_wait_s, deadline));
    // Not zero-filled: ReadPiece writes every byte before it is sent.
    std::unique_ptr<uint8_t[]> buf(new uint8_t[std::max<uint64_t>(req.length, 1)]);
    MEMENTO_RETURN_IF_ERROR(
        pieces_->ReadPiece(plan->plan, req.source.id, req.step, req.offset, req.length, buf.get()));
    net::ConstBuffer part{buf.get(), req.length};
    return reply(&part, 1);
  }
  if (auto* shm_red = dynamic_cast<ShmRedundancyStore*>(options_.redundancy)) {
    // Redundancy entries are immutable once finished: sent from shared memory.
    MEMENTO_ASSIGN_OR_RETURN(ShmRedundancyStore::View view, shm_red->ReadView(req));
    net::ConstBuffer part{view.data, view.length};
    return reply(&part, 1);
  }
  std::string buf(req.length, '\0');
  MEMENTO_RETURN_IF_ERROR(options_.redundancy->Read(req, buf.data()));
  net::ConstBuffer part{buf.data(), buf.size()};
  return reply(&part, 1);
}

Status PeerService::HandleReadStream(std::string_view body, Deadline deadline,
                                     const net::RpcServer::DataFn& data) {
  MEMENTO_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(body, "read request"));
  MEMENTO_ASSIGN_OR_RETURN(ReadRequest req, recover::ReadRequestFromJson(j));
  if (req.source.kind == SourceKind::kPiece) {
    // Straight from the T0 slot, chunk by chunk with the table's checksums;
    // ServePiece re-checks the generation after the last byte went out.
    // A restarted agent may not have its plan back yet: waited for.
    MEMENTO_ASSIGN_OR_RETURN(std::shared_ptr<const ClusterPlan> plan,
                             WaitForPlan(options_.plan, options_.plan_wait_s, deadline));
    return pieces_->ServePiece(plan->plan, req.source.id, req.step, req.offset, req.length,
                               [&](const uint8_t* p, uint64_t n, uint64_t digest) {
                                 net::ConstBuffer part{p, n};
                                 return data(&part, 1, digest);
                               });
  }
  auto send_parts = [&](const uint8_t* p, uint64_t n) -> Status {
    for (uint64_t at = 0; at < n; at += kPeerStreamPartBytes) {
      net::ConstBuffer part{p + at, std::min(kPeerStreamPartBytes, n - at)};
      MEMENTO_RETURN_IF_ERROR(data(&part, 1, std::nullopt));
    }
    return Status::Ok();
  };
  if (auto* shm_red = dynamic_cast<ShmRedundancyStore*>(options_.redundancy)) {
    MEMENTO_ASSIGN_OR_RETURN(std::optional<RedundancyStore::ResidentRef> resident,
                             shm_red->Resident(req.step, req.source));
    if (resident.has_value()) {
      // Resident in a local rank's T0 slot (docs/reft.md section 4): served
      // from the slot chunk by chunk with the table's checksums, like a piece.
      return shm_red->ServeResident(req, [&](const uint8_t* p, uint64_t n, uint64_t digest) {
        net::ConstBuffer part{p, n};
        return data(&part, 1, digest);
      });
    }
    // Immutable once finished, pinned while it is sent.
    MEMENTO_ASSIGN_OR_RETURN(ShmRedundancyStore::View view, shm_red->ReadView(req));
    return send_parts(static_cast<const uint8_t*>(view.data), view.length);
  }
  if (req.length > kMaxPeerReadBytes) {
    return InvalidArgumentError(fmt::format("read request of {} bytes: at most {} per request",
                                            req.length, kMaxPeerReadBytes));
  }
  std::string buf(req.length, '\0');
  MEMENTO_RETURN_IF_ERROR(options_.redundancy->Read(req, buf.data()));
  return send_parts(reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
}

Result<std::string> PeerService::HandlePush(std::string_view body) {
  if (body.size() < 4) return InvalidArgumentError("push: body shorter than its length prefix");
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<uint8_t>(body[i])) << (8 * i);
  if (n > body.size() - 4) {
    return InvalidArgumentError(
        fmt::format("push: header length {} exceeds the {}-byte body", n, body.size()));
  }
  MEMENTO_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(body.substr(4, n), "push"));
  const std::string_view payload = body.substr(4 + n);
  if (!j.contains("step") || !j["step"].is_number_integer() || !j.contains("copy") ||
      !j["copy"].is_number_unsigned() || !j.contains("offset") ||
      !j["offset"].is_number_unsigned() || !j.contains("total") ||
      !j["total"].is_number_unsigned() || (j.contains("xxh3") && !j["xxh3"].is_number_unsigned())) {
    return InvalidArgumentError("push: header needs integer step, copy, offset, total: " +
                                j.dump());
  }
  const int64_t step = j["step"].get<int64_t>();
  const uint32_t copy = j["copy"].get<uint32_t>();
  const uint64_t offset = j["offset"].get<uint64_t>();
  const uint64_t total = j["total"].get<uint64_t>();
  if (step < 0) return InvalidArgumentError(fmt::format("push: step {} < 0", step));
  MEMENTO_ASSIGN_OR_RETURN(std::shared_ptr<const ClusterPlan> plan, options_.plan());
  // A copy of a step at or below the newest commit comes too late: this node
  // already dropped (or never needs) that version's redundancy.
  if (options_.committed) {
    const int64_t committed = options_.committed();
    if (step <= committed) {
      return FailedPreconditionError(
          fmt::format("push: step {} is not newer than the committed step {} on node {}", step,
                      committed, options_.node));
    }
  }
  const auto& np = plan->plan.nodes;
  if (options_.node >= static_cast<int>(np.size()) ||
      std::find(np[options_.node].copies.begin(), np[options_.node].copies.end(), copy) ==
          np[options_.node].copies.end()) {
    return InvalidArgumentError(
        fmt::format("push: copy {} is not held by node {} in the plan", copy, options_.node));
  }
  const ByteSource entry{SourceKind::kCopy, copy};
  MEMENTO_RETURN_IF_ERROR(options_.redundancy->Ensure(step));
  auto* shm_red = dynamic_cast<ShmRedundancyStore*>(options_.redundancy);
  const uint64_t want = plan->plan.pieces[plan->plan.copies[copy].piece].bytes;
  if (shm_red != nullptr) {
    MEMENTO_ASSIGN_OR_RETURN(uint64_t have, shm_red->EntryBytes(step, entry));
    if (have != want) {
      return FailedPreconditionError(
          fmt::format("push: version {} holds copy {} with {} bytes, the plan says {} (made under "
                      "another plan)",
                      step, copy, have, want));
    }
  }
  if (total != want) {
    return InvalidArgumentError(
        fmt::format("push: copy {} has {} bytes, the sender says total {}", copy, want, total));
  }
  if (offset > total || payload.size() > total - offset) {
    return InvalidArgumentError(fmt::format("push: bytes [{}, +{}) of copy {} exceed its {} bytes",
                                            offset, payload.size(), copy, total));
  }
  if (shm_red != nullptr && j.contains("xxh3")) {
    // A retry (the sender lost our reply) of a copy already finished with
    // the same bytes succeeds; other bytes for a finished copy do not.
    auto finished = shm_red->FinishedChecksum(step, entry);
    if (finished.ok()) {
      if (*finished == j["xxh3"].get<uint64_t>()) return std::string("{}");
      return FailedPreconditionError(
          fmt::format("push: copy {} of version {} is already finished on node {} with other bytes",
                      copy, step, options_.node));
    }
  }
  // With the shm store the version stays mapped while this thread writes
  // into it, whatever a concurrent commit drops.
  ShmRedundancyStore::WriteView pinned;
  uint8_t* buf = nullptr;
  if (shm_red != nullptr) {
    MEMENTO_ASSIGN_OR_RETURN(pinned, shm_red->PinEntryBuffer(step, entry));
    buf = pinned.data;
  } else {
    MEMENTO_ASSIGN_OR_RETURN(buf, options_.redundancy->EntryBuffer(step, entry));
  }
  if (!payload.empty()) std::memcpy(buf + offset, payload.data(), payload.size());
  if (offset + payload.size() == total) {
    if (j.contains("xxh3") && shm_red != nullptr) {
      // One checksum pass: compared with the sender's and stored.
      MEMENTO_RETURN_IF_ERROR(
          shm_red->FinishEntryExpecting(step, entry, j["xxh3"].get<uint64_t>()));
    } else {
      if (j.contains("xxh3") && Checksum(buf, total) != j["xxh3"].get<uint64_t>()) {
        return DataLossError(fmt::format(
            "push: copy {} of version {} does not match the sender's checksum (a part is missing "
            "or corrupted)",
            copy, step));
      }
      MEMENTO_RETURN_IF_ERROR(options_.redundancy->FinishEntry(step, entry));
    }
    if (options_.on_push_finished) options_.on_push_finished(step, entry);
  }
  return std::string("{}");
}

Result<std::string> PeerService::HandleRecover(std::string_view body, Deadline deadline) {
  MEMENTO_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(body, "recover"));
  if (!j.contains("step") || !j["step"].is_number_integer() || !j.contains("plan_hash") ||
      !j["plan_hash"].is_number_unsigned() || !j.contains("assemblies") ||
      !j["assemblies"].is_array()) {
    return InvalidArgumentError(
        "recover: body needs integer step, unsigned plan_hash and an assemblies array");
  }
  const int64_t step = j["step"].get<int64_t>();
  if (step < 0) return InvalidArgumentError(fmt::format("recover: step {} < 0", step));
  MEMENTO_ASSIGN_OR_RETURN(std::shared_ptr<const ClusterPlan> plan, options_.plan());
  const uint64_t hash = j["plan_hash"].get<uint64_t>();
  if (hash != plan->hash) {
    return FailedPreconditionError(
        fmt::format("recover: caller's plan hash {:016x} differs from node {}'s plan {:016x}", hash,
                    options_.node, plan->hash));
  }
  std::vector<recover::RankAssembly> assemblies;
  for (const nlohmann::json& ja : j["assemblies"]) {
    if (!ja.is_object() || !ja.contains("rank") || !ja["rank"].is_number_integer() ||
        !ja.contains("node") || !ja["node"].is_number_integer() || !ja.contains("recipe")) {
      return InvalidArgumentError("recover: an assembly needs rank, node and recipe: " + ja.dump());
    }
    recover::RankAssembly a;
    a.rank = ja["rank"].get<int>();
    a.node = ja["node"].get<int>();
    a.recipe = ja["recipe"];
    if (a.node != options_.node) {
      return InvalidArgumentError(
          fmt::format("recover: the assembly of rank {} is for node {}, this is node {}", a.rank,
                      a.node, options_.node));
    }
    if (a.rank < 0 || a.rank >= plan->plan.topology.num_ranks() ||
        plan->plan.topology.rank_node[a.rank] != options_.node) {
      return InvalidArgumentError(
          fmt::format("recover: rank {} does not run on node {}", a.rank, options_.node));
    }
    assemblies.push_back(std::move(a));
  }
  Result<recover::AssemblyStats> executed = recover::ExecuteAssembliesWithOptions(
      plan->plan, plan->inventory, options_.job, step, assemblies, *reader_, *options_.store,
      deadline, exec_options_);
  if (!executed.ok()) {
    MutexLock l(&stats_mu_);
    ++stats_.rebuild_failures;
    return executed.status();
  }
  const recover::AssemblyStats& stats = *executed;
  {
    MutexLock l(&stats_mu_);
    ++stats_.rebuilds;
    stats_.rebuilt_bytes += stats.bytes;
    stats_.rebuild_read_bytes += stats.read_bytes;
    stats_.transfer_s += stats.transfer_s;
    stats_.decode_s += stats.decode_s;
    stats_.write_s += stats.write_s;
    stats_.rebuild_s += stats.total_s;
  }
  MEMENTO_LOG_INFO("node {}: rebuilt ranks [{}] of step {} ({} bytes written, {} read) in {:.3f}s",
                   options_.node, fmt::join(stats.ranks, ","), step, stats.bytes, stats.read_bytes,
                   stats.total_s);
  return recover::AssemblyStatsToJson(stats).dump();
}

PeerServiceStats PeerService::stats() {
  PeerServiceStats s;
  {
    MutexLock l(&stats_mu_);
    s = stats_;
  }
  s.refused = refused();
  return s;
}

namespace {

// The optional "epoch" of kPeerSetRestoreTarget / kPeerLoadDurable: 0 when
// absent; InvalidArgument when it is not a non-negative integer.
Result<uint64_t> EpochField(const nlohmann::json& j, const char* what) {
  if (!j.contains("epoch")) return uint64_t{0};
  if (!j["epoch"].is_number_unsigned()) {
    return InvalidArgumentError(
        fmt::format("{}: epoch must be a non-negative integer: {}", what, j.dump()));
  }
  return j["epoch"].get<uint64_t>();
}

}  // namespace

Result<std::string> PeerService::HandleSetRestoreTarget(std::string_view body) {
  MEMENTO_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(body, "set restore target"));
  if (!j.contains("step") || !j["step"].is_number_integer()) {
    return InvalidArgumentError("set restore target: body needs an integer step: " + j.dump());
  }
  if (!options_.set_restore_target) {
    return FailedPreconditionError("set restore target: this agent takes no restore target");
  }
  MEMENTO_ASSIGN_OR_RETURN(uint64_t epoch, EpochField(j, "set restore target"));
  MEMENTO_RETURN_IF_ERROR(options_.set_restore_target(j["step"].get<int64_t>(), epoch));
  {
    MutexLock l(&stats_mu_);
    ++stats_.restore_targets;
    stats_.last_restore_target = j["step"].get<int64_t>();
  }
  return std::string("{}");
}

Result<std::string> PeerService::HandleLoadDurable(std::string_view body) {
  MEMENTO_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(body, "load durable"));
  if (!j.contains("dir") || !j["dir"].is_string() || j["dir"].get<std::string>().empty() ||
      !j.contains("step") || !j["step"].is_number_integer()) {
    return InvalidArgumentError("load durable: body needs a non-empty dir and an integer step: " +
                                j.dump());
  }
  const std::string dir = j["dir"].get<std::string>();
  const int64_t step = j["step"].get<int64_t>();
  if (step < 0) return InvalidArgumentError(fmt::format("load durable: step {} < 0", step));
  MEMENTO_ASSIGN_OR_RETURN(uint64_t epoch, EpochField(j, "load durable"));
  if (!options_.set_restore_target) {
    return FailedPreconditionError("load durable: this agent takes no restore target");
  }
  MEMENTO_ASSIGN_OR_RETURN(std::shared_ptr<const ClusterPlan> plan, options_.plan());
  MEMENTO_ASSIGN_OR_RETURN(
      DurableLoadStats stats,
      LoadDurableVersion(*plan, options_.job, options_.node, dir, step, *options_.store));
  // Redundancy of newer steps belongs to the history the job abandons: a
  // step trained again must not be decoded with parities of the old one.
  options_.redundancy->DropAbove(step);
  MEMENTO_RETURN_IF_ERROR(options_.set_restore_target(step, epoch));
  {
    MutexLock l(&stats_mu_);
    ++stats_.durable_loads;
    stats_.durable_load_bytes += stats.bytes;
    stats_.durable_load_s += stats.total_s;
    ++stats_.restore_targets;
    stats_.last_restore_target = step;
  }
  MEMENTO_LOG_INFO(
      "node {}: loaded ranks [{}] of durable version {} from {} ({} bytes written, {} read) in "
      "{:.3f}s",
      options_.node, fmt::join(stats.ranks, ","), step, dir, stats.bytes, stats.read_bytes,
      stats.total_s);
  return DurableLoadStatsToJson(stats).dump();
}

}  // namespace memento::agent
