// CUDA runtime helpers: device queries that never throw, per-thread cuBLAS handles, scratch.
#include "kernels/cuda/runtime.h"

#include <memory>
#include <vector>

namespace kvb::kernels::cuda {

int device_count() noexcept {
  int n = 0;
  // Without a driver this is cudaErrorInsufficientDriver / cudaErrorNoDevice: report 0. The
  // last-error read clears what it can; a missing driver is persistent (every later runtime call
  // fails with it again), which is why callers ask here first and skip.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

bool has_device() noexcept { return device_count() > 0; }

void keep_pool_memory(uint64_t bytes) {
  int device = 0;
  KVB_CUDA_CHECK(cudaGetDevice(&device));
  cudaMemPool_t pool = nullptr;
  KVB_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  KVB_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &bytes));
}

namespace {
struct HandleDeleter {
  void operator()(cublasContext* h) const noexcept { cublasDestroy(h); }
};
}  // namespace

cublasHandle_t cublas_handle(cudaStream_t stream) {
  // One handle per (thread, device): a handle is tied to the device current at creation.
  thread_local std::vector<std::unique_ptr<cublasContext, HandleDeleter>> handles;
  int dev = 0;
  KVB_CUDA_CHECK(cudaGetDevice(&dev));
  if (static_cast<size_t>(dev) >= handles.size()) handles.resize(dev + 1);
  if (!handles[dev]) {
    cublasHandle_t h = nullptr;
    KVB_CUBLAS_CHECK(cublasCreate(&h));
    handles[dev].reset(h);
  }
  KVB_CUBLAS_CHECK(cublasSetStream(handles[dev].get(), stream));
  return handles[dev].get();
}

StreamScratch::StreamScratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes > 0) KVB_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream));
}

StreamScratch::~StreamScratch() {
  if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);  // teardown errors cannot be reported
}

DeviceErrorFlag::DeviceErrorFlag(cudaStream_t stream)
    : flag_(sizeof(int), stream), stream_(stream) {
  KVB_CUDA_CHECK(cudaMemsetAsync(flag_.as<int>(), 0, sizeof(int), stream));
}

void DeviceErrorFlag::check(const char* what, const char* (*describe)(int code)) const {
  int code = 0;
  KVB_CUDA_CHECK(
      cudaMemcpyAsync(&code, flag_.as<int>(), sizeof(int), cudaMemcpyDeviceToHost, stream_));
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  KVB_CHECK(code == 0) << what << ": " << describe(code);
}

}  // namespace kvb::kernels::cuda
