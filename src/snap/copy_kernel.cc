#include "snap/copy_kernel.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace memento::snap {
#if defined(__x86_64__)
namespace internal {
uint64_t CopyAndChecksumAvx2(void* dst, const void* src, size_t len);
uint64_t ChecksumAvx2(const void* data, size_t len);
}  // namespace internal
#endif
namespace {

constexpr size_t kBlock = 64 * 1024;

#if defined(__x86_64__)
// SSE2 is part of x86-64: unaligned loads from the (cached) source, aligned
// streaming stores to the destination.
void StreamCopy(uint8_t* d, const uint8_t* s, size_t n) {
  size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (head > n) head = n;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, n - i);
}
#endif

}  // namespace

uint64_t CopyAndChecksumStreaming(void* dst, const void* src, size_t len) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return internal::CopyAndChecksumAvx2(dst, src, len);
#endif
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
#if defined(__x86_64__)
  if (len < kBlock) {  // small: a plain copy, hashed from cache
    std::memcpy(d, s, len);
    return XXH3_64bits(d, len);
  }
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t off = 0; off < len; off += kBlock) {
    size_t n = len - off < kBlock ? len - off : kBlock;
    XXH3_64bits_update(&state, s + off, n);  // pulls the block into cache
    StreamCopy(d + off, s + off, n);         // copies it from cache
  }
  _mm_sfence();
  return XXH3_64bits_digest(&state);
#else
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t off = 0; off < len; off += kBlock) {
    size_t n = len - off < kBlock ? len - off : kBlock;
    std::memcpy(d + off, s + off, n);
    XXH3_64bits_update(&state, d + off, n);
  }
  return XXH3_64bits_digest(&state);
#endif
}

uint64_t FastChecksum(const void* data, size_t len) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return internal::ChecksumAvx2(data, len);
#endif
  return XXH3_64bits(data, len);
}

}  // namespace memento::snap
