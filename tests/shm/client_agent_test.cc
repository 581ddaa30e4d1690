// Client library against a real agent (in a thread of this process) over its
// real Unix socket and real shared memory.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "agent/agent.h"
#include "agent_fixture.h"
#include "client/testing_hooks.h"
#include "common/check.h"
#include "common/checksum.h"
#include "memento/client.h"
#include "opt/adamw.h"
#include "shm/node_store.h"
#include "shm/protocol.h"
#include "shm/segment.h"
#include "shm/shm_test_util.h"
#include "shm/slot.h"
#include "topo/topology_json.h"

namespace memento {
namespace {

using testing::AgentThread;
using testing::LocalAgent;
using testing::State;

class ClientAgentTest : public ::testing::Test {
 protected:
  ClientAgentTest() : root_(dir_.path() + "/job1/node0") {}
  ClientOptions Options(int rank = 0) {
    ClientOptions o;
    o.job_id = "job1";
    o.rank = rank;
    o.world_size = 4;
    o.agent_dir = root_;
    o.copy_threads = 2;
    o.chunk_bytes = 256 << 10;
    o.connect_timeout_s = 2;
    return o;
  }
  std::unique_ptr<Client> Sealed(State& s, int rank = 0) {
    auto c = Client::Connect(Options(rank));
    MEMENTO_CHECK_OK(c.status());
    MEMENTO_CHECK_OK(s.Register(**c));
    MEMENTO_CHECK_OK((*c)->Seal());
    return std::move(*c);
  }
  shm::testing::ShmScratchDir dir_;
  std::string root_;
};

// Client::Connect is the client's edge (docs/architecture.md, "Settings and
// test hooks"): a setting its user names wrongly, in the environment or in
// ClientOptions, is refused naming it before any agent is asked.
TEST_F(ClientAgentTest, ConnectRefusesAnUnknownParityPlaceOrCopyKernel) {
  ASSERT_EQ(setenv("MEMENTO_PARITY_IN", "sideways", 1), 0);
  auto env = Client::Connect(Options());
  unsetenv("MEMENTO_PARITY_IN");
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().code(), StatusCode::kInvalidArgument) << env.status();
  EXPECT_NE(env.status().message().find("MEMENTO_PARITY_IN='sideways'"), std::string::npos)
      << env.status();
  ClientOptions o = Options();
  o.copy_kernel = "no-such-kernel";
  auto kernel = Client::Connect(o);
  ASSERT_FALSE(kernel.ok());
  EXPECT_EQ(kernel.status().code(), StatusCode::kInvalidArgument) << kernel.status();
  EXPECT_NE(kernel.status().message().find("copy kernel 'no-such-kernel' is not available"),
            std::string::npos)
      << kernel.status();
}

TEST_F(ClientAgentTest, SnapshotRestoreRoundTrip) {
  AgentThread agent(LocalAgent("job1", root_));
  uint64_t seed = memento::testing::TestSeed("ClientAgentTest.SnapshotRestoreRoundTrip");
  State s;
  auto c = Sealed(s);
  EXPECT_EQ(c->Restore().status().code(), StatusCode::kNotFound);
  uint64_t digests[4];
  for (int step = 1; step <= 3; ++step) {
    ASSERT_TRUE(c->Fence().ok());
    s.Fill(seed + step);
    digests[step] = s.Digest();
    ASSERT_TRUE(c->Snapshot(step).ok());
  }
  ASSERT_TRUE(c->Fence().ok());
  auto stats = c->LastSnapshotStats();
  EXPECT_EQ(stats.step, 3);
  EXPECT_GE(stats.bytes, s.w.size() * 4);
  EXPECT_EQ(c->Snapshot(3).code(), StatusCode::kInvalidArgument);
  auto versions = c->ListVersions();
  ASSERT_TRUE(versions.ok()) << versions.status();
  ASSERT_EQ(versions->size(), 2u);
  EXPECT_EQ((*versions)[0].step, 3);
  EXPECT_TRUE((*versions)[0].intact);
  EXPECT_EQ((*versions)[1].step, 2);
  c.reset();

  // A fresh trainer (another Client) restores the newest version exactly.
  State t;
  auto c2 = Sealed(t);
  auto step = c2->Restore();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 3);
  EXPECT_EQ(t.Digest(), digests[3]);
  EXPECT_EQ(c2->LastRestoreStats().step, 3);
  EXPECT_TRUE(c2->LastRestoreStats().skipped.empty());
  // ... and continues: the next snapshot goes to the older slot.
  t.Fill(seed + 4);
  ASSERT_TRUE(c2->Snapshot(4).ok());
  ASSERT_TRUE(c2->Fence().ok());
  versions = c2->ListVersions();
  ASSERT_TRUE(versions.ok());
  EXPECT_EQ((*versions)[0].step, 4);
  EXPECT_EQ((*versions)[1].step, 3);
}

