#include "agent/redundancy.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "agent/redundancy_shm.h"
#include "common/test_util.h"
#include "shm/redundancy_format.h"
#include "shm/segment.h"
#include "shm/shm_test_util.h"

namespace memento::agent {
namespace {

using recover::ByteSource;
using recover::ReadRequest;
using recover::SourceKind;

TensorMeta Tensor(std::string name, DType dtype, int64_t numel, StateClass cls) {
  TensorMeta t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = {numel};
  t.state_class = cls;
  return t;
}

// dp=4 on 4 nodes (one rank each), replicated + private state: parities for
// the replicated pieces and peer copies of the private ones.
topo::Plan MakeTestPlan(const std::string& policy, uint64_t w = 1 << 16, uint64_t p = 1000) {
  auto t = topo::Topology::Uniform(4, 1, 1, 0, 1);
  EXPECT_TRUE(t.ok()) << t.status();
  topo::Inventory inv(t->num_ranks());
  for (auto& r : inv) {
    r.push_back(Tensor("params", DType::kFloat32, w / 4, StateClass::kReplicated));
    r.push_back(Tensor("rng", DType::kUInt8, p, StateClass::kPrivate));
  }
  auto pol = topo::ParsePolicy(policy);
  EXPECT_TRUE(pol.ok()) << pol.status();
  auto plan = topo::MakePlan(*t, inv, *pol);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return std::move(plan).value();
}

std::vector<ByteSource> EntriesOf(const topo::Plan& plan, int node) {
  std::vector<ByteSource> out;
  for (uint32_t id : plan.nodes[node].copies) out.push_back({SourceKind::kCopy, id});
  for (uint32_t id : plan.nodes[node].parities) out.push_back({SourceKind::kParity, id});
  return out;
}

uint64_t BytesOf(const topo::Plan& plan, ByteSource e) {
  if (e.kind == SourceKind::kCopy) return plan.pieces[plan.copies[e.id].piece].bytes;
  return plan.parities[e.id].bytes;
}

// Deterministic content of an entry of a version.
std::vector<uint8_t> Content(int64_t step, ByteSource e, uint64_t n) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(step * 1000003 + static_cast<int>(e.kind) * 7919 + e.id);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

void WriteEntry(RedundancyStore& store, const topo::Plan& plan, int64_t step, ByteSource e,
                bool finish = true) {
  auto buf = store.EntryBuffer(step, e);
  ASSERT_TRUE(buf.ok()) << buf.status();
  auto bytes = Content(step, e, BytesOf(plan, e));
  if (!bytes.empty()) std::memcpy(*buf, bytes.data(), bytes.size());
  if (finish) {
    ASSERT_TRUE(store.FinishEntry(step, e).ok());
  }
}

void WriteVersion(RedundancyStore& store, const topo::Plan& plan, int node, int64_t step) {
  ASSERT_TRUE(store.Ensure(step).ok());
  for (ByteSource e : EntriesOf(plan, node)) WriteEntry(store, plan, step, e);
}

class RedundancyTest : public ::testing::Test {
 protected:
  shm::testing::ShmScratchDir dir_{"memento-red"};
  std::string root() const { return dir_.path() + "/node1"; }
};

TEST_F(RedundancyTest, PlanHasCopiesAndParities) {
  topo::Plan plan = MakeTestPlan("xor");
  EXPECT_FALSE(plan.nodes[1].parities.empty());
  EXPECT_FALSE(plan.nodes[1].copies.empty()) << "private state should get peer copies";
}

TEST_F(RedundancyTest, WriteFinishReadRoundTrip) {
  const topo::Plan plan = MakeTestPlan("xor");
  auto store = RedundancyStore::Open(root(), 1);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Ensure(5).code(), StatusCode::kFailedPrecondition);  // no plan yet
  ASSERT_TRUE((*store)->SetPlan(plan).ok());
  ASSERT_TRUE((*store)->Ensure(5).ok());
  ASSERT_TRUE((*store)->Ensure(5).ok());  // idempotent
  const auto entries = EntriesOf(plan, 1);
  ASSERT_GE(entries.size(), 2u);
  EXPECT_FALSE((*store)->Complete(5));
  for (size_t i = 0; i < entries.size(); ++i) {
    WriteEntry(**store, plan, 5, entries[i]);
    EXPECT_EQ((*store)->Complete(5), i + 1 == entries.size());
  }
  EXPECT_EQ((*store)->CompleteVersions(), std::vector<int64_t>{5});
  // A finished entry cannot be written again.
  EXPECT_EQ((*store)->EntryBuffer(5, entries[0]).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*store)->FinishEntry(5, entries[0]).code(), StatusCode::kFailedPrecondition);
  for (ByteSource e : entries) {
    const uint64_t n = BytesOf(plan, e);
    auto want = Content(5, e, n);
    std::vector<uint8_t> got(n);
    ReadRequest req{5, e, 0, n};
    ASSERT_TRUE((*store)->Read(req, got.data()).ok());
    EXPECT_EQ(got, want);
    // A sub-range.
    ReadRequest part{5, e, n / 3, n / 2};
    std::vector<uint8_t> sub(n / 2);
    ASSERT_TRUE((*store)->Read(part, sub.data()).ok());
    EXPECT_TRUE(std::equal(sub.begin(), sub.end(), want.begin() + n / 3));
    // Past the end.
    ReadRequest bad{5, e, n - 1, 2};
    EXPECT_EQ((*store)->Read(bad, sub.data()).code(), StatusCode::kInvalidArgument);
  }
  recover::VersionHolding h = (*store)->Holding(5, /*verify=*/true);
  EXPECT_EQ(h.step, 5);
  EXPECT_EQ(h.copies, plan.nodes[1].copies);
  EXPECT_EQ(h.parities, plan.nodes[1].parities);
  // Unknown step / entry / a piece.
  std::vector<uint8_t> buf(16);
  EXPECT_EQ((*store)->Read({6, entries[0], 0, 1}, buf.data()).code(), StatusCode::kNotFound);
  EXPECT_EQ((*store)->Read({5, {SourceKind::kCopy, 9999}, 0, 1}, buf.data()).code(),
            StatusCode::kNotFound);
  EXPECT_EQ((*store)->Read({5, {SourceKind::kPiece, 0}, 0, 1}, buf.data()).code(),
            StatusCode::kInvalidArgument);

