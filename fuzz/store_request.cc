// Fuzz target: the RPC request decoder (net::RpcServer) and the embedded
// store's message decoders (coord::EmbeddedStoreServer), over a real
// authenticated TCP connection to a real server in this process. The input
// is a sequence of requests, each `u32 method, u16 length, body`; each goes
// out as one kRpcRequest frame (request header + body, the caller's deadline
// clamped to 20 ms so that Wait and WatchPoll return quickly) and its reply
// is read back. No input may crash the server, hang it or break the
// connection for a well-formed frame.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "coord/embedded_store.h"
#include "net/connection.h"
#include "net/job_token.h"
#include "net/rpc.h"

namespace {

using namespace memento;

struct Harness {
  net::JobToken token = *net::JobToken::FromSecret("fuzz-token-0123456789abcdef");
  std::unique_ptr<coord::EmbeddedStoreServer> server;
  std::unique_ptr<net::Connection> conn;
  uint64_t next_id = 1;

  Harness() {
    auto s = coord::EmbeddedStoreServer::Start("127.0.0.1", 0, token);
    if (!s.ok()) std::abort();
    server = std::move(*s);
  }
  net::Connection* Conn() {
    if (!conn) {
      auto c = net::Dial("127.0.0.1", server->port(), token, Deadline::AfterSeconds(5));
      if (!c.ok()) std::abort();
      conn = std::move(*c);
    }
    return conn.get();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness* h = new Harness();
  size_t pos = 0;
  for (int calls = 0; calls < 16 && pos + 6 <= size; ++calls) {
    uint32_t method = 0;
    uint16_t len = 0;
    std::memcpy(&method, data + pos, 4);
    std::memcpy(&len, data + pos + 4, 2);
    pos += 6;
    len = static_cast<uint16_t>(std::min<size_t>(len, size - pos));
    net::RpcRequestHeader rh{h->next_id++, method, 20};
    std::string payload(reinterpret_cast<const char*>(&rh), sizeof(rh));
    payload.append(reinterpret_cast<const char*>(data + pos), len);
    pos += len;
    net::Connection* c = h->Conn();
    if (!c->Send(net::FrameType::kRpcRequest, payload, Deadline::AfterSeconds(5)).ok()) {
      h->conn.reset();
      continue;
    }
    auto reply = c->Recv(Deadline::AfterSeconds(5));
    if (!reply.ok()) {
      // The server closes a connection only for a broken frame; these are not.
      std::abort();
    }
  }
  return 0;
}
