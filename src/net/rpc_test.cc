// RPC layer tests: status propagation, concurrency, deadline propagation and
// faults injected through FaultInjectionConnection.
#include "net/rpc.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "common/test_util.h"
#include "net/fault_connection.h"
#include "net/server.h"

namespace memento::net {
namespace {

JobToken Token() { return JobToken::FromSecret("rpc-test-token-0123456789").value(); }

enum Method : uint32_t { kEcho = 1, kFail = 2, kSleepUntilDeadline = 3, kSlice = 4 };

class RpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.Register(kEcho, [](std::string_view req, Deadline) -> Result<std::string> {
      return std::string(req);
    });
    server_.Register(kFail, [](std::string_view req, Deadline) -> Result<std::string> {
      return NotFoundError("no such thing: " + std::string(req));
    });
    server_.Register(kSleepUntilDeadline,
                     [this](std::string_view, Deadline d) -> Result<std::string> {
                       saw_finite_deadline_ = !d.infinite();
                       while (!d.expired())
                         std::this_thread::sleep_for(std::chrono::milliseconds(5));
                       return DeadlineExceededError("slept until the caller's deadline");
                     });
    // Serves a byte range of a large buffer straight from memory (as an
    // agent serves a piece from a shared-memory slot).
    blob_.resize(24 << 20);
    for (size_t i = 0; i < blob_.size(); ++i) blob_[i] = static_cast<char>(i * 131 + (i >> 16));
    server_.RegisterParts(
        kSlice, [this](std::string_view req, Deadline, const RpcServer::ReplyFn& reply) -> Status {
          uint64_t off = 0, len = 0;
          if (req.size() != 16) return InvalidArgumentError("want 16 bytes");
          std::memcpy(&off, req.data(), 8);
          std::memcpy(&len, req.data() + 8, 8);
          if (off > blob_.size() || len > blob_.size() - off) return OutOfRange();
          // Two parts, to exercise the iovec path.
          size_t half = len / 2;
          ConstBuffer parts[2] = {{blob_.data() + off, half},
                                  {blob_.data() + off + half, len - half}};
          return reply(parts, 2);
        });
    ASSERT_TRUE(server_.Start(ServerOptions{}, Token()).ok());
  }
  std::unique_ptr<RpcClient> Client() {
    return RpcClient::Connect("127.0.0.1", server_.port(), Token(), Deadline::AfterSeconds(10))
        .value();
  }
  static Status OutOfRange() { return InvalidArgumentError("range outside the blob"); }
  static std::string SliceRequest(uint64_t off, uint64_t len) {
    std::string r(16, '\0');
    std::memcpy(r.data(), &off, 8);
    std::memcpy(r.data() + 8, &len, 8);
    return r;
  }
  std::string blob_;
  RpcServer server_;
  std::atomic<bool> saw_finite_deadline_{false};
};

TEST_F(RpcTest, EchoAndStatusPropagation) {
  auto c = Client();
  auto r = c->Call(kEcho, "ping", Deadline::AfterSeconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "ping");
  r = c->Call(kFail, "x", Deadline::AfterSeconds(10));
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "no such thing: x");
  r = c->Call(999, "", Deadline::AfterSeconds(10));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  // Application errors leave the client usable.
  r = c->Call(kEcho, std::string(1 << 20, 'z'), Deadline::AfterSeconds(10));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 1u << 20);
  EXPECT_FALSE(c->broken());
}

TEST_F(RpcTest, CallIntoReceivesStraightIntoCallerMemory) {
  auto c = Client();
  std::vector<char> dst(20 << 20);
  auto n = c->CallInto(kSlice, SliceRequest(12345, 20 << 20), dst.data(), dst.size(),
                       Deadline::AfterSeconds(60));
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(*n, size_t{20} << 20);
  EXPECT_EQ(std::memcmp(dst.data(), blob_.data() + 12345, *n), 0);
  // The same method through the copying Call.
  auto r = c->Call(kSlice, SliceRequest(7, 1000), Deadline::AfterSeconds(10));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, blob_.substr(7, 1000));
  // Errors arrive as statuses and leave the client usable.
  n = c->CallInto(kSlice, SliceRequest(blob_.size(), 1), dst.data(), dst.size(),
                  Deadline::AfterSeconds(10));
  EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(n.status().message(), "range outside the blob");
  EXPECT_FALSE(c->broken());
  // A reply larger than the buffer is refused and breaks the client.
  n = c->CallInto(kSlice, SliceRequest(0, 4096), dst.data(), 4095, Deadline::AfterSeconds(10));
  EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument) << n.status();
  EXPECT_TRUE(c->broken());
}

