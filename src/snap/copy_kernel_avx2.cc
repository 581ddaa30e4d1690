// The AVX2 build of the fused copy + checksum kernel (copy_kernel.h). This
// file alone is compiled with -mavx2; copy_kernel.cc calls it only on CPUs
// that have AVX2. xxHash is inlined here so that XXH3 uses its AVX2 path
// (about 4x the SSE2 path of the shared library on the same core); the hash
// value is the same on every path.
#if defined(__x86_64__) && defined(__AVX2__)

#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include <immintrin.h>
#include <xxhash.h>

#include <cstdint>
#include <cstring>

namespace memento::snap::internal {

namespace {

constexpr size_t kBlock = 64 * 1024;

void StreamCopyAvx2(uint8_t* d, const uint8_t* s, size_t n) {
  size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
  if (head > n) head = n;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  std::memcpy(d + i, s + i, n - i);
}

}  // namespace

uint64_t CopyAndChecksumAvx2(void* dst, const void* src, size_t len) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  if (len < kBlock) {
    std::memcpy(d, s, len);
    return XXH3_64bits(d, len);
  }
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t off = 0; off < len; off += kBlock) {
    size_t n = len - off < kBlock ? len - off : kBlock;
    XXH3_64bits_update(&state, s + off, n);  // pulls the block into cache
    StreamCopyAvx2(d + off, s + off, n);     // writes it around the cache
  }
  _mm_sfence();
  return XXH3_64bits_digest(&state);
}

uint64_t ChecksumAvx2(const void* data, size_t len) { return XXH3_64bits(data, len); }

}  // namespace memento::snap::internal

#endif
