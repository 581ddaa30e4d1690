// The client computes the parities its rank produces (docs/reft.md section
// 4): an agent (a minimal one in a thread of this process, speaking the real
// protocol over the real Unix socket; the cluster agent's answer is tested in
// cluster_save_test) answers the `plan` op with ranges and parities; the
// client's copy workers (eager and HAS) write the ranges and the parity
// entries into the real shared-memory slot. Every parity byte must equal the
// slow reference codec over the stripe's data blocks read from the
// registered tensors, and no stripe input lands in the slot.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "codec/reference_codec.h"
#include "common/check.h"
#include "common/test_util.h"
#include "memento/client.h"
#include "shm/agent_messages.h"
#include "shm/node_store.h"
#include "shm/protocol.h"
#include "shm/segment.h"
#include "shm/shm_test_util.h"
#include "shm/slot.h"

namespace memento {
namespace {

// Answers hello, seal (two slot files), plan (the reply it is given) and
// everything else with ok, on one connection at a time.
class PlanAgent {
 public:
  PlanAgent(std::string root, shm::PlanReply plan)
      : root_(std::move(root)), plan_(std::move(plan)) {
    std::filesystem::create_directories(root_);
    auto fd = shm::ListenUnix(shm::AgentSocketPath(root_));
    MEMENTO_CHECK_OK(fd.status());
    listen_fd_ = *fd;
    thread_ = std::thread([this] { Run(); });
  }
  ~PlanAgent() {
    stop_.store(true);
    thread_.join();
    close(listen_fd_);
  }
  bool asked_parities() const { return asked_parities_.load(); }
  int plan_calls() const { return plan_calls_.load(); }

 private:
  void Run() {
    while (!stop_.load()) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      Serve(fd);
      close(fd);
    }
  }
  void Serve(int fd) {
    while (!stop_.load()) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      auto msg = shm::RecvJson(fd, Deadline::AfterSeconds(5));
      if (!msg.ok()) return;
      auto req = shm::AgentRequestFromJson(*msg);
      nlohmann::json reply = shm::StatusToJson(Status::Ok());
      if (!req.ok()) {
        reply = shm::StatusToJson(req.status());
      } else if (req->op == shm::AgentOp::kHello) {
        reply = shm::ToJson(shm::HelloReply{0, root_, getpid()});
      } else if (req->op == shm::AgentOp::kSeal) {
        shm::SealReply seal;
        for (int s = 0; s < shm::kSlotsPerRank; ++s) {
          seal.paths.push_back(shm::SlotPath(root_, req->rank, s));
          MEMENTO_CHECK_OK(shm::Segment::CreateOrGrow(seal.paths.back(), req->bytes).status());
        }
        reply = shm::ToJson(seal);
      } else if (req->op == shm::AgentOp::kPlan) {
        ++plan_calls_;
        asked_parities_.store(req->client_parity);
        reply = shm::ToJson(plan_);
      }
      if (!shm::SendJson(fd, reply, Deadline::AfterSeconds(5)).ok()) return;
    }
  }

  const std::string root_;
  const shm::PlanReply plan_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> asked_parities_{false};
  std::atomic<int> plan_calls_{0};
  std::thread thread_;
};

struct Case {
  const char* name;
  bool xor_code;
  int k, f, index;
  Schedule schedule;
};

class ClientParityTest : public ::testing::TestWithParam<Case> {};