long ThreadMinorFaults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// A restarted trainer maps its slots without touching their data in Seal()
// (a background thread and the copiers do, docs/node_store.md, "Restart"):
// its first Snapshot() call still takes no page fault on the training
// thread, with 4 KiB slot pages (rank 0) and with huge pages (rank 1), and
// the copy is exact.
//
// Under a sanitizer Snapshot() also faults on the runtime's own bookkeeping
// (perf record -e page-faults under AddressSanitizer: its stack depot, which
// stores each allocation stack it has not seen, and fresh heap; none in a
// slot): 10-46 faults in the first pass, 5-7 in later ones, which repeat its
// stacks. There a first pass (rank 2) runs every call unchecked, and the
// checked passes allow 12 faults: still fewer than the 16 of one touch of
// the 32 MiB slot with 2 MiB pages (and far fewer than with 4 KiB pages).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kSanitizerWarmUpRank = 2;
constexpr int kFaultRanks[] = {kSanitizerWarmUpRank, 0, 1};
constexpr long kMaxSnapshotFaults = 12;
#else
constexpr int kSanitizerWarmUpRank = -1;
constexpr int kFaultRanks[] = {0, 1};
constexpr long kMaxSnapshotFaults = 4;
#endif
TEST_F(ClientAgentTest, FirstSnapshotAfterARestartDoesNotFaultOnTheTrainingThread) {
  AgentThread agent(LocalAgent("job1", root_));
  const size_t n = size_t{32} << 20;
  for (int rank : kFaultRanks) {
    shm::SetHugePagesWanted(rank != 0);  // the in-process agent makes the slots
    std::vector<uint8_t> a(n), b(n, 0);
    for (size_t i = 0; i < n; ++i) a[i] = static_cast<uint8_t>(i * 7 + rank);
    TensorMeta m{"w", DType::kUInt8, {static_cast<int64_t>(n)}, StateClass::kReplicated};
    {
      auto c = Client::Connect(Options(rank));
      ASSERT_TRUE(c.ok()) << c.status();
      ASSERT_TRUE((*c)->RegisterTensor(m, a.data()).ok());
      ASSERT_TRUE((*c)->Seal().ok());
      ASSERT_TRUE((*c)->Snapshot(1).ok());
      ASSERT_TRUE((*c)->Fence().ok());
    }
    shm::SetHugePagesWanted(true);
    auto c = Client::Connect(Options(rank));
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->RegisterTensor(m, b.data()).ok());
    ASSERT_TRUE((*c)->Seal().ok());
    auto step = (*c)->Restore();
    ASSERT_TRUE(step.ok()) << step.status();
    ASSERT_EQ(*step, 1);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), n), 0);
    for (size_t i = 0; i < n; i += 4096) b[i] ^= 0x5a;
    const long before = ThreadMinorFaults();
    ASSERT_TRUE((*c)->Snapshot(2).ok());
    const long snapshot_faults = ThreadMinorFaults() - before;
    ASSERT_TRUE((*c)->Fence().ok());
    if (rank != kSanitizerWarmUpRank) {
      EXPECT_LE(snapshot_faults, kMaxSnapshotFaults) << "rank " << rank;
    }
    // The counter does see slot faults: a fresh mapping of the slot the
    // snapshot wrote, read on this thread, faults at least once per 2 MiB
    // (and per 64 KiB with 4 KiB pages).
    auto seg = shm::Segment::Open(shm::SlotPath(root_, rank, 0), /*writable=*/false,
                                  /*prefault=*/false, /*populate=*/false);
    ASSERT_TRUE(seg.ok()) << seg.status();
    const long f0 = ThreadMinorFaults();
    uint64_t sum = 0;
    for (size_t i = 0; i < (*seg)->size(); i += 4096) sum += (*seg)->data()[i];
    EXPECT_GE(ThreadMinorFaults() - f0, static_cast<long>(n / shm::kHugePageBytes)) << sum;
    // (4 KiB pages: one read fault maps 16 of them, the kernel's fault-around.)
    if (rank == 0) {
      EXPECT_GE(ThreadMinorFaults() - f0, static_cast<long>(n / (64 << 10)));
    }
    c->reset();
    // And step 2 restores exactly.
    std::vector<uint8_t> d(n, 0);
    auto c3 = Client::Connect(Options(rank));
    ASSERT_TRUE(c3.ok()) << c3.status();
    ASSERT_TRUE((*c3)->RegisterTensor(m, d.data()).ok());
    ASSERT_TRUE((*c3)->Seal().ok());
    step = (*c3)->Restore();
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(*step, 2);
    EXPECT_EQ(std::memcmp(b.data(), d.data(), n), 0);
  }
}

TEST_F(ClientAgentTest, MismatchListsEveryDifferenceAndWritesNothing) {
  AgentThread agent(LocalAgent("job1", root_));
  State s;
  s.Fill(1);
  auto c = Sealed(s);
  ASSERT_TRUE(c->Snapshot(1).ok());
  ASSERT_TRUE(c->Fence().ok());
  c.reset();

  State t(300001);  // w has another shape
  std::vector<float> extra(10, 5.0f);
  auto c2 = Client::Connect(Options());
  ASSERT_TRUE(c2.ok());
  ASSERT_TRUE(
      (*c2)
          ->RegisterTensor({"w", DType::kFloat32, {300001}, StateClass::kReplicated}, t.w.data())
          .ok());
  ASSERT_TRUE((*c2)
                  ->RegisterTensor({"counts", DType::kInt32, {10, 200}, StateClass::kDpSharded},
                                   t.counts.data())
                  .ok());
  ASSERT_TRUE(
      (*c2)
          ->RegisterTensor({"extra", DType::kFloat32, {10}, StateClass::kPrivate}, extra.data())
          .ok());
  ASSERT_TRUE((*c2)->Seal().ok());
  uint64_t before = t.Digest();
  auto r = (*c2)->Restore();
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("'w': shape [300000] saved, [300001] registered"), std::string::npos) << m;
  EXPECT_NE(m.find("'counts': dtype I64 saved, I32 registered"), std::string::npos) << m;
  EXPECT_NE(m.find("'counts': shape [10, 100] saved, [10, 200] registered"), std::string::npos)
      << m;
  EXPECT_NE(m.find("'rng' (U8 [32]) is saved but not registered"), std::string::npos) << m;
  EXPECT_NE(m.find("'extra' (F32 [10]) is registered but not saved"), std::string::npos) << m;
  EXPECT_EQ(t.Digest(), before);
  EXPECT_EQ(extra, std::vector<float>(10, 5.0f));
}

