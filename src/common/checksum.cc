#include "common/checksum.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>
#if MEMENTO_XXH_DISPATCH
// The library's run-time dispatcher (AVX-512, AVX2 or SSE2, whichever the CPU
// has) replaces XXH3_64bits, XXH3_64bits_withSeed and XXH3_64bits_update
// below: the same hash values, computed with the widest vectors available.
#include <xxh_x86dispatch.h>
#endif

#include <cstring>

namespace memento {

uint64_t Checksum(const void* data, size_t len) { return XXH3_64bits(data, len); }

uint64_t ChecksumWithSeed(const void* data, size_t len, uint64_t seed) {
  return XXH3_64bits_withSeed(data, len, seed);
}

uint64_t CopyAndChecksum(void* dst, const void* src, size_t len) {
  // Copy in cache-sized blocks and hash each block right after copying it, so
  // the bytes are hashed from L1/L2 instead of being read from memory twice.
  constexpr size_t kBlock = 64 * 1024;
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (size_t off = 0; off < len; off += kBlock) {
    size_t n = len - off < kBlock ? len - off : kBlock;
    std::memcpy(d + off, s + off, n);
    XXH3_64bits_update(&state, d + off, n);
  }
  return XXH3_64bits_digest(&state);
}

StreamingChecksum::StreamingChecksum() : state_(XXH3_createState()) { Reset(); }
StreamingChecksum::~StreamingChecksum() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void StreamingChecksum::Update(const void* data, size_t len) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, len);
}
uint64_t StreamingChecksum::Digest() const {
  return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}
void StreamingChecksum::Reset() { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)); }

}  // namespace memento
