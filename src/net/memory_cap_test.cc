// Bounded memory under hostile peers (issue 21, section 4): real TCP
// connections, authenticated with the job token, that announce large frames
// and stall. A frame above the per-connection cap is refused from its header
// alone; frames that together exceed the server's total cap are read and
// dropped without being held, and answered ResourceExhausted naming the cap.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cstring>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "net/connection.h"
#include "net/memory_budget.h"
#include "net/rpc.h"
#include "net/socket.h"

namespace memento::net {
namespace {

JobToken Token() { return JobToken::FromSecret("memory-cap-test-token-0123").value(); }

constexpr uint32_t kEcho = 1;
constexpr uint64_t kMaxRequest = 2 << 20;   // per connection
constexpr uint64_t kMaxBuffered = 5 << 20;  // all together

// A request frame of `len` payload bytes (an RpcRequestHeader, then filler),
// with its checksum, so that it can be sent in pieces over the raw socket.
std::string RequestFrame(uint64_t id, uint64_t len) {
  std::string payload(len, 'x');
  RpcRequestHeader req{id, kEcho, 0};
  std::memcpy(payload.data(), &req, sizeof(req));
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.version = kFrameVersion;
  h.type = static_cast<uint16_t>(FrameType::kRpcRequest);
  h.payload_len = len;
  StreamingChecksum sum;
  sum.Update(&h, sizeof(h));
  sum.Update(payload.data(), payload.size());
  h.checksum = sum.Digest();
  std::string frame(reinterpret_cast<const char*>(&h), sizeof(h));
  return frame + payload;
}

Status SendRaw(int fd, std::string_view bytes) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  return SendAll(fd, &iov, 1, Deadline::AfterSeconds(20));
}

// Reads one reply frame and returns its status (OK with an empty message for
// a successful reply).
Status ReadReply(Connection& c, uint64_t* id) {
  auto f = c.Recv(Deadline::AfterSeconds(20));
  if (!f.ok()) return f.status();
  if (f->payload.size() < sizeof(RpcReplyHeader)) return DataLossError("short reply");
  RpcReplyHeader rep;
  std::memcpy(&rep, f->payload.data(), sizeof(rep));
  *id = rep.request_id;
  if (rep.status_code == 0) return Status::Ok();
  return Status(static_cast<StatusCode>(rep.status_code),
                f->payload.substr(sizeof(rep), rep.message_len));
}

template <typename Pred>
bool WaitFor(Pred pred, double timeout_s) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

class MemoryCapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.Register(kEcho, [](std::string_view req, Deadline) -> Result<std::string> {
      return std::to_string(req.size());
    });
    ServerOptions o;
    o.connection.max_payload = kMaxRequest;
    o.max_buffered_bytes = kMaxBuffered;
    o.limit_name = "the test's --max-buffered";
    ASSERT_TRUE(server_.Start(o, Token()).ok());
  }
  std::unique_ptr<Connection> Dial() {
    auto c = net::Dial("127.0.0.1", server_.port(), Token(), Deadline::AfterSeconds(10));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  static int Fd(Connection& c) { return dynamic_cast<TcpConnection&>(c).fd(); }

  RpcServer server_;
};

TEST_F(MemoryCapTest, AFrameAboveTheConnectionCapIsRefusedFromItsHeader) {
  auto c = Dial();
  ASSERT_NE(c, nullptr);
  // Announce 1 TiB and send nothing more: the header alone is refused.
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.version = kFrameVersion;
  h.type = static_cast<uint16_t>(FrameType::kRpcRequest);
  h.payload_len = uint64_t{1} << 40;
  ASSERT_TRUE(SendRaw(Fd(*c), std::string_view(reinterpret_cast<char*>(&h), sizeof(h))).ok());
  // The server closes the connection without reading a payload byte.
  char b;
  EXPECT_TRUE(WaitFor([&] { return recv(Fd(*c), &b, 1, MSG_DONTWAIT) == 0; }, 20))
      << "the connection stayed open";
  EXPECT_EQ(server_.budget()->peak(), 0u) << "the server reserved memory for the frame";
  // Other peers are served as before.
  auto ok = RpcClient::Connect("127.0.0.1", server_.port(), Token(), Deadline::AfterSeconds(10));
  ASSERT_TRUE(ok.ok());
  auto r = (*ok)->Call(kEcho, "hi", Deadline::AfterSeconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "2");
}