TEST_F(ClientAgentTest, CorruptedSlotFallsBackThenDataLoss) {
  AgentThread agent(LocalAgent("job1", root_));
  uint64_t seed = memento::testing::TestSeed("ClientAgentTest.Corrupted");
  State s;
  auto c = Sealed(s);
  uint64_t d1 = 0;
  for (int step = 1; step <= 2; ++step) {
    s.Fill(seed + step);
    if (step == 1) d1 = s.Digest();
    ASSERT_TRUE(c->Snapshot(step).ok());
    ASSERT_TRUE(c->Fence().ok());
  }
  c.reset();
  // Flip one byte of step 2's data (the slot written second is slot 1).
  std::mt19937_64 rng(seed);
  auto flip = [&](int slot) {
    std::string path = shm::SlotPath(root_, 0, slot);
    auto seg = shm::Segment::Open(path, true);
    ASSERT_TRUE(seg.ok());
    auto info = shm::ReadSlot(**seg);
    ASSERT_TRUE(info.ok());
    size_t pos = info->data_offset + rng() % (s.w.size() * 4);
    (*seg)->data()[pos] ^= 0x20;
  };
  flip(1);
  State t;
  auto c2 = Sealed(t);
  auto r = c2->Restore();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 1);
  EXPECT_EQ(t.Digest(), d1);
  auto rs = c2->LastRestoreStats();
  ASSERT_EQ(rs.skipped.size(), 1u);
  EXPECT_NE(rs.skipped[0].find("step 2"), std::string::npos) << rs.skipped[0];
  EXPECT_NE(rs.skipped[0].find("DataLoss"), std::string::npos) << rs.skipped[0];
  auto versions = c2->ListVersions();
  ASSERT_TRUE(versions.ok());
  ASSERT_EQ(versions->size(), 2u);
  EXPECT_EQ((*versions)[0].step, 2);
  EXPECT_FALSE((*versions)[0].intact);  // the agent's verifier saw it too
  EXPECT_TRUE((*versions)[1].intact);
  c2.reset();
  flip(0);
  State u;
  auto c3 = Sealed(u);
  r = c3->Restore();
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("step 1"), std::string::npos);
  EXPECT_NE(r.status().message().find("step 2"), std::string::npos);
}

// The last byte of `slot`'s data region (the last chunk's last byte: a
// restore that checks while it copies has written every other chunk of the
// version when it finds it).
void FlipLastDataByte(const std::string& root, int slot) {
  auto seg = shm::Segment::Open(shm::SlotPath(root, 0, slot), true);
  ASSERT_TRUE(seg.ok()) << seg.status();
  auto info = shm::ReadSlot(**seg);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_GT(info->chunks.size(), 4u);  // several chunks: the bad one comes last
  (*seg)->data()[info->data_offset + info->data_bytes - 1] ^= 0x01;
}

bool SameBytes(const State& a, const State& b) {
  return std::memcmp(a.w.data(), b.w.data(), a.w.size() * sizeof(float)) == 0 &&
         std::memcmp(a.counts.data(), b.counts.data(), a.counts.size() * 8) == 0 &&
         std::memcmp(a.rng, b.rng, sizeof(a.rng)) == 0;
}

// A restore checks each chunk while it copies it (one read of the slot,
// docs/node_store.md "Restore"). A bad byte in the newest version's last
// chunk is found after every other chunk of it was written into the
// registered tensors; the older version then overwrites every byte, so the
// result is that version bit-exact.
TEST_F(ClientAgentTest, AFlippedByteInTheLastChunkFallsBackToTheOlderVersionBitExact) {
  AgentThread agent(LocalAgent("job1", root_));
  uint64_t seed = memento::testing::TestSeed("ClientAgentTest.FlippedLastChunk");
  State s;
  auto c = Sealed(s);
  State saved[3];
  for (int step = 1; step <= 2; ++step) {
    s.Fill(seed + step);
    saved[step] = s;
    ASSERT_TRUE(c->Snapshot(step).ok());
    ASSERT_TRUE(c->Fence().ok());
  }
  c.reset();
  FlipLastDataByte(root_, 1);  // step 2 (the slot written second)
  State t;
  t.Fill(seed + 1000);
  auto c2 = Sealed(t);
  auto r = c2->Restore();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 1);
  EXPECT_TRUE(SameBytes(t, saved[1])) << "the older version was not restored bit-exact";
  const RestoreStats rs = c2->LastRestoreStats();
  EXPECT_EQ(rs.step, 1);
  EXPECT_FALSE(rs.overwritten);
  ASSERT_EQ(rs.skipped.size(), 1u);
  EXPECT_NE(rs.skipped[0].find("step 2"), std::string::npos) << rs.skipped[0];
  EXPECT_NE(rs.skipped[0].find("'rng'"), std::string::npos) << rs.skipped[0];
  EXPECT_NE(rs.skipped[0].find("partly overwritten"), std::string::npos) << rs.skipped[0];
}

