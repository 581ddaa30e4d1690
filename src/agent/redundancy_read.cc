// Reading the shared-memory redundancy store (ShmRedundancyStore,
// redundancy_shm.h): what a version holds (Holding: stored entries checked
// against their checksums, resident ones against their T0 slots), where
// resident entries lie (Resident, ResidentRanks) and the bytes of an entry
// (Read, ReadView in place, ServeResident with the slot's digests).
// docs/cluster.md, "Redundancy store"; docs/reft.md section 4.
#include <algorithm>
#include <cstring>

#include "agent/redundancy_layout.h"
#include "agent/redundancy_shm.h"
#include "common/checksum.h"
#include "common/log.h"

namespace memento::agent {

using recover::ByteSource;
using recover::SourceKind;

namespace {

// Lists a done entry in `out` by its kind.
void AddTo(const shm::RedundancyEntry& e, recover::VersionHolding* out) {
  if (e.kind == static_cast<uint32_t>(SourceKind::kCopy)) {
    out->copies.push_back(e.id);
  } else {
    out->parities.push_back(e.id);
  }
}

// InvalidArgument when `req` reads past the end of entry `e`.
Status CheckReadRange(const shm::RedundancyEntry& e, const recover::ReadRequest& req) {
  if (req.offset > e.bytes || req.length > e.bytes - req.offset) {
    return InvalidArgumentError(
        fmt::format("read of bytes [{}, +{}) of {} of version {}: the entry has {} bytes",
                    req.offset, req.length, DescribeSource(req.source), req.step, e.bytes));
  }
  return Status::Ok();
}

}  // namespace

Status ShmRedundancyStore::NotFinishedYet(ByteSource entry, int64_t step) const {
  return NotFoundError(fmt::format("{} of version {} on node {} is not finished yet",
                                   DescribeSource(entry), step, node_));
}

// ---- What a version holds ---------------------------------------------------

recover::VersionHolding ShmRedundancyStore::Holding(int64_t step, bool verify) {
  recover::VersionHolding out;
  out.step = step;
  std::shared_ptr<Version> v;
  std::vector<uint32_t> stored;  // done entries with bytes in the file
  std::vector<std::pair<uint32_t, std::shared_ptr<const ResidentSource>>> resident;
  {
    MutexLock l(&mu_);
    auto it = versions_.find(step);
    if (it == versions_.end()) return out;
    v = it->second;
    const shm::RedundancyEntry* table = TableOf(*v->segment);
    for (uint32_t i = 0; i < v->check.size(); ++i) {
      if (__atomic_load_n(&table[i].done, __ATOMIC_ACQUIRE) == 0) continue;
      if (IsResident(table[i])) {
        // Listed only while its T0 slot still holds the bytes it was made from.
        if (v->resident[i] != nullptr) resident.emplace_back(i, v->resident[i]);
      } else {
        stored.push_back(i);
      }
    }
  }
  ListResident(*v, resident, verify, &out);
  ListStored(*v, stored, verify, &out);
  std::sort(out.copies.begin(), out.copies.end());
  std::sort(out.parities.begin(), out.parities.end());
  return out;
}

void ShmRedundancyStore::ListResident(
    const Version& v,
    const std::vector<std::pair<uint32_t, std::shared_ptr<const ResidentSource>>>& resident,
    bool verify, recover::VersionHolding* out) {
  const shm::RedundancyEntry* table = TableOf(*v.segment);
  for (const auto& [i, src] : resident) {
    Status st = t0_.CheckSegments(RefOf(v, i, *src), verify);
    if (!st.ok()) {
      MEMENTO_LOG_INFO("redundancy store: {} not listed: {}", EntryName(v, i), st.ToString());
      continue;
    }
    AddTo(table[i], out);
  }
}

void ShmRedundancyStore::ListStored(Version& v, const std::vector<uint32_t>& done, bool verify,
                                    recover::VersionHolding* out) {
  const shm::RedundancyEntry* table = TableOf(*v.segment);
  // With verify: every entry hashed now (without the lock), its check updated.
  std::vector<Check> result(done.size());
  std::vector<uint64_t> sums(done.size(), 0);
  if (verify) {
    for (size_t j = 0; j < done.size(); ++j) {
      const shm::RedundancyEntry& e = table[done[j]];
      sums[j] = Checksum(v.segment->data() + e.offset, e.bytes);
      result[j] = sums[j] == e.xxh3 ? Check::kGood : Check::kBad;
    }
  }
  MutexLock l(&mu_);
  for (size_t j = 0; j < done.size(); ++j) {
    const uint32_t i = done[j];
    if (verify) {
      v.check[i] = result[j];
      v.computed[i] = sums[j];
    }
    if (v.check[i] == Check::kBad) continue;
    AddTo(table[i], out);
  }
}

// ---- Resident entries -------------------------------------------------------

std::map<std::pair<recover::SourceKind, uint32_t>, int> ShmRedundancyStore::ResidentRanks(
    int64_t step) {
  std::map<std::pair<recover::SourceKind, uint32_t>, int> out;
  MutexLock l(&mu_);
  auto it = versions_.find(step);
  if (it == versions_.end()) return out;
  const Version& v = *it->second;
  const shm::RedundancyEntry* table = TableOf(*v.segment);
  for (uint32_t i = 0; i < v.resident.size(); ++i) {
    if (!IsResident(table[i]) || v.resident[i] == nullptr) continue;
    out[{static_cast<recover::SourceKind>(table[i].kind), table[i].id}] = v.resident[i]->rank;
  }
  return out;
}

PieceReader::SegmentsRef ShmRedundancyStore::RefOf(const Version& v, uint32_t index,
                                                   const ResidentSource& src) {
  const shm::RedundancyEntry& e = TableOf(*v.segment)[index];
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
  const shm::RedundancyEntry& e = TableOf(*v->segment)[index];
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

Status ShmRedundancyStore::CheckResidentRead(const Version& v, uint32_t index,
                                             const ResidentSource* src,
                                             const recover::ReadRequest& req) const {
  const shm::RedundancyEntry& e = TableOf(*v.segment)[index];
  if (__atomic_load_n(&e.done, __ATOMIC_ACQUIRE) == 0) return NotFinishedYet(req.source, req.step);
  if (src == nullptr) {
    return NotFoundError(
        fmt::format("{} is resident in T0 but the plan does not say where", EntryName(v, index)));
  }
  return CheckReadRange(e, req);
}

// ---- Bytes ------------------------------------------------------------------

Result<ShmRedundancyStore::ReadTarget> ShmRedundancyStore::FindForRead(
    const recover::ReadRequest& req) {
  ReadTarget t;
  MutexLock l(&mu_);
  MEMENTO_ASSIGN_OR_RETURN(auto found, Find(req.step, req.source));
  std::tie(t.version, t.index) = found;
  t.is_resident = IsResident(TableOf(*t.version->segment)[t.index]);
  t.resident = t.version->resident[t.index];
  t.check = t.version->check[t.index];
  return t;
}

Status ShmRedundancyStore::ServeResident(const recover::ReadRequest& req,
                                         const PieceReader::EmitFn& emit) {
  MEMENTO_ASSIGN_OR_RETURN(ReadTarget t, FindForRead(req));
  const Version& v = *t.version;
  if (!t.is_resident) {
    return FailedPreconditionError(
        fmt::format("{} is stored, not resident in T0", EntryName(v, t.index)));
  }
  MEMENTO_RETURN_IF_ERROR(CheckResidentRead(v, t.index, t.resident.get(), req));
  return t0_.ServeSegments(RefOf(v, t.index, *t.resident), req.offset, req.length, emit);
}

Result<ShmRedundancyStore::View> ShmRedundancyStore::ReadView(const recover::ReadRequest& req) {
  MEMENTO_ASSIGN_OR_RETURN(ReadTarget t, FindForRead(req));
  if (t.is_resident) return ReadResidentView(*t.version, t.index, t.resident.get(), req);
  return ReadStoredView(std::move(t), req);
}

Result<ShmRedundancyStore::View> ShmRedundancyStore::ReadStoredView(
    ReadTarget target, const recover::ReadRequest& req) {
  Version& v = *target.version;
  MEMENTO_RETURN_IF_ERROR(CheckStoredRead(v, target.index, target.check, req));
  const shm::RedundancyEntry& e = TableOf(*v.segment)[target.index];
  View view;
  view.data = v.segment->data() + e.offset + req.offset;
  view.length = req.length;
  view.keep = std::move(target.version);
  return view;
}

Result<ShmRedundancyStore::View> ShmRedundancyStore::ReadResidentView(
    const Version& v, uint32_t index, const ResidentSource* src, const recover::ReadRequest& req) {
  // Not in the file: read from the producer's T0 slot into a buffer the
  // view owns (chunks verified, the slot's generation checked).
  MEMENTO_RETURN_IF_ERROR(CheckResidentRead(v, index, src, req));
  auto buf = std::make_shared<std::vector<uint8_t>>(req.length);
  MEMENTO_RETURN_IF_ERROR(
      t0_.ReadSegments(RefOf(v, index, *src), req.offset, req.length, buf->data()));
  View view;
  view.data = buf->data();
  view.length = req.length;
  view.keep = std::move(buf);
  return view;
}

Status ShmRedundancyStore::CheckStoredRead(Version& v, uint32_t index, Check check,
                                           const recover::ReadRequest& req) {
  const shm::RedundancyEntry& e = TableOf(*v.segment)[index];
  if (__atomic_load_n(&e.done, __ATOMIC_ACQUIRE) == 0) return NotFinishedYet(req.source, req.step);
  MEMENTO_RETURN_IF_ERROR(CheckReadRange(e, req));
  if (check == Check::kUnknown) {
    const uint64_t sum = Checksum(v.segment->data() + e.offset, e.bytes);
    MutexLock l(&mu_);
    v.check[index] = sum == e.xxh3 ? Check::kGood : Check::kBad;
    v.computed[index] = sum;
    check = v.check[index];
  }
  if (check == Check::kBad) {
    uint64_t computed = 0;
    {
      MutexLock l(&mu_);
      computed = v.computed[index];
    }
    return DataLossError(fmt::format(
        "{} of version {} on node {} fails its checksum (stored {:016x}, computed {:016x})",
        DescribeSource(req.source), req.step, node_, e.xxh3, computed));
  }
  return Status::Ok();
}

Status ShmRedundancyStore::Read(const recover::ReadRequest& req, void* dst) {
  MEMENTO_ASSIGN_OR_RETURN(ReadTarget t, FindForRead(req));
  if (t.is_resident) {
    MEMENTO_RETURN_IF_ERROR(CheckResidentRead(*t.version, t.index, t.resident.get(), req));
    return t0_.ReadSegments(RefOf(*t.version, t.index, *t.resident), req.offset, req.length, dst);
  }
  MEMENTO_ASSIGN_OR_RETURN(View view, ReadStoredView(std::move(t), req));
  if (view.length > 0) std::memcpy(dst, view.data, view.length);
  return Status::Ok();
}

}  // namespace memento::agent
