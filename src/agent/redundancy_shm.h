// The shared-memory implementation of RedundancyStore (redundancy.h), one
// file per version (format and crash protocol in redundancy_format.h).
// Implemented by concern in redundancy.cc (opening, the plan, the versions),
// redundancy_file.cc (the files), redundancy_entries.cc (writing entries)
// and redundancy_read.cc (reading them).
// RedundancyStore::Open returns one of these; the peer service uses the extra
// ReadView to send entry bytes straight from shared memory.
//
// Thread safety: every method is thread-safe. One mutex guards the version
// map and the per-entry bookkeeping; checksums are computed outside it.
// Different entries of one version may be written concurrently; one entry
// has one writer at a time (the caller's contract).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "agent/piece_reader.h"
#include "agent/redundancy.h"
#include "common/mutex.h"
#include "shm/redundancy_format.h"
#include "shm/segment.h"

namespace memento::agent {

// <root>/red.<step as 20 digits>.
std::string RedundancyVersionPath(const std::string& root, int64_t step);

// The plan hash the store records in its files (recover::PlanHash).
uint64_t RedundancyPlanHash(const topo::Plan& plan);

class ShmRedundancyStore final : public RedundancyStore {
 public:
  [[nodiscard]] static Result<std::unique_ptr<ShmRedundancyStore>> OpenShm(const std::string& root,
                                                                           int node);
  ~ShmRedundancyStore() override;

  Status SetPlan(const topo::Plan& plan) override EXCLUDES(mu_);
  Status Ensure(int64_t step) override EXCLUDES(mu_);
  void SetRoomCheck(RoomCheck check) override EXCLUDES(mu_);
  uint64_t bytes_in_use() override EXCLUDES(mu_);
  Result<uint8_t*> EntryBuffer(int64_t step, recover::ByteSource entry) override EXCLUDES(mu_);
  Status FinishEntry(int64_t step, recover::ByteSource entry) override EXCLUDES(mu_);
  bool Complete(int64_t step) override EXCLUDES(mu_);
  std::vector<int64_t> CompleteVersions() override EXCLUDES(mu_);
  recover::VersionHolding Holding(int64_t step, bool verify) override EXCLUDES(mu_);
  Status Read(const recover::ReadRequest& req, void* dst) override EXCLUDES(mu_);
  void DropBelow(int64_t keep_from) override EXCLUDES(mu_);
  void DropAbove(int64_t keep_to) override EXCLUDES(mu_);
  void SetResidentT0(bool on) override EXCLUDES(mu_);
  void SetClientParity(int rank, int64_t from_step, uint64_t plan_hash) override EXCLUDES(mu_);
  Result<std::optional<ResidentRef>> Resident(int64_t step, recover::ByteSource entry) override
      EXCLUDES(mu_);
  Status FinishResidentEntry(int64_t step, recover::ByteSource entry,
                             uint64_t slot_generation) override EXCLUDES(mu_);

  // Serves bytes [req.offset, +req.length) of a done resident entry straight
  // from the producer's T0 slot with the chunks' digests
  // (PieceReader::ServeSegments). FailedPrecondition for an entry stored in
  // the file (use ReadView).
  [[nodiscard]] Status ServeResident(const recover::ReadRequest& req,
                                     const PieceReader::EmitFn& emit) EXCLUDES(mu_);

  // Bytes [req.offset, +req.length) of a done entry whose checksum verified
  // (once, cached), in place in shared memory (a resident entry: read from
  // its T0 slot into a buffer that `keep` owns). `keep` holds the version's
  // mapping alive while the caller uses `data` (a concurrent DropBelow only
  // unlinks the file). Errors as Read.
  struct View {
    std::shared_ptr<const void> keep;
    const uint8_t* data = nullptr;
    uint64_t length = 0;
  };
  [[nodiscard]] Result<View> ReadView(const recover::ReadRequest& req) EXCLUDES(mu_);