// The documented contract of a restore that finds no intact version:
// DataLoss naming every version tried, LastRestoreStats().overwritten, and
// the message saying the registered tensors are partly overwritten; every
// registered element then holds its value before the call or that of one of
// the versions tried (chunks of them), never anything else.
TEST_F(ClientAgentTest, NoIntactVersionFailsAndSaysTheTensorsArePartlyOverwritten) {
  AgentThread agent(LocalAgent("job1", root_));
  uint64_t seed = memento::testing::TestSeed("ClientAgentTest.NoIntactVersion");
  State s;
  auto c = Sealed(s);
  State saved[3];
  for (int step = 1; step <= 2; ++step) {
    s.Fill(seed + step);
    saved[step] = s;
    ASSERT_TRUE(c->Snapshot(step).ok());
    ASSERT_TRUE(c->Fence().ok());
  }
  c.reset();
  for (int slot = 0; slot < shm::kSlotsPerRank; ++slot) FlipLastDataByte(root_, slot);
  State t;
  t.Fill(seed + 1000);
  const State before = t;
  auto c2 = Sealed(t);
  auto each_element_known = [&] {
    for (size_t i = 0; i < t.w.size(); ++i) {
      const float v = t.w[i];
      if (v != before.w[i] && v != saved[1].w[i] && v != saved[2].w[i]) return false;
    }
    for (size_t i = 0; i < t.counts.size(); ++i) {
      const int64_t v = t.counts[i];
      if (v != before.counts[i] && v != saved[1].counts[i] && v != saved[2].counts[i]) {
        return false;
      }
    }
    return true;
  };
  auto r = c2->Restore();
  ASSERT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("step 1"), std::string::npos) << m;
  EXPECT_NE(m.find("step 2"), std::string::npos) << m;
  EXPECT_NE(m.find("'rng'"), std::string::npos) << m;
  EXPECT_NE(m.find("the registered tensors are partly overwritten"), std::string::npos) << m;
  EXPECT_TRUE(c2->LastRestoreStats().overwritten);
  EXPECT_EQ(c2->LastRestoreStats().step, -1);
  EXPECT_EQ(c2->LastRestoreStats().skipped.size(), 2u);
  EXPECT_TRUE(each_element_known());
  for (int64_t step : {1, 2}) {
    r = c2->Restore(step);
    ASSERT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find("partly overwritten"), std::string::npos) << r.status();
    EXPECT_TRUE(c2->LastRestoreStats().overwritten);
    EXPECT_TRUE(each_element_known());
  }
  // The agent learned of both (the client asks it to re-verify).
  auto versions = c2->ListVersions();
  ASSERT_TRUE(versions.ok()) << versions.status();
  ASSERT_EQ(versions->size(), 2u);
  for (const VersionInfo& v : *versions) EXPECT_FALSE(v.intact) << "step " << v.step;
  // A mismatch of the registered tensors is still refused before a byte is
  // written (InvalidArgument), whatever the checksums.
  State u(1000);
  u.Fill(seed + 2000);
  const State u_before = u;
  auto c3 = Sealed(u);
  ASSERT_EQ(c3->Restore().status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(SameBytes(u, u_before));
  EXPECT_FALSE(c3->LastRestoreStats().overwritten);
}

// A slot that holds only byte ranges of its tensors (the sharded save path,
// docs/reft.md section 2) cannot be restored alone: the client asks its
// agent to assemble the rank's state from the plan pieces (section 3). A
// single-node agent has no plan and refuses with its reason; the restore then
// takes the older whole version, and Restore(step) of the sharded one fails
// with that reason, writing no registered byte.
TEST_F(ClientAgentTest, ASlotOfPiecesIsRestoredThroughTheAgentsAssembly) {
  AgentThread agent(LocalAgent("job1", root_));
  uint64_t seed = memento::testing::TestSeed("ClientAgentTest.SlotOfPieces");
  State s;
  auto c = Sealed(s);
  uint64_t d1 = 0;
  for (int step = 1; step <= 2; ++step) {
    s.Fill(seed + step);
    if (step == 1) d1 = s.Digest();
    ASSERT_TRUE(c->Snapshot(step).ok());
    ASSERT_TRUE(c->Fence().ok());
  }
  c.reset();
  // Step 2 (slot 1) rewritten as a slot of pieces: the first half of "w"
  // (the rest is another rank's piece), "counts" and "rng" whole.
  {
    auto seg = shm::Segment::Open(shm::SlotPath(root_, 0, 1), true);
    ASSERT_TRUE(seg.ok()) << seg.status();
    auto info = shm::ReadSlot(**seg);
    ASSERT_TRUE(info.ok()) << info.status();
    ASSERT_EQ(info->step, 2);
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<shm::SlotEntrySpec> entries;
    for (const shm::SavedTensor& t : info->tensors) {
      const uint8_t* p = (*seg)->data() + info->data_offset + t.offset;
      const uint64_t n = t.meta.name == "w" ? t.nbytes / 2 / 64 * 64 : t.nbytes;
      bytes.emplace_back(p, p + n);
      entries.push_back(shm::SlotEntrySpec{t.meta, 0, n});
    }
    auto layout = shm::ComputeRangeSlotLayout("job1", 0, entries, 256 << 10);
    ASSERT_TRUE(layout.ok()) << layout.status();
    ASSERT_LE(layout->total_bytes, (*seg)->size());
    shm::BeginSlotWrite(**seg, *layout, 1, 2);
    uint8_t* data = shm::SlotData(**seg);
    for (size_t i = 0; i < layout->tensors.size(); ++i) {
      std::memcpy(data + layout->tensors[i].offset, bytes[i].data(), bytes[i].size());
    }
    shm::ChunkEntry* table = shm::SlotTable(**seg);
    for (size_t i = 0; i < layout->chunks.size(); ++i) {
      table[i].checksum = Checksum(data + table[i].offset, table[i].length);
    }
    shm::CompleteSlotWrite(**seg);
    auto again = shm::ReadSlot(**seg);
    ASSERT_TRUE(again.ok()) << again.status();
    ASSERT_TRUE(shm::HasRangeEntries(again->tensors));
  }
  State t;
  auto c2 = Sealed(t);
  auto r = c2->Restore();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 1);
  EXPECT_EQ(t.Digest(), d1);
  auto rs = c2->LastRestoreStats();
  ASSERT_EQ(rs.skipped.size(), 1u);
  EXPECT_NE(rs.skipped[0].find("step 2 (slot 1, sharded)"), std::string::npos) << rs.skipped[0];
  EXPECT_NE(rs.skipped[0].find("'assemble' needs an agent in cluster mode"), std::string::npos)
      << rs.skipped[0];
  // Exactly step 2: the agent's reason, and no registered byte written.
  State u;
  u.Fill(seed + 1000);
  const uint64_t before = u.Digest();
  auto c3 = Sealed(u);
  r = c3->Restore(2);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("restoring step 2 of rank 0 from its pieces"),
            std::string::npos)
      << r.status();
  EXPECT_EQ(u.Digest(), before) << "a refused Restore(2) wrote into the registered tensors";
  // No staging file was made.
  EXPECT_NE(access(shm::AssembledSlotPath(root_, 0).c_str(), F_OK), 0);
}

