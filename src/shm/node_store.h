// The node-local snapshot store: the directory of one job on one node and the
// slot segments in it (docs/node_store.md). Owned by the agent; trainers map
// the same files.
//
//   <root>/                 mode 0700, default /dev/shm/memento/<job>/node<N>
//     agent.sock            the agent's Unix socket (mode 0600)
//     agent.lock            flock'ed by the running agent
//     rank<R>.slot<S>       slot S (0 or 1) of rank R, mode 0600
//
// Each rank has two slots: while one holds the newest complete version the
// other receives the next one. Slots are allocated once (pages pre-faulted),
// grown when a rank registers more state, and reused for every step.
//
// Thread safety: all methods may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "memento/status.h"
#include "shm/segment.h"
#include "shm/slot.h"

namespace memento::shm {

struct NodeStoreOptions {
  std::string root;
  std::string job_id;
  int node = 0;
  // Most bytes all slots on this node may take; 0: whatever the shared-memory
  // filesystem can hold.
  uint64_t budget_bytes = 0;
};

// The default root of a job on a node: /dev/shm/memento/<job>/node<N>.
std::string DefaultNodeRoot(const std::string& job_id, int node);
std::string SlotPath(const std::string& root, int rank, int slot);
// <root>/assembled.rank<R>: the whole-tensor slot the agent's `assemble` op
// stages for a restore of a rank whose slot holds plan pieces (docs/reft.md,
// section 3). Removed by the client after its restore, by the next assembly
// of the rank, and by the agent's adoption at start.
std::string AssembledSlotPath(const std::string& root, int rank);

// Creates `path` and missing parents; the last component gets mode 0700 and
// must belong to this uid (PermissionDenied otherwise).
Status MakePrivateDir(const std::string& path);

// Free and total bytes of the filesystem holding `path`.
struct FsSpace {
  uint64_t total = 0;
  uint64_t available = 0;
};
Result<FsSpace> GetFsSpace(const std::string& path);

// ResourceExhausted, with how much is needed and how to get it, when the
// filesystem at `root` cannot hold `more_bytes` beyond what it holds now.
Status CheckShmCapacity(const std::string& root, uint64_t more_bytes, const std::string& why);

// What the store knows about one slot.
struct SlotStatus {
  int rank = -1;
  int slot = -1;
  SlotState state = SlotState::kEmpty;
  int64_t step = -1;
  uint64_t generation = 0;
  uint64_t data_bytes = 0;
  uint64_t segment_bytes = 0;
  bool intact = false;    // complete and its checksums verified (this generation)
  bool verified = false;  // a verification ran for this generation
  std::string error;      // why it is not intact, when verified
};

class NodeStore {
 public:
  // Creates or opens the root, checks the budget against the filesystem, and
  // adopts every slot already there: complete slots are verified and kept,
  // torn or corrupted ones are reported and left out of the inventory.
  static Result<std::unique_ptr<NodeStore>> Open(const NodeStoreOptions& options);

  // Makes sure `rank` has its two slots, each at least `bytes` long, within
  // the budget and the filesystem's free space. Returns their paths.
  Result<std::vector<std::string>> EnsureSlots(int rank, uint64_t bytes) EXCLUDES(mu_);

  // Makes sure slot `slot` of `rank` exists and is at least `bytes` long,
  // within the budget and the filesystem's free space, and leaves the other
  // slot alone: a rebuild writes one slot, and the restarted trainer's Seal
  // (EnsureSlots) creates the other when it needs it. Returns the store's
  // mapping of the slot: writable when this call created or grew it, the
  // mapping adopted at Open (read-only) otherwise (Segment::writable()).
  Result<std::shared_ptr<Segment>> EnsureSlot(int rank, int slot, uint64_t bytes) EXCLUDES(mu_);

  // Verifies slot `slot` of `rank` (header and every chunk) and records the
  // outcome for its current generation. A slot that a writer starts to
  // rewrite during the check gives Aborted and records nothing (seqlock on
  // the header's state and generation): a concurrent rewrite is never
  // reported as corruption. With `pace` the data is hashed in pieces of at
  // most `piece_bytes`, `pace(n)` called before each (VerifySlotDataPaced);
  // a `pace` that returns false stops the check (Aborted, nothing recorded).
  Status Verify(int rank, int slot, const std::function<bool(uint64_t)>& pace = nullptr,
                uint64_t piece_bytes = 1 << 20) EXCLUDES(mu_);

  // Verifies a slot its caller has just written and completed (a rebuild,
  // docs/recovery.md "Verification of a rebuilt slot") and records the
  // outcome like Verify: the header, manifest and chunk table are checked as
  // Verify checks them, and every chunk i with trusted[i] == 0 is hashed
  // against its table checksum, on `threads` threads. A chunk with
  // trusted[i] != 0 is not read again: the caller vouches that its table
  // checksum was compared with its bytes in this slot after they were
  // written, and that nothing wrote them since (a peer's chunk checked on
  // arrival). `trusted` is empty or has one entry per chunk of the slot's
  // table (InvalidArgument otherwise). Seqlock rules as Verify.
  Status VerifyWritten(int rank, int slot, const std::vector<uint8_t>& trusted, int threads)
      EXCLUDES(mu_);

  // Both slots of `rank` (re-reading their headers); empty when unknown.
  std::vector<SlotStatus> Inventory(int rank) EXCLUDES(mu_);
  std::vector<int> Ranks() EXCLUDES(mu_);
  // The mapping of slot `slot` of `rank` (read-only for the agent), null when
  // unknown. Shared: stays valid after the slot is reallocated (grown).
  std::shared_ptr<Segment> SlotSegment(int rank, int slot) EXCLUDES(mu_);
  uint64_t allocated_bytes() EXCLUDES(mu_);
  const NodeStoreOptions& options() const { return options_; }

 private:
  explicit NodeStore(NodeStoreOptions options) : options_(std::move(options)) {}
  struct SlotEntry {
    std::shared_ptr<Segment> segment;
    uint64_t verified_generation = 0;
    bool verified = false;
    bool intact = false;
    std::string error;
  };
  Status Adopt();
  // ResourceExhausted when `more` bytes of slots for `why` exceed the budget
  // or the filesystem.
  Status CheckRoom(uint64_t more, const std::string& why) REQUIRES(mu_);
  // Records a verification outcome for `seg`'s generation `generation`.
  Status Record(int rank, int slot, const std::shared_ptr<Segment>& seg, uint64_t generation,
                const Status& st) EXCLUDES(mu_);
  SlotStatus StatusOf(int rank, int slot, const SlotEntry& e);

  const NodeStoreOptions options_;
  Mutex mu_;
  std::map<std::pair<int, int>, SlotEntry> slots_ GUARDED_BY(mu_);
};

}  // namespace memento::shm