TEST_F(RpcTest, ManyConcurrentClients) {
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto c = Client();
      for (int i = 0; i < 50; ++i) {
        std::string msg = std::to_string(t) + "/" + std::to_string(i);
        auto r = c->Call(kEcho, msg, Deadline::AfterSeconds(30));
        if (r.ok() && *r == msg) ok.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 8 * 50);
}

TEST_F(RpcTest, DeadlineTravelsToTheServer) {
  auto c = Client();
  auto r = c->Call(kSleepUntilDeadline, "", Deadline::AfterSeconds(0.2));
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_TRUE(saw_finite_deadline_.load());
}

TEST_F(RpcTest, DroppedRequestTimesOutAndBreaksTheClient) {
  auto conn = Dial("127.0.0.1", server_.port(), Token(), Deadline::AfterSeconds(10)).value();
  FaultPlan plan;
  plan.drop_probability = 1.0;
  auto* faulty = new FaultInjectionConnection(std::move(conn), plan);
  RpcClient c{std::unique_ptr<Connection>(faulty)};
  auto r = c.Call(kEcho, "lost", Deadline::AfterSeconds(0.1));
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_EQ(faulty->dropped(), 1);
  // Whether or not a late reply arrives, the stream is not trusted again.
  faulty->set_plan(FaultPlan{});
  EXPECT_EQ(c.Call(kEcho, "again", Deadline::AfterSeconds(1)).status().code(),
            StatusCode::kUnavailable);
}

TEST_F(RpcTest, DelayedAndCutConnections) {
  auto conn = Dial("127.0.0.1", server_.port(), Token(), Deadline::AfterSeconds(10)).value();
  FaultPlan plan;
  plan.send_delay = std::chrono::milliseconds(20);
  plan.cut_after_sends = 2;
  auto* faulty = new FaultInjectionConnection(std::move(conn), plan);
  RpcClient c{std::unique_ptr<Connection>(faulty)};
  for (int i = 0; i < 2; ++i) {
    auto r = c.Call(kEcho, "slow", Deadline::AfterSeconds(10));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, "slow");
  }
  auto r = c.Call(kEcho, "cut", Deadline::AfterSeconds(10));
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status();
}

TEST_F(RpcTest, ServerStopFailsCallsPromptly) {
  auto c = Client();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    server_.Stop();
  });
  // Calls keep failing with Unavailable (not hanging) once the server is gone.
  Status last;
  for (int i = 0; i < 100 && last.ok(); ++i) {
    last = c->Call(kEcho, "x", Deadline::AfterSeconds(10)).status();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stopper.join();
  EXPECT_EQ(last.code(), StatusCode::kUnavailable) << last;
}

// A streaming method: 16-byte request (offset, length) plus an optional
// byte: 'x' sends one part with a wrong digest, 'a' ends with Aborted after
// the data. Parts of 1 MiB, every other one with its digest given, the
// others hashed by the server.
class RpcStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    blob_.resize(9 << 20);
    for (size_t i = 0; i < blob_.size(); ++i) blob_[i] = static_cast<char>(i * 7 + (i >> 12));
    server_.RegisterStream(kStream,
                           [this](std::string_view req, Deadline, const RpcServer::DataFn& data,
                                  const RpcServer::ReplyFn& reply) -> Status {
                             if (req.size() < 16) return InvalidArgumentError("want 16 bytes");
                             uint64_t off = 0, len = 0;
                             std::memcpy(&off, req.data(), 8);
                             std::memcpy(&len, req.data() + 8, 8);
                             const char mode = req.size() > 16 ? req[16] : 0;
                             if (off > blob_.size() || len > blob_.size() - off) {
                               return InvalidArgumentError("range outside the blob");
                             }
                             int i = 0;
                             for (uint64_t at = 0; at < len; at += kPart, ++i) {
                               const uint64_t n = std::min<uint64_t>(kPart, len - at);
                               ConstBuffer part{blob_.data() + off + at, n};
                               std::optional<uint64_t> digest;
                               if (i % 2 == 0) digest = Checksum(part.data, n);
                               if (mode == 'x' && i == 1) digest = Checksum(part.data, n) ^ 1;
                               MEMENTO_RETURN_IF_ERROR(data(&part, 1, digest));
                             }
                             if (mode == 'a')
                               return AbortedError("the source changed while it was sent");
                             return reply(nullptr, 0);
                           });
    server_.Register(kEcho, [](std::string_view req, Deadline) -> Result<std::string> {
      return std::string(req);
    });
    ASSERT_TRUE(server_.Start(ServerOptions{}, Token()).ok());
  }
  std::unique_ptr<RpcClient> Client() {
    return RpcClient::Connect("127.0.0.1", server_.port(), Token(), Deadline::AfterSeconds(10))
        .value();
  }
  static std::string Request(uint64_t off, uint64_t len, char mode = 0) {
    std::string r(16, '\0');
    std::memcpy(r.data(), &off, 8);
    std::memcpy(r.data() + 8, &len, 8);
    if (mode != 0) r.push_back(mode);
    return r;
  }
  static constexpr uint64_t kPart = 1 << 20;
  enum : uint32_t { kStream = 10, kEcho = 11 };
  std::string blob_;
  RpcServer server_;
};