TEST_F(MemoryCapTest, StalledConnectionsHoldNoMoreThanTheTotalCap) {
  // Six peers each announce a 1.5 MiB request (within the per-connection
  // cap), send part of it and stall: 9 MiB announced against a 5 MiB cap.
  constexpr int kPeers = 6;
  constexpr uint64_t kLen = (3 << 20) / 2;
  std::vector<std::unique_ptr<Connection>> peers;
  std::vector<std::string> frames;
  for (int i = 0; i < kPeers; ++i) {
    peers.push_back(Dial());
    ASSERT_NE(peers.back(), nullptr);
    frames.push_back(RequestFrame(100 + i, kLen));
    const uint64_t in_use = server_.budget()->in_use();
    const uint64_t refused = server_.budget()->refused();
    ASSERT_TRUE(SendRaw(Fd(*peers[i]), std::string_view(frames[i]).substr(0, 4096)).ok());
    // The server has read the header: it either holds the request or refused it.
    ASSERT_TRUE(WaitFor(
        [&] {
          return server_.budget()->in_use() > in_use || server_.budget()->refused() > refused;
        },
        20));
    EXPECT_LE(server_.budget()->in_use(), kMaxBuffered);
  }
  const uint64_t held = kMaxBuffered / kLen;  // 3 requests fit
  EXPECT_EQ(server_.budget()->in_use(), held * kLen);
  EXPECT_EQ(server_.budget()->refused(), kPeers - held);
  EXPECT_LE(server_.budget()->peak(), kMaxBuffered);
  // The peers finish their requests: the held ones are served, the refused
  // ones answered with the cap, and every connection stays usable.
  for (int i = 0; i < kPeers; ++i) {
    ASSERT_TRUE(SendRaw(Fd(*peers[i]), std::string_view(frames[i]).substr(4096)).ok());
  }
  int served = 0, refused = 0;
  for (int i = 0; i < kPeers; ++i) {
    uint64_t id = 0;
    Status s = ReadReply(*peers[i], &id);
    EXPECT_EQ(id, static_cast<uint64_t>(100 + i));
    if (s.ok()) {
      ++served;
    } else {
      ++refused;
      EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
      EXPECT_NE(s.message().find("the test's --max-buffered"), std::string::npos) << s;
    }
  }
  EXPECT_EQ(served, static_cast<int>(held));
  EXPECT_EQ(refused, kPeers - static_cast<int>(held));
  EXPECT_TRUE(WaitFor([&] { return server_.budget()->in_use() == 0; }, 20));
  EXPECT_LE(server_.budget()->peak(), kMaxBuffered);
  // A refused peer's connection is still in step: its next request is served.
  RpcClient again(std::move(peers[kPeers - 1]));
  auto r = again.Call(kEcho, "again", Deadline::AfterSeconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "5");
}

TEST(MemoryBudgetTest, ReservesUpToTheLimitAndGivesBack) {
  MemoryBudget b(100, "--cap");
  auto a = b.Reserve(60);
  ASSERT_TRUE(a.ok());
  auto c = b.Reserve(41);
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("--cap"), std::string::npos);
  EXPECT_EQ(b.Reserve(UINT64_MAX).status().code(), StatusCode::kResourceExhausted);
  {
    auto d = b.Reserve(40);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(b.in_use(), 100u);
  }
  EXPECT_EQ(b.in_use(), 60u);
  a->Release();
  EXPECT_EQ(b.in_use(), 0u);
  EXPECT_EQ(b.peak(), 100u);
  EXPECT_EQ(b.refused(), 2u);
}

}  // namespace
}  // namespace memento::net