  // EntryBuffer that also pins the version: `keep` holds its mapping alive,
  // so a concurrent DropBelow (a newer commit) cannot unmap the bytes while
  // the caller writes them (FinishEntry then reports NotFound). Errors as
  // EntryBuffer.
  struct WriteView {
    std::shared_ptr<void> keep;
    uint8_t* data = nullptr;
    uint64_t bytes = 0;
  };
  [[nodiscard]] Result<WriteView> PinEntryBuffer(int64_t step, recover::ByteSource entry)
      EXCLUDES(mu_);

  // Every version (complete or not), newest first.
  std::vector<int64_t> Versions() EXCLUDES(mu_);
  // The entry's size in version `step`; NotFound when it has no such entry.
  [[nodiscard]] Result<uint64_t> EntryBytes(int64_t step, recover::ByteSource entry) EXCLUDES(mu_);
  // FinishEntry that first compares the bytes' checksum with the producer's
  // (one pass): DataLoss, entry left unfinished, when they differ.
  [[nodiscard]] Status FinishEntryExpecting(int64_t step, recover::ByteSource entry,
                                            uint64_t expected_xxh3) EXCLUDES(mu_);
  // The stored xxHash3 of a finished entry; NotFound when absent or not finished.
  [[nodiscard]] Result<uint64_t> FinishedChecksum(int64_t step, recover::ByteSource entry)
      EXCLUDES(mu_);
  // PlanHash of the plan set with SetPlan; 0 before.
  uint64_t plan_hash() EXCLUDES(mu_);
  // The rank whose T0 slot holds each resident entry of version `step`, keyed
  // by (kind, id): such an entry is only as usable as that slot (a slot that
  // fails its check is rebuilt, which overwrites the entry's bytes).
  std::map<std::pair<recover::SourceKind, uint32_t>, int> ResidentRanks(int64_t step) EXCLUDES(mu_);
  int node() const { return node_; }
  const std::string& root() const { return root_; }

 private:
  enum class Check : uint8_t { kUnknown = 0, kGood = 1, kBad = 2 };
  struct Version {
    int64_t step = -1;
    uint64_t plan_hash = 0;
    std::string path;
    std::unique_ptr<shm::Segment> segment;
    std::map<std::pair<uint32_t, uint32_t>, uint32_t> index;  // (kind, id) -> table index
    std::vector<Check> check;                                 // per entry, for the current bytes
    std::vector<uint64_t> computed;  // the checksum found when check is kBad
    // Per entry: where a resident entry's bytes lie (nullopt: in the file).
    std::vector<std::shared_ptr<const ResidentSource>> resident;
    uint32_t done = 0;
    bool complete = false;
  };
  ShmRedundancyStore(std::string root, int node)
      : root_(std::move(root)), node_(node), t0_(root_, "") {}
  static std::string EntryName(const Version& v, uint32_t index);
  static bool IsResident(const shm::RedundancyEntry& e) {
    return (e.flags & shm::kEntryResident) != 0;
  }
  // Looks up a version and entry. NotFound naming what is missing.
  Result<std::pair<std::shared_ptr<Version>, uint32_t>> Find(int64_t step,
                                                             recover::ByteSource entry)
      REQUIRES(mu_);
  struct PlannedEntry {
    recover::SourceKind kind;
    uint32_t id;
    uint64_t bytes;
    std::shared_ptr<const ResidentSource> resident;  // null: stored in the file
    // A parity the producer's client may write into its slot: resident in
    // the versions SetClientParity names (Ensure decides), else stored.
    std::shared_ptr<const ResidentSource> client_parity;
  };
  // Resident sources by (kind, id).
  using ResidentMap =
      std::map<std::pair<uint32_t, uint32_t>, std::shared_ptr<const ResidentSource>>;

  // The plan (redundancy.cc). This node's entries of `plan`, in table order
  // (InvalidArgument for a node, copy or parity out of range).
  [[nodiscard]] Result<std::vector<PlannedEntry>> PlanEntries(const topo::Plan& plan) const;
  // Which of `planned` the plan could keep resident in T0, checked against
  // the entries' sizes (Internal when they disagree).
  [[nodiscard]] static Result<ResidentMap> ResidentSources(
      const topo::Plan& plan, const std::vector<PlannedEntry>& planned);
  // Resolves the resident entries of an adopted version with the plan.
  void ResolveResident(Version& v) REQUIRES(mu_);
  // The entries of a new version `step`: planned_, with the client parities
  // SetClientParity names for that step resident.
  std::vector<PlannedEntry> PlannedFor(int64_t step) REQUIRES(mu_);

