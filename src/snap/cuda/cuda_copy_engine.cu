#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "snap/cuda/cuda_copy_engine.h"

namespace memento::cuda {
namespace {

Status CudaError(cudaError_t err, const char* what) {
  cudaGetLastError();  // clear it, so that a later launch check does not see it
  return Status(StatusCode::kInternal, std::string("CUDA ") + what + ": " + cudaGetErrorName(err) +
                                           " (" + cudaGetErrorString(err) + ")");
}

#define MEMENTO_CUDA_RETURN_IF_ERROR(expr, what)   \
  do {                                             \
    cudaError_t memento_cuda_err_ = (expr);        \
    if (memento_cuda_err_ != cudaSuccess) {        \
      return CudaError(memento_cuda_err_, (what)); \
    }                                              \
  } while (0)

// Waits for an event until the deadline: a blocking wait when the deadline is
// infinite (events are created with cudaEventBlockingSync, so the thread
// sleeps), else polling.
Status WaitEvent(cudaEvent_t ev, Deadline deadline) {
  if (deadline.infinite()) {
    MEMENTO_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev), "event synchronize");
    return Status::Ok();
  }
  while (true) {
    cudaError_t err = cudaEventQuery(ev);
    if (err == cudaSuccess) return Status::Ok();
    if (err != cudaErrorNotReady) return CudaError(err, "event query");
    if (deadline.expired()) {
      return Status(StatusCode::kDeadlineExceeded, "CUDA copy still running at the deadline");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

struct XorSources {
  const uint8_t* src[CudaCopyEngine::kMaxParitySources];
  int k;
};

// dst[i] = XOR over j of src[j][offset + i], 16 bytes per thread and step when
// every pointer is 16-byte aligned (vector path), else byte by byte.
__global__ void XorKernel16(XorSources s, size_t offset, uint4* dst, size_t n16) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n16;
       i += size_t{gridDim.x} * blockDim.x) {
    uint4 acc = reinterpret_cast<const uint4*>(s.src[0] + offset)[i];
    for (int j = 1; j < s.k; ++j) {
      const uint4 v = reinterpret_cast<const uint4*>(s.src[j] + offset)[i];
      acc.x ^= v.x;
      acc.y ^= v.y;
      acc.z ^= v.z;
      acc.w ^= v.w;
    }
    dst[i] = acc;
  }
}

__global__ void XorKernel1(XorSources s, size_t offset, uint8_t* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint8_t acc = s.src[0][offset + i];
    for (int j = 1; j < s.k; ++j) acc ^= s.src[j][offset + i];
    dst[i] = acc;
  }
}

}  // namespace

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

// ---- PinnedRegion / DeviceBuffer ------------------------------------------------

Result<std::unique_ptr<PinnedRegion>> PinnedRegion::Register(void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) {
    return Status(StatusCode::kInvalidArgument, "PinnedRegion: empty range");
  }
  MEMENTO_CUDA_RETURN_IF_ERROR(cudaHostRegister(data, bytes, cudaHostRegisterPortable),
                               "cudaHostRegister");
  return std::unique_ptr<PinnedRegion>(new PinnedRegion(data, bytes));
}

PinnedRegion::~PinnedRegion() { cudaHostUnregister(data_); }

Result<std::unique_ptr<DeviceBuffer>> DeviceBuffer::Allocate(size_t bytes, int device) {
  if (bytes == 0) return Status(StatusCode::kInvalidArgument, "DeviceBuffer: 0 bytes");
  MEMENTO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "cudaSetDevice");
  void* p = nullptr;
  MEMENTO_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes), "cudaMalloc");
  return std::unique_ptr<DeviceBuffer>(new DeviceBuffer(p, bytes));
}

DeviceBuffer::~DeviceBuffer() { cudaFree(data_); }

// ---- CudaCopyEngine -------------------------------------------------------------

