// The shared-memory redundancy store (ShmRedundancyStore, redundancy_shm.h):
// opening it, the plan it follows (SetPlan: this node's entries, which of
// them are resident in T0), the versions it holds (Ensure creates one,
// DropBelow / DropAbove remove them) and its settings. Its files are in
// redundancy_file.cc, the producers' side in redundancy_entries.cc, the
// readers' side in redundancy_read.cc. docs/cluster.md, "Redundancy store".
#include "agent/redundancy.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "agent/redundancy_layout.h"
#include "agent/redundancy_shm.h"
#include "common/log.h"
#include "shm/node_store.h"

namespace memento::agent {

using recover::ByteSource;
using recover::SourceKind;

Result<std::unique_ptr<RedundancyStore>> RedundancyStore::Open(const std::string& root, int node) {
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<ShmRedundancyStore> store,
                           ShmRedundancyStore::OpenShm(root, node));
  return std::unique_ptr<RedundancyStore>(std::move(store));
}

Result<std::unique_ptr<ShmRedundancyStore>> ShmRedundancyStore::OpenShm(const std::string& root,
                                                                        int node) {
  if (node < 0) return InvalidArgumentError(fmt::format("redundancy store: node {} < 0", node));
  MEMENTO_RETURN_IF_ERROR(shm::MakePrivateDir(root));
  std::unique_ptr<ShmRedundancyStore> store(new ShmRedundancyStore(root, node));
  MEMENTO_RETURN_IF_ERROR(store->Adopt());
  return store;
}

ShmRedundancyStore::~ShmRedundancyStore() {
  MutexLock l(&mu_);
  if (spare_.kept() && unlink(SparePath().c_str()) != 0 && errno != ENOENT) {
    MEMENTO_LOG_WARN("redundancy store: unlink {}: {}", SparePath(), std::strerror(errno));
  }
}

// ---- The plan ---------------------------------------------------------------

Result<std::vector<ShmRedundancyStore::PlannedEntry>> ShmRedundancyStore::PlanEntries(
    const topo::Plan& plan) const {
  if (node_ >= static_cast<int>(plan.nodes.size())) {
    return InvalidArgumentError(fmt::format(
        "redundancy store: node {} is not in the plan ({} nodes)", node_, plan.nodes.size()));
  }
  const topo::NodePlan& np = plan.nodes[node_];
  std::vector<PlannedEntry> planned;
  for (uint32_t id : np.copies) {
    if (id >= plan.copies.size() || plan.copies[id].piece >= plan.pieces.size()) {
      return InvalidArgumentError(fmt::format("redundancy store: plan copy {} out of range", id));
    }
    planned.push_back(
        {SourceKind::kCopy, id, plan.pieces[plan.copies[id].piece].bytes, nullptr, nullptr});
  }
  for (uint32_t id : np.parities) {
    if (id >= plan.parities.size()) {
      return InvalidArgumentError(fmt::format("redundancy store: plan parity {} out of range", id));
    }
    planned.push_back({SourceKind::kParity, id, plan.parities[id].bytes, nullptr, nullptr});
  }
  return planned;
}

Result<ShmRedundancyStore::ResidentMap> ShmRedundancyStore::ResidentSources(
    const topo::Plan& plan, const std::vector<PlannedEntry>& planned) {
  ResidentMap resident;
  for (const PlannedEntry& p : planned) {
    std::optional<ResidentSource> src = T0ResidentSource(plan, {p.kind, p.id});
    if (!src.has_value()) continue;
    uint64_t sum = 0;
    for (const topo::Segment& seg : src->segments) sum += seg.length;
    if (src->is_parity() && sum <= src->bytes) sum = src->bytes;  // zeros after the block
    if (sum != p.bytes || src->bytes != p.bytes || src->rank < 0) {
      return InternalError(
          fmt::format("redundancy store: {} {} resident in rank {}: {} bytes of "
                      "segments for an entry of {}",
                      recover::SourceKindName(p.kind), p.id, src->rank, sum, p.bytes));
    }
    resident[{static_cast<uint32_t>(p.kind), p.id}] =
        std::make_shared<const ResidentSource>(std::move(*src));
  }
  return resident;
}