  // The file: mode 0600, header complete.
  struct stat st;
  ASSERT_EQ(stat(RedundancyVersionPath(root(), 5).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  // Reopen: the complete version is adopted, re-verified, same bytes.
  store->reset();
  auto again = RedundancyStore::Open(root(), 1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->CompleteVersions(), std::vector<int64_t>{5});
  for (ByteSource e : entries) {
    const uint64_t n = BytesOf(plan, e);
    std::vector<uint8_t> got(n);
    ASSERT_TRUE((*again)->Read({5, e, 0, n}, got.data()).ok());
    EXPECT_EQ(got, Content(5, e, n));
  }
}

TEST_F(RedundancyTest, UnfinishedEntryIsNotServed) {
  const topo::Plan plan = MakeTestPlan("xor");
  auto store = RedundancyStore::Open(root(), 1);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->SetPlan(plan).ok());
  ASSERT_TRUE((*store)->Ensure(3).ok());
  const auto entries = EntriesOf(plan, 1);
  WriteEntry(**store, plan, 3, entries[0], /*finish=*/false);
  std::vector<uint8_t> buf(8);
  EXPECT_EQ((*store)->Read({3, entries[0], 0, 8}, buf.data()).code(), StatusCode::kNotFound);
  recover::VersionHolding h = (*store)->Holding(3, true);
  EXPECT_TRUE(h.copies.empty() && h.parities.empty());
}

TEST_F(RedundancyTest, ConcurrentEntries) {
  // Several versions, each entry written by its own thread.
  const topo::Plan plan = MakeTestPlan("rs:2", 1 << 18, 4096);
  auto store = RedundancyStore::Open(root(), 1);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->SetPlan(plan).ok());
  const auto entries = EntriesOf(plan, 1);
  ASSERT_GE(entries.size(), 2u);
  // Every writer creates the version itself (as the save path and pushes
  // do): one file per version, nobody sees a half-made one.
  std::vector<std::thread> threads;
  for (int64_t step = 10; step < 13; ++step) {
    for (ByteSource e : entries) {
      threads.emplace_back([&, step, e] {
        ASSERT_TRUE((*store)->Ensure(step).ok());
        WriteEntry(**store, plan, step, e);
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ((*store)->CompleteVersions(), (std::vector<int64_t>{12, 11, 10}));
  for (int64_t step = 10; step < 13; ++step) {
    for (ByteSource e : entries) {
      const uint64_t n = BytesOf(plan, e);
      std::vector<uint8_t> got(n);
      ASSERT_TRUE((*store)->Read({step, e, 0, n}, got.data()).ok());
      EXPECT_EQ(got, Content(step, e, n)) << step;
    }
  }
}

TEST_F(RedundancyTest, TornVersionIsRemovedOnReopen) {
  const topo::Plan plan = MakeTestPlan("xor");
  {
    auto store = RedundancyStore::Open(root(), 1);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->SetPlan(plan).ok());
    WriteVersion(**store, plan, 1, 7);
    // Version 8: the agent "crashes" after one of its entries.
    ASSERT_TRUE((*store)->Ensure(8).ok());
    WriteEntry(**store, plan, 8, EntriesOf(plan, 1)[0]);
  }
  ASSERT_EQ(access(RedundancyVersionPath(root(), 8).c_str(), F_OK), 0);
  auto store = RedundancyStore::Open(root(), 1);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->CompleteVersions(), std::vector<int64_t>{7});
  EXPECT_NE(access(RedundancyVersionPath(root(), 8).c_str(), F_OK), 0) << "torn file not removed";
  // Version 8 can be produced again from scratch.
  ASSERT_TRUE((*store)->SetPlan(plan).ok());
  WriteVersion(**store, plan, 1, 8);
  EXPECT_EQ((*store)->CompleteVersions(), (std::vector<int64_t>{8, 7}));
}

// A real agent process killed with SIGKILL in the middle of version 2 (one
// entry finished, one half written): the restarted store keeps version 1 and
// removes version 2.
TEST_F(RedundancyTest, ProcessKilledMidVersionLeavesItTorn) {
  const topo::Plan plan = MakeTestPlan("xor");
  const auto entries = EntriesOf(plan, 1);
  ASSERT_GE(entries.size(), 2u);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(ready[0]);
    auto store = RedundancyStore::Open(root(), 1);
    if (!store.ok() || !(*store)->SetPlan(plan).ok()) _exit(2);
    WriteVersion(**store, plan, 1, 1);
    if (!(*store)->Ensure(2).ok()) _exit(3);
    WriteEntry(**store, plan, 2, entries[0]);
    auto buf = (*store)->EntryBuffer(2, entries[1]);
    if (!buf.ok()) _exit(4);
    std::memset(*buf, 0xab, BytesOf(plan, entries[1]) / 2);
    char c = 1;
    if (write(ready[1], &c, 1) != 1) _exit(5);
    for (;;) pause();  // killed here, mid-version
  }
  close(ready[1]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1) << "child failed before the kill point";
  close(ready[0]);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  ASSERT_EQ(access(RedundancyVersionPath(root(), 2).c_str(), F_OK), 0);
  auto store = RedundancyStore::Open(root(), 1);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->CompleteVersions(), std::vector<int64_t>{1});
  EXPECT_NE(access(RedundancyVersionPath(root(), 2).c_str(), F_OK), 0);
  for (ByteSource e : entries) {
    std::vector<uint8_t> got(BytesOf(plan, e));
    ASSERT_TRUE((*store)->Read({1, e, 0, got.size()}, got.data()).ok());
    EXPECT_EQ(got, Content(1, e, got.size()));
  }
}

