// The version files of the shared-memory redundancy store
// (ShmRedundancyStore, redundancy_shm.h; format and crash protocol in
// shm/redundancy_format.h): adopting the complete files a previous agent
// left (Adopt), laying out and creating a new version's file
// (CreateVersion, reusing the spare's pages), sealing it complete (Seal)
// and removing a version (Remove, keeping its file as the spare).
#include <dirent.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "agent/redundancy_layout.h"
#include "agent/redundancy_shm.h"
#include "common/checksum.h"
#include "common/log.h"
#include "recover/recover.h"

namespace memento::agent {

using recover::SourceKind;

namespace {

constexpr char kPrefix[] = "red.";
constexpr size_t kStepDigits = 20;

int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t HeaderChecksum(const shm::RedundancyHeader* h) {
  return Checksum(h, offsetof(shm::RedundancyHeader, header_checksum));
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

// The version files under `root`: (step, path), in directory order.
Result<std::vector<std::pair<int64_t, std::string>>> ListVersionFiles(const std::string& root) {
  DIR* dir = opendir(root.c_str());
  if (dir == nullptr) return ErrnoError("opendir " + root, errno);
  std::vector<std::pair<int64_t, std::string>> files;
  while (dirent* d = readdir(dir)) {
    std::string name = d->d_name;
    int64_t step = StepOfName(name);
    if (step >= 0) files.emplace_back(step, root + "/" + name);
  }
  closedir(dir);
  return files;
}

// Why the file of version `step` is not a complete version file with a
// sound header, in words; "" when it is.
std::string HeaderProblem(const shm::Segment& segment, int64_t step) {
  if (segment.size() < shm::kRedundancyHeaderBytes)
    return "shorter than a header (torn at creation)";
  const shm::RedundancyHeader* h = HeaderOf(segment);
  if (shm::LoadState(h) != shm::RedundancyState::kComplete) {
    return "not complete (torn by a crash while it was written)";
  }
  if (h->magic != shm::kRedundancyMagic ||
      (h->format_version != shm::kRedundancyFormatVersion &&
       h->format_version != shm::kRedundancyFormatVersionResident) ||
      h->header_bytes != shm::kRedundancyHeaderBytes || h->header_checksum != HeaderChecksum(h)) {
    return "bad magic, version or header checksum";
  }
  if (h->step != step) return fmt::format("header says step {}, name says {}", h->step, step);
  return "";
}

// Why the header's bounds or its entry table do not hold; "" when they do.
std::string TableProblem(const shm::Segment& segment) {
  const shm::RedundancyHeader* h = HeaderOf(segment);
  const uint64_t n = h->num_entries;
  if (h->table_offset != shm::kRedundancyHeaderBytes ||
      h->table_offset + n * sizeof(shm::RedundancyEntry) > h->data_offset ||
      h->data_offset > h->total_bytes || h->total_bytes > segment.size()) {
    return "header bounds do not fit the file";
  }
  if (Checksum(TableOf(segment), n * sizeof(shm::RedundancyEntry)) != h->table_checksum) {
    return "entry table checksum mismatch";
  }
  return "";
}

}  // namespace

std::string RedundancyVersionPath(const std::string& root, int64_t step) {
  return fmt::format("{}/{}{:020d}", root, kPrefix, step);
}

uint64_t RedundancyPlanHash(const topo::Plan& plan) { return recover::PlanHash(plan); }

std::string ShmRedundancyStore::EntryName(const Version& v, uint32_t index) {
  const shm::RedundancyEntry& e = TableOf(*v.segment)[index];
  return fmt::format("{} {} of version {}",
                     recover::SourceKindName(static_cast<SourceKind>(e.kind)), e.id, v.step);
}

// ---- Adopting the files of a previous agent --------------------------------

Status ShmRedundancyStore::Adopt() {
  // A spare file left by an agent that stopped holds no version.
  if (unlink(SparePath().c_str()) != 0 && errno != ENOENT) {
    return ErrnoError("unlink " + SparePath(), errno);
  }
  MEMENTO_ASSIGN_OR_RETURN(auto files, ListVersionFiles(root_));
  for (const auto& [step, path] : files) {
    std::shared_ptr<Version> v = AdoptFile(step, path);
    if (v == nullptr) continue;
    MutexLock l(&mu_);
    versions_[step] = std::move(v);
  }
  return Status::Ok();
}

std::shared_ptr<ShmRedundancyStore::Version> ShmRedundancyStore::AdoptFile(
    int64_t step, const std::string& path) const {
  auto drop = [&](const std::string& why) {
    MEMENTO_LOG_WARN("redundancy store: removing {}: {}", path, why);
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      MEMENTO_LOG_WARN("redundancy store: unlink {}: {}", path, std::strerror(errno));
    }
  };
  auto seg = shm::Segment::Open(path, /*writable=*/true);
  if (!seg.ok()) {
    MEMENTO_LOG_WARN("redundancy store: cannot open {}: {}", path, seg.status().ToString());
    return nullptr;
  }
  std::unique_ptr<shm::Segment> segment = std::move(seg).value();
  if (std::string why = HeaderProblem(*segment, step); !why.empty()) {
    drop(why);
    return nullptr;
  }
  const shm::RedundancyHeader* h = HeaderOf(*segment);
  if (h->node != node_) {
    MEMENTO_LOG_WARN("redundancy store: {} belongs to node {}, not {}; left alone", path, h->node,
                     node_);
    return nullptr;
  }
  if (std::string why = TableProblem(*segment); !why.empty()) {
    drop(why);
    return nullptr;
  }
  auto v = std::make_shared<Version>();
  v->step = step;
  v->plan_hash = h->plan_hash;
  v->path = path;
  if (!IndexEntries(*h, TableOf(*segment), v.get())) {
    drop("entry table out of bounds, not done or with duplicates");
    return nullptr;
  }
  v->segment = std::move(segment);
  CheckStoredEntries(v.get());
  v->done = h->num_entries;
  v->complete = true;
  return v;
}

bool ShmRedundancyStore::IndexEntries(const shm::RedundancyHeader& h,
                                      const shm::RedundancyEntry* table, Version* v) {
  for (uint32_t i = 0; i < h.num_entries; ++i) {
    const shm::RedundancyEntry& e = table[i];
    const bool stored_ok = e.flags == 0 && e.offset >= h.data_offset &&
                           e.offset % shm::kRedundancyEntryAlignment == 0 &&
                           e.offset + e.bytes <= h.total_bytes;
    const bool resident_ok = e.flags == shm::kEntryResident &&
                             h.format_version == shm::kRedundancyFormatVersionResident &&
                             e.offset < (uint64_t{1} << 31) && e.generation != 0;
    if (!ValidKind(e.kind) || e.done != 1 || !(stored_ok || resident_ok) ||
        !v->index.emplace(std::make_pair(e.kind, e.id), i).second) {
      return false;
    }
  }
  return true;
}

void ShmRedundancyStore::CheckStoredEntries(Version* v) {
  // Re-verify every entry's bytes (silent corruption while the agent was
  // down): bad entries are kept but never served or listed.
  const uint32_t n = HeaderOf(*v->segment)->num_entries;
  const shm::RedundancyEntry* table = TableOf(*v->segment);
  v->check.assign(n, Check::kGood);
  v->computed.assign(n, 0);
  // Resident entries are resolved with the plan (SetPlan) and checked in
  // their T0 slot when listed or read.
  v->resident.assign(n, nullptr);
  for (uint32_t i = 0; i < n; ++i) {
    const shm::RedundancyEntry& e = table[i];
    if (IsResident(e)) {
      v->check[i] = Check::kUnknown;
      continue;
    }
    uint64_t sum = Checksum(v->segment->data() + e.offset, e.bytes);
    if (sum != e.xxh3) {
      v->check[i] = Check::kBad;
      v->computed[i] = sum;
      MEMENTO_LOG_WARN("redundancy store: {} fails its checksum", EntryName(*v, i));
    }
  }
}

// ---- Creating a version's file ---------------------------------------------

ShmRedundancyStore::FileLayout ShmRedundancyStore::LayOut(
    const std::vector<PlannedEntry>& planned) {
  FileLayout out;
  const uint64_t n = planned.size();
  out.data_offset = shm::AlignUp(shm::kRedundancyHeaderBytes + n * sizeof(shm::RedundancyEntry),
                                 shm::kRedundancyDataAlignment);
  uint64_t end = out.data_offset;
  for (const PlannedEntry& p : planned) {
    if (p.resident != nullptr) {
      // No bytes in the file: `offset` records the producer rank.
      out.offsets.push_back(static_cast<uint64_t>(p.resident->rank));
      out.any_resident = true;
      continue;
    }
    end = shm::AlignUp(end, shm::kRedundancyEntryAlignment);
    out.offsets.push_back(end);
    end += p.bytes;
  }
  out.total = shm::AlignUp(end, shm::kRedundancyDataAlignment);
  return out;
}

Result<std::unique_ptr<shm::Segment>> ShmRedundancyStore::SegmentFor(
    int64_t step, const std::string& path, uint64_t total, const RoomCheck& room,
    std::unique_ptr<shm::Segment> spare) const {
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
  return segment;
}

void ShmRedundancyStore::WriteHeader(shm::RedundancyHeader* h, int64_t step, uint64_t plan_hash,
                                     uint32_t num_entries, const FileLayout& layout) const {
  shm::StoreState(h, shm::RedundancyState::kWriting);  // first
  h->magic = shm::kRedundancyMagic;
  h->format_version =
      layout.any_resident ? shm::kRedundancyFormatVersionResident : shm::kRedundancyFormatVersion;
  h->header_bytes = shm::kRedundancyHeaderBytes;
  h->step = step;
  h->plan_hash = plan_hash;
  h->node = node_;
  h->num_entries = num_entries;
  h->table_offset = shm::kRedundancyHeaderBytes;
  h->table_checksum = 0;
  h->data_offset = layout.data_offset;
  h->total_bytes = layout.total;
  h->create_wall_ns = WallNs();
  h->complete_wall_ns = 0;
  std::memset(h->reserved, 0, sizeof(h->reserved));
  h->header_checksum = 0;
}

Result<std::shared_ptr<ShmRedundancyStore::Version>> ShmRedundancyStore::CreateVersion(
    int64_t step, const std::vector<PlannedEntry>& planned, uint64_t plan_hash,
    const RoomCheck& room, std::unique_ptr<shm::Segment> spare) {
  const uint64_t n = planned.size();
  const FileLayout layout = LayOut(planned);
  const std::string path = RedundancyVersionPath(root_, step);
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<shm::Segment> segment,
                           SegmentFor(step, path, layout.total, room, std::move(spare)));
  WriteHeader(HeaderOf(*segment), step, plan_hash, static_cast<uint32_t>(n), layout);
  auto v = std::make_shared<Version>();
  v->step = step;
  v->plan_hash = plan_hash;
  v->path = path;
  shm::RedundancyEntry* table = TableOf(*segment);
  for (uint32_t i = 0; i < n; ++i) {
    shm::RedundancyEntry e{};
    e.kind = static_cast<uint32_t>(planned[i].kind);
    e.id = planned[i].id;
    e.offset = layout.offsets[i];
    e.bytes = planned[i].bytes;
    e.flags = planned[i].resident != nullptr ? shm::kEntryResident : 0;
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
  shm::RedundancyHeader* h = HeaderOf(*v.segment);
  h->table_checksum = Checksum(TableOf(*v.segment), h->num_entries * sizeof(shm::RedundancyEntry));
  h->complete_wall_ns = WallNs();
  h->header_checksum = HeaderChecksum(h);
  shm::StoreState(h, shm::RedundancyState::kComplete);  // last
  v.complete = true;
}

// ---- Removing a version -----------------------------------------------------

void ShmRedundancyStore::Remove(const std::shared_ptr<Version>& v) {
  // Nobody else holds the version (no reader, no pinned writer) and no spare
  // is kept yet: keep its file and mapping as the spare for the next version
  // (renamed away from its step's name first, and marked not complete before
  // that, so that neither a reader nor a restarted agent's Adopt takes its old
  // bytes for a version).
  if (v.use_count() == 1 && v->segment != nullptr && spare_.empty() &&
      v->segment->size() >= shm::kRedundancyHeaderBytes) {
    shm::StoreState(HeaderOf(*v->segment), shm::RedundancyState::kWriting);
    if (rename(v->path.c_str(), SparePath().c_str()) == 0) {
      spare_.Keep(std::move(v->segment));
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

}  // namespace memento::agent