// A single-node agent given the job's topology (`memento agent --topology`
// without --store; docs/reft.md section 1, "Single-node jobs") plans the DP
// ranks' sharded snapshots itself. DP 2 on one node: each rank's slot holds
// half of the replicated "w" plus its own dp_sharded and private state; a
// restore reassembles the rank's state from both ranks' slots in this node's
// shared memory, bit for bit. A byte flipped in rank 1's piece fails either
// rank's assembly of that step on its checksum before any registered byte
// is written, and Restore() takes the older version.
TEST_F(ClientAgentTest, SingleNodeTopologyShardsTheDpRanksAndAssemblesFromTheirSlots) {
  agent::AgentOptions options = LocalAgent("job1", root_);
  topo::JobTopology topology;
  topology.topology.dp = 2;
  topology.topology.zero_stage = 1;
  topology.topology.rank_node = {0, 0};
  topology.sharded = true;
  options.single_node_topology = topology;
  AgentThread agent(options);
  const uint64_t seed = memento::testing::TestSeed("ClientAgentTest.SingleNodeSharded");
  State s[2];
  uint64_t digest[2][3] = {};
  std::unique_ptr<Client> c[2] = {Sealed(s[0], 0), Sealed(s[1], 1)};
  for (int step = 1; step <= 2; ++step) {
    for (int r = 0; r < 2; ++r) s[r].Fill(seed + step * 10 + r);
    s[1].w = s[0].w;  // replicated: the same on both DP ranks
    for (int r = 0; r < 2; ++r) {
      digest[r][step] = s[r].Digest();
      ASSERT_TRUE(c[r]->Snapshot(step).ok());
    }
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(c[r]->Fence().ok());
  }
  c[0].reset();
  c[1].reset();
  // Each slot of step 2: a slot of pieces, half of "w" (cut at 64 bytes).
  const uint64_t w_bytes = s[0].w.size() * 4;
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    bool found = false;
    for (int slot = 0; slot < shm::kSlotsPerRank; ++slot) {
      auto seg = shm::Segment::Open(shm::SlotPath(root_, r, slot), false);
      ASSERT_TRUE(seg.ok()) << seg.status();
      auto info = shm::ReadSlot(**seg);
      ASSERT_TRUE(info.ok()) << info.status();
      if (info->step != 2) continue;
      found = true;
      EXPECT_TRUE(shm::HasRangeEntries(info->tensors));
      uint64_t w = 0, other = 0;
      for (const shm::SavedTensor& t : info->tensors) (t.meta.name == "w" ? w : other) += t.nbytes;
      EXPECT_LE(w, w_bytes / 2 + 64);
      EXPECT_GE(w + 64, w_bytes / 2);
      EXPECT_EQ(other, s[r].Bytes() - w_bytes);  // counts (dp_sharded) and rng (private) whole
    }
    EXPECT_TRUE(found);
  }
  for (int r = 0; r < 2; ++r) {
    State u;
    auto cu = Sealed(u, r);
    auto restored = cu->Restore();
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(*restored, 2);
    EXPECT_EQ(u.Digest(), digest[r][2]) << "rank " << r;
  }
  // Flip one byte of rank 1's piece of "w" in its slot of step 2.
  for (int slot = 0; slot < shm::kSlotsPerRank; ++slot) {
    auto seg = shm::Segment::Open(shm::SlotPath(root_, 1, slot), true);
    ASSERT_TRUE(seg.ok()) << seg.status();
    auto info = shm::ReadSlot(**seg);
    ASSERT_TRUE(info.ok()) << info.status();
    if (info->step != 2) continue;
    for (const shm::SavedTensor& t : info->tensors) {
      if (t.meta.name == "w") (*seg)->data()[info->data_offset + t.offset + t.nbytes / 2] ^= 0x10;
    }
  }
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    State u;
    u.Fill(seed + 1000 + r);
    const uint64_t before = u.Digest();
    auto cu = Sealed(u, r);
    auto exact = cu->Restore(2);
    EXPECT_EQ(exact.status().code(), StatusCode::kDataLoss) << exact.status();
    EXPECT_EQ(u.Digest(), before) << "a refused Restore(2) wrote into the registered tensors";
    auto older = cu->Restore();
    ASSERT_TRUE(older.ok()) << older.status();
    EXPECT_EQ(*older, 1);
    EXPECT_EQ(u.Digest(), digest[r][1]);
  }
}

