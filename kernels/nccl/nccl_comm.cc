// NcclComm over the CUDA runtime, cuBLAS (the rank-order sum; loaded by kernels/cuda/cublas_api.h)
// and NCCL.
#include "kernels/nccl/nccl_comm.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "common/error.h"
#include "kernels/cuda/cublas_api.h"

#define KVB_CUDA_OK(call)                                                          \
  do {                                                                             \
    const cudaError_t kvb_e = (call);                                              \
    KVB_CHECK(kvb_e == cudaSuccess) << #call << ": " << cudaGetErrorString(kvb_e); \
  } while (0)
#define KVB_NCCL_OK(call)                                                          \
  do {                                                                             \
    const ncclResult_t kvb_r = (call);                                             \
    KVB_CHECK(kvb_r == ncclSuccess) << #call << ": " << ncclGetErrorString(kvb_r); \
  } while (0)
#define KVB_CUBLAS_OK(call)                                                            \
  do {                                                                                 \
    const cublasStatus_t kvb_s = (call);                                               \
    KVB_CHECK(kvb_s == CUBLAS_STATUS_SUCCESS) << #call << ": cuBLAS status " << kvb_s; \
  } while (0)

namespace kvb::kernels {

struct NcclComm::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  float* gathered = nullptr;  // [size, capacity] floats, grown on demand
  size_t capacity = 0;        // floats per rank
  char* staging = nullptr;    // host buffers go through here
  size_t staging_bytes = 0;

  char* stage(size_t bytes) {
    if (staging_bytes < bytes) {
      if (staging) KVB_CUDA_OK(cudaFree(staging));
      staging = nullptr;
      KVB_CUDA_OK(cudaMalloc(&staging, bytes));
      staging_bytes = bytes;
    }
    return staging;
  }
};

namespace {
// Host code (policies deciding on the CPU, measurements, the time-limit flag) passes host
// memory; it is staged through device memory so that every group collective goes over NCCL.
bool on_device(const void* p) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}
}  // namespace

int NcclComm::visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

NcclComm::NcclComm(Communicator& bootstrap, int device)
    : impl_(std::make_unique<Impl>()),
      rank_(bootstrap.rank()),
      size_(bootstrap.size()),
      device_(device) {
  const int devices = visible_devices();
  KVB_CHECK(device >= 0 && device < devices)
      << "NCCL rank " << rank_ << ": GPU " << device << " requested, " << devices
      << " visible (CUDA_VISIBLE_DEVICES, or --gpus-per-worker larger than the GPUs per node?)";
  KVB_CUDA_OK(cudaSetDevice(device));
  ncclUniqueId id;
  if (rank_ == 0) KVB_NCCL_OK(ncclGetUniqueId(&id));
  bootstrap.broadcast(&id, sizeof(id), 0);
  KVB_NCCL_OK(ncclCommInitRank(&impl_->comm, size_, id, rank_));
  KVB_CUDA_OK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  KVB_CUBLAS_OK(cuda::cublas().Create(&impl_->blas));
  KVB_CUBLAS_OK(cuda::cublas().SetStream(impl_->blas, impl_->stream));
  // Pointer mode host: alpha lives on the host. Atomics stay off (the default): deterministic.
  KVB_CUBLAS_OK(cuda::cublas().SetPointerMode(impl_->blas, CUBLAS_POINTER_MODE_HOST));
}

NcclComm::~NcclComm() {
  if (impl_->gathered) cudaFree(impl_->gathered);
  if (impl_->staging) cudaFree(impl_->staging);
  if (impl_->blas) cuda::cublas().Destroy(impl_->blas);
  if (impl_->comm) ncclCommDestroy(impl_->comm);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void NcclComm::do_all_reduce_sum(float* data, size_t count) {
  KVB_CHECK(count < (1ull << 31)) << "all_reduce_sum of " << count << " floats";
  if (!on_device(data)) {
    float* d = reinterpret_cast<float*>(impl_->stage(count * sizeof(float)));
    KVB_CUDA_OK(cudaMemcpy(d, data, count * sizeof(float), cudaMemcpyHostToDevice));
    do_all_reduce_sum(d, count);
    KVB_CUDA_OK(cudaMemcpy(data, d, count * sizeof(float), cudaMemcpyDeviceToHost));
    return;
  }
  if (impl_->capacity < count) {
    if (impl_->gathered) KVB_CUDA_OK(cudaFree(impl_->gathered));
    impl_->gathered = nullptr;
    KVB_CUDA_OK(cudaMalloc(&impl_->gathered, count * size_ * sizeof(float)));
    impl_->capacity = count;
  }
  float* g = impl_->gathered;  // rank r's part at g + r * count
  KVB_NCCL_OK(ncclAllGather(data, g, count, ncclFloat32, impl_->comm, impl_->stream));
  KVB_CUDA_OK(
      cudaMemcpyAsync(data, g, count * sizeof(float), cudaMemcpyDeviceToDevice, impl_->stream));
  const float one = 1.0f;
  for (int r = 1; r < size_; ++r) {
    KVB_CUBLAS_OK(
        cuda::cublas().Saxpy(impl_->blas, static_cast<int>(count), &one, g + r * count, 1, data, 1));
  }
  KVB_CUDA_OK(cudaStreamSynchronize(impl_->stream));
}

void NcclComm::do_all_gather(const void* in, size_t bytes, void* out) {
  if (!on_device(in) || !on_device(out)) {
    char* d = impl_->stage(bytes * (size_ + 1));  // [input | output]
    KVB_CUDA_OK(cudaMemcpy(d, in, bytes,
                           on_device(in) ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice));
    do_all_gather(d, bytes, d + bytes);
    KVB_CUDA_OK(cudaMemcpy(out, d + bytes, bytes * size_,
                           on_device(out) ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost));
    return;
  }
  KVB_NCCL_OK(ncclAllGather(in, out, bytes, ncclUint8, impl_->comm, impl_->stream));
  KVB_CUDA_OK(cudaStreamSynchronize(impl_->stream));
}

void NcclComm::do_broadcast(void* data, size_t bytes, int root) {
  if (!on_device(data)) {
    char* d = impl_->stage(bytes);
    KVB_CUDA_OK(cudaMemcpy(d, data, bytes, cudaMemcpyHostToDevice));
    do_broadcast(d, bytes, root);
    KVB_CUDA_OK(cudaMemcpy(data, d, bytes, cudaMemcpyDeviceToHost));
    return;
  }
  KVB_NCCL_OK(ncclBroadcast(data, data, bytes, ncclUint8, root, impl_->comm, impl_->stream));
  KVB_CUDA_OK(cudaStreamSynchronize(impl_->stream));
}

}  // namespace kvb::kernels