Status ShmRedundancyStore::SetPlan(const topo::Plan& plan) {
  MEMENTO_ASSIGN_OR_RETURN(std::vector<PlannedEntry> planned, PlanEntries(plan));
  MEMENTO_ASSIGN_OR_RETURN(ResidentMap resident, ResidentSources(plan, planned));
  const uint64_t hash = RedundancyPlanHash(plan);
  MutexLock l(&mu_);
  if (resident_t0_) {
    for (PlannedEntry& p : planned) {
      auto it = resident.find({static_cast<uint32_t>(p.kind), p.id});
      if (it == resident.end()) continue;
      // A parity is resident only in the versions its client writes it
      // into (SetClientParity; decided in Ensure).
      if (it->second->needs_client_entry()) {
        p.client_parity = it->second;
      } else {
        p.resident = it->second;
      }
    }
  }
  plan_resident_ = std::move(resident);
  have_plan_ = true;
  if (hash != plan_hash_) {
    for (auto& [step, superseded] : creating_) superseded = true;
  }
  plan_hash_ = hash;
  planned_ = std::move(planned);
  for (auto it = versions_.begin(); it != versions_.end();) {
    if (it->second->plan_hash != hash) {
      MEMENTO_LOG_INFO(
          "redundancy store: dropping version {} (made under plan {:016x}, now {:016x})", it->first,
          it->second->plan_hash, hash);
      Remove(it->second);
      it = versions_.erase(it);
    } else {
      ResolveResident(*it->second);
      ++it;
    }
  }
  return Status::Ok();
}

void ShmRedundancyStore::ResolveResident(Version& v) {
  // Resident entries of an adopted version: where the plan says their
  // bytes lie (the rank must be the one the file recorded).
  const shm::RedundancyEntry* table = TableOf(*v.segment);
  for (uint32_t i = 0; i < v.resident.size(); ++i) {
    if (!IsResident(table[i]) || v.resident[i] != nullptr) continue;
    auto r = plan_resident_.find({table[i].kind, table[i].id});
    if (r != plan_resident_.end() && static_cast<uint64_t>(r->second->rank) == table[i].offset) {
      v.resident[i] = r->second;
    } else {
      MEMENTO_LOG_WARN(
          "redundancy store: {} is resident in T0 but the plan does not say where; "
          "not served",
          EntryName(v, i));
    }
  }
}

uint64_t ShmRedundancyStore::plan_hash() {
  MutexLock l(&mu_);
  return plan_hash_;
}

// ---- Settings ---------------------------------------------------------------

void ShmRedundancyStore::SetRoomCheck(RoomCheck check) {
  MutexLock l(&mu_);
  room_check_ = std::move(check);
}

void ShmRedundancyStore::SetResidentT0(bool on) {
  MutexLock l(&mu_);
  resident_t0_ = on;
}

void ShmRedundancyStore::SetClientParity(int rank, int64_t from_step, uint64_t plan_hash) {
  MutexLock l(&mu_);
  if (from_step < 0) {
    client_parity_.erase(rank);
  } else {
    client_parity_[rank] = {from_step, plan_hash};
  }
}

// ---- Versions ---------------------------------------------------------------

std::vector<ShmRedundancyStore::PlannedEntry> ShmRedundancyStore::PlannedFor(int64_t step) {
  std::vector<PlannedEntry> planned = planned_;
  for (PlannedEntry& p : planned) {
    if (p.client_parity == nullptr) continue;
    auto it = client_parity_.find(p.client_parity->rank);
    if (it != client_parity_.end() && it->second.second == plan_hash_ && it->second.first >= 0 &&
        step >= it->second.first) {
      p.resident = p.client_parity;
    }
  }
  return planned;
}

