// CUDA runtime helpers shared by every twin in kernels/cuda (STYLE.md "Errors"): check macros
// that throw kvb::Error naming the failed call and the CUDA/cuBLAS error string, RAII device
// memory, a per-thread cuBLAS handle, a device-side error flag for inputs that only the device
// can validate, and device queries that never throw when no driver is installed.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "common/error.h"
#include "kernels/cuda/cublas_api.h"

// KVB_CUDA_CHECK(cudaMemcpy(...)); throws kvb::Error "<file>:<line> cudaMemcpy(...): <error>".
// A failed call also records its (non-sticky) error as the thread's last error; it is cleared
// before throwing, or the next KVB_CUDA_CHECK_LAUNCH of an unrelated op would report it again
// (a sweep goes on after a bundle's out-of-memory).
#define KVB_CUDA_CHECK(call)                                                                     \
  do {                                                                                           \
    const cudaError_t kvb_cuda_status_ = (call);                                                 \
    if (kvb_cuda_status_ != cudaSuccess) {                                                       \
      (void)cudaGetLastError();                                                                  \
      ::kvb::detail::ErrorBuilder(__FILE__, __LINE__, #call,                                     \
                                  kvb_cuda_status_ == cudaErrorMemoryAllocation                  \
                                      ? ::kvb::ErrorKind::kOutOfMemory                           \
                                      : ::kvb::ErrorKind::kRuntime)                              \
          << cudaGetErrorName(kvb_cuda_status_) << ": " << cudaGetErrorString(kvb_cuda_status_); \
    }                                                                                            \
  } while (0)

#define KVB_CUBLAS_CHECK(call)                                                           \
  do {                                                                                   \
    const cublasStatus_t kvb_cublas_status_ = (call);                                    \
    if (kvb_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                   \
      ::kvb::detail::ErrorBuilder(__FILE__, __LINE__, #call,                             \
                                  kvb_cublas_status_ == CUBLAS_STATUS_ALLOC_FAILED       \
                                      ? ::kvb::ErrorKind::kOutOfMemory                   \
                                      : ::kvb::ErrorKind::kRuntime)                      \
          << ::kvb::kernels::cuda::cublas().GetStatusName(kvb_cublas_status_) << ": "     \
          << ::kvb::kernels::cuda::cublas().GetStatusString(kvb_cublas_status_);          \
    }                                                                                    \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next sync.
#define KVB_CUDA_CHECK_LAUNCH() KVB_CUDA_CHECK(cudaGetLastError())

namespace kvb::kernels::cuda {

namespace detail {
// graph.cu: while the calling thread captures a step (graph.h), the memory a DeviceBuffer
// releases may still be read by captured work that has not run: its cudaFree waits until the
// host's next wait for the stream (StepGraph::after_sync). False: not capturing, free it now.
bool defer_device_free(void* p) noexcept;
// A capture's temporary device memory (StreamScratch while capturing `stream`).
void* capture_scratch(size_t bytes, cudaStream_t stream);
}  // namespace detail

// Number of visible CUDA devices; 0 when there is no driver, no device or any runtime error
// (never throws: tests and benchmarks call it to decide whether to skip).
int device_count() noexcept;
bool has_device() noexcept;

// Lets the current device's default memory pool (the one cudaMallocAsync and StreamScratch draw
// from) keep up to `bytes` of freed memory across synchronisations. CUDA's default, 0, returns it
// all at each stream, event or device sync, so the next cudaMallocAsync maps memory again: the
// benches' --pool-keep-mib A/B measures what that costs (the library leaves the default).
void keep_pool_memory(uint64_t bytes);

// cuBLAS handle of the calling thread for the current device, created on first use, bound to
// `stream` (handles are not thread-safe; one per thread avoids locking), with a 32 MiB
// workspace of its own per stream (runtime.cu says why); nothing is set again while calls keep
// to the stream of the previous one.
cublasHandle_t cublas_handle(cudaStream_t stream);
// Frees the calling thread's cuBLAS workspace for `stream` on the current device (call after
// the stream's work has finished, before destroying it); no-op if it has none.
void release_cublas_workspace(cudaStream_t stream) noexcept;

// Owning device allocation of `count` elements of T (cudaMalloc; freed in the destructor).
// Move-only. Zero elements allocate nothing and give data() == nullptr.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count > 0) KVB_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  // Synchronous copies of the whole buffer (sizes must match; checked).
  void upload(const T* host, size_t count) {
    KVB_CHECK(count == count_) << "DeviceBuffer::upload of " << count << " into " << count_;
    if (count > 0) KVB_CUDA_CHECK(cudaMemcpy(data_, host, bytes(), cudaMemcpyHostToDevice));
  }
  void download(T* host, size_t count) const {
    KVB_CHECK(count == count_) << "DeviceBuffer::download of " << count_ << " into " << count;
    if (count > 0) KVB_CUDA_CHECK(cudaMemcpy(host, data_, bytes(), cudaMemcpyDeviceToHost));
  }

 private:
  void release() noexcept {
    // Errors at teardown cannot be reported; ignored. During a captured step (graph.h) the free
    // waits for the graph to have run.
    if (data_ != nullptr && !detail::defer_device_free(data_)) cudaFree(data_);
    data_ = nullptr;
    count_ = 0;
  }
  T* data_ = nullptr;
  size_t count_ = 0;
};

// Stream-ordered scratch (cudaMallocAsync / cudaFreeAsync on `stream`): for temporaries of one
// op call; freed in stream order, so kernels queued on the stream may still use it. While the
// calling thread captures `stream` (graph.h), from the capture's arena instead: no graph memory
// node, and the memory stays until the graph has run.
class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream);
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch();
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
  bool arena_ = false;
};

// Input checks only the device can make (lengths, keep lists in device memory): kernels
// atomicOr a code into flag(); check() waits for the stream and throws with `what` and the
// code's meaning when it is non-zero. One sync per op call that uses it (so never inside a
// captured step: check() throws there).
class DeviceErrorFlag {
 public:
  explicit DeviceErrorFlag(cudaStream_t stream);
  int* flag() const { return flag_.as<int>(); }
  // Throws kvb::Error "<what>: <describe(code)>" when a kernel raised the flag.
  void check(const char* what, const char* (*describe)(int code)) const;

 private:
  StreamScratch flag_;
  cudaStream_t stream_;
};

// Blocks for a 1-D launch of `work` items at `threads` per block, at least 1.
inline unsigned grid_for(size_t work, unsigned threads) {
  const size_t b = (work + threads - 1) / threads;
  return static_cast<unsigned>(b == 0 ? 1 : (b > 0x7fffffffu ? 0x7fffffffu : b));
}

}  // namespace kvb::kernels::cuda