TEST_F(RpcStreamTest, DataFramesLandBackToBackInCallerMemoryWithTheirDigests) {
  auto c = Client();
  const uint64_t off = 12345, len = (3 << 20) + 777;
  std::vector<char> dst(len + 100, 0);
  std::vector<RpcClient::StreamedData> got;
  auto n = c->CallStreamInto(kStream, Request(off, len), dst.data(), dst.size(),
                             Deadline::AfterSeconds(10),
                             [&](const RpcClient::StreamedData& d) { got.push_back(d); });
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, len);
  EXPECT_EQ(std::memcmp(dst.data(), blob_.data() + off, len), 0);
  ASSERT_EQ(got.size(), 4u);
  uint64_t at = 0;
  for (const auto& d : got) {
    EXPECT_EQ(d.offset, at);
    EXPECT_EQ(d.digest, Checksum(dst.data() + d.offset, d.length));
    at += d.length;
  }
  EXPECT_EQ(at, len);
  // An empty stream, then an ordinary call on the same connection.
  n = c->CallStreamInto(kStream, Request(0, 0), dst.data(), dst.size(), Deadline::AfterSeconds(10));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0u);
  auto e = c->Call(kEcho, "still in step", Deadline::AfterSeconds(10));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(*e, "still in step");
}

// Staged receive: the same bytes and digests land in caller memory, through
// the client's own buffer; a frame whose digest does not match is not copied
// into caller memory at all.
TEST_F(RpcStreamTest, StagedReceiveLandsTheSameBytesAndDropsABadFrame) {
  auto c = Client();
  c->set_staged_receive(true);
  const uint64_t off = 777, len = (3 << 20) + 4321;
  std::vector<char> dst(len, 0);
  std::vector<RpcClient::StreamedData> got;
  auto n = c->CallStreamInto(kStream, Request(off, len), dst.data(), dst.size(),
                             Deadline::AfterSeconds(10),
                             [&](const RpcClient::StreamedData& d) { got.push_back(d); });
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, len);
  EXPECT_EQ(std::memcmp(dst.data(), blob_.data() + off, len), 0);
  ASSERT_EQ(got.size(), 4u);
  for (const auto& d : got) EXPECT_EQ(d.digest, Checksum(dst.data() + d.offset, d.length));
  std::fill(dst.begin(), dst.end(), 0);
  n = c->CallStreamInto(kStream, Request(0, 3 << 20, 'x'), dst.data(), dst.size(),
                        Deadline::AfterSeconds(10));
  EXPECT_EQ(n.status().code(), StatusCode::kDataLoss) << n.status();
  EXPECT_FALSE(c->broken());
  EXPECT_EQ(std::memcmp(dst.data(), blob_.data(), kPart), 0);  // part 0: good
  EXPECT_EQ(std::count(dst.begin() + kPart, dst.begin() + 2 * kPart, 0), static_cast<long>(kPart))
      << "the part with the wrong digest reached caller memory";
}

