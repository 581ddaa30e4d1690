#include "shm/node_store.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "common/checksum.h"
#include "common/human.h"
#include "common/log.h"
#include "fmt/format.h"
#include "shm/slot_limits.h"

namespace memento::shm {

std::string DefaultNodeRoot(const std::string& job_id, int node) {
  return fmt::format("/dev/shm/memento/{}/node{}", job_id, node);
}

std::string SlotPath(const std::string& root, int rank, int slot) {
  return fmt::format("{}/rank{}.slot{}", root, rank, slot);
}

std::string AssembledSlotPath(const std::string& root, int rank) {
  return fmt::format("{}/assembled.rank{}", root, rank);
}

namespace {

// A hint for the operator when the slots under `root` will live on 4 KiB
// tmpfs pages: the collapse into huge pages is turned off
// (MEMENTO_SHM_HUGE_PAGES=off) or refused by the kernel
// (shmem_enabled=deny), and the tmpfs is not mounted huge=always. Empty
// otherwise (Segment collapses new slots into 2 MiB pages itself).
std::string HugePageHint(const std::string& root) {
  const std::string huge = TmpfsHugeOption(root);
  if (huge.empty() || huge == "always") return "";  // not a tmpfs, or huge pages anyway
  const bool collapse = HugePagesWanted() && ShmemThpSetting() != "deny";
  if (collapse) return "";
  return fmt::format(
      "the slots under {} will live on 4 KiB pages (huge-page collapse {}, tmpfs huge={}): on "
      "virtual machines with shadow paging every trainer (re)start then spends seconds per GiB "
      "of slots mapping them (docs/node_store.md, \"Huge pages\"); mount that tmpfs with "
      "huge=always (`mount -o remount,huge=always /dev/shm`) or give the agent a --root on one",
      root,
      HugePagesWanted() ? "refused by the kernel (shmem_enabled=deny)"
                        : "off (MEMENTO_SHM_HUGE_PAGES)",
      huge);
}

}  // namespace

Status MakePrivateDir(const std::string& path) {
  if (path.empty()) return InvalidArgumentError("empty directory path");
  // Parents: created 0755 when missing (they may be shared by jobs).
  for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1)) {
    std::string parent = path.substr(0, pos);
    if (mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError("mkdir " + parent, errno);
    }
  }
  if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError("mkdir " + path, errno);
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return ErrnoError("stat " + path, errno);
  if (!S_ISDIR(st.st_mode)) return FailedPreconditionError(path + " exists and is not a directory");
  if (st.st_uid != geteuid()) {
    return PermissionDeniedError(
        fmt::format("directory {} belongs to uid {}, not to uid {}", path, st.st_uid, geteuid()));
  }
  if ((st.st_mode & 0777) != 0700 && chmod(path.c_str(), 0700) != 0) {
    return ErrnoError("chmod 0700 " + path, errno);
  }
  return Status::Ok();
}

Result<FsSpace> GetFsSpace(const std::string& path) {
  struct statvfs vfs;
  if (statvfs(path.c_str(), &vfs) != 0) return ErrnoError("statvfs " + path, errno);
  FsSpace s;
  s.total = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  s.available = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  return s;
}

Status CheckShmCapacity(const std::string& root, uint64_t more_bytes, const std::string& why) {
  MEMENTO_ASSIGN_OR_RETURN(FsSpace space, GetFsSpace(root));
  if (more_bytes <= space.available) return Status::Ok();
  uint64_t want = space.total + (more_bytes - space.available);
  uint64_t want_gib = (want + (uint64_t{1} << 30) - 1) >> 30;
  return ResourceExhaustedError(fmt::format(
      "the shared-memory filesystem holding {} has {} free ({} total) but {} needs {} ({} bytes) "
      "more; raise it to at least {}G (docker run --shm-size={}g; Kubernetes: an emptyDir with "
      "medium Memory and sizeLimit; or `sudo mount -o remount,size={}G /dev/shm`), or point the "
      "agent at a larger tmpfs with --root",
      root, HumanBytes(space.available), HumanBytes(space.total), why, HumanBytes(more_bytes),
      more_bytes, want_gib, want_gib, want_gib));
}

