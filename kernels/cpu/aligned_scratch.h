// Per-thread scratch of f32, 64-byte aligned, grown on demand and kept for reuse (the matmuls'
// packed operands: cpu/matmul.cc, cpu/matmul_bf16.cc).
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace kvb::kernels::cpu {

class AlignedScratch {
 public:
  float* get(size_t count) {
    if (count > size_) {
      data_.reset(new (std::align_val_t{64}) float[count]);
      size_ = count;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<float[], Free> data_;
  size_t size_ = 0;
};

}  // namespace kvb::kernels::cpu
