// Device (CUDA) tensors in the client against a real agent (docs/has.md,
// "CUDA path"). Without CUDA in the build, or without a visible device, the
// client refuses a device tensor with a message that names it (checked on
// every machine that cannot run the GPU cases); with a GPU, device tensors
// snapshot through the CUDA copy engine and restore bit-identically, under
// both the eager and the HAS schedule. GPU cases skip without a device.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "agent/agent.h"
#include "agent_fixture.h"
#include "common/check.h"
#include "common/test_util.h"
#include "memento/client.h"
#include "memento/config.h"
#include "shm/shm_test_util.h"
#if MEMENTO_HAVE_CUDA
#include "snap/cuda/cuda_copy_engine.h"
#endif

namespace memento {
namespace {

using testing::AgentThread;
using testing::LocalAgent;

int VisibleDevices() {
#if MEMENTO_HAVE_CUDA
  return cuda::DeviceCount();
#else
  return 0;
#endif
}

class ClientDeviceTest : public ::testing::Test {
 protected:
  ClientDeviceTest() : root_(dir_.path() + "/jobd/node0") {}
  ClientOptions Options(Schedule schedule) {
    ClientOptions o;
    o.job_id = "jobd";
    o.agent_dir = root_;
    o.copy_threads = 2;
    o.chunk_bytes = 64 << 10;
    o.connect_timeout_s = 2;
    o.schedule = schedule;
    return o;
  }
  shm::testing::ShmScratchDir dir_;
  std::string root_;
};

TEST_F(ClientDeviceTest, RefusesDeviceTensorNamingItWithoutCudaOrDevice) {
  if (VisibleDevices() > 0) GTEST_SKIP() << "a CUDA device is visible: the GPU cases run instead";
  AgentThread agent(LocalAgent("jobd", root_));
  auto c = Client::Connect(Options(Schedule::kEager));
  ASSERT_TRUE(c.ok()) << c.status();
  float fake[4] = {};
  TensorMeta meta{"layer3.weight", DType::kFloat32, {4}, StateClass::kReplicated};
  Status st = (*c)->RegisterTensor(meta, fake, Device::Cuda(0));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("'layer3.weight'"), std::string::npos) << st;
  EXPECT_NE(st.message().find("cuda:0"), std::string::npos) << st;
#if MEMENTO_HAVE_CUDA
  EXPECT_NE(st.message().find("no CUDA device is visible"), std::string::npos) << st;
#else
  EXPECT_NE(st.message().find("built without CUDA"), std::string::npos) << st;
#endif
  // The refusal registered nothing: the same name on the host is accepted,
  // and the client seals, snapshots and restores as usual.
  float host[4] = {1, 2, 3, 4};
  ASSERT_TRUE((*c)->RegisterTensor(meta, host).ok());
  ASSERT_TRUE((*c)->Seal().ok());
  ASSERT_TRUE((*c)->Snapshot(1).ok());
  ASSERT_TRUE((*c)->Fence().ok());
  std::memset(host, 0, sizeof(host));
  auto r = (*c)->Restore();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(host[3], 4.0f);
}

#if MEMENTO_HAVE_CUDA
// Device state: a device tensor filled from a seed, plus a host blob.
struct DeviceState {
  std::unique_ptr<cuda::DeviceBuffer> w;
  std::vector<uint8_t> host_w;
  uint8_t rng[64];
  explicit DeviceState(size_t bytes) : host_w(bytes) {
    auto b = cuda::DeviceBuffer::Allocate(bytes);
    MEMENTO_CHECK_OK(b.status());
    w = std::move(*b);
    std::memset(rng, 0, sizeof(rng));
  }
  Status Register(Client& c) {
    MEMENTO_RETURN_IF_ERROR(c.RegisterTensor(
        {"w", DType::kUInt8, {static_cast<int64_t>(host_w.size())}, StateClass::kReplicated},
        w->data(), Device::Cuda(0)));
    return c.RegisterBlob("rng", rng, sizeof(rng));
  }
};

Status Upload(cuda::CudaCopyEngine& e, DeviceState& s) {
  return e.CopyH2D(s.w->data(), s.host_w.data(), s.host_w.size());
}
Status Download(cuda::CudaCopyEngine& e, DeviceState& s) {
  return e.CopyD2H(s.host_w.data(), s.w->data(), s.host_w.size());
}

class ClientDeviceRoundTrip : public ClientDeviceTest,
                              public ::testing::WithParamInterface<const char*> {};

TEST_P(ClientDeviceRoundTrip, SnapshotsAndRestoresBitIdentically) {
  if (VisibleDevices() == 0) GTEST_SKIP() << "no CUDA device visible";
  AgentThread agent(LocalAgent("jobd", root_));
  auto engine = cuda::CudaCopyEngine::Create({});
  ASSERT_TRUE(engine.ok()) << engine.status();
  const size_t bytes = (size_t{3} << 20) + 4096;  // several chunks and a short tail
  std::mt19937_64 g(memento::testing::TestSeed("ClientDeviceRoundTrip"));
  DeviceState s(bytes);
  auto c = Client::Connect(Options(ParseSchedule(GetParam()).value()));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(s.Register(**c).ok());
  ASSERT_TRUE((*c)->Seal().ok());
  std::vector<uint8_t> expect;
  uint8_t expect_rng[64];
  for (int step = 1; step <= 3; ++step) {
    ASSERT_TRUE((*c)->Fence().ok());
    for (auto& b : s.host_w) b = static_cast<uint8_t>(g());
    for (auto& b : s.rng) b = static_cast<uint8_t>(g());
    ASSERT_TRUE(Upload(**engine, s).ok());
    expect = s.host_w;
    std::memcpy(expect_rng, s.rng, sizeof(expect_rng));
    (*c)->OnPhase(step % 2 ? Phase::kIdle : Phase::kCompute);
    ASSERT_TRUE((*c)->Snapshot(step).ok());
  }
  ASSERT_TRUE((*c)->Fence().ok());
  SnapshotStats st = (*c)->LastSnapshotStats();
  EXPECT_EQ(st.step, 3);
  EXPECT_EQ(st.bytes, bytes + sizeof(s.rng));
  c->reset();

  DeviceState t(bytes);
  auto c2 = Client::Connect(Options(Schedule::kEager));
  ASSERT_TRUE(c2.ok()) << c2.status();
  ASSERT_TRUE(t.Register(**c2).ok());
  ASSERT_TRUE((*c2)->Seal().ok());
  auto r = (*c2)->Restore();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 3);
  ASSERT_TRUE(Download(**engine, t).ok());
  EXPECT_TRUE(t.host_w == expect) << "device tensor differs after restore";
  EXPECT_EQ(std::memcmp(t.rng, expect_rng, sizeof(expect_rng)), 0);
}

INSTANTIATE_TEST_SUITE_P(Schedules, ClientDeviceRoundTrip,
                         ::testing::Values("eager", "has", "auto"));

TEST_F(ClientDeviceTest, RefusesADeviceThatDoesNotExist) {
  const int n = VisibleDevices();
  if (n == 0) GTEST_SKIP() << "no CUDA device visible";
  AgentThread agent(LocalAgent("jobd", root_));
  auto c = Client::Connect(Options(Schedule::kEager));
  ASSERT_TRUE(c.ok()) << c.status();
  float fake[4];
  Status st = (*c)->RegisterTensor({"x", DType::kFloat32, {4}, StateClass::kReplicated}, fake,
                                   Device::Cuda(n));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("'x'"), std::string::npos) << st;
}
#endif  // MEMENTO_HAVE_CUDA

}  // namespace
}  // namespace memento
