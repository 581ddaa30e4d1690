// The fused copy + checksum kernel of the CPU copy engine.
#pragma once

#include <cstddef>
#include <cstdint>

namespace memento::snap {

// Copies `len` bytes from `src` to `dst` and returns the xxHash3 (64-bit) of
// the bytes, equal to Checksum(dst, len) when `src` is not modified meanwhile.
// One pass over memory: each 64 KiB block is hashed while it is read into
// cache and then written with non-temporal stores, so the destination is
// neither read for ownership nor left in cache (the same traffic as a large
// memcpy). Ends with a store fence: the bytes are globally visible in order
// with later stores (the slot's release of kComplete). Regions must not overlap.
uint64_t CopyAndChecksumStreaming(void* dst, const void* src, size_t len);

// xxHash3 of `len` bytes (the same value as Checksum()), on the fastest
// vector path this CPU has.
uint64_t FastChecksum(const void* data, size_t len);

}  // namespace memento::snap
