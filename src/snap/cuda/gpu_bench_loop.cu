#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "snap/cuda/cuda_copy_engine.h"
#include "snap/cuda/gpu_bench_loop.h"

namespace memento::cuda {
namespace {

class GpuLoop : public GpuTrainingLoop {
 public:
  ~GpuLoop() override {
    cudaSetDevice(o_.device);
    if (stream_) cudaStreamSynchronize(stream_);
    if (handle_) cublasDestroy(handle_);
    for (void* p : {a_, b_, c_, act_, act2_, state_}) {
      if (p) cudaFree(p);
    }
    if (stream_) cudaStreamDestroy(stream_);
    if (send_) cudaFreeHost(send_);
    if (recv_) cudaFreeHost(recv_);
  }

  Status Init(const GpuLoopOptions& o) {
    o_ = o;
    if (DeviceCount() == 0) return Status(StatusCode::kUnavailable, "gpu loop: no CUDA device");
    if (cudaSetDevice(o.device) != cudaSuccess) {
      return Status(StatusCode::kInvalidArgument,
                    "gpu loop: no device " + std::to_string(o.device));
    }
    // A blocking stream: it synchronises with the legacy default stream, as
    // PyTorch's default stream does with other legacy-stream work.
    if (cudaStreamCreate(&stream_) != cudaSuccess) return Err("stream create");
    const size_t mat = size_t(o.hidden) * o.hidden * sizeof(__nv_bfloat16);
    if (cudaMalloc(&a_, mat) || cudaMalloc(&b_, mat) || cudaMalloc(&c_, mat) ||
        cudaMalloc(&act_, o.activation_bytes) || cudaMalloc(&act2_, o.activation_bytes) ||
        cudaMalloc(&state_, o.state_bytes)) {
      return Err("cudaMalloc");
    }
    // bf16 0x3c3c ~ 0.0115; fp32 0x3c3c3c3c ~ 0.0115.
    if (cudaMemset(a_, 0x3c, mat) || cudaMemset(b_, 0x3c, mat) ||
        cudaMemset(act_, 0x3c, o.activation_bytes) || cudaMemset(act2_, 0x3c, o.activation_bytes) ||
        cudaMemset(state_, 0x3c, o.state_bytes)) {
      return Err("cudaMemset");
    }
    if (o.comm_bytes > 0) {
      if (o.comm_bytes > o.activation_bytes) {
        return Status(StatusCode::kInvalidArgument, "gpu loop: comm_bytes > activation_bytes");
      }
      if (cudaMallocHost(&send_, o.comm_bytes) || cudaMallocHost(&recv_, o.comm_bytes)) {
        return Err("cudaMallocHost");
      }
      std::memset(recv_, 0, o.comm_bytes);
    }
    if (cublasCreate(&handle_) != CUBLAS_STATUS_SUCCESS) return Err("cublasCreate");
    cublasSetStream(handle_, stream_);
    if (cudaDeviceSynchronize() != cudaSuccess) return Err("synchronize");
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, o.device);
    name_ = prop.name;
    return Status::Ok();
  }

  std::string Describe() const override {
    return "cuda:" + std::to_string(o_.device) + " " + name_ + ": cublas bf16 gemm " +
           std::to_string(o_.hidden) + "^3 + " + std::to_string(o_.activation_bytes >> 20) +
           " MiB saxpy per layer, " + std::to_string(o_.layers) + " layers, " +
           std::to_string(o_.comm_bytes >> 20) + " MiB D2H+H2D per pass";
  }
  bool on_device() const override { return true; }
  void* stream() const override { return stream_; }
  std::vector<has::StateRegion> State() const override { return {{state_, o_.state_bytes}}; }

  void OptimizerStep() override {
    const float alpha = 0.9999f;
    cublasSscal(handle_, static_cast<int>(o_.state_bytes / sizeof(float)), &alpha,
                static_cast<float*>(state_), 1);
    cudaStreamSynchronize(stream_);
  }
  void Forward() override {
    for (int l = 0; l < o_.layers; ++l) Layer();
    cudaStreamSynchronize(stream_);
  }
  void Backward() override {
    for (int l = 0; l < 2 * o_.layers; ++l) Layer();
    cudaStreamSynchronize(stream_);
  }
  void Communicate() override {
    if (o_.comm_bytes == 0) return;
    cudaMemcpyAsync(send_, act2_, o_.comm_bytes, cudaMemcpyDeviceToHost, stream_);
    cudaMemcpyAsync(act_, recv_, o_.comm_bytes, cudaMemcpyHostToDevice, stream_);
    cudaStreamSynchronize(stream_);
  }

 private:
  Status Err(const char* what) {
    return Status(StatusCode::kInternal,
                  std::string("gpu loop: ") + what + ": " + cudaGetErrorString(cudaGetLastError()));
  }
  void Layer() {
    const float one = 1.f, zero = 0.f;
    const int h = o_.hidden;
    cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, h, h, h, &one, a_, CUDA_R_16BF, h, b_,
                 CUDA_R_16BF, h, &zero, c_, CUDA_R_16BF, h, CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT);
    const float small = 1e-3f;
    cublasSaxpy(handle_, static_cast<int>(o_.activation_bytes / sizeof(float)), &small,
                static_cast<const float*>(act_), 1, static_cast<float*>(act2_), 1);
  }

  GpuLoopOptions o_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  void *a_ = nullptr, *b_ = nullptr, *c_ = nullptr, *act_ = nullptr, *act2_ = nullptr,
       *state_ = nullptr;
  void *send_ = nullptr, *recv_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<GpuTrainingLoop>> MakeGpuLoop(const GpuLoopOptions& options) {
  auto loop = std::make_unique<GpuLoop>();
  MEMENTO_RETURN_IF_ERROR(loop->Init(options));
  return std::unique_ptr<GpuTrainingLoop>(std::move(loop));
}

}  // namespace memento::cuda
