// The fused copy + xxHash3 loop of the copy engine, written once as a
// template over the vector instruction set and instantiated in one
// translation unit per set (copy_kernel.cc: SSE2, copy_kernel_avx2.cc:
// -mavx2, copy_kernel_avx512.cc: -mavx512f), each compiled with its own -m
// flags. Include it from those files only: it pulls in xxhash.h with
// XXH_INLINE_ALL so that XXH3's constants and final merge are the library's
// own.
//
// XXH3_64bits of an input longer than 240 bytes (xxhash.h,
// XXH3_hashLong_64b_internal) keeps eight 64-bit accumulators, feeds them
// 64-byte stripes (XXH3_accumulate_512: data ^ secret window, a 32x32->64
// multiply of the halves, plus the lane-swapped data), scrambles them after
// every block of 16 stripes (1 KiB, with the 192-byte default secret), then
// feeds the last (possibly overlapping) stripe with its own secret window
// and merges. The loop below does exactly that, but every 64-byte stripe is
// loaded into registers once and the same registers are written to the
// destination with non-temporal stores: one read of the source, one write of
// the destination around the cache, like a large memcpy. The value is
// bit-identical to XXH3_64bits (copy_kernel_test.cc checks every kernel
// against it over random lengths and alignments).
#pragma once