// Restore(step): exactly that version or NotFound / DataLoss, never another
// step. The motivating case: a rank killed in the middle of Snapshot(3) holds
// a torn slot and step 2 only, so the job must restart every rank at step 2.
TEST_F(ClientAgentTest, RestoreExactStep) {
  AgentThread agent(LocalAgent("job1", root_));
  uint64_t seed = memento::testing::TestSeed("ClientAgentTest.RestoreExactStep");
  State s;
  auto c = Sealed(s);
  uint64_t digests[5] = {};
  for (int step = 1; step <= 3; ++step) {
    s.Fill(seed + step);
    digests[step] = s.Digest();
    ASSERT_TRUE(c->Snapshot(step).ok());
    ASSERT_TRUE(c->Fence().ok());
  }
  c.reset();

  // The older of the two versions, although a newer one is intact.
  State t;
  auto c2 = Sealed(t);
  EXPECT_EQ(c2->Restore(-1).status().code(), StatusCode::kInvalidArgument);
  const uint64_t untouched = t.Digest();
  auto r = c2->Restore(1);  // overwritten by step 3
  ASSERT_EQ(r.status().code(), StatusCode::kNotFound) << r.status();
  EXPECT_NE(r.status().message().find("step 1"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("2"), std::string::npos) << r.status();
  EXPECT_EQ(t.Digest(), untouched);
  EXPECT_EQ(c2->Restore(4).status().code(), StatusCode::kNotFound);
  r = c2->Restore(2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 2);
  EXPECT_EQ(t.Digest(), digests[2]);
  EXPECT_EQ(c2->LastRestoreStats().step, 2);
  // Training continues from step 2: the new step 3 replaces the old step 3
  // and keeps step 2.
  t.Fill(seed + 103);
  digests[3] = t.Digest();
  ASSERT_TRUE(c2->Snapshot(3).ok());
  ASSERT_TRUE(c2->Fence().ok());
  auto versions = c2->ListVersions();
  ASSERT_TRUE(versions.ok()) << versions.status();
  ASSERT_EQ(versions->size(), 2u);
  EXPECT_EQ((*versions)[0].step, 3);
  EXPECT_EQ((*versions)[1].step, 2);
  c2.reset();
  State u;
  auto c3 = Sealed(u);
  r = c3->Restore(3);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(u.Digest(), digests[3]);
  c3.reset();

  // Step 3's slot is torn (its writer died after BeginSlotWrite): Restore(3)
  // is NotFound, Restore(2) loads step 2.
  int slot3 = -1;
  for (int slot = 0; slot < shm::kSlotsPerRank; ++slot) {
    auto seg = shm::Segment::Open(shm::SlotPath(root_, 0, slot), true);
    ASSERT_TRUE(seg.ok()) << seg.status();
    auto info = shm::ReadSlot(**seg);
    ASSERT_TRUE(info.ok()) << info.status();
    if (info->step == 3) {
      slot3 = slot;
      shm::StoreState(reinterpret_cast<shm::SlotHeader*>((*seg)->data()), shm::SlotState::kWriting);
    }
  }
  ASSERT_GE(slot3, 0);
  State v;
  auto c4 = Sealed(v);
  r = c4->Restore(3);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status();
  r = c4->Restore(2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(v.Digest(), digests[2]);
  c4.reset();

  // A version that fails its checksums is DataLoss, with no fallback.
  {
    auto seg = shm::Segment::Open(shm::SlotPath(root_, 0, 1 - slot3), true);
    ASSERT_TRUE(seg.ok());
    auto info = shm::ReadSlot(**seg);
    ASSERT_TRUE(info.ok());
    ASSERT_EQ(info->step, 2);
    (*seg)->data()[info->data_offset + 12345] ^= 0x20;
  }
  State w;
  auto c5 = Sealed(w);
  r = c5->Restore(2);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("step 2"), std::string::npos) << r.status();
}

TEST_F(ClientAgentTest, ClearErrorsForBadSetups) {
  // No agent directory: unknown job.
  ClientOptions o = Options();
  o.connect_timeout_s = 0.1;
  auto c = Client::Connect(o);
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound) << c.status();
  EXPECT_NE(c.status().message().find("unknown job"), std::string::npos) << c.status();
  {
    AgentThread agent(LocalAgent("job1", root_, 1 << 20));  // 1 MiB budget
    // An agent of another job at this directory.
    ClientOptions other = o;
    other.job_id = "job2";
    c = Client::Connect(other);
    EXPECT_EQ(c.status().code(), StatusCode::kNotFound) << c.status();
    EXPECT_NE(c.status().message().find("serves job 'job1'"), std::string::npos) << c.status();
    // Budget too small for 2 x 1.2 MB.
    State s;
    c = Client::Connect(o);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(s.Register(**c).ok());
    Status st = (*c)->Seal();
    EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st;
    EXPECT_NE(st.message().find("--budget"), std::string::npos) << st;
    // A second agent on the same root is refused.
    auto second = agent::Agent::Start(LocalAgent("job1", root_));
    EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists) << second.status();
  }
  // The agent is gone and its socket file stays: stale.
  ASSERT_EQ(access(shm::AgentSocketPath(root_).c_str(), F_OK), 0);
  c = Client::Connect(o);
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status();
  EXPECT_NE(c.status().message().find("stale"), std::string::npos) << c.status();
  // An agent whose budget the shared-memory filesystem cannot hold refuses to
  // start, saying how much is needed and how to raise it.
  agent::AgentOptions huge_options =
      LocalAgent("job1", dir_.path() + "/job1/node1", uint64_t{1} << 60);
  huge_options.node = 1;
  auto huge = agent::Agent::Start(huge_options);
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted) << huge.status();
  EXPECT_NE(huge.status().message().find("--shm-size"), std::string::npos) << huge.status();
  // Bad options.
  ClientOptions bad = o;
  bad.chunk_bytes = 1000;
  EXPECT_EQ(Client::Connect(bad).status().code(), StatusCode::kInvalidArgument);
  bad = o;
  bad.job_id = "a/b";
  EXPECT_EQ(Client::Connect(bad).status().code(), StatusCode::kInvalidArgument);
  auto refused = ParseCopyPriority("high");
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("idle, normal"), std::string::npos) << refused.status();
  bad = o;
  bad.copy_priority = static_cast<CopyPriority>(9);
  EXPECT_EQ(Client::Connect(bad).status().code(), StatusCode::kInvalidArgument);
}