struct CudaCopyEngine::Impl {
  struct Slot {
    cudaEvent_t ev = nullptr;
    uint64_t ticket = 0;  // 0: never used
  };
  std::mutex mu;  // guards ring, next_ticket, stream use for submissions
  std::vector<cudaStream_t> streams;
  std::vector<Slot> ring;  // ticket t lives in ring[t % size] until reused
  uint64_t next_ticket = 1;

  std::mutex parity_mu;  // one parity pipeline at a time
  cudaStream_t kernel_stream = nullptr;
  void* staging = nullptr;
  std::vector<cudaEvent_t> kernel_done, copy_done;
  int sms = 1;
};

CudaCopyEngine::CudaCopyEngine(const CudaCopyOptions& options)
    : options_(options), impl_(new Impl) {}

Result<std::unique_ptr<CudaCopyEngine>> CudaCopyEngine::Create(const CudaCopyOptions& o) {
  const int n = DeviceCount();
  if (n == 0) return Status(StatusCode::kUnavailable, "CudaCopyEngine: no CUDA device");
  if (o.device < 0 || o.device >= n) {
    return Status(
        StatusCode::kInvalidArgument,
        "CudaCopyEngine: device " + std::to_string(o.device) + " of " + std::to_string(n));
  }
  if (o.streams < 1 || o.max_inflight < 1 || o.chunk_bytes == 0 || o.parity_sub_buffers < 1 ||
      o.parity_staging_bytes < size_t{16} * o.parity_sub_buffers) {
    return Status(StatusCode::kInvalidArgument,
                  "CudaCopyEngine: streams, max_inflight, chunk_bytes and parity_sub_buffers "
                  "must be positive and the staging buffer at least 16 bytes per sub-buffer");
  }
  std::unique_ptr<CudaCopyEngine> e(new CudaCopyEngine(o));
  Impl& im = *e->impl_;
  MEMENTO_CUDA_RETURN_IF_ERROR(cudaSetDevice(o.device), "cudaSetDevice");
  int least = 0, greatest = 0;
  MEMENTO_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                               "stream priority range");
  // CUDA: lower numbers are higher priorities; `least` is the lowest one.
  e->priority_ = o.low_priority ? least : greatest;
  for (int i = 0; i < o.streams; ++i) {
    cudaStream_t s;
    MEMENTO_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, e->priority_), "stream create");
    im.streams.push_back(s);
  }
  MEMENTO_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithPriority(&im.kernel_stream, cudaStreamNonBlocking, e->priority_),
      "stream create");
  const unsigned flags = cudaEventDisableTiming | cudaEventBlockingSync;
  im.ring.resize(o.max_inflight);
  for (auto& slot : im.ring) {
    MEMENTO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&slot.ev, flags), "event create");
  }
  im.kernel_done.resize(o.parity_sub_buffers);
  im.copy_done.resize(o.parity_sub_buffers);
  for (int i = 0; i < o.parity_sub_buffers; ++i) {
    MEMENTO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&im.kernel_done[i], flags),
                                 "event create");
    MEMENTO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&im.copy_done[i], flags), "event create");
  }
  MEMENTO_CUDA_RETURN_IF_ERROR(cudaMalloc(&im.staging, o.parity_staging_bytes),
                               "cudaMalloc (parity staging)");
  cudaDeviceProp prop;
  MEMENTO_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, o.device), "device properties");
  im.sms = prop.multiProcessorCount;
  return e;
}

CudaCopyEngine::~CudaCopyEngine() {
  if (!impl_) return;
  Impl& im = *impl_;
  cudaSetDevice(options_.device);
  for (cudaStream_t s : im.streams) cudaStreamSynchronize(s);
  if (im.kernel_stream) cudaStreamSynchronize(im.kernel_stream);
  for (auto& slot : im.ring) {
    if (slot.ev) cudaEventDestroy(slot.ev);
  }
  for (cudaEvent_t ev : im.kernel_done) {
    if (ev) cudaEventDestroy(ev);
  }
  for (cudaEvent_t ev : im.copy_done) {
    if (ev) cudaEventDestroy(ev);
  }
  for (cudaStream_t s : im.streams) cudaStreamDestroy(s);
  if (im.kernel_stream) cudaStreamDestroy(im.kernel_stream);
  if (im.staging) cudaFree(im.staging);
}