  // The files (redundancy_file.cc). Adopts the complete version files under
  // root_ (Adopt); a file that is torn or unsound is removed, one of another
  // node left alone (AdoptFile returns null for both).
  Status Adopt() EXCLUDES(mu_);
  std::shared_ptr<Version> AdoptFile(int64_t step, const std::string& path) const;
  // Indexes an adopted file's table into v->index; false when an entry is
  // out of bounds, not done or repeated.
  static bool IndexEntries(const shm::RedundancyHeader& h, const shm::RedundancyEntry* table,
                           Version* v);
  // Checks an adopted version's stored entries against their checksums.
  static void CheckStoredEntries(Version* v);
  // Where a new version's entries go in its file.
  struct FileLayout {
    uint64_t data_offset = 0;
    uint64_t total = 0;             // the file's size
    std::vector<uint64_t> offsets;  // per entry: its bytes, or the producer rank (resident)
    bool any_resident = false;
  };
  static FileLayout LayOut(const std::vector<PlannedEntry>& planned);
  // The file of a new version at `path`: the spare renamed when it has
  // `total` bytes (else unlinked), or a new one (after the room check).
  Result<std::unique_ptr<shm::Segment>> SegmentFor(int64_t step, const std::string& path,
                                                   uint64_t total, const RoomCheck& room,
                                                   std::unique_ptr<shm::Segment> spare) const;
  // Writes a new version's header, state kWriting first.
  void WriteHeader(shm::RedundancyHeader* h, int64_t step, uint64_t plan_hash, uint32_t num_entries,
                   const FileLayout& layout) const;
  // Creates, lays out and maps the file of a new version (no lock held).
  Result<std::shared_ptr<Version>> CreateVersion(int64_t step,
                                                 const std::vector<PlannedEntry>& planned,
                                                 uint64_t plan_hash, const RoomCheck& room,
                                                 std::unique_ptr<shm::Segment> spare);
  // Seals the table and header and flips the state to complete.
  static void Seal(Version& v);
  void Remove(const std::shared_ptr<Version>& v) REQUIRES(mu_);

  // Writing entries (redundancy_entries.cc).
  Status FinishEntryImpl(int64_t step, recover::ByteSource entry, const uint64_t* expected)
      EXCLUDES(mu_);
  // FailedPrecondition: the entry of `step` is already finished.
  Status AlreadyFinished(recover::ByteSource entry, int64_t step) const;

  // Reading (redundancy_read.cc). NotFound: the entry of `step` is not
  // finished yet.
  Status NotFinishedYet(recover::ByteSource entry, int64_t step) const;
  // A resident entry's reference for the T0 reader (generation 0 before
  // done); `src` (v.resident[index], taken under mu_) must outlive it.
  static PieceReader::SegmentsRef RefOf(const Version& v, uint32_t index,
                                        const ResidentSource& src);
  // What a read of one entry takes under mu_ and uses outside it: the
  // version (kept alive), the entry's index, where a resident entry's bytes
  // lie, and what is known of a stored entry's checksum.
  struct ReadTarget {
    std::shared_ptr<Version> version;
    uint32_t index = 0;
    bool is_resident = false;  // its bytes are in a T0 slot, not in the file
    std::shared_ptr<const ResidentSource> resident;
    Check check = Check::kUnknown;
  };
  // The entry `req` names (Find; NotFound naming what is missing). The one
  // lookup of Read, ReadView and ServeResident.
  Result<ReadTarget> FindForRead(const recover::ReadRequest& req) EXCLUDES(mu_);
  // ReadView of a stored entry: checked (CheckStoredRead), in the file's
  // mapping, the version kept alive by the view.
  Result<View> ReadStoredView(ReadTarget target, const recover::ReadRequest& req) EXCLUDES(mu_);
  // A read of a resident entry: done, resolvable, in range.
  Status CheckResidentRead(const Version& v, uint32_t index, const ResidentSource* src,
                           const recover::ReadRequest& req) const;
  // A read of a stored entry: done, in range, its bytes matching their
  // checksum (hashed on the first read, the result kept in v.check).
  Status CheckStoredRead(Version& v, uint32_t index, Check check, const recover::ReadRequest& req)
      EXCLUDES(mu_);
  // ReadView of a resident entry: its bytes read from the T0 slot into a
  // buffer the view owns.
  Result<View> ReadResidentView(const Version& v, uint32_t index, const ResidentSource* src,
                                const recover::ReadRequest& req);
  // Holding's two lists: the done resident entries whose T0 slot still holds
  // them, and the done stored entries not known bad (with verify, hashed now).
  void ListResident(
      const Version& v,
      const std::vector<std::pair<uint32_t, std::shared_ptr<const ResidentSource>>>& resident,
      bool verify, recover::VersionHolding* out);
  void ListStored(Version& v, const std::vector<uint32_t>& done, bool verify,
                  recover::VersionHolding* out) EXCLUDES(mu_);
  // The file a dropped version's pages are kept in for the next version
  // (docs/benchmarks.md "Agent CPU per step").
  std::string SparePath() const { return root_ + "/red.spare"; }