TEST_F(RedundancyTest, CorruptedHeaderIsRemovedOnReopen) {
  const topo::Plan plan = MakeTestPlan("xor");
  {
    auto store = RedundancyStore::Open(root(), 1);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->SetPlan(plan).ok());
    WriteVersion(**store, plan, 1, 4);
    WriteVersion(**store, plan, 1, 5);
  }
  {
    auto seg = shm::Segment::Open(RedundancyVersionPath(root(), 4), true);
    ASSERT_TRUE(seg.ok());
    reinterpret_cast<shm::RedundancyHeader*>((*seg)->data())->plan_hash ^= 1;  // a flipped bit
  }
  auto store = RedundancyStore::Open(root(), 1);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->CompleteVersions(), std::vector<int64_t>{5});
}

TEST_F(RedundancyTest, CorruptedByteGivesDataLossNamingTheEntry) {
  const topo::Plan plan = MakeTestPlan("xor");
  auto store = RedundancyStore::Open(root(), 1);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->SetPlan(plan).ok());
  WriteVersion(**store, plan, 1, 9);
  const ByteSource victim{SourceKind::kParity, plan.nodes[1].parities[0]};
  const uint64_t n = BytesOf(plan, victim);
  {
    auto buf = (*store)->EntryBuffer(9, victim);  // finished: refused
    EXPECT_FALSE(buf.ok());
  }
  // Flip a byte in the file behind the store's back (silent corruption).
  {
    auto seg = shm::Segment::Open(RedundancyVersionPath(root(), 9), true);
    ASSERT_TRUE(seg.ok());
    const auto* h = reinterpret_cast<const shm::RedundancyHeader*>((*seg)->data());
    const auto* table =
        reinterpret_cast<const shm::RedundancyEntry*>((*seg)->data() + h->table_offset);
    bool flipped = false;
    for (uint32_t i = 0; i < h->num_entries; ++i) {
      if (table[i].kind == static_cast<uint32_t>(SourceKind::kParity) && table[i].id == victim.id) {
        (*seg)->data()[table[i].offset + n / 2] ^= 0x40;
        flipped = true;
      }
    }
    ASSERT_TRUE(flipped);
  }
  std::vector<uint8_t> got(n);
  Status s = (*store)->Read({9, victim, 0, 16}, got.data());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("parity " + std::to_string(victim.id)), std::string::npos) << s;
  EXPECT_NE(s.message().find("version 9"), std::string::npos) << s;
  recover::VersionHolding h = (*store)->Holding(9, true);
  EXPECT_EQ(std::count(h.parities.begin(), h.parities.end(), victim.id), 0);
  EXPECT_EQ(h.copies, plan.nodes[1].copies);
  // After a restart the corruption is still found (re-verified at open).
  store->reset();
  auto again = RedundancyStore::Open(root(), 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->Read({9, victim, 0, 16}, got.data()).code(), StatusCode::kDataLoss);
  EXPECT_EQ((*again)->Holding(9, false).parities.size(), plan.nodes[1].parities.size() - 1);
}

