#include "agent/memory_tier.h"

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "shm/node_store.h"
#include "shm/segment.h"
#include "shm/slot.h"

namespace memento::agent {
namespace {

// "rank<R>.slot<S>" -> (R, S); false for any other name.
bool ParseSlotName(const std::string& name, int* rank, int* slot) {
  char tail = 0;
  return std::sscanf(name.c_str(), "rank%d.slot%d%c", rank, slot, &tail) == 2 && *rank >= 0 &&
         (*slot == 0 || *slot == 1);
}

MemorySlotReport ReadOne(const std::string& root, int rank, int slot, bool verify_data) {
  MemorySlotReport r;
  r.root = root;
  r.rank = rank;
  r.slot = slot;
  auto segment = shm::Segment::Open(shm::SlotPath(root, rank, slot), /*writable=*/false);
  if (!segment.ok()) {
    r.state = "unreadable";
    r.error = segment.status().ToString();
    return r;
  }
  auto info = shm::ReadSlot(**segment);
  if (!info.ok()) {
    r.state = "unreadable";
    r.error = info.status().ToString();
    return r;
  }
  r.state = shm::SlotStateName(info->state);
  r.step = info->step;
  r.data_bytes = info->data_bytes;
  if (info->state != shm::SlotState::kComplete) {
    r.error = "not complete";
    return r;
  }
  if (verify_data) {
    Status s = shm::VerifySlotData(**segment, *info);
    if (!s.ok()) {
      r.error = s.ToString();
      return r;
    }
  }
  // A writer that started while we read makes what we read meaningless.
  if (!shm::SlotUnchanged(**segment, *info)) {
    r.error = "rewritten while being read";
    return r;
  }
  r.intact = true;
  return r;
}

}  // namespace

Result<MemoryTierReport> InspectMemoryTier(const std::vector<std::string>& roots,
                                           bool verify_data) {
  MemoryTierReport report;
  std::map<int, std::set<int64_t>> intact_steps;  // rank -> steps held intact
  for (const std::string& root : roots) {
    DIR* dir = opendir(root.c_str());
    if (dir == nullptr) return ErrnoError("node root '" + root + "'", errno);
    std::vector<std::pair<int, int>> found;
    while (dirent* e = readdir(dir)) {
      int rank, slot;
      if (ParseSlotName(e->d_name, &rank, &slot)) found.emplace_back(rank, slot);
    }
    closedir(dir);
    std::sort(found.begin(), found.end());
    for (auto [rank, slot] : found) {
      MemorySlotReport r = ReadOne(root, rank, slot, verify_data);
      intact_steps[rank];  // a rank with no intact slot still counts
      if (r.intact) intact_steps[rank].insert(r.step);
      report.slots.push_back(std::move(r));
    }
  }
  for (const auto& [rank, steps] : intact_steps) report.ranks.push_back(rank);
  if (!intact_steps.empty()) {
    // Newest step present in every rank's set.
    const std::set<int64_t>& first = intact_steps.begin()->second;
    for (auto it = first.rbegin(); it != first.rend(); ++it) {
      bool everywhere = std::all_of(intact_steps.begin(), intact_steps.end(),
                                    [&](const auto& kv) { return kv.second.count(*it) > 0; });
      if (everywhere) {
        report.latest_complete = *it;
        break;
      }
    }
  }
  return report;
}

Result<std::optional<int64_t>> MemoryVersionSource::LatestComplete(Deadline deadline) {
  if (deadline.expired()) return DeadlineExceededError("memory tier: deadline passed");
  MEMENTO_ASSIGN_OR_RETURN(MemoryTierReport report,
                           InspectMemoryTier(roots_, /*verify_data=*/true));
  return report.latest_complete;
}

}  // namespace memento::agent