TEST_F(RpcStreamTest, WrongDigestIsDataLossAndTheConnectionStaysInStep) {
  auto c = Client();
  std::vector<char> dst(4 << 20);
  auto n = c->CallStreamInto(kStream, Request(0, 3 << 20, 'x'), dst.data(), dst.size(),
                             Deadline::AfterSeconds(10));
  EXPECT_EQ(n.status().code(), StatusCode::kDataLoss) << n.status();
  EXPECT_FALSE(c->broken());
  auto e = c->Call(kEcho, "after", Deadline::AfterSeconds(10));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(*e, "after");
}

TEST_F(RpcStreamTest, AnErrorAfterTheDataIsReturnedAndTheDataIsNotAccepted) {
  auto c = Client();
  std::vector<char> dst(4 << 20);
  auto n = c->CallStreamInto(kStream, Request(0, 2 << 20, 'a'), dst.data(), dst.size(),
                             Deadline::AfterSeconds(10));
  EXPECT_EQ(n.status().code(), StatusCode::kAborted) << n.status();
  EXPECT_FALSE(c->broken());
  n = c->CallStreamInto(kStream, Request(blob_.size(), 1), dst.data(), dst.size(),
                        Deadline::AfterSeconds(10));
  EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument) << n.status();
  n = c->CallStreamInto(kStream, Request(5, 100), dst.data(), dst.size(),
                        Deadline::AfterSeconds(10));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(std::memcmp(dst.data(), blob_.data() + 5, 100), 0);
}

TEST_F(RpcStreamTest, MoreDataThanTheBufferBreaksTheClient) {
  auto c = Client();
  std::vector<char> dst((2 << 20) - 1);
  auto n = c->CallStreamInto(kStream, Request(0, 2 << 20), dst.data(), dst.size(),
                             Deadline::AfterSeconds(10));
  EXPECT_FALSE(n.ok());
  EXPECT_TRUE(c->broken());
}

TEST(DigestFrameTest, RecvChecksDigestsAndRecvWithReportsAMismatchWithoutBreaking) {
  auto token = Token();
  std::atomic<int> handled{0};
  auto server = Server::Start(ServerOptions{}, token, [&](Connection& conn) {
    // Echoes: a good digest frame, then one with a wrong digest.
    std::string data(100000, 'q');
    ConstBuffer part{data.data(), data.size()};
    EXPECT_TRUE(conn.SendDigested(FrameType::kData, &part, 1, Checksum(data.data(), data.size()),
                                  Deadline::AfterSeconds(10))
                    .ok());
    EXPECT_TRUE(conn.SendDigested(FrameType::kData, &part, 1, 42, Deadline::AfterSeconds(10)).ok());
    EXPECT_TRUE(conn.Send(FrameType::kData, "tail", Deadline::AfterSeconds(10)).ok());
    EXPECT_TRUE(conn.SendDigested(FrameType::kData, &part, 1, 43, Deadline::AfterSeconds(10)).ok());
    handled.fetch_add(1);
    (void)conn.Recv(Deadline::AfterSeconds(10));  // until the client closes
  });
  ASSERT_TRUE(server.ok()) << server.status();
  auto conn = Dial("127.0.0.1", (*server)->port(), token, Deadline::AfterSeconds(10));
  ASSERT_TRUE(conn.ok()) << conn.status();
  std::vector<char> buf(100000);
  auto into = [&](FrameType, uint32_t, uint64_t len) -> Result<void*> {
    if (len > buf.size()) return InvalidArgumentError("too big");
    return static_cast<void*>(buf.data());
  };
  auto f = (*conn)->RecvWith(into, Deadline::AfterSeconds(10));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->digest_ok);
  EXPECT_EQ(f->size, 100000u);
  EXPECT_EQ(f->digest, Checksum(buf.data(), buf.size()));
  EXPECT_EQ(buf[99999], 'q');
  f = (*conn)->RecvWith(into, Deadline::AfterSeconds(10));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->digest_ok);
  // Still in step: the plain frame after it arrives intact.
  auto t = (*conn)->Recv(Deadline::AfterSeconds(10));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->payload, "tail");
  // Recv turns a digest mismatch into DataLoss and breaks the connection.
  t = (*conn)->Recv(Deadline::AfterSeconds(10));
  EXPECT_EQ(t.status().code(), StatusCode::kDataLoss) << t.status();
  EXPECT_FALSE((*conn)->Recv(Deadline::AfterSeconds(1)).ok());
  (*conn)->Shutdown();
  (*server)->Stop();
  EXPECT_EQ(handled.load(), 1);
}

}  // namespace
}  // namespace memento::net
