// CUDA runtime helpers: device queries that never throw, per-thread cuBLAS handles, scratch.
#include "kernels/cuda/runtime.h"

#include "kernels/cuda/graph.h"

#include <map>
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
  void operator()(cublasContext* h) const noexcept { cublas().Destroy(h); }
};

// This thread's cuBLAS handle on one device (a handle is tied to the device current at its
// creation), the stream it is bound to, and a workspace per stream, ours: cuBLAS's own default
// workspace is allocated anew for each captured graph (graph.h captures every decode step:
// memory would grow per step), and cublasSetStream resets a handle to that default. Separate per
// stream, as cuBLAS's default: work on two streams may overlap.
struct DeviceHandle {
  std::unique_ptr<cublasContext, HandleDeleter> handle;
  cudaStream_t stream = nullptr;
  bool bound = false;  // handle set to `stream` and that stream's workspace
  std::map<cudaStream_t, DeviceBuffer<unsigned char>> workspaces;
};

std::vector<DeviceHandle>& device_handles() {
  thread_local std::vector<DeviceHandle> h;
  return h;
}
}  // namespace

void release_cublas_workspace(cudaStream_t stream) noexcept {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return;
  std::vector<DeviceHandle>& all = device_handles();
  if (static_cast<size_t>(dev) >= all.size()) return;
  DeviceHandle& d = all[dev];
  if (d.bound && d.stream == stream) d.bound = false;  // its workspace is about to go
  d.workspaces.erase(stream);
}

cublasHandle_t cublas_handle(cudaStream_t stream) {
  constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper
  int dev = 0;
  KVB_CUDA_CHECK(cudaGetDevice(&dev));
  std::vector<DeviceHandle>& all = device_handles();
  if (static_cast<size_t>(dev) >= all.size()) all.resize(dev + 1);
  DeviceHandle& d = all[dev];
  if (!d.handle) {
    cublasHandle_t h = nullptr;
    KVB_CUBLAS_CHECK(cublas().Create(&h));
    d.handle.reset(h);
  }
  // Bound already (the usual case: every product of a pass on one stream): nothing to set.
  if (d.bound && d.stream == stream) return d.handle.get();
  d.bound = false;
  KVB_CUBLAS_CHECK(cublas().SetStream(d.handle.get(), stream));
  DeviceBuffer<unsigned char>& ws = d.workspaces[stream];
  if (ws.size() == 0) ws = DeviceBuffer<unsigned char>(kWorkspaceBytes);
  KVB_CUBLAS_CHECK(cublas().SetWorkspace(d.handle.get(), ws.data(), ws.bytes()));
  d.stream = stream;
  d.bound = true;
  return d.handle.get();
}

StreamScratch::StreamScratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes == 0) return;
  if (capturing(stream)) {
    ptr_ = detail::capture_scratch(bytes, stream);
    arena_ = true;
    return;
  }
  KVB_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream));
}

StreamScratch::~StreamScratch() {
  // Teardown errors cannot be reported; arena memory lives until the next capture. Scratch
  // taken before a capture and released inside it is freed after the graph's launch (a capture
  // may only free graph allocations, and the captured work may still read it).
  if (ptr_ == nullptr || arena_) return;
  try {
    free_async(ptr_, stream_);  // capture-aware: deferred while capturing, else cudaFreeAsync
  } catch (...) {
  }
}

DeviceErrorFlag::DeviceErrorFlag(cudaStream_t stream)
    : flag_(sizeof(int), stream), stream_(stream) {
  KVB_CUDA_CHECK(cudaMemsetAsync(flag_.as<int>(), 0, sizeof(int), stream));
}

void DeviceErrorFlag::check(const char* what, const char* (*describe)(int code)) const {
  require_not_capturing(stream_, what);
  int code = 0;
  KVB_CUDA_CHECK(
      cudaMemcpyAsync(&code, flag_.as<int>(), sizeof(int), cudaMemcpyDeviceToHost, stream_));
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  KVB_CHECK(code == 0) << what << ": " << describe(code);
}

}  // namespace kvb::kernels::cuda