#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include <immintrin.h>
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace memento::snap::internal {

constexpr size_t kStripeLen = 64;                                   // XXH_STRIPE_LEN
constexpr size_t kSecretLen = 192;                                  // XXH_SECRET_DEFAULT_SIZE
constexpr size_t kStripesPerBlock = (kSecretLen - kStripeLen) / 8;  // 16
constexpr size_t kBlockLen = kStripeLen * kStripesPerBlock;         // 1 KiB
constexpr size_t kLongMin = 241;                                    // XXH3_MIDSIZE_MAX + 1
// Bytes hashed before they are copied when the destination is not aligned
// for streaming stores (see CopyAndChecksumImpl). A multiple of kBlockLen.
constexpr size_t kUnalignedBlock = 64 * 1024;
static_assert(kStripesPerBlock == 16 && kUnalignedBlock % kBlockLen == 0);

// How far ahead of the stripe being hashed the source is prefetched. The
// hardware prefetcher follows the stream too; this only hides its ramp-up at
// page boundaries (tuned on the development VM with `memento bench snapshot`).
constexpr size_t kPrefetchDistance = 1024;

// An instruction set is a struct (defined in its own translation unit):
//   using Vec = <vector type>;  kLanes = 64 / sizeof(Vec);  kAlign (bytes a
//   streaming store needs); Vec Load(const void*) (unaligned);
//   void Stream(void*, Vec); void Accumulate(Vec* acc, Vec data, Vec key)
//   and void Scramble(Vec* acc, Vec key): XXH3_accumulate_512 and
//   XXH3_scrambleAcc on one vector, lane for lane as xxhash.h's versions.

// Feeds `n` stripes of `s` to the accumulators (secret window advancing 8
// bytes per stripe from `secret`); with kStore also streams them to `d`,
// which must then be aligned to Isa::kAlign.
template <class Isa, bool kStore>
inline void Stripes(typename Isa::Vec* acc, uint8_t* d, const uint8_t* s, size_t n,
                    const uint8_t* secret) {
  using Vec = typename Isa::Vec;
  for (size_t k = 0; k < n; ++k) {
    const uint8_t* in = s + k * kStripeLen;
    _mm_prefetch(reinterpret_cast<const char*>(in + kPrefetchDistance), _MM_HINT_T0);
    Vec data[Isa::kLanes];
    for (int l = 0; l < Isa::kLanes; ++l) data[l] = Isa::Load(in + l * sizeof(Vec));
    for (int l = 0; l < Isa::kLanes; ++l) {
      Isa::Accumulate(&acc[l], data[l], Isa::Load(secret + k * 8 + l * sizeof(Vec)));
    }
    if constexpr (kStore) {
      for (int l = 0; l < Isa::kLanes; ++l) {
        Isa::Stream(d + k * kStripeLen + l * sizeof(Vec), data[l]);
      }
    }
  }
}

// `n` whole blocks of 16 stripes, each followed by the scramble.
template <class Isa, bool kStore>
inline void Blocks(typename Isa::Vec* acc, uint8_t* d, const uint8_t* s, size_t n) {
  using Vec = typename Isa::Vec;
  const uint8_t* secret = XXH3_kSecret;
  for (size_t b = 0; b < n; ++b) {
    Stripes<Isa, kStore>(acc, kStore ? d + b * kBlockLen : nullptr, s + b * kBlockLen,
                         kStripesPerBlock, secret);
    for (int l = 0; l < Isa::kLanes; ++l) {
      Isa::Scramble(&acc[l], Isa::Load(secret + kSecretLen - kStripeLen + l * sizeof(Vec)));
    }
  }
}

// Copies n bytes with aligned streaming stores (unaligned loads); the head
// up to the first aligned destination byte and the tail by memcpy.
template <class Isa>
inline void StreamCopy(uint8_t* d, const uint8_t* s, size_t n) {
  using Vec = typename Isa::Vec;
  size_t head =
      (Isa::kAlign - (reinterpret_cast<uintptr_t>(d) & (Isa::kAlign - 1))) & (Isa::kAlign - 1);
  if (head > n) head = n;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t i = 0;
  for (; i + kStripeLen <= n; i += kStripeLen) {
    Vec v[Isa::kLanes];
    for (int l = 0; l < Isa::kLanes; ++l) v[l] = Isa::Load(s + i + l * sizeof(Vec));
    for (int l = 0; l < Isa::kLanes; ++l) Isa::Stream(d + i + l * sizeof(Vec), v[l]);
  }
  std::memcpy(d + i, s + i, n - i);
}

template <class Isa>
inline void InitAcc(typename Isa::Vec* acc) {
  alignas(64) static const uint64_t kInit[8] = XXH3_INIT_ACC;
  for (int l = 0; l < Isa::kLanes; ++l) {
    acc[l] = Isa::Load(reinterpret_cast<const uint8_t*>(kInit) + l * sizeof(acc[0]));
  }
}

// The last stripe (the final 64 bytes, overlapping the ones before) and the
// merge, as XXH3_hashLong_64b_internal.
template <class Isa>
inline uint64_t Finish(typename Isa::Vec* acc, const uint8_t* s, size_t len) {
  Stripes<Isa, false>(acc, nullptr, s + len - kStripeLen, 1,
                      XXH3_kSecret + kSecretLen - kStripeLen - 7 /*XXH_SECRET_LASTACC_START*/);
  alignas(64) uint64_t out[8];
  std::memcpy(out, acc, sizeof(out));
  return XXH3_mergeAccs(out, XXH3_kSecret + 11 /*XXH_SECRET_MERGEACCS_START*/,
                        static_cast<uint64_t>(len) * XXH_PRIME64_1);
}

// xxHash3 (64-bit) of `len` bytes; equal to XXH3_64bits(data, len).
template <class Isa>
inline uint64_t ChecksumImpl(const void* data, size_t len) {
  const auto* s = static_cast<const uint8_t*>(data);
  if (len < kLongMin) return XXH3_64bits(s, len);
  typename Isa::Vec acc[Isa::kLanes];
  InitAcc<Isa>(acc);
  const size_t blocks = (len - 1) / kBlockLen;
  Blocks<Isa, false>(acc, nullptr, s, blocks);
  const size_t stripes = ((len - 1) - blocks * kBlockLen) / kStripeLen;
  Stripes<Isa, false>(acc, nullptr, s + blocks * kBlockLen, stripes, XXH3_kSecret);
  return Finish<Isa>(acc, s, len);
}

// Copies `len` bytes and returns XXH3_64bits of them (copy_kernel.h).
// kFused = false always takes the two-pass path (hash a 64 KiB block, then
// stream-copy it from cache): the kernel before the fused loop, kept for
// `memento bench snapshot --kernel` comparisons.
template <class Isa, bool kFused = true>
inline uint64_t CopyAndChecksumImpl(void* dst, const void* src, size_t len) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  if (len < kLongMin) {
    std::memcpy(d, s, len);
    return XXH3_64bits(s, len);
  }
  typename Isa::Vec acc[Isa::kLanes];
  InitAcc<Isa>(acc);
  const size_t blocks = (len - 1) / kBlockLen;
  const size_t stripes = ((len - 1) - blocks * kBlockLen) / kStripeLen;
  const size_t body = blocks * kBlockLen;           // whole blocks
  const size_t done = body + stripes * kStripeLen;  // then whole stripes; 1..64 bytes remain
  if (kFused && (reinterpret_cast<uintptr_t>(d) & (Isa::kAlign - 1)) == 0) {
    // One pass: each stripe is loaded once, hashed and streamed out.
    Blocks<Isa, true>(acc, d, s, blocks);
    Stripes<Isa, true>(acc, d + body, s + body, stripes, XXH3_kSecret);
  } else {
    // The destination cannot take aligned streaming stores at the stripes'
    // offsets: hash a cache-sized block (pulling it into cache), then copy
    // it from cache with realigned streaming stores.
    for (size_t off = 0; off < body; off += kUnalignedBlock) {
      const size_t n = body - off < kUnalignedBlock ? body - off : kUnalignedBlock;
      Blocks<Isa, false>(acc, nullptr, s + off, n / kBlockLen);
      StreamCopy<Isa>(d + off, s + off, n);
    }
    Stripes<Isa, false>(acc, nullptr, s + body, stripes, XXH3_kSecret);
    StreamCopy<Isa>(d + body, s + body, done - body);
  }
  std::memcpy(d + done, s + done, len - done);
  _mm_sfence();  // the streamed bytes are ordered before later stores
  return Finish<Isa>(acc, s, len);
}

}  // namespace memento::snap::internal
