#include "shm/protocol.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <thread>

#include "shm/shm_test_util.h"

namespace memento::shm {
namespace {

TEST(ProtocolTest, FramesRoundTrip) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  Deadline d = Deadline::AfterSeconds(5);
  nlohmann::json msg = {{"op", "hello"}, {"rank", 3}};
  ASSERT_TRUE(SendJson(sv[0], msg, d).ok());
  auto got = RecvJson(sv[1], d);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, msg);
  std::string big(3 << 20, 'x');
  Status sent;
  std::thread sender([&] { sent = SendFrame(sv[1], big, d); });
  auto body = RecvFrame(sv[0], d);
  sender.join();
  EXPECT_TRUE(sent.ok()) << sent;
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, big);
  close(sv[0]);
  close(sv[1]);
}

TEST(ProtocolTest, MalformedAndClosed) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  Deadline d = Deadline::AfterSeconds(5);
  const char huge[4] = {'\xff', '\xff', '\xff', '\x7f'};
  ASSERT_EQ(write(sv[0], huge, 4), 4);
  EXPECT_EQ(RecvFrame(sv[1], d).status().code(), StatusCode::kDataLoss);
  ASSERT_TRUE(SendFrame(sv[0], "not json", d).ok());
  EXPECT_EQ(RecvJson(sv[1], d).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(RecvFrame(sv[1], Deadline::AfterSeconds(0.05)).status().code(),
            StatusCode::kDeadlineExceeded);
  close(sv[0]);
  EXPECT_EQ(RecvFrame(sv[1], d).status().code(), StatusCode::kUnavailable);
  close(sv[1]);
}

TEST(ProtocolTest, StatusTravels) {
  Status st = DataLossError("chunk 3");
  Status back = StatusFromJson(StatusToJson(st));
  EXPECT_EQ(back.code(), StatusCode::kDataLoss);
  EXPECT_NE(back.message().find("chunk 3"), std::string::npos);
  EXPECT_TRUE(StatusFromJson(StatusToJson(Status::Ok())).ok());
  EXPECT_EQ(StatusFromJson(nlohmann::json{{"x", 1}}).code(), StatusCode::kDataLoss);
}

// Found by the agent_frame fuzz target: fields of the wrong type threw
// nlohmann::type_error out of StatusFromJson (and terminated the process).
TEST(ProtocolTest, StatusFromJsonToleratesWrongTypes) {
  Status a = StatusFromJson(nlohmann::json{{"ok", false}, {"code", "x"}, {"message", 5}});
  EXPECT_EQ(a.code(), StatusCode::kInternal);
  EXPECT_NE(a.message().find("(no message)"), std::string::npos);
  EXPECT_EQ(StatusFromJson(nlohmann::json{{"ok", false}, {"code", 1e30}}).code(),
            StatusCode::kInternal);
  EXPECT_EQ(StatusFromJson(nlohmann::json{{"ok", false}, {"code", -3}}).code(),
            StatusCode::kInternal);
  Status b = StatusFromJson(nlohmann::json{
      {"ok", false}, {"code", static_cast<int>(StatusCode::kNotFound)}, {"message", "m"}});
  EXPECT_EQ(b.code(), StatusCode::kNotFound);
  EXPECT_NE(b.message().find("m"), std::string::npos);
}

TEST(ProtocolTest, ListenConnectStaleAndPeerCred) {
  testing::ShmScratchDir dir;
  std::string path = AgentSocketPath(dir.path());
  EXPECT_EQ(ConnectUnix(path).status().code(), StatusCode::kNotFound);
  auto lfd = ListenUnix(path);
  ASSERT_TRUE(lfd.ok()) << lfd.status();
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(ListenUnix(path).status().code(), StatusCode::kAlreadyExists);
  auto cfd = ConnectUnix(path);
  ASSERT_TRUE(cfd.ok()) << cfd.status();
  int afd = accept(*lfd, nullptr, nullptr);
  ASSERT_GE(afd, 0);
  auto cred = GetPeerCred(afd);
  ASSERT_TRUE(cred.ok());
  EXPECT_EQ(cred->uid, geteuid());
  EXPECT_EQ(cred->pid, getpid());
  close(afd);
  close(*cfd);
  close(*lfd);  // the socket file stays behind: stale
  EXPECT_EQ(ConnectUnix(path).status().code(), StatusCode::kUnavailable);
  auto again = ListenUnix(path);
  ASSERT_TRUE(again.ok()) << again.status();
  close(*again);
}

}  // namespace
}  // namespace memento::shm