TEST_F(RedundancyTest, DropBelow) {
  const topo::Plan plan = MakeTestPlan("xor");
  auto store = RedundancyStore::Open(root(), 1);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->SetPlan(plan).ok());
  for (int64_t s = 1; s <= 4; ++s) WriteVersion(**store, plan, 1, s);
  ASSERT_TRUE((*store)->Ensure(5).ok());  // incomplete
  // A reader holding version 2 keeps its bytes readable across the drop.
  auto* shm_store = static_cast<ShmRedundancyStore*>(store->get());
  const ByteSource e = EntriesOf(plan, 1)[0];
  const uint64_t n = BytesOf(plan, e);
  auto view = shm_store->ReadView({2, e, 0, n});
  ASSERT_TRUE(view.ok()) << view.status();
  (*store)->DropBelow(3);
  EXPECT_EQ((*store)->CompleteVersions(), (std::vector<int64_t>{4, 3}));
  EXPECT_NE(access(RedundancyVersionPath(root(), 2).c_str(), F_OK), 0);
  EXPECT_EQ(access(RedundancyVersionPath(root(), 3).c_str(), F_OK), 0);
  auto want = Content(2, e, n);
  EXPECT_EQ(std::memcmp(view->data, want.data(), n), 0);
  std::vector<uint8_t> buf(8);
  EXPECT_EQ((*store)->Read({2, e, 0, 8}, buf.data()).code(), StatusCode::kNotFound);
  // A writer that pinned an entry of version 5 keeps writable memory across
  // the drop; finishing it afterwards is NotFound, never a crash.
  auto pinned = shm_store->PinEntryBuffer(5, e);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  (*store)->DropBelow(6);
  EXPECT_TRUE(shm_store->Versions().empty());
  std::memset(pinned->data, 0x33, pinned->bytes);
  EXPECT_EQ((*store)->FinishEntry(5, e).code(), StatusCode::kNotFound);
}

