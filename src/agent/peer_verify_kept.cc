// kPeerVerifyKept (net/peer_protocol.h): the survivors' deferred verification
// of a recovery (docs/recovery.md, "The survivors' verification"), served by
// PeerService.
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

void PeerService::EndKeptSession() {
  if (kept_ == nullptr) return;
  if (kept_->t0_thread.joinable()) kept_->t0_thread.join();
  if (kept_->red_thread.joinable()) kept_->red_thread.join();
  kept_.reset();
  MutexLock l(&kept_mu_);
  kept_step_ = -1;
  sent_whole_.clear();
}

namespace {

// Hashes chunk `i` of a kept slot against its table checksum.
Status CheckKeptChunk(const KeptSlot& k, size_t i) {
  const shm::ChunkEntry& c = k.info.chunks[i];
  const uint8_t* data = k.segment->data() + k.info.data_offset;
  if (Checksum(data + c.offset, c.length) == c.checksum) return Status::Ok();
  if (!shm::SlotUnchanged(*k.segment, k.info)) {
    return AbortedError(fmt::format("slot {} of rank {} (step {}) was rewritten while verified",
                                    k.slot, k.rank, k.info.step));
  }
  return DataLossError(
      fmt::format("slot {} of rank {} (step {}): chunk {} (bytes {}..{} of tensor {}) fails its "
                  "checksum",
                  k.slot, k.rank, k.info.step, i, c.offset, c.offset + c.length,
                  shm::EntryName(k.info.tensors[c.tensor_index])));
}

}  // namespace

