// The node's T1 holdings: for each version, the redundancy this node holds for
// its peers as the plan's NodePlan says (Copy and Parity entries), in shared
// memory owned by the agent, so it survives trainer crashes and agent
// restarts like the T0 slots do. docs/cluster.md, "Redundancy store".
//
//   <root>/red.<step 20 digits>   one file per version: fixed header, entry
//                                 table (kind, id, offset, bytes, xxh3, done),
//                                 then the entries' bytes; a version is
//                                 complete when every entry is done; the
//                                 header's state word is written last.
//
// Producers: the agent's save path (parities and ARC / local copies computed
// from the node's own T0 slots) and the peer service (peer and AOR copies
// pushed by the pieces' nodes). Readers: the peer service (recovery reads).
// Entries resident in T0 (agent/resident.h) keep no bytes here: reads
// resolve them through the producer rank's T0 slot.
//
// Thread safety: every method is thread-safe; different entries of one
// version may be written concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/resident.h"
#include "fmt/format.h"
#include "memento/status.h"
#include "recover/source.h"
#include "topo/plan.h"

namespace memento::agent {

class RedundancyStore {
 public:
  virtual ~RedundancyStore() = default;

  // Opens the store under a node root and adopts the complete versions found
  // there (entries re-verified; torn versions removed).
  [[nodiscard]] static Result<std::unique_ptr<RedundancyStore>> Open(const std::string& root,
                                                                     int node);

  // The plan whose NodePlan(node) decides the entries of later versions.
  // Versions made under another plan (different PlanHash) are dropped.
  [[nodiscard]] virtual Status SetPlan(const topo::Plan& plan) = 0;

  // Creates version `step` with every entry of this node's plan (idempotent;
  // a version that already exists is returned as is).
  [[nodiscard]] virtual Status Ensure(int64_t step) = 0;

  // Asked before a new version's file is allocated, with its size and what it
  // is ("redundancy version 42"): an error (ResourceExhausted) refuses the
  // version, Ensure returns it. The agent checks its node budget (--budget)
  // this way. Set before the store is used; the default store has none.
  using RoomCheck = std::function<Status(uint64_t more_bytes, const std::string& why)>;
  virtual void SetRoomCheck(RoomCheck check) {}
  // Bytes of the version files this store holds now.
  virtual uint64_t bytes_in_use() { return 0; }

  // Writable bytes of one entry (kCopy or kParity id of the plan) of version
  // `step`, for zero-copy receive and encode output. Valid until the version
  // is dropped.
  [[nodiscard]] virtual Result<uint8_t*> EntryBuffer(int64_t step, recover::ByteSource entry) = 0;
  // Checksums the entry's bytes and marks it done; when it is the last one the
  // version becomes complete (state word last, release ordering).
  [[nodiscard]] virtual Status FinishEntry(int64_t step, recover::ByteSource entry) = 0;

  // Entries resident in T0 (agent/resident.h; docs/reft.md section 4): when
  // on, versions created after the next SetPlan lay out the entries
  // T0ResidentSource names without bytes in the file, and the producer
  // finishes them with FinishResidentEntry; every read resolves them through
  // the producer rank's T0 slot under the store's root. Off by default (the
  // agent turns it on); a store that cannot resolve them keeps it off.
  virtual void SetResidentT0(bool on) { (void)on; }
  // Parities resident in T0 (docs/reft.md section 4): `rank`'s client
  // computes the parities its rank produces under the plan of hash
  // `plan_hash` into parity entries of its slots, for every snapshot from
  // step `from_step` on (the plan op's answer). While the store's plan has
  // that hash, versions of steps >= from_step created afterwards lay out
  // those parities as resident (with SetResidentT0 on); the producer then
  // finishes them with FinishResidentEntry. from_step < 0 forgets it (the
  // rank's client writes whole slots, or nothing is known): later versions
  // keep its parities in the file.
  virtual void SetClientParity(int rank, int64_t from_step, uint64_t plan_hash) {
    (void)rank;
    (void)from_step;
    (void)plan_hash;
  }

  // A resident entry of version `step` (not done yet or done): where its bytes
  // lie. nullopt for an entry stored in the file; NotFound for no such entry.
  struct ResidentRef {
    ResidentSource source;
    uint64_t generation = 0;  // of the producer's slot, once finished; 0 before
  };
  [[nodiscard]] virtual Result<std::optional<ResidentRef>> Resident(int64_t step,
                                                                    recover::ByteSource entry) {
    (void)step;
    (void)entry;
    return std::optional<ResidentRef>();
  }
  // Finishes a resident entry: the producer rank's T0 slot of `step` must
  // hold it now with `slot_generation` (the generation whose bytes the
  // caller verified) and every segment; the generation is recorded (no bytes
  // are read or copied; the slot's chunk checksums cover them, xxh3 stays 0).
  // NotFound / Aborted from the slot; FailedPrecondition for an entry that is
  // not resident or already finished.
  [[nodiscard]] virtual Status FinishResidentEntry(int64_t step, recover::ByteSource entry,
                                                   uint64_t slot_generation) {
    (void)step;
    (void)slot_generation;
    return FailedPreconditionError(
        fmt::format("{} {} is not resident in T0", recover::SourceKindName(entry.kind), entry.id));
  }

  virtual bool Complete(int64_t step) = 0;
  // Complete versions, newest first.
  virtual std::vector<int64_t> CompleteVersions() = 0;
  // The entries of `step` that are done and (with verify) whose checksums verify.
  virtual recover::VersionHolding Holding(int64_t step, bool verify) = 0;

  // Copies bytes of a done entry; NotFound when absent, DataLoss when its
  // checksum fails (checked once per entry, then cached).
  [[nodiscard]] virtual Status Read(const recover::ReadRequest& req, void* dst) = 0;

  // Removes every version with step < `keep_from` (older than the newest
  // commit) and every incomplete version older than `keep_from`.
  virtual void DropBelow(int64_t keep_from) = 0;
  // Removes every version with step > `keep_to`: a restart from an older
  // version (the durable-tier fallback) abandons the history they belong to.
  virtual void DropAbove(int64_t keep_to) = 0;
};

}  // namespace memento::agent
