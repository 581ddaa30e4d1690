// The fused copy + checksum kernel of the CPU copy engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memento/status.h"

namespace memento::snap {

// Copies `len` bytes from `src` to `dst` and returns the xxHash3 (64-bit) of
// the bytes, equal to Checksum(dst, len) when `src` is not modified meanwhile.
// One pass over memory: each 64-byte stripe is loaded into vector registers
// once, fed to XXH3's accumulators and written from the same registers with
// non-temporal stores, so the destination is neither read for ownership nor
// left in cache (the traffic of a large memcpy). A destination that is not
// aligned for streaming stores (32 bytes with AVX2) takes a two-pass path per
// 64 KiB block instead (hash, then copy from cache). Ends with a store fence:
// the bytes are globally visible in order with later stores (the slot's
// release of kComplete). Regions must not overlap. Thread-safe.
uint64_t CopyAndChecksumStreaming(void* dst, const void* src, size_t len);

// xxHash3 of `len` bytes (the same value as Checksum()), on the fastest
// vector path this CPU has.
uint64_t FastChecksum(const void* data, size_t len);

// One build of the kernel for one instruction set.
struct CopyKernel {
  // "avx512", "avx2", "sse2" (the fused loop); "avx2-twopass" (hash each
  // 64 KiB block, then stream-copy it: the kernel before the fused loop);
  // "portable" (memcpy, then XXH3 from cache; the only one off x86-64).
  const char* name;
  uint64_t (*copy_and_checksum)(void* dst, const void* src, size_t len);
  uint64_t (*checksum)(const void* data, size_t len);
};

// Every kernel this CPU can run, the default first.
std::vector<CopyKernel> AvailableCopyKernels();

// The kernel behind CopyAndChecksumStreaming and FastChecksum: the one
// selected last, else the default (the widest vector set the CPU has:
// avx512, avx2, sse2).
const CopyKernel& ActiveCopyKernel();

// Makes `name` the active kernel for the whole process (benchmarks,
// comparisons). InvalidArgument naming the available ones when this CPU
// cannot run it. Not for use while copies run.
[[nodiscard]] Status SelectCopyKernel(std::string_view name);

// SelectCopyKernel, unless a kernel was selected or used already in this
// process: a process's edge passes the kernel its user named
// (MEMENTO_COPY_KERNEL, read by `memento` in tools/environment.cc and by
// Client::Connect), and an explicit choice made before (a benchmark's
// --kernel) stands. InvalidArgument as SelectCopyKernel.
[[nodiscard]] Status SelectCopyKernelUnlessChosen(std::string_view name);

}  // namespace memento::snap
