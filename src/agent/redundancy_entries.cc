// Writing the entries of the shared-memory redundancy store
// (ShmRedundancyStore, redundancy_shm.h): the producers' buffers
// (EntryBuffer, PinEntryBuffer), finishing an entry stored in the file
// (FinishEntry, FinishEntryExpecting: checksum, done word, the version
// sealed after its last entry) and finishing a resident one
// (FinishResidentEntry: the producer's T0 slot checked, its generation
// recorded). docs/cluster.md, "Redundancy store".
#include "agent/redundancy_layout.h"
#include "agent/redundancy_shm.h"
#include "common/checksum.h"

namespace memento::agent {

using recover::ByteSource;

namespace {

Status ResidentRefusal(ByteSource entry, int64_t step, const shm::RedundancyEntry& e) {
  return FailedPreconditionError(fmt::format(
      "{} of version {} is resident in T0 (rank {}'s slot): it has no bytes in the redundancy "
      "store; finish it with FinishResidentEntry",
      DescribeSource(entry), step, e.offset));
}

}  // namespace

Status ShmRedundancyStore::AlreadyFinished(ByteSource entry, int64_t step) const {
  return FailedPreconditionError(fmt::format("{} of version {} on node {} is already finished",
                                             DescribeSource(entry), step, node_));
}

Result<uint8_t*> ShmRedundancyStore::EntryBuffer(int64_t step, ByteSource entry) {
  MEMENTO_ASSIGN_OR_RETURN(WriteView view, PinEntryBuffer(step, entry));
  return view.data;
}

Result<ShmRedundancyStore::WriteView> ShmRedundancyStore::PinEntryBuffer(int64_t step,
                                                                         ByteSource entry) {
  MutexLock l(&mu_);
  MEMENTO_ASSIGN_OR_RETURN(auto found, Find(step, entry));
  const shm::RedundancyEntry& e = TableOf(*found.first->segment)[found.second];
  if (IsResident(e)) return ResidentRefusal(entry, step, e);
  if (e.done != 0) return AlreadyFinished(entry, step);
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
  const shm::RedundancyEntry& e = TableOf(*found.first->segment)[found.second];
  if (__atomic_load_n(&e.done, __ATOMIC_ACQUIRE) == 0) return NotFinishedYet(entry, step);
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
    if (TableOf(*v->segment)[index].done != 0) return AlreadyFinished(entry, step);
  }
  // The caller is the entry's only writer: checksum its bytes without the lock.
  shm::RedundancyEntry& e = TableOf(*v->segment)[index];
  const uint64_t sum = Checksum(v->segment->data() + e.offset, e.bytes);
  if (expected != nullptr && sum != *expected) {
    return DataLossError(fmt::format(
        "{} of version {} on node {}: its bytes have checksum {:016x}, the producer's is {:016x} "
        "(a part is missing or corrupted); left unfinished",
        DescribeSource(entry), step, node_, sum, *expected));
  }
  MutexLock l(&mu_);
  if (e.done != 0) return AlreadyFinished(entry, step);
  e.xxh3 = sum;
  __atomic_store_n(&e.done, 1u, __ATOMIC_RELEASE);
  // Left kUnknown: the first read re-checks the bytes (they may rot at rest).
  v->check[index] = Check::kUnknown;
  if (++v->done == v->index.size()) Seal(*v);
  return Status::Ok();
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
    const shm::RedundancyEntry& e = TableOf(*v->segment)[index];
    if (!IsResident(e) || v->resident[index] == nullptr) {
      return FailedPreconditionError(fmt::format(
          "{} of version {} on node {} is stored in the redundancy store, not resident in T0",
          DescribeSource(entry), step, node_));
    }
    if (e.done != 0) return AlreadyFinished(entry, step);
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
  shm::RedundancyEntry& e = TableOf(*v->segment)[index];
  if (e.done != 0) return AlreadyFinished(entry, step);
  e.xxh3 = 0;
  e.generation = slot_generation;
  __atomic_store_n(&e.done, 1u, __ATOMIC_RELEASE);
  v->check[index] = Check::kUnknown;
  if (++v->done == v->index.size()) Seal(*v);
  return Status::Ok();
}

}  // namespace memento::agent