Result<std::unique_ptr<NodeStore>> NodeStore::Open(const NodeStoreOptions& options) {
  if (options.root.empty()) return InvalidArgumentError("node store root is empty");
  MEMENTO_RETURN_IF_ERROR(MakePrivateDir(options.root));
  std::unique_ptr<NodeStore> store(new NodeStore(options));
  if (std::string hint = HugePageHint(options.root); !hint.empty()) {
    MEMENTO_LOG_INFO("{}", hint);
  }
  MEMENTO_RETURN_IF_ERROR(store->Adopt());
  if (options.budget_bytes > 0) {
    uint64_t have = store->allocated_bytes();
    if (options.budget_bytes > have) {
      MEMENTO_RETURN_IF_ERROR(
          CheckShmCapacity(options.root, options.budget_bytes - have,
                           fmt::format("the agent's memory budget of {} (--budget)",
                                       HumanBytes(options.budget_bytes))));
    }
  }
  return store;
}

Status NodeStore::Adopt() {
  DIR* dir = opendir(options_.root.c_str());
  if (dir == nullptr) return ErrnoError("opendir " + options_.root, errno);
  std::vector<std::pair<int, int>> found;
  std::vector<std::string> stale;
  while (dirent* e = readdir(dir)) {
    int rank = -1, slot = -1, n = 0;
    if (std::sscanf(e->d_name, "rank%d.slot%d%n", &rank, &slot, &n) == 2 && e->d_name[n] == '\0' &&
        rank >= 0 && slot >= 0 && slot < kSlotsPerRank) {
      found.emplace_back(rank, slot);
    } else if (std::sscanf(e->d_name, "assembled.rank%d%n", &rank, &n) == 1 &&
               e->d_name[n] == '\0') {
      stale.push_back(AssembledSlotPath(options_.root, rank));
    }
  }
  closedir(dir);
  // A restore's staging file an earlier agent left (docs/reft.md, section 3).
  for (const std::string& path : stale) {
    if (unlink(path.c_str()) == 0) MEMENTO_LOG_INFO("adopt: removed the stale {}", path);
  }
  for (auto [rank, slot] : found) {
    const std::string path = SlotPath(options_.root, rank, slot);
    auto seg = Segment::Open(path, /*writable=*/false);
    if (!seg.ok()) {
      MEMENTO_LOG_WARN("adopt: cannot open slot {} of rank {}: {}", slot, rank,
                       seg.status().ToString());
      continue;
    }
    // A file too short for a slot header, or whose state word is none of
    // the slot states, was never a slot (an allocation that failed, a stray
    // file): torn. Nobody can be writing it (a trainer maps only slots the
    // agent sized), so it is removed and the rank's next seal allocates the
    // slot afresh.
    std::string torn;
    if ((*seg)->size() < kSlotHeaderBytes) {
      torn = fmt::format("its file is {} bytes, shorter than a slot header ({} bytes)",
                         (*seg)->size(), kSlotHeaderBytes);
    } else {
      SlotState state;
      uint64_t generation = 0;
      LoadSlotVersion(**seg, &state, &generation);
      if (state != SlotState::kEmpty && state != SlotState::kWriting &&
          state != SlotState::kComplete) {
        torn = fmt::format("its state word is {}, not a slot state (garbage)",
                           static_cast<uint32_t>(state));
      }
    }
    if (!torn.empty()) {
      seg->reset();
      const bool removed = unlink(path.c_str()) == 0;
      MEMENTO_LOG_WARN("adopt: slot {} of rank {} is torn: {}; {}", slot, rank, torn,
                       removed
                           ? "removed " + path
                           : fmt::format("could not remove {}: {}", path, std::strerror(errno)));
      continue;
    }
    {
      MutexLock l(&mu_);
      slots_[{rank, slot}].segment = std::shared_ptr<Segment>(std::move(*seg));
    }
    // A live trainer may rewrite the slot while it is verified (Aborted):
    // try again a few times.
    Status st = Verify(rank, slot);
    for (int attempt = 0; attempt < 3 && st.code() == StatusCode::kAborted; ++attempt) {
      st = Verify(rank, slot);
    }
    SlotStatus s;
    {
      MutexLock l(&mu_);
      s = StatusOf(rank, slot, slots_[{rank, slot}]);
    }
    if (s.intact) {
      MEMENTO_LOG_INFO("adopt: kept slot {} of rank {}: step {} ({} bytes, checksums ok)", slot,
                       rank, s.step, s.data_bytes);
    } else if (s.state == SlotState::kEmpty) {
      MEMENTO_LOG_INFO("adopt: slot {} of rank {} is empty", slot, rank);
    } else {
      MEMENTO_LOG_WARN("adopt: dropped slot {} of rank {} (state {}, step {}): {}", slot, rank,
                       SlotStateName(s.state), s.step,
                       s.state == SlotState::kWriting
                           ? "a write in progress (live trainer) or torn by a crash"
                           : s.error);
    }
  }
  return Status::Ok();
}