// "w": 300 000 bytes of replicated state, "b": 1000 private bytes. The rank's
// own pieces are w[0, 65536) and b; its parity's data blocks are other
// members' pieces of w, the last one crossing into b and shorter than the
// block (zero padding), one block empty (all zeros) under rs.
TEST_P(ClientParityTest, ParityEntryEqualsTheReferenceCodecOfTheInputs) {
  const Case& c = GetParam();
  shm::testing::ShmScratchDir dir;
  const std::string root = dir.path() + "/job1/node0";
  std::vector<uint8_t> w(300000), b(1000);
  std::mt19937_64 rng(
      memento::testing::TestSeed((std::string("ClientParityTest.") + c.name).c_str()));
  for (auto& x : w) x = static_cast<uint8_t>(rng());
  for (auto& x : b) x = static_cast<uint8_t>(rng());

  const uint64_t block = 100032;  // a multiple of 64, not of the chunk size
  shm::PlanReply plan;
  plan.plan_hash = "0123456789abcdef";
  plan.sharded = true;
  plan.ranges = {{"w", 0, 65536}, {"b", 0, 1000}};
  shm::PlanParity par;
  par.id = 3;
  par.xor_code = c.xor_code;
  par.k = c.k;
  par.f = c.f;
  par.index = c.index;
  par.block_bytes = block;
  par.blocks = {{{"w", 65536, 100032}}, {{"w", 165568, 100032}}};
  if (c.k == 3) par.blocks.push_back({{"w", 265600, 34400}, {"b", 0, 1000}});
  if (!c.xor_code) par.blocks.back() = {};  // an all-zero block
  plan.parities = {par};
  PlanAgent agent(root, plan);

  ClientOptions o;
  o.job_id = "job1";
  o.rank = 0;
  o.world_size = 4;
  o.agent_dir = root;
  o.copy_threads = 2;
  o.chunk_bytes = 64 << 10;
  o.schedule = c.schedule;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  TensorMeta wm{"w", DType::kUInt8, {300000}, StateClass::kReplicated};
  TensorMeta bm{"b", DType::kUInt8, {1000}, StateClass::kPrivate};
  ASSERT_TRUE((*client)->RegisterTensor(wm, w.data(), Device::Host()).ok());
  ASSERT_TRUE((*client)->RegisterTensor(bm, b.data(), Device::Host()).ok());
  ASSERT_TRUE((*client)->Seal().ok());
  ASSERT_TRUE((*client)->Snapshot(1).ok());
  ASSERT_TRUE((*client)->Fence().ok());
  EXPECT_TRUE(agent.asked_parities());
  EXPECT_EQ(agent.plan_calls(), 1);

  // The reference: the k padded data blocks, encoded byte by byte.
  std::vector<std::vector<uint8_t>> data(c.k, std::vector<uint8_t>(block, 0));
  for (int i = 0; i < c.k; ++i) {
    uint64_t at = 0;
    for (const shm::SaveRange& r : par.blocks[i]) {
      const uint8_t* src = (r.tensor == "w" ? w.data() : b.data()) + r.offset;
      std::memcpy(data[i].data() + at, src, r.length);
      at += r.length;
    }
  }
  std::vector<std::vector<uint8_t>> parity(c.f, std::vector<uint8_t>(block));
  std::vector<const uint8_t*> dp;
  std::vector<uint8_t*> pp;
  for (auto& d : data) dp.push_back(d.data());
  for (auto& p : parity) pp.push_back(p.data());
  codec::reference::Encode(codec::reference::GeneratorMatrix(c.xor_code, c.k, c.f), c.k, c.f, block,
                           dp.data(), pp.data());

  auto seg = shm::Segment::Open(shm::SlotPath(root, 0, 0), /*writable=*/false);
  ASSERT_TRUE(seg.ok()) << seg.status();
  auto info = shm::ReadSlot(**seg);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->state, shm::SlotState::kComplete);
  ASSERT_EQ(info->step, 1);
  EXPECT_TRUE(shm::VerifySlotData(**seg, *info).ok());
  const int e = shm::FindParityEntry(info->tensors, 3);
  ASSERT_GE(e, 0);
  const shm::SavedTensor& pe = info->tensors[static_cast<size_t>(e)];
  ASSERT_EQ(pe.nbytes, block);
  const uint8_t* got = (*seg)->data() + info->data_offset + pe.offset;
  EXPECT_EQ(std::memcmp(got, parity[static_cast<size_t>(c.index)].data(), block), 0)
      << "the client's parity differs from the reference codec";
  // The slot holds the rank's ranges and the parity, no stripe input: 65536
  // + 1000 + one block, each entry 64-byte aligned.
  EXPECT_EQ(info->tensors.size(), 3u);
  auto own = shm::FindRange(*info, "w", 0, 65536);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(
      std::memcmp((*seg)->data() + info->data_offset + (*own)[0].data_offset, w.data(), 65536), 0);
  EXPECT_EQ(shm::FindRange(*info, "w", 65536, 1).status().code(), StatusCode::kNotFound);
  EXPECT_LT(info->data_bytes, 65536u + 1024u + block + 128u);
}

INSTANTIATE_TEST_SUITE_P(Codes, ClientParityTest,
                         ::testing::Values(Case{"xor_eager", true, 3, 1, 0, Schedule::kEager},
                                           Case{"xor_has", true, 3, 1, 0, Schedule::kHas},
                                           Case{"rs_2_eager", false, 3, 2, 1, Schedule::kEager},
                                           Case{"rs_2_has", false, 2, 2, 0, Schedule::kHas}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.name);
                         });

}  // namespace
}  // namespace memento