// With idle-priority copy workers (the default) a Fence() that has to wait
// copies the remaining chunks on the trainer thread; with "normal" it only
// waits. Either way the version is exact. The workers are slowed down (a
// sleep after every chunk) so that the fence always finds chunks left.
TEST_F(ClientAgentTest, IdlePriorityFenceCopiesWhatIsLeft) {
  AgentThread agent(LocalAgent("job1", root_));
  uint64_t seed = memento::testing::TestSeed("ClientAgentTest.IdlePriorityFenceCopiesWhatIsLeft");
  memento::client::testing_hooks::SetCopyDelayUs(20000);
  for (CopyPriority priority : {CopyPriority::kIdle, CopyPriority::kNormal}) {
    SCOPED_TRACE(CopyPriorityName(priority));
    State s;
    ClientOptions o = Options();
    o.copy_priority = priority;
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(s.Register(**c).ok());
    ASSERT_TRUE((*c)->Seal().ok());
    const int64_t step = priority == CopyPriority::kIdle ? 1 : 2;
    s.Fill(seed + step);
    const uint64_t digest = s.Digest();
    ASSERT_TRUE((*c)->Snapshot(step).ok());
    ASSERT_TRUE((*c)->Fence().ok());
    SnapshotStats stats = (*c)->LastSnapshotStats();
    EXPECT_EQ(stats.bytes, s.Bytes());
    if (priority == CopyPriority::kIdle) {
      // 7 chunks, 2 workers each sleeping 20 ms after a chunk.
      EXPECT_GT(stats.bytes_fence, 0u);
      EXPECT_LT(stats.bytes_fence, stats.bytes);
      EXPECT_EQ(stats.bytes_compute, stats.bytes);  // bytes_fence is a part of it
    } else {
      EXPECT_EQ(stats.bytes_fence, 0u);
    }
    s.Fill(seed + 100);
    auto restored = (*c)->Restore(step);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(s.Digest(), digest);
  }
  memento::client::testing_hooks::SetCopyDelayUs(0);
}