Status NodeStore::CheckRoom(uint64_t more, const std::string& why) {
  if (more == 0) return Status::Ok();
  uint64_t in_use = 0;
  for (const auto& [key, e] : slots_) in_use += e.segment->size();
  if (options_.budget_bytes > 0 && in_use + more > options_.budget_bytes) {
    return ResourceExhaustedError(fmt::format(
        "node memory budget exhausted: {} needs {} more but the budget is {} with {} in use; "
        "raise the agent's --budget to at least {} bytes",
        why, HumanBytes(more), HumanBytes(options_.budget_bytes), HumanBytes(in_use),
        in_use + more));
  }
  return CheckShmCapacity(options_.root, more, why);
}

Status CheckSlotRequest(int rank, int slot, uint64_t bytes) {
  if (rank < 0 || rank > kMaxRank) {
    return InvalidArgumentError(fmt::format("rank {} is out of range [0, {}]", rank, kMaxRank));
  }
  if (slot < 0 || slot >= kSlotsPerRank) {
    return InvalidArgumentError(
        fmt::format("slot {} of rank {}: a rank has slots 0 to {}", slot, rank, kSlotsPerRank - 1));
  }
  if (bytes < kSlotHeaderBytes || bytes > kMaxSlotBytes) {
    return InvalidArgumentError(
        fmt::format("a slot of {} bytes for rank {}: a slot holds between {} (its header) and {} "
                    "bytes",
                    bytes, rank, kSlotHeaderBytes, kMaxSlotBytes));
  }
  return Status::Ok();
}

Result<std::vector<std::string>> NodeStore::EnsureSlots(int rank, uint64_t bytes) {
  MEMENTO_RETURN_IF_ERROR(CheckSlotRequest(rank, 0, bytes));
  MutexLock l(&mu_);
  uint64_t more = 0;  // at most kSlotsPerRank * kMaxSlotBytes: no overflow
  for (int s = 0; s < kSlotsPerRank; ++s) {
    auto it = slots_.find({rank, s});
    uint64_t have = it == slots_.end() ? 0 : it->second.segment->size();
    if (have < bytes) more += bytes - have;
  }
  MEMENTO_RETURN_IF_ERROR(CheckRoom(
      more, fmt::format("rank {} ({} slots of {})", rank, kSlotsPerRank, HumanBytes(bytes))));
  std::vector<std::string> paths;
  for (int s = 0; s < kSlotsPerRank; ++s) {
    std::string path = SlotPath(options_.root, rank, s);
    auto it = slots_.find({rank, s});
    if (it == slots_.end() || it->second.segment->size() < bytes) {
      // The entry is made (or changed) only once the segment exists: a
      // failed allocation leaves the store as it was.
      MEMENTO_ASSIGN_OR_RETURN(auto seg, Segment::CreateOrGrow(path, bytes));
      slots_[{rank, s}].segment = std::shared_ptr<Segment>(std::move(seg));
    }
    paths.push_back(path);
  }
  return paths;
}

