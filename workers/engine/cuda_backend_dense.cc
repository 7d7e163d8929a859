// CudaBackend's dense side (cuda_backend.h): the weights' upload (wq|wk|wv and w_gate|w_up
// stacked, one product each), the products (cuBLAS; with bf16 weights their inputs rounded to
// bf16 once, by the op that writes them where it can), the norms, the GLU and the logits.
// Compiled only with KVB_WITH_CUDA.
#include <algorithm>
#include <initializer_list>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/swiglu.h"
#include "workers/engine/cuda_backend.h"
#include "workers/engine/cuda_backend_state.h"
#include "workers/engine/cuda_engine_kernels.h"

namespace kvb::engine {

namespace cu = kvb::kernels::cuda;
using cuda_backend_detail::ensure;

void CudaBackend::upload_weights() {
  const ModelConfig& c = model_.config;
  cu::DeviceBuffer<float> staging;
  auto vec = [&](const std::vector<float>& v) {
    cu::DeviceBuffer<float> d(v.size());
    d.upload(v.data(), v.size());
    weight_bytes_ += d.bytes();
    return d;
  };
  // Row blocks [m_i, k] stacked into one [sum m_i, k] (host, for the upload).
  std::vector<float> stack;
  auto stacked = [&](std::initializer_list<const std::vector<float>*> parts)
      -> const std::vector<float>& {
    stack.clear();
    for (const std::vector<float>* p : parts) stack.insert(stack.end(), p->begin(), p->end());
    return stack;
  };
  auto matrix = [&](const std::vector<float>& v, DeviceLayer::Matrix& m) {
    if (dtype_ == DType::kF32) {
      m.f32 = vec(v);
      return;
    }
    if (staging.size() < v.size()) staging = cu::DeviceBuffer<float>(v.size());
    KVB_CUDA_CHECK(cudaMemcpy(staging.data(), v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    m.bf16 = cu::DeviceBuffer<__nv_bfloat16>(v.size());
    cu::f32_to_bf16(m.bf16.data(), staging.data(), v.size(), stream_);
    KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));  // staging is overwritten by the next one
    weight_bytes_ += m.bf16.bytes();
  };
  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = model_.layers[l];
    DeviceLayer& d = layers_[l];
    d.attn_norm = vec(w.attn_norm);
    d.ffn_norm = vec(w.ffn_norm);
    if (!w.bq.empty() || !w.bk.empty() || !w.bv.empty()) {
      std::vector<float> b(static_cast<size_t>(c.num_heads + 2 * c.num_kv_heads) * c.head_dim,
                           0.0f);
      const size_t qd = static_cast<size_t>(c.num_heads) * c.head_dim;
      const size_t kvd = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
      std::copy(w.bq.begin(), w.bq.end(), b.begin());
      std::copy(w.bk.begin(), w.bk.end(), b.begin() + qd);
      std::copy(w.bv.begin(), w.bv.end(), b.begin() + qd + kvd);
      d.bqkv = vec(b);
    }
    d.q_norm = vec(w.q_norm);
    d.k_norm = vec(w.k_norm);
    d.post_attn_norm = vec(w.post_attn_norm);
    d.post_ffn_norm = vec(w.post_ffn_norm);
    matrix(stacked({&w.wq, &w.wk, &w.wv}), d.wqkv);
    matrix(w.wo, d.wo);
    matrix(stacked({&w.w_gate, &w.w_up}), d.w_gu);
    matrix(w.w_down, d.w_down);
  }
  embedding_ = vec(model_.token_embedding);
  final_norm_ = vec(model_.final_norm);
  const size_t out_elems = static_cast<size_t>(c.vocab_size) * c.dim;
  if (dtype_ == DType::kF32) {
    if (!model_.output.empty()) output_f32_ = vec(model_.output);
  } else {
    output_bf16_ = cu::DeviceBuffer<__nv_bfloat16>(out_elems);
    const float* src = embedding_.data();
    if (!model_.output.empty()) {
      if (staging.size() < out_elems) staging = cu::DeviceBuffer<float>(out_elems);
      KVB_CUDA_CHECK(
          cudaMemcpy(staging.data(), model_.output.data(), out_elems * 4, cudaMemcpyHostToDevice));
      src = staging.data();
    }
    cu::f32_to_bf16(output_bf16_.data(), src, out_elems, stream_);
    weight_bytes_ += output_bf16_.bytes();
  }
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::gemm(float* y, const float* x, const void* w, const float* bias, int n, int k,
                       int m) {
  if (dtype_ == DType::kF32) {
    cu::matmul(y, x, static_cast<const float*>(w), bias, n, k, m, stream_);
    return;
  }
  const size_t count = static_cast<size_t>(n) * k;
  if (x != x16_src_ || count != x16_count_) {
    ensure(s_->x16, count);
    cu::f32_to_bf16(s_->x16.data(), x, count, stream_);
    x16_src_ = nullptr;  // x16 now holds a copy no op keeps in step with its source
  }
  cu::matmul(y, s_->x16.data(), static_cast<const __nv_bfloat16*>(w), bias, n, k, m, stream_);
}

const float* CudaBackend::norm_weight(int layer, Norm which) const {
  if (layer < 0) return final_norm_.data();
  const DeviceLayer& d = layers_[layer];
  const cu::DeviceBuffer<float>& w = which == Norm::kAttn       ? d.attn_norm
                                     : which == Norm::kFfn      ? d.ffn_norm
                                     : which == Norm::kPostAttn ? d.post_attn_norm
                                                                : d.post_ffn_norm;
  KVB_CHECK(w.size() == static_cast<size_t>(model_.config.dim))
      << "layer " << layer << " has no norm " << static_cast<int>(which) << " of dim "
      << model_.config.dim << " (size " << w.size() << ")";
  return w.data();
}

void CudaBackend::rmsnorm(Act out, Act in, int layer, Norm which, int row0, int rows) {
  const ModelConfig& c = model_.config;
  const float* w = norm_weight(layer, which);
  __nv_bfloat16* y16 = nullptr;
  if (dtype_ == DType::kBf16 && out == Act::kXb) {
    // xb is the next products' input: its bf16 copy in the same launch (gemm reuses it).
    ensure(s_->x16, static_cast<size_t>(rows) * c.dim);
    y16 = s_->x16.data();
  }
  cu::rmsnorm(act(out), act(in) + static_cast<size_t>(row0) * c.dim, w, rows, c.dim, c.norm_eps,
              stream_, y16);
  wrote(act(out), y16, static_cast<size_t>(rows) * c.dim);
}

void CudaBackend::wrote(const float* dst, bool with_x16, size_t count) {
  if (with_x16) {
    x16_src_ = dst;
    x16_count_ = count;
  } else if (dst == x16_src_) {
    x16_src_ = nullptr;
  }
}

void CudaBackend::head_rmsnorm(Act a, int layer, QkNorm which, int heads, int n) {
  const ModelConfig& c = model_.config;
  const cu::DeviceBuffer<float>& w = which == QkNorm::kQ ? layers_[layer].q_norm
                                                         : layers_[layer].k_norm;
  KVB_CHECK(w.size() == static_cast<size_t>(c.head_dim))
      << "layer " << layer << " has no " << (which == QkNorm::kQ ? "q_norm" : "k_norm")
      << " of head_dim " << c.head_dim << " (size " << w.size() << ")";
  // [n, heads, head_dim] = [n * heads, head_dim] rows, in place: kernels::cuda::rmsnorm's
  // contract (y may alias x), the same one the CPU instance uses.
  cu::rmsnorm(act(a), act(a), w.data(), n * heads, c.head_dim, c.norm_eps, stream_);
}

void CudaBackend::linear(Act out, Act in, int layer, Mat which, int n) {
  const ModelConfig& c = model_.config;
  const DeviceLayer& w = layers_[layer];
  const int D = c.dim, H = c.hidden_dim;
  const int QD = c.num_heads * c.head_dim, KVD = c.num_kv_heads * c.head_dim;
  float* y = act(out);
  const float* x = act(in);
  // Rows [row, row + m) of a stacked matrix, and of the stacked bias (null without one).
  auto rows = [&](const DeviceLayer::Matrix& s, size_t row, int k) -> const void* {
    return dtype_ == DType::kBf16 ? static_cast<const void*>(s.bf16.data() + row * k)
                                  : s.f32.data() + row * k;
  };
  auto bias = [&](size_t at) { return w.bqkv.size() ? w.bqkv.data() + at : nullptr; };
  wrote(y, false, 0);
  if (out == Act::kGate || out == Act::kUp) gu_pending_ = 0;
  switch (which) {
    case Mat::kWq: return gemm(y, x, rows(w.wqkv, 0, D), bias(0), n, D, QD);
    case Mat::kWk: return gemm(y, x, rows(w.wqkv, QD, D), bias(QD), n, D, KVD);
    case Mat::kWv: return gemm(y, x, rows(w.wqkv, QD + KVD, D), bias(QD + KVD), n, D, KVD);
    case Mat::kWo: return gemm(y, x, w.wo.ptr(dtype_), nullptr, n, QD, D);
    case Mat::kGate: return gemm(y, x, rows(w.w_gu, 0, D), nullptr, n, D, H);
    case Mat::kUp: return gemm(y, x, rows(w.w_gu, H, D), nullptr, n, D, H);
    case Mat::kDown: return gemm(y, x, w.w_down.ptr(dtype_), nullptr, n, H, D);
  }
}

// One product of xb and the stacked q|k|v rows into the fused scratch, then its columns into
// q, k and v: three launches (with bf16 weights: convert, GEMM, split) instead of six.
void CudaBackend::linear_qkv(int layer, int n) {
  const ModelConfig& c = model_.config;
  const DeviceLayer& w = layers_[layer];
  const int QD = c.num_heads * c.head_dim, KVD = c.num_kv_heads * c.head_dim;
  const int width = QD + 2 * KVD;
  ensure(s_->fused, static_cast<size_t>(n) * width);
  gemm(s_->fused.data(), act(Act::kXb), w.wqkv.ptr(dtype_),
       w.bqkv.size() ? w.bqkv.data() : nullptr, n, c.dim, width);
  gpu::ColumnSplit split;
  split.parts = 3;
  split.dst[0] = act(Act::kQ);
  split.dst[1] = act(Act::kK);
  split.dst[2] = act(Act::kV);
  split.width[0] = QD;
  split.width[1] = split.width[2] = KVD;
  gpu::split_columns(s_->fused.data(), n, split, stream_);
}

// The stacked gate|up product stays in the fused scratch for glu, which reads it there (no
// split; the block stack calls glu next): two launches with glu instead of five.
void CudaBackend::linear_gate_up(int layer, int n) {
  const ModelConfig& c = model_.config;
  const int H = c.hidden_dim;
  ensure(s_->fused, static_cast<size_t>(n) * 2 * H);
  gemm(s_->fused.data(), act(Act::kXb), layers_[layer].w_gu.ptr(dtype_), nullptr, n, c.dim,
       2 * H);
  gu_pending_ = n;
}

void CudaBackend::reduce_add(Act x, Act y, int n) {
  // One GPU: no group to sum over (make_engine refuses tensor-parallel groups on cuda).
  gpu::add_inplace(act(x), act(y), static_cast<size_t>(n) * model_.config.dim, stream_);
}

void CudaBackend::reduce_norm_add(Act x, Act y, int layer, Norm which, int n) {
  const ModelConfig& c = model_.config;
  cu::rmsnorm(act(y), act(y), norm_weight(layer, which), n, c.dim, c.norm_eps, stream_);
  gpu::add_inplace(act(x), act(y), static_cast<size_t>(n) * c.dim, stream_);
}

void CudaBackend::glu(int n) {
  const size_t count = static_cast<size_t>(n) * model_.config.hidden_dim;
  const bool gelu = model_.config.ffn_act == FfnAct::kGeluTanh;
  if (gu_pending_ == n && n > 0) {
    // From linear_gate_up's stacked product into gate, and (bf16 weights) the down product's
    // bf16 input in the same launch.
    __nv_bfloat16* out16 = nullptr;
    if (dtype_ == DType::kBf16) {
      ensure(s_->x16, count);
      out16 = s_->x16.data();
    }
    cu::glu_stacked(s_->gate.data(), out16, s_->fused.data(), n, model_.config.hidden_dim, gelu,
                    stream_);
    gu_pending_ = 0;
    wrote(s_->gate.data(), out16 != nullptr, count);
    return;
  }
  KVB_CHECK(gu_pending_ == 0) << "glu over " << n << " rows after a gate|up product of "
                              << gu_pending_;
  wrote(s_->gate.data(), false, 0);
  if (gelu) {
    cu::geglu_tanh(s_->gate.data(), s_->up.data(), count, stream_);
  } else {
    cu::swiglu(s_->gate.data(), s_->up.data(), count, stream_);
  }
}

void CudaBackend::classify(int rows, std::vector<float>* logits) {
  const ModelConfig& c = model_.config;
  const size_t out = static_cast<size_t>(rows) * c.vocab_size;
  ensure(s_->logits, out);
  const void* wout = dtype_ == DType::kBf16  ? static_cast<const void*>(output_bf16_.data())
                     : model_.output.empty() ? static_cast<const void*>(embedding_.data())
                                             : output_f32_.data();
  gemm(s_->logits.data(), s_->xb.data(), wout, nullptr, rows, c.dim, c.vocab_size);
  logits->resize(out);
  copy_d2h(logits->data(), s_->logits.data(), out * 4);  // complete at end_pass's sync
}

}  // namespace kvb::engine
