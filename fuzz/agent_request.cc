// Fuzz target: agent.sock's request parser (shm::ParseAgentRequest), the
// function every message a trainer sends goes through before the agent acts
// on it: the input is one frame body. No input may crash, hang or be
// accepted with a field outside its documented range.
#include <cstdint>
#include <string_view>

#include "shm/agent_messages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto req =
      memento::shm::ParseAgentRequest(std::string_view(reinterpret_cast<const char*>(data), size));
  (void)req;
  return 0;
}