Result<std::shared_ptr<Segment>> NodeStore::EnsureSlot(int rank, int slot, uint64_t bytes) {
  MEMENTO_RETURN_IF_ERROR(CheckSlotRequest(rank, slot, bytes));
  MutexLock l(&mu_);
  auto it = slots_.find({rank, slot});
  const uint64_t have = it == slots_.end() ? 0 : it->second.segment->size();
  if (have >= bytes) return it->second.segment;
  MEMENTO_RETURN_IF_ERROR(CheckRoom(
      bytes - have, fmt::format("slot {} of rank {} ({})", slot, rank, HumanBytes(bytes))));
  MEMENTO_ASSIGN_OR_RETURN(auto seg,
                           Segment::CreateOrGrow(SlotPath(options_.root, rank, slot), bytes));
  SlotEntry& e = slots_[{rank, slot}];
  e.segment = std::shared_ptr<Segment>(std::move(seg));
  e.verified = false;
  e.intact = false;
  e.error.clear();
  return e.segment;
}

Status NodeStore::Verify(int rank, int slot, const std::function<bool(uint64_t)>& pace,
                         uint64_t piece_bytes) {
  std::shared_ptr<Segment> seg;
  {
    MutexLock l(&mu_);
    auto it = slots_.find({rank, slot});
    if (it == slots_.end()) {
      return NotFoundError(fmt::format("rank {} has no slot {} on this node", rank, slot));
    }
    seg = it->second.segment;
  }
  // Reads shared memory without the lock: a writer may be active (seqlock).
  SlotState state0;
  uint64_t generation0 = 0;
  LoadSlotVersion(*seg, &state0, &generation0);
  auto rewritten = [&] {
    SlotState state;
    uint64_t generation = 0;
    LoadSlotVersion(*seg, &state, &generation);
    return state != state0 || generation != generation0;
  };
  Status st;
  uint64_t generation = 0;
  auto info = ReadSlot(*seg);
  if (!info.ok()) {
    // A header read while a writer began rewriting it is torn, not corrupt.
    if (rewritten()) {
      return AbortedError(
          fmt::format("slot {} of rank {} was rewritten while its header was read", slot, rank));
    }
    st = info.status();
    generation = generation0;
  } else {
    generation = info->generation;
    if (info->state != SlotState::kComplete) {
      st = FailedPreconditionError(
          fmt::format("slot is {} (step {})", SlotStateName(info->state), info->step));
    } else {
      st = pace ? VerifySlotDataPaced(*seg, *info, piece_bytes, pace) : VerifySlotData(*seg, *info);
      if (st.code() == StatusCode::kAborted) return st;
      if (!SlotUnchanged(*seg, *info)) {
        return AbortedError(
            fmt::format("slot {} of rank {} was rewritten while being verified", slot, rank));
      }
    }
  }
  return Record(rank, slot, seg, generation, st);
}

Status NodeStore::Record(int rank, int slot, const std::shared_ptr<Segment>& seg,
                         uint64_t generation, const Status& st) {
  MutexLock l(&mu_);
  auto it = slots_.find({rank, slot});
  if (it == slots_.end() || it->second.segment != seg) {
    return AbortedError("slot was reallocated while being verified");
  }
  SlotEntry& e = it->second;
  e.verified = true;
  e.verified_generation = generation;
  e.intact = st.ok();
  e.error = st.ok() ? "" : st.ToString();
  return st;
}