  const std::string root_;
  const int node_;
  PieceReader t0_;  // the node's T0 slots (same root), for resident entries
  Mutex mu_;
  bool resident_t0_ GUARDED_BY(mu_) = false;
  // SetClientParity: rank -> (first step, plan hash) whose slots hold the
  // parities that rank produces.
  std::map<int, std::pair<int64_t, uint64_t>> client_parity_ GUARDED_BY(mu_);
  // The current plan's resident sources, by (kind, id): resolves adopted
  // versions' resident entries.
  ResidentMap plan_resident_ GUARDED_BY(mu_);
  std::map<int64_t, std::shared_ptr<Version>> versions_ GUARDED_BY(mu_);
  bool have_plan_ GUARDED_BY(mu_) = false;
  uint64_t plan_hash_ GUARDED_BY(mu_) = 0;
  // The entries of this node's plan, in table order.
  std::vector<PlannedEntry> planned_ GUARDED_BY(mu_);
  RoomCheck room_check_ GUARDED_BY(mu_);
  // Versions whose file is being made (no lock held), with whether a new
  // plan or a DropBelow past them arrived meanwhile (then they are discarded).
  std::map<int64_t, bool> creating_ GUARDED_BY(mu_);
  CondVar created_cv_;  // signalled when a creation ends
  // The spare at SparePath(): a dropped version's file (renamed there,
  // marked not complete) and its mapping, kept so that the next version of
  // the same size reuses its pages instead of the kernel freeing them and
  // zeroing new ones every step. At most one, in one of three states:
  //   empty  no spare file;
  //   kept   its mapping is here, counted in bytes_in_use();
  //   taken  a creation took the mapping out: the file stays at SparePath()
  //          until that creation renames it to the new version's name (or
  //          unlinks it), and no other file goes there meanwhile.
  class Spare {
   public:
    bool empty() const { return state_ == State::kEmpty; }
    bool kept() const { return state_ == State::kKept; }
    uint64_t bytes() const { return kept() ? segment_->size() : 0; }
    // empty -> kept. REQUIRES: empty().
    void Keep(std::unique_ptr<shm::Segment> segment) {
      segment_ = std::move(segment);
      state_ = State::kKept;
    }
    // kept -> taken: the mapping, for a creation; nullptr (and no change)
    // when no spare is kept.
    std::unique_ptr<shm::Segment> Take() {
      if (!kept()) return nullptr;
      state_ = State::kTaken;
      return std::move(segment_);
    }
    // taken -> empty: the creation that took it has renamed or unlinked the
    // file.
    void Release() { state_ = State::kEmpty; }

   private:
    enum class State { kEmpty, kKept, kTaken };
    State state_ = State::kEmpty;
    std::unique_ptr<shm::Segment> segment_;  // set exactly when kept
  };
  Spare spare_ GUARDED_BY(mu_);
};

}  // namespace memento::agent