Result<uint64_t> CudaCopyEngine::Submit(void* dst, const void* src, size_t bytes, bool d2h) {
  if (dst == nullptr || src == nullptr) {
    return Status(StatusCode::kInvalidArgument, "CudaCopyEngine: null pointer");
  }
  Impl& im = *impl_;
  std::lock_guard<std::mutex> l(im.mu);
  MEMENTO_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
  const uint64_t t = im.next_ticket++;
  Impl::Slot& slot = im.ring[t % im.ring.size()];
  if (slot.ticket != 0) {
    // Bounded in flight: the oldest queued copy must finish first.
    MEMENTO_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.ev), "event synchronize");
  }
  cudaStream_t s = im.streams[t % im.streams.size()];
  MEMENTO_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, d2h ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, s),
      d2h ? "cudaMemcpyAsync D2H" : "cudaMemcpyAsync H2D");
  MEMENTO_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.ev, s), "event record");
  slot.ticket = t;
  return t;
}

Result<uint64_t> CudaCopyEngine::SubmitD2H(void* host_dst, const void* dev_src, size_t bytes) {
  return Submit(host_dst, dev_src, bytes, /*d2h=*/true);
}

Result<uint64_t> CudaCopyEngine::SubmitH2D(void* dev_dst, const void* host_src, size_t bytes) {
  return Submit(dev_dst, host_src, bytes, /*d2h=*/false);
}

bool CudaCopyEngine::Done(uint64_t ticket) {
  Impl& im = *impl_;
  std::lock_guard<std::mutex> l(im.mu);
  const Impl::Slot& slot = im.ring[ticket % im.ring.size()];
  if (slot.ticket != ticket) return ticket < im.next_ticket;  // reused: finished long ago
  cudaSetDevice(options_.device);
  return cudaEventQuery(slot.ev) != cudaErrorNotReady;
}

Status CudaCopyEngine::Wait(uint64_t ticket, Deadline deadline) {
  Impl& im = *impl_;
  cudaEvent_t ev;
  {
    std::lock_guard<std::mutex> l(im.mu);
    if (ticket == 0 || ticket >= im.next_ticket) {
      return Status(StatusCode::kInvalidArgument,
                    "CudaCopyEngine: unknown ticket " + std::to_string(ticket));
    }
    const Impl::Slot& slot = im.ring[ticket % im.ring.size()];
    if (slot.ticket != ticket) return Status::Ok();  // its slot was reused after it finished
    ev = slot.ev;
  }
  // If the slot is reused meanwhile, this waits for a later copy too: safe.
  MEMENTO_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
  return WaitEvent(ev, deadline);
}

Status CudaCopyEngine::WaitAll(Deadline deadline) {
  Impl& im = *impl_;
  std::vector<cudaEvent_t> evs;
  {
    std::lock_guard<std::mutex> l(im.mu);
    for (const auto& slot : im.ring) {
      if (slot.ticket != 0) evs.push_back(slot.ev);
    }
  }
  MEMENTO_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
  for (cudaEvent_t ev : evs) MEMENTO_RETURN_IF_ERROR(WaitEvent(ev, deadline));
  return Status::Ok();
}

Status CudaCopyEngine::CopyD2H(void* host_dst, const void* dev_src, size_t bytes) {
  auto* d = static_cast<uint8_t*>(host_dst);
  auto* s = static_cast<const uint8_t*>(dev_src);
  uint64_t last = 0;
  for (size_t off = 0; off < bytes; off += options_.chunk_bytes) {
    MEMENTO_ASSIGN_OR_RETURN(
        last, SubmitD2H(d + off, s + off, std::min(options_.chunk_bytes, bytes - off)));
  }
  return last == 0 ? Status::Ok() : WaitAll();
}