// A dropped version nobody holds keeps its file as the spare (renamed, not
// a version), and the next version of the same size takes its pages: no
// freeing and zeroing of a version's memory every step. The spare is counted
// in bytes_in_use, never adopted, and removed when the store closes or opens.
TEST_F(RedundancyTest, DroppedVersionIsReusedForTheNextOne) {
  const topo::Plan plan = MakeTestPlan("xor");
  const std::string spare = root() + "/red.spare";
  {
    auto store = RedundancyStore::Open(root(), 1);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->SetPlan(plan).ok());
    WriteVersion(**store, plan, 1, 1);
    WriteVersion(**store, plan, 1, 2);
    const uint64_t two = (*store)->bytes_in_use();
    ASSERT_GT(two, 0u);
    (*store)->DropBelow(2);
    EXPECT_NE(access(RedundancyVersionPath(root(), 1).c_str(), F_OK), 0);
    EXPECT_EQ(access(spare.c_str(), F_OK), 0) << "the dropped version's file is not kept";
    EXPECT_EQ((*store)->bytes_in_use(), two) << "the spare's memory is not counted";
    EXPECT_EQ((*store)->CompleteVersions(), std::vector<int64_t>{2});
    // Version 3 takes the spare: it starts not complete, old bytes or not.
    ASSERT_TRUE((*store)->Ensure(3).ok());
    EXPECT_NE(access(spare.c_str(), F_OK), 0) << "the spare was not reused";
    EXPECT_EQ((*store)->bytes_in_use(), two);
    EXPECT_FALSE((*store)->Complete(3));
    const auto entries = EntriesOf(plan, 1);
    std::vector<uint8_t> buf(8);
    EXPECT_EQ((*store)->Read({3, entries[0], 0, 8}, buf.data()).code(), StatusCode::kNotFound)
        << "an entry of the reused file is served before it is written";
    for (ByteSource e : entries) WriteEntry(**store, plan, 3, e);
    EXPECT_EQ((*store)->CompleteVersions(), (std::vector<int64_t>{3, 2}));
    for (ByteSource e : entries) {
      const uint64_t n = BytesOf(plan, e);
      std::vector<uint8_t> got(n);
      ASSERT_TRUE((*store)->Read({3, e, 0, n}, got.data()).ok());
      EXPECT_EQ(got, Content(3, e, n));
    }
    (*store)->DropBelow(3);  // version 2 becomes the spare
    EXPECT_EQ(access(spare.c_str(), F_OK), 0);
  }
  EXPECT_NE(access(spare.c_str(), F_OK), 0) << "closing the store left its spare";
  // A spare left by an agent that died is removed, never adopted.
  {
    auto seg = shm::Segment::CreateOrGrow(spare, 4096);
    ASSERT_TRUE(seg.ok()) << seg.status();
  }
  auto store = RedundancyStore::Open(root(), 1);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->CompleteVersions(), std::vector<int64_t>{3});
  EXPECT_NE(access(spare.c_str(), F_OK), 0);
}

TEST_F(RedundancyTest, SetPlanWithAnotherPlanDropsVersions) {
  const topo::Plan plan = MakeTestPlan("xor");
  const topo::Plan other = MakeTestPlan("rs:2");
  auto store = RedundancyStore::Open(root(), 1);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->SetPlan(plan).ok());
  WriteVersion(**store, plan, 1, 1);
  WriteVersion(**store, plan, 1, 2);
  ASSERT_TRUE((*store)->SetPlan(plan).ok());  // the same plan keeps them
  EXPECT_EQ((*store)->CompleteVersions().size(), 2u);
  ASSERT_TRUE((*store)->SetPlan(other).ok());
  EXPECT_TRUE((*store)->CompleteVersions().empty());
  EXPECT_NE(access(RedundancyVersionPath(root(), 1).c_str(), F_OK), 0);
  // Versions of the new plan have its entries.
  WriteVersion(**store, other, 1, 3);
  EXPECT_EQ((*store)->Holding(3, true).parities, other.nodes[1].parities);
  // After a restart, setting the old plan drops the adopted version too.
  store->reset();
  auto again = RedundancyStore::Open(root(), 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->CompleteVersions(), std::vector<int64_t>{3});
  ASSERT_TRUE((*again)->SetPlan(plan).ok());
  EXPECT_TRUE((*again)->CompleteVersions().empty());
  // A node outside the plan.
  auto far = RedundancyStore::Open(dir_.path() + "/node9", 9);
  ASSERT_TRUE(far.ok());
  EXPECT_EQ((*far)->SetPlan(plan).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace memento::agent
