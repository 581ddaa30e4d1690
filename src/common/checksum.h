// Checksums: xxHash3 (64-bit), used per chunk for slots, wire frames and the
// durable tier. Fast enough to run fused with the snapshot copy.
#pragma once

#include <cstddef>
#include <cstdint>

namespace memento {

uint64_t Checksum(const void* data, size_t len);
uint64_t ChecksumWithSeed(const void* data, size_t len, uint64_t seed);

// Copies `len` bytes from `src` to `dst` and returns Checksum(dst, len),
// computed on the bytes while they are still in cache (one pass over memory).
// Regions must not overlap.
uint64_t CopyAndChecksum(void* dst, const void* src, size_t len);

// Incremental xxHash3 over a stream of buffers.
class StreamingChecksum {
 public:
  StreamingChecksum();
  ~StreamingChecksum();
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;

  void Update(const void* data, size_t len);
  uint64_t Digest() const;
  void Reset();

 private:
  void* state_;  // XXH3_state_t, owned
};

}  // namespace memento