Status NodeStore::VerifyWritten(int rank, int slot, const std::vector<uint8_t>& trusted,
                                int threads) {
  std::shared_ptr<Segment> seg = SlotSegment(rank, slot);
  if (seg == nullptr) {
    return NotFoundError(fmt::format("rank {} has no slot {} on this node", rank, slot));
  }
  auto info = ReadSlot(*seg);
  if (!info.ok()) {
    SlotState state;
    uint64_t generation = 0;
    LoadSlotVersion(*seg, &state, &generation);
    return Record(rank, slot, seg, generation, info.status());
  }
  if (info->state != SlotState::kComplete) {
    return Record(rank, slot, seg, info->generation,
                  FailedPreconditionError(
                      fmt::format("slot is {} (step {})", SlotStateName(info->state), info->step)));
  }
  if (!trusted.empty() && trusted.size() != info->chunks.size()) {
    return InvalidArgumentError(fmt::format("slot {} of rank {}: {} trust flags for {} chunks",
                                            slot, rank, trusted.size(), info->chunks.size()));
  }
  std::vector<size_t> todo;
  for (size_t i = 0; i < info->chunks.size(); ++i) {
    if (trusted.empty() || trusted[i] == 0) todo.push_back(i);
  }
  const uint8_t* data = seg->data() + info->data_offset;
  std::atomic<size_t> next{0};
  std::atomic<size_t> bad{SIZE_MAX};
  auto work = [&] {
    for (size_t j; (j = next.fetch_add(1)) < todo.size() && bad.load() == SIZE_MAX;) {
      const ChunkEntry& c = info->chunks[todo[j]];
      if (Checksum(data + c.offset, c.length) != c.checksum) {
        size_t none = SIZE_MAX;
        bad.compare_exchange_strong(none, todo[j]);
      }
    }
  };
  const int n =
      static_cast<int>(std::min<size_t>(std::max(threads, 1), std::max<size_t>(todo.size(), 1)));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  Status st;
  if (const size_t i = bad.load(); i != SIZE_MAX) {
    const ChunkEntry& c = info->chunks[i];
    st = DataLossError(fmt::format(
        "slot {} (step {}): chunk {} (bytes {}..{} of tensor {}) fails its checksum", seg->path(),
        info->step, i, c.offset, c.offset + c.length, EntryName(info->tensors[c.tensor_index])));
  }
  if (!SlotUnchanged(*seg, *info)) {
    return AbortedError(
        fmt::format("slot {} of rank {} was rewritten while being verified", slot, rank));
  }
  return Record(rank, slot, seg, info->generation, st);
}

SlotStatus NodeStore::StatusOf(int rank, int slot, const SlotEntry& e) {
  SlotStatus s;
  s.rank = rank;
  s.slot = slot;
  s.segment_bytes = e.segment->size();
  auto info = ReadSlot(*e.segment);
  if (!info.ok()) {
    s.state = SlotState::kComplete;
    s.error = info.status().ToString();
    return s;
  }
  s.state = info->state;
  s.step = info->step;
  s.generation = info->generation;
  s.data_bytes = info->data_bytes;
  s.verified = e.verified && e.verified_generation == info->generation;
  s.intact = s.verified && e.intact && s.state == SlotState::kComplete;
  if (s.verified) s.error = e.error;
  return s;
}

std::vector<SlotStatus> NodeStore::Inventory(int rank) {
  MutexLock l(&mu_);
  std::vector<SlotStatus> out;
  for (int s = 0; s < kSlotsPerRank; ++s) {
    auto it = slots_.find({rank, s});
    if (it != slots_.end()) out.push_back(StatusOf(rank, s, it->second));
  }
  return out;
}

std::vector<int> NodeStore::Ranks() {
  MutexLock l(&mu_);
  std::vector<int> out;
  for (const auto& [key, e] : slots_) {
    if (out.empty() || out.back() != key.first) out.push_back(key.first);
  }
  return out;
}

uint64_t NodeStore::allocated_bytes() {
  MutexLock l(&mu_);
  uint64_t n = 0;
  for (const auto& [key, e] : slots_) n += e.segment->size();
  return n;
}

std::shared_ptr<Segment> NodeStore::SlotSegment(int rank, int slot) {
  MutexLock l(&mu_);
  auto it = slots_.find({rank, slot});
  if (it == slots_.end()) return nullptr;
  return it->second.segment;
}

}  // namespace memento::shm
