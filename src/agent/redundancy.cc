#include "agent/redundancy.h"

#include <dirent.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "agent/redundancy_shm.h"
#include "common/checksum.h"
#include "common/log.h"
#include "recover/recover.h"
#include "shm/node_store.h"
#include "shm/redundancy_format.h"

namespace memento::agent {

using recover::ByteSource;
using recover::SourceKind;

namespace {

constexpr char kPrefix[] = "red.";
constexpr size_t kStepDigits = 20;

int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

RedundancyHeader* HeaderOf(const shm::Segment& s) {
  return reinterpret_cast<RedundancyHeader*>(s.data());
}
RedundancyEntry* TableOf(const shm::Segment& s) {
  return reinterpret_cast<RedundancyEntry*>(s.data() + HeaderOf(s)->table_offset);
}

uint64_t HeaderChecksum(const RedundancyHeader* h) {
  return Checksum(h, offsetof(RedundancyHeader, header_checksum));
}

// Parses "red.<20 digits>"; -1 when the name is not a version file.
int64_t StepOfName(const std::string& name) {
  if (name.size() != sizeof(kPrefix) - 1 + kStepDigits || name.compare(0, 4, kPrefix) != 0) {
    return -1;
  }
  int64_t step = 0;
  for (size_t i = 4; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

bool ValidKind(uint32_t k) {
  return k == static_cast<uint32_t>(SourceKind::kCopy) ||
         k == static_cast<uint32_t>(SourceKind::kParity);
}

std::string DescribeSource(ByteSource e) {
  return fmt::format("{} {}", recover::SourceKindName(e.kind), e.id);
}

Status ResidentRefusal(ByteSource entry, int64_t step, const RedundancyEntry& e) {
  return FailedPreconditionError(fmt::format(
      "{} of version {} is resident in T0 (rank {}'s slot): it has no bytes in the redundancy "
      "store; finish it with FinishResidentEntry",
      DescribeSource(entry), step, e.offset));
}

}  // namespace

std::string RedundancyVersionPath(const std::string& root, int64_t step) {
  return fmt::format("{}/{}{:020d}", root, kPrefix, step);
}

uint64_t RedundancyPlanHash(const topo::Plan& plan) { return recover::PlanHash(plan); }

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

std::string ShmRedundancyStore::EntryName(const Version& v, uint32_t index) {
  const RedundancyEntry& e = TableOf(*v.segment)[index];
  return fmt::format("{} {} of version {}",
                     recover::SourceKindName(static_cast<SourceKind>(e.kind)), e.id, v.step);
}

ShmRedundancyStore::~ShmRedundancyStore() {
  MutexLock l(&mu_);
  if (spare_ != nullptr && unlink(SparePath().c_str()) != 0 && errno != ENOENT) {
    MEMENTO_LOG_WARN("redundancy store: unlink {}: {}", SparePath(), std::strerror(errno));
  }
}

Status ShmRedundancyStore::Adopt() {
  // A spare file left by an agent that stopped holds no version.
  if (unlink(SparePath().c_str()) != 0 && errno != ENOENT) {
    return ErrnoError("unlink " + SparePath(), errno);
  }
  DIR* dir = opendir(root_.c_str());
  if (dir == nullptr) return ErrnoError("opendir " + root_, errno);
  std::vector<std::pair<int64_t, std::string>> files;
  while (dirent* d = readdir(dir)) {
    std::string name = d->d_name;
    int64_t step = StepOfName(name);
    if (step >= 0) files.emplace_back(step, root_ + "/" + name);
  }
  closedir(dir);

  for (const auto& [step, path] : files) {
    auto drop = [&, path = path](const std::string& why) {
      MEMENTO_LOG_WARN("redundancy store: removing {}: {}", path, why);
      if (unlink(path.c_str()) != 0 && errno != ENOENT) {
        MEMENTO_LOG_WARN("redundancy store: unlink {}: {}", path, std::strerror(errno));
      }
    };
    auto seg = shm::Segment::Open(path, /*writable=*/true);
    if (!seg.ok()) {
      MEMENTO_LOG_WARN("redundancy store: cannot open {}: {}", path, seg.status().ToString());
      continue;
    }
    std::unique_ptr<shm::Segment> segment = std::move(seg).value();
    if (segment->size() < kRedundancyHeaderBytes) {
      drop("shorter than a header (torn at creation)");
      continue;
    }
    const RedundancyHeader* h = HeaderOf(*segment);
    if (LoadState(h) != RedundancyState::kComplete) {
      drop("not complete (torn by a crash while it was written)");
      continue;
    }
    if (h->magic != kRedundancyMagic ||
        (h->format_version != kRedundancyFormatVersion &&
         h->format_version != kRedundancyFormatVersionResident) ||
        h->header_bytes != kRedundancyHeaderBytes || h->header_checksum != HeaderChecksum(h)) {
      drop("bad magic, version or header checksum");
      continue;
    }
    if (h->step != step) {
      drop(fmt::format("header says step {}, name says {}", h->step, step));
      continue;
    }
    if (h->node != node_) {
      MEMENTO_LOG_WARN("redundancy store: {} belongs to node {}, not {}; left alone", path, h->node,
                       node_);
      continue;
    }
    const uint64_t n = h->num_entries;
    if (h->table_offset != kRedundancyHeaderBytes ||
        h->table_offset + n * sizeof(RedundancyEntry) > h->data_offset ||
        h->data_offset > h->total_bytes || h->total_bytes > segment->size()) {
      drop("header bounds do not fit the file");
      continue;
    }
    const RedundancyEntry* table = TableOf(*segment);
    if (Checksum(table, n * sizeof(RedundancyEntry)) != h->table_checksum) {
      drop("entry table checksum mismatch");
      continue;
    }
    auto v = std::make_shared<Version>();
    v->step = step;
    v->plan_hash = h->plan_hash;
    v->path = path;
    bool ok = true;
    for (uint32_t i = 0; i < n && ok; ++i) {
      const RedundancyEntry& e = table[i];
      const bool stored_ok = e.flags == 0 && e.offset >= h->data_offset &&
                             e.offset % kRedundancyEntryAlignment == 0 &&
                             e.offset + e.bytes <= h->total_bytes;
      const bool resident_ok = e.flags == kEntryResident &&
                               h->format_version == kRedundancyFormatVersionResident &&
                               e.offset < (uint64_t{1} << 31) && e.generation != 0;
      ok = ValidKind(e.kind) && e.done == 1 && (stored_ok || resident_ok) &&
           v->index.emplace(std::make_pair(e.kind, e.id), i).second;
    }
    if (!ok) {
      drop("entry table out of bounds, not done or with duplicates");
      continue;
    }
    // Re-verify every entry's bytes (silent corruption while the agent was
    // down): bad entries are kept but never served or listed.
    v->check.assign(n, Check::kGood);
    v->computed.assign(n, 0);
    // Resident entries are resolved with the plan (SetPlan) and checked in
    // their T0 slot when listed or read.
    v->resident.assign(n, nullptr);
    for (uint32_t i = 0; i < n; ++i) {
      const RedundancyEntry& e = table[i];
      if (IsResident(e)) {
        v->check[i] = Check::kUnknown;
        continue;
      }
      uint64_t sum = Checksum(segment->data() + e.offset, e.bytes);
      if (sum != e.xxh3) {
        v->check[i] = Check::kBad;
        v->computed[i] = sum;
        MEMENTO_LOG_WARN("redundancy store: {} {} of version {} fails its checksum",
                         recover::SourceKindName(static_cast<SourceKind>(e.kind)), e.id, step);
      }
    }
    v->done = static_cast<uint32_t>(n);
    v->complete = true;
    v->segment = std::move(segment);
    MutexLock l(&mu_);
    versions_[step] = std::move(v);
  }
  return Status::Ok();
}

Status ShmRedundancyStore::SetPlan(const topo::Plan& plan) {
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
  std::map<std::pair<uint32_t, uint32_t>, std::shared_ptr<const ResidentSource>> resident;
  for (PlannedEntry& p : planned) {
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
      // Resident entries of an adopted version: where the plan says their
      // bytes lie (the rank must be the one the file recorded).
      Version& v = *it->second;
      const RedundancyEntry* table = TableOf(*v.segment);
      for (uint32_t i = 0; i < v.resident.size(); ++i) {
        if (!IsResident(table[i]) || v.resident[i] != nullptr) continue;
        auto r = plan_resident_.find({table[i].kind, table[i].id});
        if (r != plan_resident_.end() &&
            static_cast<uint64_t>(r->second->rank) == table[i].offset) {
          v.resident[i] = r->second;
        } else {
          MEMENTO_LOG_WARN(
              "redundancy store: {} is resident in T0 but the plan does not say where; "
              "not served",
              EntryName(v, i));
        }
      }
      ++it;
    }
  }
  return Status::Ok();
}

void ShmRedundancyStore::Remove(const std::shared_ptr<Version>& v) {
  // Nobody else holds the version (no reader, no pinned writer) and no spare
  // is kept yet: keep its file and mapping as the spare for the next version
  // (renamed away from its step's name first, and marked not complete before
  // that, so that neither a reader nor a restarted agent's Adopt takes its old
  // bytes for a version).
  if (v.use_count() == 1 && v->segment != nullptr && spare_ == nullptr && !spare_taken_ &&
      v->segment->size() >= kRedundancyHeaderBytes) {
    StoreState(HeaderOf(*v->segment), RedundancyState::kWriting);
    if (rename(v->path.c_str(), SparePath().c_str()) == 0) {
      spare_ = std::move(v->segment);
      return;
    }
    MEMENTO_LOG_WARN("redundancy store: rename {} to {}: {}", v->path, SparePath(),
                     std::strerror(errno));
  }
  // Unlink only: readers holding the version keep its mapping until they let go.
  if (unlink(v->path.c_str()) != 0 && errno != ENOENT) {
    MEMENTO_LOG_WARN("redundancy store: unlink {}: {}", v->path, std::strerror(errno));
  }
}

void ShmRedundancyStore::SetRoomCheck(RoomCheck check) {
  MutexLock l(&mu_);
  room_check_ = std::move(check);
}

uint64_t ShmRedundancyStore::bytes_in_use() {
  MutexLock l(&mu_);
  uint64_t n = 0;
  for (const auto& [step, v] : versions_) n += v->segment ? v->segment->size() : 0;
  if (spare_ != nullptr) n += spare_->size();
  return n;
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
    if (spare_ != nullptr) {
      spare = std::move(spare_);
      spare_taken_ = true;
    }
    planned = planned_;
    plan_hash = plan_hash_;
    for (PlannedEntry& p : planned) {
      if (p.client_parity == nullptr) continue;
      auto it = client_parity_.find(p.client_parity->rank);
      if (it != client_parity_.end() && it->second.second == plan_hash && it->second.first >= 0 &&
          step >= it->second.first) {
        p.resident = p.client_parity;
      }
    }
  }
  // Allocating and populating the file can take a while for large entries:
  // done without the lock, so reads and other versions are not held up.
  const bool took_spare = spare != nullptr;
  Result<std::shared_ptr<Version>> made =
      CreateVersion(step, planned, plan_hash, room, std::move(spare));
  MutexLock l(&mu_);
  if (took_spare) spare_taken_ = false;
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

Result<std::shared_ptr<ShmRedundancyStore::Version>> ShmRedundancyStore::CreateVersion(
    int64_t step, const std::vector<PlannedEntry>& planned, uint64_t plan_hash,
    const RoomCheck& room, std::unique_ptr<shm::Segment> spare) {
  const uint64_t n = planned.size();
  const uint64_t data_offset =
      shm::AlignUp(kRedundancyHeaderBytes + n * sizeof(RedundancyEntry), kRedundancyDataAlignment);
  std::vector<uint64_t> offsets;
  uint64_t end = data_offset;
  bool any_resident = false;
  for (const PlannedEntry& p : planned) {
    if (p.resident != nullptr) {
      // No bytes in the file: `offset` records the producer rank.
      offsets.push_back(static_cast<uint64_t>(p.resident->rank));
      any_resident = true;
      continue;
    }
    end = shm::AlignUp(end, kRedundancyEntryAlignment);
    offsets.push_back(end);
    end += p.bytes;
  }
  const uint64_t total = shm::AlignUp(end, kRedundancyDataAlignment);
  const std::string path = RedundancyVersionPath(root_, step);
  // A leftover file of this step is not ours (Adopt removed torn ones and we
  // do not hold this step): start from an empty file.
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError("unlink " + path, errno);
  }
  std::unique_ptr<shm::Segment> segment;
  if (spare != nullptr && spare->size() == total) {
    // The spare of a dropped version has exactly this size: its pages are
    // reused (already allocated, zeroed once, mapped and populated). Its
    // header says "writing" since it was dropped, and every entry's bytes
    // are written and checked again before the version is complete. Its
    // bytes were counted in bytes_in_use(): no room check.
    if (rename(SparePath().c_str(), path.c_str()) == 0) {
      segment = std::move(spare);
    } else {
      MEMENTO_LOG_WARN("redundancy store: rename {} to {}: {}", SparePath(), path,
                       std::strerror(errno));
    }
  }
  if (spare != nullptr) {
    // Not of this size (another plan): its pages go back to the kernel.
    if (unlink(SparePath().c_str()) != 0 && errno != ENOENT) {
      MEMENTO_LOG_WARN("redundancy store: unlink {}: {}", SparePath(), std::strerror(errno));
    }
    spare.reset();
  }
  if (segment == nullptr) {
    if (room) MEMENTO_RETURN_IF_ERROR(room(total, fmt::format("redundancy version {}", step)));
    MEMENTO_ASSIGN_OR_RETURN(segment, shm::Segment::CreateOrGrow(path, total));
  }
  RedundancyHeader* h = HeaderOf(*segment);
  StoreState(h, RedundancyState::kWriting);  // first
  h->magic = kRedundancyMagic;
  h->format_version = any_resident ? kRedundancyFormatVersionResident : kRedundancyFormatVersion;
  h->header_bytes = kRedundancyHeaderBytes;
  h->step = step;
  h->plan_hash = plan_hash;
  h->node = node_;
  h->num_entries = static_cast<uint32_t>(n);
  h->table_offset = kRedundancyHeaderBytes;
  h->table_checksum = 0;
  h->data_offset = data_offset;
  h->total_bytes = total;
  h->create_wall_ns = WallNs();
  h->complete_wall_ns = 0;
  std::memset(h->reserved, 0, sizeof(h->reserved));
  h->header_checksum = 0;
  auto v = std::make_shared<Version>();
  v->step = step;
  v->plan_hash = plan_hash;
  v->path = path;
  RedundancyEntry* table = TableOf(*segment);
  for (uint32_t i = 0; i < n; ++i) {
    RedundancyEntry e{};
    e.kind = static_cast<uint32_t>(planned[i].kind);
    e.id = planned[i].id;
    e.offset = offsets[i];
    e.bytes = planned[i].bytes;
    e.flags = planned[i].resident != nullptr ? kEntryResident : 0;
    table[i] = e;
    v->index.emplace(std::make_pair(e.kind, e.id), i);
    v->resident.push_back(planned[i].resident);
  }
  v->check.assign(n, Check::kUnknown);
  v->computed.assign(n, 0);
  v->segment = std::move(segment);
  if (n == 0) Seal(*v);
  return v;
}

void ShmRedundancyStore::Seal(Version& v) {
  RedundancyHeader* h = HeaderOf(*v.segment);
  h->table_checksum = Checksum(TableOf(*v.segment), h->num_entries * sizeof(RedundancyEntry));
  h->complete_wall_ns = WallNs();
  h->header_checksum = HeaderChecksum(h);
  StoreState(h, RedundancyState::kComplete);  // last
  v.complete = true;
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

Result<uint8_t*> ShmRedundancyStore::EntryBuffer(int64_t step, ByteSource entry) {
  MutexLock l(&mu_);
  MEMENTO_ASSIGN_OR_RETURN(auto found, Find(step, entry));
  const RedundancyEntry& e = TableOf(*found.first->segment)[found.second];
  if (IsResident(e)) return ResidentRefusal(entry, step, e);
  if (e.done != 0) {
    return FailedPreconditionError(fmt::format("{} of version {} on node {} is already finished",
                                               DescribeSource(entry), step, node_));
  }
  return found.first->segment->data() + e.offset;
}

Result<ShmRedundancyStore::WriteView> ShmRedundancyStore::PinEntryBuffer(int64_t step,
                                                                         ByteSource entry) {
  MutexLock l(&mu_);
  MEMENTO_ASSIGN_OR_RETURN(auto found, Find(step, entry));
  const RedundancyEntry& e = TableOf(*found.first->segment)[found.second];
  if (IsResident(e)) return ResidentRefusal(entry, step, e);
  if (e.done != 0) {
    return FailedPreconditionError(fmt::format("{} of version {} on node {} is already finished",
                                               DescribeSource(entry), step, node_));
  }
  WriteView view;
  view.data = found.first->segment->data() + e.offset;
  view.bytes = e.bytes;
  view.keep = std::move(found.first);
  return view;
}

Result<uint64_t> ShmRedundancyStore::EntryBytes(int64_t step, ByteSource entry) {
  MutexLock l(&mu_);
  MEMENTO_ASSIGN_OR_RETURN(auto found, Find(step, entry));
  return TableOf(*found.first->segment)[found.second].bytes;
}

Result<uint64_t> ShmRedundancyStore::FinishedChecksum(int64_t step, ByteSource entry) {
  MutexLock l(&mu_);
  MEMENTO_ASSIGN_OR_RETURN(auto found, Find(step, entry));
  const RedundancyEntry& e = TableOf(*found.first->segment)[found.second];
  if (__atomic_load_n(&e.done, __ATOMIC_ACQUIRE) == 0) {
    return NotFoundError(fmt::format("{} of version {} on node {} is not finished yet",
                                     DescribeSource(entry), step, node_));
  }
  return e.xxh3;
}

Status ShmRedundancyStore::FinishEntry(int64_t step, ByteSource entry) {
  return FinishEntryImpl(step, entry, nullptr);
}

Status ShmRedundancyStore::FinishEntryExpecting(int64_t step, ByteSource entry,
                                                uint64_t expected_xxh3) {
  return FinishEntryImpl(step, entry, &expected_xxh3);
}

Status ShmRedundancyStore::FinishEntryImpl(int64_t step, ByteSource entry,
                                           const uint64_t* expected) {
  std::shared_ptr<Version> v;
  uint32_t index = 0;
  {
    MutexLock l(&mu_);
    MEMENTO_ASSIGN_OR_RETURN(auto found, Find(step, entry));
    std::tie(v, index) = found;
    if (IsResident(TableOf(*v->segment)[index])) {
      return ResidentRefusal(entry, step, TableOf(*v->segment)[index]);
    }
    if (TableOf(*v->segment)[index].done != 0) {
      return FailedPreconditionError(fmt::format("{} of version {} on node {} is already finished",
                                                 DescribeSource(entry), step, node_));
    }
  }
  // The caller is the entry's only writer: checksum its bytes without the lock.
  RedundancyEntry& e = TableOf(*v->segment)[index];
  const uint64_t sum = Checksum(v->segment->data() + e.offset, e.bytes);
  if (expected != nullptr && sum != *expected) {
    return DataLossError(fmt::format(
        "{} of version {} on node {}: its bytes have checksum {:016x}, the producer's is {:016x} "
        "(a part is missing or corrupted); left unfinished",
        DescribeSource(entry), step, node_, sum, *expected));
  }
  MutexLock l(&mu_);
  if (e.done != 0) {
    return FailedPreconditionError(fmt::format("{} of version {} on node {} is already finished",
                                               DescribeSource(entry), step, node_));
  }
  e.xxh3 = sum;
  __atomic_store_n(&e.done, 1u, __ATOMIC_RELEASE);
  // Left kUnknown: the first read re-checks the bytes (they may rot at rest).
  v->check[index] = Check::kUnknown;
  if (++v->done == v->index.size()) Seal(*v);
  return Status::Ok();
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

uint64_t ShmRedundancyStore::plan_hash() {
  MutexLock l(&mu_);
  return plan_hash_;
}

recover::VersionHolding ShmRedundancyStore::Holding(int64_t step, bool verify) {
  recover::VersionHolding out;
  out.step = step;
  std::shared_ptr<Version> v;
  std::vector<uint32_t> done;
  std::vector<std::pair<uint32_t, std::shared_ptr<const ResidentSource>>> resident;
  {
    MutexLock l(&mu_);
    auto it = versions_.find(step);
    if (it == versions_.end()) return out;
    v = it->second;
    const RedundancyEntry* table = TableOf(*v->segment);
    for (uint32_t i = 0; i < v->check.size(); ++i) {
      if (__atomic_load_n(&table[i].done, __ATOMIC_ACQUIRE) == 0) continue;
      if (IsResident(table[i])) {
        // Listed only while its T0 slot still holds the bytes it was made from.
        if (v->resident[i] != nullptr) resident.emplace_back(i, v->resident[i]);
      } else {
        done.push_back(i);
      }
    }
  }
  const RedundancyEntry* table = TableOf(*v->segment);
  for (const auto& [i, src] : resident) {
    Status st = t0_.CheckSegments(RefOf(*v, i, *src), verify);
    if (!st.ok()) {
      MEMENTO_LOG_INFO("redundancy store: {} not listed: {}", EntryName(*v, i), st.ToString());
      continue;
    }
    if (table[i].kind == static_cast<uint32_t>(SourceKind::kCopy)) {
      out.copies.push_back(table[i].id);
    } else {
      out.parities.push_back(table[i].id);
    }
  }
  std::vector<Check> result(done.size());
  std::vector<uint64_t> sums(done.size(), 0);
  if (verify) {
    for (size_t j = 0; j < done.size(); ++j) {
      const RedundancyEntry& e = table[done[j]];
      sums[j] = Checksum(v->segment->data() + e.offset, e.bytes);
      result[j] = sums[j] == e.xxh3 ? Check::kGood : Check::kBad;
    }
  }
  MutexLock l(&mu_);
  for (size_t j = 0; j < done.size(); ++j) {
    const uint32_t i = done[j];
    if (verify) {
      v->check[i] = result[j];
      v->computed[i] = sums[j];
    }
    if (v->check[i] == Check::kBad) continue;
    const RedundancyEntry& e = table[i];
    if (e.kind == static_cast<uint32_t>(SourceKind::kCopy)) {
      out.copies.push_back(e.id);
    } else {
      out.parities.push_back(e.id);
    }
  }
  std::sort(out.copies.begin(), out.copies.end());
  std::sort(out.parities.begin(), out.parities.end());
  return out;
}

std::map<std::pair<recover::SourceKind, uint32_t>, int> ShmRedundancyStore::ResidentRanks(
    int64_t step) {
  std::map<std::pair<recover::SourceKind, uint32_t>, int> out;
  MutexLock l(&mu_);
  auto it = versions_.find(step);
  if (it == versions_.end()) return out;
  const Version& v = *it->second;
  const RedundancyEntry* table = TableOf(*v.segment);
  for (uint32_t i = 0; i < v.resident.size(); ++i) {
    if (!IsResident(table[i]) || v.resident[i] == nullptr) continue;
    out[{static_cast<recover::SourceKind>(table[i].kind), table[i].id}] = v.resident[i]->rank;
  }
  return out;
}

PieceReader::SegmentsRef ShmRedundancyStore::RefOf(const Version& v, uint32_t index,
                                                   const ResidentSource& src) {
  const RedundancyEntry& e = TableOf(*v.segment)[index];
  PieceReader::SegmentsRef ref;
  ref.rank = src.rank;
  ref.step = v.step;
  ref.generation = e.generation;
  ref.segments = &src.segments;
  if (src.is_parity()) {
    ref.parity = src.parity;
    ref.parity_bytes = src.bytes;
  }
  ref.what = fmt::format("{} (resident in rank {}'s T0 slot)", EntryName(v, index), src.rank);
  return ref;
}

Result<std::optional<RedundancyStore::ResidentRef>> ShmRedundancyStore::Resident(int64_t step,
                                                                                 ByteSource entry) {
  MutexLock l(&mu_);
  MEMENTO_ASSIGN_OR_RETURN(auto found, Find(step, entry));
  const auto& [v, index] = found;
  const RedundancyEntry& e = TableOf(*v->segment)[index];
  if (!IsResident(e)) return std::optional<ResidentRef>();
  if (v->resident[index] == nullptr) {
    return NotFoundError(
        fmt::format("{} is resident in T0 but the plan does not say where", EntryName(*v, index)));
  }
  ResidentRef ref;
  ref.source = *v->resident[index];
  ref.generation = __atomic_load_n(&e.done, __ATOMIC_ACQUIRE) != 0 ? e.generation : 0;
  return std::optional<ResidentRef>(std::move(ref));
}

Status ShmRedundancyStore::FinishResidentEntry(int64_t step, ByteSource entry,
                                               uint64_t slot_generation) {
  std::shared_ptr<Version> v;
  uint32_t index = 0;
  std::shared_ptr<const ResidentSource> src;
  {
    MutexLock l(&mu_);
    MEMENTO_ASSIGN_OR_RETURN(auto found, Find(step, entry));
    std::tie(v, index) = found;
    const RedundancyEntry& e = TableOf(*v->segment)[index];
    if (!IsResident(e) || v->resident[index] == nullptr) {
      return FailedPreconditionError(fmt::format(
          "{} of version {} on node {} is stored in the redundancy store, not resident in T0",
          DescribeSource(entry), step, node_));
    }
    if (e.done != 0) {
      return FailedPreconditionError(fmt::format("{} of version {} on node {} is already finished",
                                                 DescribeSource(entry), step, node_));
    }
    src = v->resident[index];
  }
  if (slot_generation == 0) {
    return InvalidArgumentError(
        fmt::format("{} of version {}: slot generation 0", DescribeSource(entry), step));
  }
  // Nothing is read or copied: the slot must hold the step with the caller's
  // generation (whose bytes the save path verified, VerifySlotData) and every
  // segment; the slot's chunk checksums cover the bytes from then on, so the
  // entry records no checksum of its own (xxh3 0).
  PieceReader::SegmentsRef ref = RefOf(*v, index, *src);
  ref.generation = slot_generation;
  MEMENTO_RETURN_IF_ERROR(t0_.CheckSegments(ref, /*verify=*/false));
  MutexLock l(&mu_);
  RedundancyEntry& e = TableOf(*v->segment)[index];
  if (e.done != 0) {
    return FailedPreconditionError(fmt::format("{} of version {} on node {} is already finished",
                                               DescribeSource(entry), step, node_));
  }
  e.xxh3 = 0;
  e.generation = slot_generation;
  __atomic_store_n(&e.done, 1u, __ATOMIC_RELEASE);
  v->check[index] = Check::kUnknown;
  if (++v->done == v->index.size()) Seal(*v);
  return Status::Ok();
}

Status ShmRedundancyStore::ServeResident(const recover::ReadRequest& req,
                                         const PieceReader::EmitFn& emit) {
  std::shared_ptr<Version> v;
  uint32_t index = 0;
  std::shared_ptr<const ResidentSource> src;
  {
    MutexLock l(&mu_);
    MEMENTO_ASSIGN_OR_RETURN(auto found, Find(req.step, req.source));
    std::tie(v, index) = found;
    if (!IsResident(TableOf(*v->segment)[index])) {
      return FailedPreconditionError(
          fmt::format("{} is stored, not resident in T0", EntryName(*v, index)));
    }
    src = v->resident[index];
  }
  MEMENTO_RETURN_IF_ERROR(CheckResidentRead(*v, index, src.get(), req));
  return t0_.ServeSegments(RefOf(*v, index, *src), req.offset, req.length, emit);
}

Status ShmRedundancyStore::CheckResidentRead(const Version& v, uint32_t index,
                                             const ResidentSource* src,
                                             const recover::ReadRequest& req) const {
  const RedundancyEntry& e = TableOf(*v.segment)[index];
  if (__atomic_load_n(&e.done, __ATOMIC_ACQUIRE) == 0) {
    return NotFoundError(fmt::format("{} of version {} on node {} is not finished yet",
                                     DescribeSource(req.source), req.step, node_));
  }
  if (src == nullptr) {
    return NotFoundError(
        fmt::format("{} is resident in T0 but the plan does not say where", EntryName(v, index)));
  }
  if (req.offset > e.bytes || req.length > e.bytes - req.offset) {
    return InvalidArgumentError(
        fmt::format("read of bytes [{}, +{}) of {} of version {}: the entry has {} bytes",
                    req.offset, req.length, DescribeSource(req.source), req.step, e.bytes));
  }
  return Status::Ok();
}

Result<ShmRedundancyStore::View> ShmRedundancyStore::ReadView(const recover::ReadRequest& req) {
  std::shared_ptr<Version> v;
  uint32_t index = 0;
  Check check = Check::kUnknown;
  std::shared_ptr<const ResidentSource> src;
  {
    MutexLock l(&mu_);
    MEMENTO_ASSIGN_OR_RETURN(auto found, Find(req.step, req.source));
    std::tie(v, index) = found;
    check = v->check[index];
    src = v->resident[index];
  }
  const RedundancyEntry& e = TableOf(*v->segment)[index];
  if (IsResident(e)) {
    // Not in the file: read from the producer's T0 slot into a buffer the
    // view owns (chunks verified, the slot's generation checked).
    MEMENTO_RETURN_IF_ERROR(CheckResidentRead(*v, index, src.get(), req));
    auto buf = std::make_shared<std::vector<uint8_t>>(req.length);
    MEMENTO_RETURN_IF_ERROR(
        t0_.ReadSegments(RefOf(*v, index, *src), req.offset, req.length, buf->data()));
    View view;
    view.data = buf->data();
    view.length = req.length;
    view.keep = std::move(buf);
    return view;
  }
  if (__atomic_load_n(&e.done, __ATOMIC_ACQUIRE) == 0) {
    return NotFoundError(fmt::format("{} of version {} on node {} is not finished yet",
                                     DescribeSource(req.source), req.step, node_));
  }
  if (req.offset > e.bytes || req.length > e.bytes - req.offset) {
    return InvalidArgumentError(
        fmt::format("read of bytes [{}, +{}) of {} of version {}: the entry has {} bytes",
                    req.offset, req.length, DescribeSource(req.source), req.step, e.bytes));
  }
  if (check == Check::kUnknown) {
    const uint64_t sum = Checksum(v->segment->data() + e.offset, e.bytes);
    MutexLock l(&mu_);
    v->check[index] = sum == e.xxh3 ? Check::kGood : Check::kBad;
    v->computed[index] = sum;
    check = v->check[index];
  }
  if (check == Check::kBad) {
    uint64_t computed = 0;
    {
      MutexLock l(&mu_);
      computed = v->computed[index];
    }
    return DataLossError(fmt::format(
        "{} of version {} on node {} fails its checksum (stored {:016x}, computed {:016x})",
        DescribeSource(req.source), req.step, node_, e.xxh3, computed));
  }
  View view;
  view.data = v->segment->data() + e.offset + req.offset;
  view.length = req.length;
  view.keep = std::move(v);
  return view;
}

Status ShmRedundancyStore::Read(const recover::ReadRequest& req, void* dst) {
  {
    std::shared_ptr<Version> v;
    uint32_t index = 0;
    std::shared_ptr<const ResidentSource> src;
    {
      MutexLock l(&mu_);
      MEMENTO_ASSIGN_OR_RETURN(auto found, Find(req.step, req.source));
      std::tie(v, index) = found;
      src = v->resident[index];
    }
    if (IsResident(TableOf(*v->segment)[index])) {
      MEMENTO_RETURN_IF_ERROR(CheckResidentRead(*v, index, src.get(), req));
      return t0_.ReadSegments(RefOf(*v, index, *src), req.offset, req.length, dst);
    }
  }
  MEMENTO_ASSIGN_OR_RETURN(View view, ReadView(req));
  if (view.length > 0) std::memcpy(dst, view.data, view.length);
  return Status::Ok();
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

}  // namespace memento::agent