Status CudaCopyEngine::CopyH2D(void* dev_dst, const void* host_src, size_t bytes) {
  auto* d = static_cast<uint8_t*>(dev_dst);
  auto* s = static_cast<const uint8_t*>(host_src);
  uint64_t last = 0;
  for (size_t off = 0; off < bytes; off += options_.chunk_bytes) {
    MEMENTO_ASSIGN_OR_RETURN(
        last, SubmitH2D(d + off, s + off, std::min(options_.chunk_bytes, bytes - off)));
  }
  return last == 0 ? Status::Ok() : WaitAll();
}

Status CudaCopyEngine::XorParityD2H(const void* const* dev_srcs, int k, size_t bytes,
                                    void* host_dst) {
  if (k < 1 || k > kMaxParitySources) {
    return Status(StatusCode::kInvalidArgument, "XorParityD2H: k = " + std::to_string(k) +
                                                    "; expected 1.." +
                                                    std::to_string(kMaxParitySources));
  }
  if (dev_srcs == nullptr || host_dst == nullptr) {
    return Status(StatusCode::kInvalidArgument, "XorParityD2H: null pointer");
  }
  XorSources srcs;
  srcs.k = k;
  bool aligned = true;
  for (int j = 0; j < k; ++j) {
    if (dev_srcs[j] == nullptr) {
      return Status(StatusCode::kInvalidArgument,
                    "XorParityD2H: source " + std::to_string(j) + " is null");
    }
    srcs.src[j] = static_cast<const uint8_t*>(dev_srcs[j]);
    aligned = aligned && reinterpret_cast<uintptr_t>(dev_srcs[j]) % 16 == 0;
  }
  if (bytes == 0) return Status::Ok();

  Impl& im = *impl_;
  std::lock_guard<std::mutex> l(im.parity_mu);
  MEMENTO_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
  const int nsub = options_.parity_sub_buffers;
  const size_t sub = (options_.parity_staging_bytes / nsub) / 16 * 16;
  cudaStream_t copy_stream = im.streams[0];
  auto* out = static_cast<uint8_t*>(host_dst);
  size_t index = 0;
  for (size_t off = 0; off < bytes; off += sub, ++index) {
    const size_t n = std::min(sub, bytes - off);
    const int i = static_cast<int>(index % nsub);
    uint8_t* stage = static_cast<uint8_t*>(im.staging) + size_t(i) * sub;
    // Sub-buffer i is free once its previous D2H copy finished.
    if (index >= static_cast<size_t>(nsub)) {
      MEMENTO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(im.kernel_stream, im.copy_done[i], 0),
                                   "stream wait");
    }
    cudaGetLastError();  // launch errors below are ours
    const int threads = 256;
    const size_t n16 = aligned ? n / 16 : 0;
    if (n16 > 0) {
      const int blocks =
          static_cast<int>(std::min<size_t>((n16 + threads - 1) / threads, size_t(4) * im.sms));
      XorKernel16<<<blocks, threads, 0, im.kernel_stream>>>(srcs, off,
                                                            reinterpret_cast<uint4*>(stage), n16);
    }
    const size_t done16 = n16 * 16;
    if (done16 < n) {
      const size_t rest = n - done16;
      const int blocks =
          static_cast<int>(std::min<size_t>((rest + threads - 1) / threads, size_t(4) * im.sms));
      XorKernel1<<<blocks, threads, 0, im.kernel_stream>>>(srcs, off + done16, stage + done16,
                                                           rest);
    }
    MEMENTO_CUDA_RETURN_IF_ERROR(cudaGetLastError(), "XOR kernel launch");
    MEMENTO_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.kernel_done[i], im.kernel_stream),
                                 "event record");
    MEMENTO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream, im.kernel_done[i], 0),
                                 "stream wait");
    MEMENTO_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(out + off, stage, n, cudaMemcpyDeviceToHost, copy_stream),
        "cudaMemcpyAsync parity D2H");
    MEMENTO_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.copy_done[i], copy_stream), "event record");
  }
  const int last = static_cast<int>((index - 1) % nsub);
  return WaitEvent(im.copy_done[last], Deadline::Infinite());
}

}  // namespace memento::cuda
