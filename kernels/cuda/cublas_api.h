// cuBLAS, loaded when the GPU path first needs it. Linking libcublas would load it (and
// libcublasLt, which it needs) into every kvbench process: measured 2026-12-03, a program that
// does nothing but link libcublasLt.so.13 peaks at 212 MB resident, so a CPU run paid ~217 MB
// for a library it never calls (kvbench --version: 227 MB). The few cuBLAS entry points kvbench
// uses are resolved here from libcublas.so.<CUBLAS_VER_MAJOR> with dlopen on first use instead;
// the types and enums still come from cublas_v2.h.
#pragma once

#include <cublas_v2.h>

namespace kvb::kernels::cuda {

struct CublasApi {
  decltype(&cublasCreate_v2) Create = nullptr;
  decltype(&cublasDestroy_v2) Destroy = nullptr;
  decltype(&cublasSetStream_v2) SetStream = nullptr;
  decltype(&cublasSetWorkspace_v2) SetWorkspace = nullptr;
  decltype(&cublasSetPointerMode_v2) SetPointerMode = nullptr;
  decltype(&cublasSaxpy_v2) Saxpy = nullptr;
  decltype(&cublasGetStatusName) GetStatusName = nullptr;
  decltype(&cublasGetStatusString) GetStatusString = nullptr;
  // cublasGemmEx (the C function; cublas_api.h also declares a C++ overload of that name).
  cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                           const void*, const void*, cudaDataType, int, const void*,
                           cudaDataType, int, const void*, void*, cudaDataType, int,
                           cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

// The entry points, libcublas.so.<major> loaded on the first call (thread-safe). Throws
// kvb::Error naming the library, dlopen's reason and what to install when it cannot be loaded
// or lacks one of them.
const CublasApi& cublas();

// Whether this process has mapped a libcublas (read from /proc/self/maps; false where that
// cannot be read): a CPU run must not.
bool cublas_mapped() noexcept;

}  // namespace kvb::kernels::cuda
