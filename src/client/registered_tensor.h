// One tensor or blob a trainer registered with its Client (include/memento/client.h).
#pragma once

#include "memento/types.h"

namespace memento::client {

// The memory stays the caller's; it must stay valid and at the same address
// until the Client is destroyed.
struct RegisteredTensor {
  TensorMeta meta;
  void* data = nullptr;
  Device device;
};

}  // namespace memento::client
