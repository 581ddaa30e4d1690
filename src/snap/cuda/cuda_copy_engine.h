// The CUDA copy path: device memory -> page-locked host slots, without
// touching the training stream.
//
// - PinnedRegion registers an existing host range (a shared-memory slot) with
//   the CUDA runtime once (cudaHostRegister), so DMA reaches it directly.
// - CudaCopyEngine copies in chunks on its own streams created with the
//   lowest priority the device has; each chunk records an event, and at most
//   `max_inflight` chunks are queued at any time (a submit waits for the
//   oldest one). Nothing here synchronises the device or the caller's streams:
//   the engine waits on its own events only.
// - XorParityD2H computes XOR parity of k device buffers with a kernel and
//   copies only the parity over PCIe (REFT AEC), through a small device
//   staging buffer cut into sub-buffers that are filled and drained in a
//   pipeline (Gemini's partition-and-pipelining of a small buffer).
// - CopyH2D is the restore path (host slots back to device memory).
//
// Reed-Solomon parity (rs:f) is not computed on the device: the data pieces
// are copied into host slots with this engine and the codec layer (ISA-L)
// encodes there.
//
// Thread safety: every method may be called from any thread; submissions are
// serialised by an internal mutex, waits run without it. Each call makes the
// engine's device current on the calling thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "memento/deadline.h"
#include "memento/status.h"

namespace memento::cuda {

// Number of CUDA devices (0 when there is no driver or no device).
int DeviceCount();

// A host range page-locked with cudaHostRegister for this object's lifetime.
class PinnedRegion {
 public:
  // InvalidArgument for a null or empty range; Internal with CUDA's message
  // when registration fails (for example a range already registered).
  static Result<std::unique_ptr<PinnedRegion>> Register(void* data, size_t bytes);
  ~PinnedRegion();
  PinnedRegion(const PinnedRegion&) = delete;
  PinnedRegion& operator=(const PinnedRegion&) = delete;
  void* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  PinnedRegion(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void* data_;
  size_t bytes_;
};

// Device memory (cudaMalloc) owned by this object.
class DeviceBuffer {
 public:
  static Result<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes, int device = 0);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  DeviceBuffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void* data_;
  size_t bytes_;
};

struct CudaCopyOptions {
  int device = 0;
  int streams = 2;                                 // copy streams, used round-robin
  size_t chunk_bytes = size_t{4} << 20;            // CopyD2H / CopyH2D chunk size
  int max_inflight = 4;                            // chunks queued at once
  bool low_priority = true;                        // lowest stream priority
  size_t parity_staging_bytes = size_t{16} << 20;  // device staging for parity
  int parity_sub_buffers = 4;
};

class CudaCopyEngine {
 public:
  // InvalidArgument for bad options or a device that does not exist;
  // Unavailable when there is no CUDA device at all.
  static Result<std::unique_ptr<CudaCopyEngine>> Create(const CudaCopyOptions& options);
  ~CudaCopyEngine();  // waits for everything queued
  CudaCopyEngine(const CudaCopyEngine&) = delete;
  CudaCopyEngine& operator=(const CudaCopyEngine&) = delete;

  // Queues one copy (no chunking) and returns its ticket. Blocks only while
  // max_inflight copies are queued. `host` should be page-locked (pinned or
  // registered), else CUDA stages it and the copy is synchronous.
  Result<uint64_t> SubmitD2H(void* host_dst, const void* dev_src, size_t bytes);
  Result<uint64_t> SubmitH2D(void* dev_dst, const void* host_src, size_t bytes);
  // True when the copy of `ticket` has finished (errors count as finished).
  bool Done(uint64_t ticket);
  // Waits for one ticket / for everything submitted so far. DeadlineExceeded
  // when the deadline passes first; Internal for a CUDA error.
  Status Wait(uint64_t ticket, Deadline deadline = Deadline::Infinite());
  Status WaitAll(Deadline deadline = Deadline::Infinite());

  // Chunked copies of a whole range (chunk_bytes each, bounded in flight),
  // returning when all of it has arrived.
  Status CopyD2H(void* host_dst, const void* dev_src, size_t bytes);
  Status CopyH2D(void* dev_dst, const void* host_src, size_t bytes);

  // host_dst[0, bytes) = src[0] ^ src[1] ^ ... ^ src[k-1], each src a device
  // pointer to `bytes` bytes. Only the parity crosses PCIe. InvalidArgument
  // for k outside [1, kMaxParitySources] or null pointers.
  static constexpr int kMaxParitySources = 32;
  Status XorParityD2H(const void* const* dev_srcs, int k, size_t bytes, void* host_dst);

  int device() const { return options_.device; }
  // The priority the copy streams were created with (larger = lower).
  int stream_priority() const { return priority_; }
  const CudaCopyOptions& options() const { return options_; }

 private:
  struct Impl;
  explicit CudaCopyEngine(const CudaCopyOptions& options);
  Result<uint64_t> Submit(void* dst, const void* src, size_t bytes, bool d2h);

  CudaCopyOptions options_;
  int priority_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memento::cuda
