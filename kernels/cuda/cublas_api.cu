// cuBLAS's entry points from dlopen (cublas_api.h says why).
#include "kernels/cuda/cublas_api.h"

#include <dlfcn.h>

#include <fstream>
#include <mutex>
#include <string>

#include "common/error.h"

namespace kvb::kernels::cuda {

namespace {
template <class Fn>
void resolve(void* lib, const char* lib_name, const char* symbol, Fn* out) {
  void* p = dlsym(lib, symbol);
  KVB_CHECK(p != nullptr) << lib_name << " has no " << symbol << " (" << dlerror()
                          << "): kvbench needs cuBLAS " << CUBLAS_VER_MAJOR << ".x, the "
                          << "toolkit's it was built with";
  *out = reinterpret_cast<Fn>(p);
}

CublasApi load() {
  const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  // The executable's run path names the toolkit's lib folder (it links libcudart from there).
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    // Beside the libcudart this process loaded.
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) != 0 && info.dli_fname) {
      std::string dir = info.dli_fname;
      dir = dir.substr(0, dir.find_last_of('/') + 1);
      lib = dlopen((dir + name).c_str(), RTLD_NOW | RTLD_LOCAL);
    }
  }
  KVB_CHECK(lib != nullptr) << "cannot load cuBLAS (" << name << "): " << dlerror()
                            << "; the GPU path needs the CUDA toolkit's cuBLAS " << CUBLAS_VER_MAJOR
                            << " (add its lib folder to LD_LIBRARY_PATH)";
  CublasApi api;
  resolve(lib, name.c_str(), "cublasCreate_v2", &api.Create);
  resolve(lib, name.c_str(), "cublasDestroy_v2", &api.Destroy);
  resolve(lib, name.c_str(), "cublasSetStream_v2", &api.SetStream);
  resolve(lib, name.c_str(), "cublasSetWorkspace_v2", &api.SetWorkspace);
  resolve(lib, name.c_str(), "cublasSetPointerMode_v2", &api.SetPointerMode);
  resolve(lib, name.c_str(), "cublasSaxpy_v2", &api.Saxpy);
  resolve(lib, name.c_str(), "cublasGetStatusName", &api.GetStatusName);
  resolve(lib, name.c_str(), "cublasGetStatusString", &api.GetStatusString);
  resolve(lib, name.c_str(), "cublasGemmEx", &api.GemmEx);
  return api;  // the library stays loaded for the process's life
}
}  // namespace

const CublasApi& cublas() {
  static std::once_flag once;
  static CublasApi api;
  std::call_once(once, [] { api = load(); });  // a throw leaves it to be tried again
  return api;
}

bool cublas_mapped() noexcept {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/libcublas") != std::string::npos) return true;
  }
  return false;
}

}  // namespace kvb::kernels::cuda
