// The AVX-512 instantiation of the fused copy + checksum loop
// (copy_kernel_impl.h): one 64-byte register per stripe, full-line
// streaming stores. This file alone is compiled with -mavx512f;
// copy_kernel.cc calls it only on CPUs that have AVX-512F.
#if defined(__x86_64__) && defined(__AVX512F__)

#include "snap/copy_kernel_impl.h"

namespace memento::snap::internal {
namespace {

// xxhash.h XXH3_accumulate_512_avx512 / XXH3_scrambleAcc_avx512.
struct Avx512 {
  using Vec = __m512i;
  static constexpr int kLanes = 1;
  static constexpr size_t kAlign = 64;
  static Vec Load(const void* p) { return _mm512_loadu_si512(p); }
  static void Stream(void* p, Vec v) { _mm512_stream_si512(static_cast<Vec*>(p), v); }
  static void Accumulate(Vec* acc, Vec data, Vec key) {
    Vec data_key = _mm512_xor_si512(data, key);
    Vec data_key_lo = _mm512_shuffle_epi32(data_key, (_MM_PERM_ENUM)_MM_SHUFFLE(0, 3, 0, 1));
    Vec product = _mm512_mul_epu32(data_key, data_key_lo);
    Vec data_swap = _mm512_shuffle_epi32(data, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2));
    *acc = _mm512_add_epi64(product, _mm512_add_epi64(*acc, data_swap));
  }
  static void Scramble(Vec* acc, Vec key) {
    const Vec prime32 = _mm512_set1_epi32(static_cast<int>(XXH_PRIME32_1));
    Vec data = _mm512_xor_si512(*acc, _mm512_srli_epi64(*acc, 47));
    Vec data_key = _mm512_xor_si512(data, key);
    Vec data_key_hi = _mm512_shuffle_epi32(data_key, (_MM_PERM_ENUM)_MM_SHUFFLE(0, 3, 0, 1));
    Vec prod_lo = _mm512_mul_epu32(data_key, prime32);
    Vec prod_hi = _mm512_mul_epu32(data_key_hi, prime32);
    *acc = _mm512_add_epi64(prod_lo, _mm512_slli_epi64(prod_hi, 32));
  }
};

}  // namespace

uint64_t CopyAndChecksumAvx512(void* dst, const void* src, size_t len) {
  return CopyAndChecksumImpl<Avx512>(dst, src, len);
}
uint64_t ChecksumAvx512(const void* data, size_t len) { return ChecksumImpl<Avx512>(data, len); }

}  // namespace memento::snap::internal

#endif
