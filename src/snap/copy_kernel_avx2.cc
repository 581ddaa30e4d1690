// The AVX2 instantiation of the fused copy + checksum loop
// (copy_kernel_impl.h). This file alone is compiled with -mavx2;
// copy_kernel.cc calls it only on CPUs that have AVX2.
#if defined(__x86_64__) && defined(__AVX2__)

#include "snap/copy_kernel_impl.h"

namespace memento::snap::internal {
namespace {

// xxhash.h XXH3_accumulate_512_avx2 / XXH3_scrambleAcc_avx2, one vector.
struct Avx2 {
  using Vec = __m256i;
  static constexpr int kLanes = 2;
  static constexpr size_t kAlign = 32;
  static Vec Load(const void* p) { return _mm256_loadu_si256(static_cast<const Vec*>(p)); }
  static void Stream(void* p, Vec v) { _mm256_stream_si256(static_cast<Vec*>(p), v); }
  static void Accumulate(Vec* acc, Vec data, Vec key) {
    Vec data_key = _mm256_xor_si256(data, key);
    Vec data_key_lo = _mm256_shuffle_epi32(data_key, _MM_SHUFFLE(0, 3, 0, 1));
    Vec product = _mm256_mul_epu32(data_key, data_key_lo);
    Vec data_swap = _mm256_shuffle_epi32(data, _MM_SHUFFLE(1, 0, 3, 2));
    *acc = _mm256_add_epi64(product, _mm256_add_epi64(*acc, data_swap));
  }
  static void Scramble(Vec* acc, Vec key) {
    const Vec prime32 = _mm256_set1_epi32(static_cast<int>(XXH_PRIME32_1));
    Vec data = _mm256_xor_si256(*acc, _mm256_srli_epi64(*acc, 47));
    Vec data_key = _mm256_xor_si256(data, key);
    Vec data_key_hi = _mm256_shuffle_epi32(data_key, _MM_SHUFFLE(0, 3, 0, 1));
    Vec prod_lo = _mm256_mul_epu32(data_key, prime32);
    Vec prod_hi = _mm256_mul_epu32(data_key_hi, prime32);
    *acc = _mm256_add_epi64(prod_lo, _mm256_slli_epi64(prod_hi, 32));
  }
};

}  // namespace

uint64_t CopyAndChecksumAvx2(void* dst, const void* src, size_t len) {
  return CopyAndChecksumImpl<Avx2>(dst, src, len);
}
uint64_t CopyAndChecksumAvx2TwoPass(void* dst, const void* src, size_t len) {
  return CopyAndChecksumImpl<Avx2, /*kFused=*/false>(dst, src, len);
}
uint64_t ChecksumAvx2(const void* data, size_t len) { return ChecksumImpl<Avx2>(data, len); }

}  // namespace memento::snap::internal

#endif
