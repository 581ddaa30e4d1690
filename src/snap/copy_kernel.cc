#include "snap/copy_kernel.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "fmt/format.h"

#if defined(__x86_64__)
#include "snap/copy_kernel_impl.h"  // SSE2 is part of x86-64: no -m flag needed
#else
#define XXH_INLINE_ALL
#include <xxhash.h>
#endif

namespace memento::snap {
namespace internal {
#if defined(__x86_64__)
uint64_t CopyAndChecksumAvx2(void* dst, const void* src, size_t len);
uint64_t CopyAndChecksumAvx2TwoPass(void* dst, const void* src, size_t len);
uint64_t ChecksumAvx2(const void* data, size_t len);
#if defined(MEMENTO_SNAP_HAVE_AVX512)
uint64_t CopyAndChecksumAvx512(void* dst, const void* src, size_t len);
uint64_t ChecksumAvx512(const void* data, size_t len);
#endif
#endif
}  // namespace internal

namespace {

#if defined(__x86_64__)
// xxhash.h XXH3_accumulate_512_sse2 / XXH3_scrambleAcc_sse2, one vector.
struct Sse2 {
  using Vec = __m128i;
  static constexpr int kLanes = 4;
  static constexpr size_t kAlign = 16;
  static Vec Load(const void* p) { return _mm_loadu_si128(static_cast<const Vec*>(p)); }
  static void Stream(void* p, Vec v) { _mm_stream_si128(static_cast<Vec*>(p), v); }
  static void Accumulate(Vec* acc, Vec data, Vec key) {
    Vec data_key = _mm_xor_si128(data, key);
    Vec data_key_lo = _mm_shuffle_epi32(data_key, _MM_SHUFFLE(0, 3, 0, 1));
    Vec product = _mm_mul_epu32(data_key, data_key_lo);
    Vec data_swap = _mm_shuffle_epi32(data, _MM_SHUFFLE(1, 0, 3, 2));
    *acc = _mm_add_epi64(product, _mm_add_epi64(*acc, data_swap));
  }
  static void Scramble(Vec* acc, Vec key) {
    const Vec prime32 = _mm_set1_epi32(static_cast<int>(XXH_PRIME32_1));
    Vec data = _mm_xor_si128(*acc, _mm_srli_epi64(*acc, 47));
    Vec data_key = _mm_xor_si128(data, key);
    Vec data_key_hi = _mm_shuffle_epi32(data_key, _MM_SHUFFLE(0, 3, 0, 1));
    Vec prod_lo = _mm_mul_epu32(data_key, prime32);
    Vec prod_hi = _mm_mul_epu32(data_key_hi, prime32);
    *acc = _mm_add_epi64(prod_lo, _mm_slli_epi64(prod_hi, 32));
  }
};

uint64_t CopySse2(void* dst, const void* src, size_t len) {
  return internal::CopyAndChecksumImpl<Sse2>(dst, src, len);
}
uint64_t SumSse2(const void* data, size_t len) { return internal::ChecksumImpl<Sse2>(data, len); }
#endif

// Copy in cache-sized blocks, hashing each block from cache right after it.
uint64_t CopyPortable(void* dst, const void* src, size_t len) {
  constexpr size_t kBlock = 64 * 1024;
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t off = 0; off < len; off += kBlock) {
    size_t n = len - off < kBlock ? len - off : kBlock;
    std::memcpy(d + off, s + off, n);
    XXH3_64bits_update(&state, d + off, n);
  }
  return XXH3_64bits_digest(&state);
}
uint64_t SumPortable(const void* data, size_t len) { return XXH3_64bits(data, len); }

std::vector<CopyKernel> Detect() {
  std::vector<CopyKernel> out;
#if defined(__x86_64__)
  // The widest first: with AVX-512 each stripe is one register and one
  // full-line streaming store (measured faster than AVX2 on the development
  // VM, docs/node_store.md); MEMENTO_COPY_KERNEL=avx2 where 512-bit code
  // lowers the clock of the cores the trainer runs on.
#if defined(MEMENTO_SNAP_HAVE_AVX512)
  if (__builtin_cpu_supports("avx512f")) {
    out.push_back({"avx512", internal::CopyAndChecksumAvx512, internal::ChecksumAvx512});
  }
#endif
  if (__builtin_cpu_supports("avx2")) {
    out.push_back({"avx2", internal::CopyAndChecksumAvx2, internal::ChecksumAvx2});
  }
  out.push_back({"sse2", CopySse2, SumSse2});
  if (__builtin_cpu_supports("avx2")) {
    out.push_back({"avx2-twopass", internal::CopyAndChecksumAvx2TwoPass, internal::ChecksumAvx2});
  }
#endif
  out.push_back({"portable", CopyPortable, SumPortable});
  return out;
}

const std::vector<CopyKernel>& Kernels() {
  static const std::vector<CopyKernel> kernels = Detect();
  return kernels;
}

const CopyKernel* Find(std::string_view name) {
  for (const CopyKernel& k : Kernels()) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

std::atomic<const CopyKernel*> active{nullptr};

Status NotAvailable(std::string_view name) {
  std::string names;
  for (const CopyKernel& c : Kernels()) names += std::string(names.empty() ? "" : ", ") + c.name;
  return InvalidArgumentError(
      fmt::format("copy kernel '{}' is not available on this CPU (available: {})", name, names));
}

}  // namespace

std::vector<CopyKernel> AvailableCopyKernels() { return Kernels(); }

const CopyKernel& ActiveCopyKernel() {
  const CopyKernel* k = active.load(std::memory_order_acquire);
  if (k == nullptr) {
    const CopyKernel* init = &Kernels().front();
    active.compare_exchange_strong(k, init, std::memory_order_acq_rel);
    k = active.load(std::memory_order_acquire);
  }
  return *k;
}

Status SelectCopyKernel(std::string_view name) {
  const CopyKernel* k = Find(name);
  if (k == nullptr) return NotAvailable(name);
  active.store(k, std::memory_order_release);
  return Status::Ok();
}

Status SelectCopyKernelUnlessChosen(std::string_view name) {
  const CopyKernel* k = Find(name);
  if (k == nullptr) return NotAvailable(name);
  const CopyKernel* none = nullptr;
  active.compare_exchange_strong(none, k, std::memory_order_acq_rel);
  return Status::Ok();
}

uint64_t CopyAndChecksumStreaming(void* dst, const void* src, size_t len) {
  return ActiveCopyKernel().copy_and_checksum(dst, src, len);
}

uint64_t FastChecksum(const void* data, size_t len) {
  return ActiveCopyKernel().checksum(data, len);
}

}  // namespace memento::snap