Status ShmRedundancyStore::Ensure(int64_t step) {
  if (step < 0) return InvalidArgumentError(fmt::format("redundancy store: step {} < 0", step));
  std::vector<PlannedEntry> planned;
  uint64_t plan_hash = 0;
  RoomCheck room;
  std::unique_ptr<shm::Segment> spare;
  {
    MutexLock l(&mu_);
    room = room_check_;
    // Another thread (the save path, a push) may be creating this version:
    // wait for it rather than create it twice.
    while (creating_.count(step) != 0) created_cv_.Wait(&l);
    if (versions_.count(step) != 0) return Status::Ok();
    if (!have_plan_) {
      return FailedPreconditionError(
          fmt::format("redundancy store: no plan set, cannot create version {}", step));
    }
    creating_[step] = false;
    spare = spare_.Take();
    planned = PlannedFor(step);
    plan_hash = plan_hash_;
  }
  // Allocating and populating the file can take a while for large entries:
  // done without the lock, so reads and other versions are not held up.
  const bool took_spare = spare != nullptr;
  Result<std::shared_ptr<Version>> made =
      CreateVersion(step, planned, plan_hash, room, std::move(spare));
  MutexLock l(&mu_);
  if (took_spare) spare_.Release();
  const bool superseded = creating_[step];
  creating_.erase(step);
  created_cv_.SignalAll();
  MEMENTO_RETURN_IF_ERROR(made.status());
  std::shared_ptr<Version> v = std::move(made).value();
  if (superseded) {
    Remove(v);
    return AbortedError(fmt::format(
        "redundancy store: version {} was superseded (new plan or newer commit) while it was "
        "created",
        step));
  }
  versions_[step] = std::move(v);
  return Status::Ok();
}

Result<std::pair<std::shared_ptr<ShmRedundancyStore::Version>, uint32_t>> ShmRedundancyStore::Find(
    int64_t step, ByteSource entry) {
  auto it = versions_.find(step);
  if (it == versions_.end()) {
    return NotFoundError(
        fmt::format("redundancy store of node {} holds no version {}", node_, step));
  }
  if (entry.kind == SourceKind::kPiece) {
    return InvalidArgumentError(fmt::format(
        "redundancy store holds copies and parities, not pieces (asked for piece {})", entry.id));
  }
  auto e = it->second->index.find({static_cast<uint32_t>(entry.kind), entry.id});
  if (e == it->second->index.end()) {
    return NotFoundError(
        fmt::format("{} is not held by node {} in version {}", DescribeSource(entry), node_, step));
  }
  return std::make_pair(it->second, e->second);
}

bool ShmRedundancyStore::Complete(int64_t step) {
  MutexLock l(&mu_);
  auto it = versions_.find(step);
  return it != versions_.end() && it->second->complete;
}

std::vector<int64_t> ShmRedundancyStore::CompleteVersions() {
  MutexLock l(&mu_);
  std::vector<int64_t> out;
  for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) {
    if (it->second->complete) out.push_back(it->first);
  }
  return out;
}

std::vector<int64_t> ShmRedundancyStore::Versions() {
  MutexLock l(&mu_);
  std::vector<int64_t> out;
  for (auto it = versions_.rbegin(); it != versions_.rend(); ++it) out.push_back(it->first);
  return out;
}

uint64_t ShmRedundancyStore::bytes_in_use() {
  MutexLock l(&mu_);
  uint64_t n = 0;
  for (const auto& [step, v] : versions_) n += v->segment ? v->segment->size() : 0;
  n += spare_.bytes();
  return n;
}

void ShmRedundancyStore::DropBelow(int64_t keep_from) {
  MutexLock l(&mu_);
  for (auto& [step, superseded] : creating_) {
    if (step < keep_from) superseded = true;
  }
  for (auto it = versions_.begin(); it != versions_.end() && it->first < keep_from;) {
    Remove(it->second);
    it = versions_.erase(it);
  }
}

void ShmRedundancyStore::DropAbove(int64_t keep_to) {
  MutexLock l(&mu_);
  for (auto& [step, superseded] : creating_) {
    if (step > keep_to) superseded = true;
  }
  for (auto it = versions_.upper_bound(keep_to); it != versions_.end();) {
    Remove(it->second);
    it = versions_.erase(it);
  }
}

}  // namespace memento::agent