Result<std::string> PeerService::HandleVerifyKept(std::string_view body) {
  MEMENTO_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(body, "verify-kept request"));
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
      !j.contains("phase") || !j["phase"].is_string()) {
    return InvalidArgumentError("verify-kept request needs an integer step and a phase: " +
                                j.dump());
  }
  const int64_t step = j["step"].get<int64_t>();
  const std::string phase = j["phase"].get<std::string>();
  if (step < 0) return InvalidArgumentError(fmt::format("verify-kept request: step {} < 0", step));
  if (phase != "begin" && phase != "finish" && phase != "discard") {
    return InvalidArgumentError(
        "verify-kept request: phase must be 'begin', 'finish' or 'discard', not '" + phase + "'");
  }
  MutexLock run(&kept_run_mu_);
  if (phase == "discard") {
    // The slots of `step` these ranks were just rebuilt into, from inputs a
    // failed check no longer vouches for: left torn (kWriting, a new
    // generation), as a rebuild that crashed leaves them, so that no
    // inventory lists them and the next rebuild writes them again.
    if (!j.contains("ranks") || !j["ranks"].is_array()) {
      return InvalidArgumentError("verify-kept discard needs a 'ranks' array: " + j.dump());
    }
    MEMENTO_ASSIGN_OR_RETURN(std::shared_ptr<const ClusterPlan> plan, options_.plan());
    std::vector<int> torn;
    for (const nlohmann::json& r : j["ranks"]) {
      if (!r.is_number_integer() || r.get<int64_t>() < 0 ||
          r.get<int64_t>() >= static_cast<int64_t>(plan->inventory.size())) {
        return InvalidArgumentError("verify-kept discard: rank " + r.dump() +
                                    " is not in the plan");
      }
      const int rank = r.get<int>();
      for (const shm::SlotStatus& st : options_.store->Inventory(rank)) {
        if (st.state != shm::SlotState::kComplete || st.step != step) continue;
        std::shared_ptr<shm::Segment> seg = options_.store->SlotSegment(rank, st.slot);
        if (seg == nullptr) continue;
        MEMENTO_ASSIGN_OR_RETURN(
            shm::SlotLayout layout,
            shm::ComputeSlotLayout(options_.job, rank, plan->inventory[static_cast<size_t>(rank)],
                                   exec_options_.chunk_bytes));
        MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<shm::Segment> w,
                                 shm::Segment::Open(seg->path(), /*writable=*/true));
        if (w->size() < layout.total_bytes) {
          return FailedPreconditionError(fmt::format(
              "slot {} of rank {} is {} bytes, not the {} it was rebuilt with; not discarded",
              st.slot, rank, w->size(), layout.total_bytes));
        }
        shm::BeginSlotWrite(*w, layout, st.slot, step);
        torn.push_back(rank);
      }
    }
    MEMENTO_LOG_WARN(
        "peer service of node {}: discarded the slots of step {} rebuilt for rank(s) "
        "{} (a check of their inputs failed)",
        options_.node, step, fmt::join(torn, ", "));
    return nlohmann::json{{"discarded", torn}}.dump();
  }
  if (phase == "begin") {
    EndKeptSession();
    // Without the plan yet (a replacement agent that just joined: it holds
    // no slot of `step` anyway) no chunk counts as served: all are hashed.
    Result<std::shared_ptr<const ClusterPlan>> plan_or = options_.plan();
    const topo::Plan* plan = plan_or.ok() ? &(*plan_or)->plan : nullptr;
    auto session = std::make_unique<KeptSession>();
    session->step = step;
    {
      // Recorded from now on: a chunk streamed before this is not counted.
      MutexLock l(&kept_mu_);
      kept_step_ = step;
      sent_whole_.clear();
    }
    // The slots the inventory without `verify` lists for `step` (complete,
    // not found corrupt by an earlier verification).
    for (int rank : options_.store->Ranks()) {
      for (const shm::SlotStatus& st : options_.store->Inventory(rank)) {
        if (st.state != shm::SlotState::kComplete || st.step != step) continue;
        if (st.verified && !st.intact) continue;
        KeptSlot k;
        k.rank = rank;
        k.slot = st.slot;
        k.segment = options_.store->SlotSegment(rank, st.slot);
        if (k.segment == nullptr) continue;
        Result<shm::SlotInfo> info = shm::ReadSlot(*k.segment);
        if (!info.ok() || info->state != shm::SlotState::kComplete || info->step != step) {
          session->t0_status = DataLossError(
              fmt::format("slot {} of rank {} (step {}) is listed complete but its header does "
                          "not read back: {}",
                          st.slot, rank, step,
                          info.ok() ? std::string("state changed") : info.status().ToString()));
          continue;
        }
        k.info = std::move(info).value();
        k.served.assign(k.info.chunks.size(), 0);
        // Chunks wholly inside a piece of this rank that this node serves.
        static const std::vector<topo::Piece> kNoPieces;
        for (const topo::Piece& p : plan != nullptr ? plan->pieces : kNoPieces) {
          if (p.node != options_.node || p.rank != rank || p.bytes == 0) continue;
          for (const topo::Segment& sg : p.segments) {
            auto runs = shm::FindRange(k.info, sg.tensor, sg.offset, sg.length);
            if (!runs.ok()) continue;  // not held here: its chunks are hashed at begin
            for (const shm::SlotRun& r : *runs) {
              for (size_t i = 0; i < k.info.chunks.size(); ++i) {
                const shm::ChunkEntry& c = k.info.chunks[i];
                if (c.tensor_index == r.entry && c.offset >= r.data_offset &&
                    c.offset + c.length <= r.data_offset + r.length) {
                  k.served[i] = 1;
                }
              }
            }
          }
        }
        session->slots.push_back(std::move(k));
      }
    }
    KeptSession* sp = session.get();
    sp->t0_thread = std::thread([sp] {
      NameThisThread("kept-verify-t0");
      if (!sp->t0_status.ok()) return;
      for (const KeptSlot& k : sp->slots) {
        for (size_t i = 0; i < k.info.chunks.size(); ++i) {
          if (k.served[i]) continue;
          sp->t0_hashed += k.info.chunks[i].length;
          Status st = CheckKeptChunk(k, i);
          if (!st.ok()) {
            sp->t0_status = st;
            return;
          }
        }
      }
    });
    RedundancyStore* red = options_.redundancy;
    sp->red_thread = std::thread([sp, red, step] {
      NameThisThread("kept-verify-t1");
      // Every entry the inventory listed, hashed now: one that fails is
      // no longer listed.
      const recover::VersionHolding before = red->Holding(step, /*verify=*/false);
      const recover::VersionHolding after = red->Holding(step, /*verify=*/true);
      if (auto* shm_red = dynamic_cast<ShmRedundancyStore*>(red)) {
        for (uint32_t id : before.copies) {
          sp->red_hashed += shm_red->EntryBytes(step, {SourceKind::kCopy, id}).value_or(0);
        }
        for (uint32_t id : before.parities) {
          sp->red_hashed += shm_red->EntryBytes(step, {SourceKind::kParity, id}).value_or(0);
        }
      }
      auto missing = [](const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
        for (uint32_t id : a) {
          if (std::find(b.begin(), b.end(), id) == b.end()) return static_cast<int64_t>(id);
        }
        return int64_t{-1};
      };
      if (const int64_t id = missing(before.copies, after.copies); id >= 0) {
        sp->red_status = DataLossError(fmt::format(
            "copy {} of step {} fails its checksum (or its T0 bytes are gone)", id, step));
      } else if (const int64_t pid = missing(before.parities, after.parities); pid >= 0) {
        sp->red_status = DataLossError(fmt::format(
            "parity {} of step {} fails its checksum (or its T0 bytes are gone)", pid, step));
      }
    });
    kept_ = std::move(session);
    return std::string("{}");
  }
  // finish
  if (kept_ == nullptr || kept_->step != step) {
    return FailedPreconditionError(
        fmt::format("no deferred verification of step {} began on node {}", step, options_.node));
  }
  if (kept_->t0_thread.joinable()) kept_->t0_thread.join();
  if (kept_->red_thread.joinable()) kept_->red_thread.join();
  std::set<std::tuple<int, uint64_t, size_t>> sent;
  {
    MutexLock l(&kept_mu_);
    sent.swap(sent_whole_);
    kept_step_ = -1;
  }
  Status st = kept_->t0_status;
  if (st.ok()) st = kept_->red_status;
  uint64_t hashed = kept_->t0_hashed, trusted = 0;
  const size_t slots = kept_->slots.size();
  for (const KeptSlot& k : kept_->slots) {
    if (!st.ok()) break;
    for (size_t i = 0; i < k.info.chunks.size() && st.ok(); ++i) {
      if (!k.served[i]) continue;
      if (sent.count({k.rank, k.info.generation, i})) {
        trusted += k.info.chunks[i].length;
        continue;
      }
      hashed += k.info.chunks[i].length;
      st = CheckKeptChunk(k, i);
    }
    if (st.ok() && !shm::SlotUnchanged(*k.segment, k.info)) {
      st = AbortedError(fmt::format(
          "slot {} of rank {} (step {}) was rewritten during the recovery", k.slot, k.rank, step));
    }
  }
  if (st.code() == StatusCode::kDataLoss) {
    // Recorded in the store (a full check of each slot, on this failure
    // path only), so that later inventories do not list a corrupt slot.
    for (const KeptSlot& k : kept_->slots) (void)options_.store->Verify(k.rank, k.slot);
  }
  hashed += kept_->red_hashed;
  EndKeptSession();
  if (!st.ok()) {
    MEMENTO_LOG_WARN("peer service of node {}: deferred verification of step {}: {}", options_.node,
                     step, st.ToString());
    return Status(st.code(), fmt::format("node {}: {}", options_.node, st.message()));
  }
  MEMENTO_LOG_INFO(
      "peer service of node {}: step {} verified in {} slot(s): {} bytes hashed here, {} bytes "
      "checked by their receivers",
      options_.node, step, slots, hashed, trusted);
  return nlohmann::json{{"hashed_bytes", hashed}, {"trusted_bytes", trusted}, {"slots", slots}}
      .dump();
}

}  // namespace memento::agent
