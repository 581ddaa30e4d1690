// Fuzz target: what a trainer (or anyone with the node's uid) can send to
// agent.sock, up to the request object: the length-prefixed frame
// (shm::RecvFrame) and its JSON (shm::RecvJson), then the reply helpers the
// agent answers with (StatusFromJson on what parsed). Fed through a real
// Unix socket pair; the sender closes after the input, so no input may make
// the receiver hang, crash or allocate past kMaxFrameBytes.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

#include "shm/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memento;
  if (size > (size_t{1} << 20)) return 0;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) std::abort();
  int buf = static_cast<int>(size * 2 + 65536);
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  size_t done = 0;
  while (done < size) {
    const ssize_t n = send(sv[0], data + done, size - done, MSG_NOSIGNAL);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  shutdown(sv[0], SHUT_WR);
  for (int i = 0; i < 16; ++i) {
    auto msg = shm::RecvJson(sv[1], Deadline::AfterSeconds(2));
    if (!msg.ok()) break;
    (void)shm::StatusFromJson(*msg);
  }
  close(sv[0]);
  close(sv[1]);
  return 0;
}