TEST_F(ClientAgentTest, OneLiveTrainerPerRank) {
  AgentThread agent(LocalAgent("job1", root_));
  auto first = Client::Connect(Options(1));
  ASSERT_TRUE(first.ok()) << first.status();
  // Another process claiming rank 1 while the first is alive is refused.
  pid_t pid = fork();
  if (pid == 0) {
    auto c = Client::Connect(Options(1));
    if (c.status().code() == StatusCode::kAlreadyExists) _exit(0);
    std::fprintf(stderr, "child: %s\n", c.status().ToString().c_str());
    _exit(1);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  // Once the first one is gone, rank 1 is free again.
  first->reset();
  std::unique_ptr<Client> again;
  for (int i = 0; i < 200 && again == nullptr; ++i) {
    auto c = Client::Connect(Options(1));
    if (c.ok())
      again = std::move(*c);
    else
      usleep(5000);
  }
  EXPECT_NE(again, nullptr);
}

TEST_F(ClientAgentTest, ClientOfAnotherUidIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  AgentThread agent(LocalAgent("job1", root_));
  // Open the directory and socket so that only the agent's SO_PEERCRED check
  // stands between the other uid and the agent.
  ASSERT_EQ(chmod(root_.c_str(), 0755), 0);
  ASSERT_EQ(chmod(shm::AgentSocketPath(root_).c_str(), 0666), 0);
  for (std::string p = root_; p.size() > dir_.path().size(); p = p.substr(0, p.rfind('/'))) {
    chmod(p.c_str(), 0755);
  }
  chmod(dir_.path().c_str(), 0755);
  pid_t pid = fork();
  if (pid == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
    auto c = Client::Connect(Options());
    if (c.ok()) _exit(11);
    if (c.status().code() != StatusCode::kPermissionDenied) {
      std::fprintf(stderr, "child got %s\n", c.status().ToString().c_str());
      _exit(12);
    }
    if (c.status().message().find("uid 65534") == std::string::npos) _exit(13);
    _exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
}

TEST_F(ClientAgentTest, MalformedRequestsGetErrorsAndTheAgentLivesOn) {
  AgentThread agent(LocalAgent("job1", root_));
  auto fd = shm::ConnectUnix(shm::AgentSocketPath(root_));
  ASSERT_TRUE(fd.ok());
  Deadline d = Deadline::AfterSeconds(5);
  auto ask = [&](const nlohmann::json& req) {
    EXPECT_TRUE(shm::SendJson(*fd, req, d).ok());
    auto reply = shm::RecvJson(*fd, d);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? shm::StatusFromJson(*reply) : reply.status();
  };
  EXPECT_EQ(ask({{"op", "bogus"}, {"rank", 0}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ask({{"op", "seal"}, {"rank", "zero"}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ask({{"no_op", 1}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ask({{"op", "seal"}, {"rank", -1}, {"bytes", 100}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ask({{"op", "hello"}, {"protocol", 99}, {"job", "job1"}, {"rank", 0}}).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ask({{"op", "ping"}}).ok());
  // A whole frame that is not JSON gets an error; the connection goes on.
  EXPECT_EQ(ask(nlohmann::json("{{{")).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(shm::SendFrame(*fd, "{{{", d).ok());
  auto reply = shm::RecvJson(*fd, d);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(shm::StatusFromJson(*reply).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ask({{"op", "ping"}}).ok());
  close(*fd);
  State s;
  auto c = Sealed(s);
  EXPECT_TRUE(c->ListVersions().ok());
}

TEST_F(ClientAgentTest, RegistrationRules) {
  AgentThread agent(LocalAgent("job1", root_));
  auto c = Client::Connect(Options());
  ASSERT_TRUE(c.ok());
  float x[4];
  ASSERT_TRUE((*c)->RegisterTensor({"x", DType::kFloat32, {4}, StateClass::kPrivate}, x).ok());
  EXPECT_EQ((*c)->RegisterTensor({"x", DType::kFloat32, {4}, StateClass::kPrivate}, x).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ((*c)->RegisterTensor({"y", DType::kFloat32, {4}, StateClass::kPrivate}, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      (*c)->RegisterTensor({"z", DType::kFloat32, {4}, StateClass::kPrivate}, x, Device::Cuda(0))
          .code(),
      StatusCode::kFailedPrecondition);
  EXPECT_EQ((*c)->Snapshot(1).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*c)->Seal().ok());
  EXPECT_EQ((*c)->RegisterBlob("b", x, 4).code(), StatusCode::kFailedPrecondition);
}

// AOR's client API (docs/client_api.md, "AOR"): malformed registrations
// and calls out of order get errors that name what is wrong; an optimizer
// encoding the agent cannot decode fails Seal(); on a single node (no plan,
// no replicas) capturing copies nothing and succeeds.
TEST_F(ClientAgentTest, GradientRegistrationRules) {
  AgentThread agent(LocalAgent("job1", root_));
  std::vector<float> params(64, 0.5f), grads(64, 0.25f);
  auto adam = opt::AdamW::Create(opt::AdamWConfig{}, {{0, 64, 0.1f}});
  ASSERT_TRUE(adam.ok());
  const std::string encoding = (*adam)->Encode();
  auto expect = [](const Status& st, StatusCode code, const std::string& text) {
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_NE(st.message().find(text), std::string::npos) << st;
  };
  {
    auto c = Client::Connect(Options());
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->RegisterTensor({"params", DType::kFloat32, {64}, StateClass::kReplicated},
                                     params.data())
                    .ok());
    expect((*c)->RegisterGradients({nullptr, 64, "params", encoding}), StatusCode::kInvalidArgument,
           "grads is null");
    expect((*c)->RegisterGradients({grads.data(), 0, "params", encoding}),
           StatusCode::kInvalidArgument, "numel is 0");
    expect((*c)->RegisterGradients({grads.data(), 64, "params", ""}), StatusCode::kInvalidArgument,
           "optimizer_encoding has 0 bytes");
    expect((*c)->RegisterGradients({grads.data(), 64, "weights", encoding}),
           StatusCode::kInvalidArgument, "'weights' is not a registered tensor");
    expect((*c)->RegisterGradients({grads.data(), 63, "params", encoding}),
           StatusCode::kInvalidArgument, "numel 63");
    expect((*c)->CaptureGradients(1, 1e-3f), StatusCode::kFailedPrecondition, "before Seal");
    expect((*c)->ReportShardChecksum(1, 7), StatusCode::kFailedPrecondition, "before Seal");
    ASSERT_TRUE((*c)->RegisterGradients({grads.data(), 64, "params", encoding}).ok());
    expect((*c)->RegisterGradients({grads.data(), 64, "params", encoding}),
           StatusCode::kAlreadyExists, "already called");
    ASSERT_TRUE((*c)->Seal().ok());
    expect((*c)->RegisterGradients({grads.data(), 64, "params", encoding}),
           StatusCode::kFailedPrecondition, "after Seal");
    // One node: no replica to feed; nothing is copied, and that is fine.
    EXPECT_TRUE((*c)->CaptureGradients(1, 1e-3f).ok());
    EXPECT_TRUE((*c)->CaptureGradients(2, std::nanf("")).ok());  // the optimizer's schedule
    EXPECT_TRUE((*c)->ReportShardChecksum(1, 0x1234).ok());
    expect((*c)->CaptureGradients(0, 1e-3f), StatusCode::kInvalidArgument, "step 0 < 1");
    expect((*c)->CaptureGradients(3, INFINITY), StatusCode::kInvalidArgument, "lr is infinite");
    expect((*c)->ReportShardChecksum(0, 1), StatusCode::kInvalidArgument, "step 0 < 1");
  }
  {
    // Capture without a registration.
    auto c = Client::Connect(Options(1));
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->RegisterTensor({"params", DType::kFloat32, {64}, StateClass::kReplicated},
                                     params.data())
                    .ok());
    ASSERT_TRUE((*c)->Seal().ok());
    expect((*c)->CaptureGradients(1, 1e-3f), StatusCode::kFailedPrecondition,
           "without RegisterGradients");
  }
  {
    // An encoding the agent cannot decode: Seal() says so.
    auto c = Client::Connect(Options(2));
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->RegisterTensor({"params", DType::kFloat32, {64}, StateClass::kReplicated},
                                     params.data())
                    .ok());
    ASSERT_TRUE((*c)->RegisterGradients({grads.data(), 64, "params", "not an optimizer"}).ok());
    expect((*c)->Seal(), StatusCode::kInvalidArgument, "field 'optimizer'");
  }
}

}  // namespace
}  // namespace memento
