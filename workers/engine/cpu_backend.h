// The CPU instance of the block stack's Backend (backend.h): f32 weights read in place from the
// Model, host activations, the host KvCache as the storage, OpenMP kernels of kernels/cpu, and
// the tensor-parallel group's all-reduce behind reduce_add(). This is the reference every other
// backend is checked against. With DType::kBf16 the linear layers and the classifier multiply by
// bf16 copies of their weights (kernels/cpu/matmul_bf16.h, f32 arithmetic); all else stays f32.
// With DType::kNative (a GGUF model) they multiply in the file's own quantized blocks with 8-bit
// activations (kernels/cpu/qmatmul.h); a matrix of a type qmatmul does not take (F32, F16, ...)
// keeps the f32 product.
#pragma once

#include <cstdint>
#include <span>
#include <initializer_list>
#include <vector>

#include "common/error.h"
#include "kernels/comm.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/qmatmul.h"
#include "workers/engine/backend.h"
#include "workers/engine/engine_types.h"
#include "workers/engine/model.h"

namespace kvb::engine {

class CpuBackend final : public Backend {
 public:
  // `model` (and `tp`, a group of more than one rank, or null) must outlive the backend.
  // dtype kBf16: the weights of every Mat and the classifier are rounded to bf16 (nearest even)
  // here, once, and kept beside the model's f32 (which embeddings and norms still read).
  // dtype kNative: the blocks of every Mat and the classifier are read from the model's GGUF file
  // (usage error for a model that has none, or under tensor parallelism).
  // kv_rows: the row type of the caches it makes (KvRows; f16 under kNative by default).
  CpuBackend(const Model& model, kernels::Communicator* tp, DType dtype = DType::kF32,
             KvRows kv_rows = KvRows::kDtypeDefault);

  std::string device_description() const override { return "cpu"; }
  policies::PolicyOps& policy_ops() override { return policies::cpu_policy_ops(); }
  // The model's f32 rows, or (--dtype native) the layer's blocks dequantized into a scratch copy.
  const void* output_projection(int layer, bool* bf16) override;
  bool f16_rows() const override { return f16_rows_; }

  // A new sequence: its rows, and no rolled keys of the previous one.
  void select_rows(int row0) override {
    row0_ = row0;
    rolled_layer_ = -1;
  }
  void begin_pass(std::span<const int32_t> tokens, const int32_t* positions,
                  kernels::KvCache& cache, int cache_rows) override;
  void rmsnorm(Act out, Act in, int layer, Norm which, int row0, int rows) override;
  void head_rmsnorm(Act a, int layer, QkNorm which, int heads, int n) override;
  void linear(Act out, Act in, int layer, Mat which, int n) override;
  // kNative: xb quantized once for the three (two) products of its blocks, not once per product
  // (the same bits: the quantization is a function of xb); otherwise Backend's.
  void linear_qkv(int layer, int n) override;
  void linear_gate_up(int layer, int n) override;
  void reduce_add(Act x, Act y, int n) override;
  void reduce_norm_add(Act x, Act y, int layer, Norm which, int n) override;
  void glu(int n) override;
  void rope(Act a, int layer, int heads, int n) override;
  void rope_rows(Act a, int layer, const int32_t* positions, int rows) override;
  void download(Act a, size_t count, float* dst, size_t offset = 0) override;
  void append_kv(int layer, int n, kernels::KvCache& cache) override;
  void roll_keys(int layer, kernels::KvCache& cache) override;
  void attention(int layer, int n, float scale, kernels::KvCache& cache, bool col_sums,
                 int last_w, int stride, policies::LayerStats* stats) override;
  // A decode batch's attention in one parallel region (cpu::attention_batch): the bits of
  // attention() per sequence, each sequence's statistics in its own buffers.
  void attention_batch(int layer, float scale, std::span<const BatchAttention> items) override;
  bool seeds_col_sums() const override { return true; }
  void seed_col_sums(const float* seed, int seed_stride) override {
    seed_ = seed;
    seed_stride_ = seed_stride;
  }
  double stats_to_host(policies::LayerStats* stats) override {
    (void)stats;
    return 0;
  }
  void attend_replaced(policies::Policy& policy, policies::AttendArgs args,
                       const kernels::KvCache& cache, kernels::EvictionPlan* plan) override;
  void apply_plan(const kernels::EvictionPlan& plan, kernels::KvCache& cache) override {
    cache.apply(plan);
  }
  void classify(int rows, std::vector<float>* logits) override;

 private:
  std::vector<float>& buf(Act a);
  // buf(a) from the selected row on (select_rows), for the per-sequence ops.
  float* rows(Act a);
  const std::vector<float>& norm_weight(int layer, Norm which) const;
  // The cpu::attention call of `layer` over `cache` for n query rows at q, out, its statistics
  // (when asked) in *cs and *lp: what attention() and attention_batch() run.
  kernels::cpu::AttentionArgs attention_args(int layer, int n, float* out, const float* q,
                                             kernels::KvCache& cache, float scale, bool col_sums,
                                             int last_w, int stride, std::vector<float>* cs,
                                             std::vector<float>* lp);

  // The bf16 copy of one layer's Mat weights, same shapes as LayerWeights'.
  struct Bf16Layer {
    std::vector<uint16_t> wq, wk, wv, wo, w_gate, w_up, w_down;
  };

  // One matrix in its file's blocks (kNative); type 0 (F32): none, the f32 product runs.
  struct QMat {
    uint32_t type = 0;
    size_t row_bytes = 0;        // qrow_bytes(type, k)
    std::vector<uint8_t> bytes;  // rows of k elements
  };
  struct QLayer {
    QMat wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  // y = x w^T (+ bias) by qmatmul when q holds blocks (the input quantized first), else
  // by matmul on the f32 weights.
  void native_or_f32(const QMat& q, float* y, const float* x, const float* w_f32,
                     const float* bias, int n, int k, int m);
  // kNative products of xb (dim wide) into `out`: xb quantized once (xq_) for every listed
  // matrix with blocks; a matrix without runs linear().
  struct XbProduct {
    Act out;
    Mat which;
    const QMat* q;
    const std::vector<float>* bias;
    int m;
  };
  void native_xb_products(int layer, int n, std::initializer_list<XbProduct> products);

  const Model& model_;
  kernels::Communicator* tp_;
  DType dtype_;
  // kNative with some product on quantized blocks: the softmax takes exp_fast (llama.cpp's
  // family, kernels/cpu/exp_fast.h). A model none of whose matrices are blocks runs the f32
  // reference's bits under kNative, softmax included.
  bool fast_exp_ = false;
  bool f16_rows_;
  std::vector<uint16_t> f16_round_;  // roll_keys' keys rounded to f16
  std::vector<QLayer> q_layers_;  // [num_layers] when dtype_ is kNative, else empty
  QMat q_embed_;   // kNative: the token embedding's blocks (also the classifier when tied)
  QMat q_output_;  // kNative: the untied classifier's blocks
  const QMat& q_classifier() const {
    return model_.config.tied_embeddings ? q_embed_ : q_output_;
  }
  std::vector<kernels::cpu::Q8Act> xq_;  // the quantized input of a native product
  std::vector<float> wo_f32_;  // output_projection's dequantized copy (kNative)
  std::vector<Bf16Layer> bf16_layers_;  // [num_layers] when dtype_ is kBf16, else empty
  std::vector<uint16_t> bf16_output_;   // [vocab_size, dim] when dtype_ is kBf16
  const int32_t* pos_ = nullptr;  // the pass's positions [n]
  int row0_ = 0;                  // select_rows
  int rolled_layer_ = -1;         // the layer whose next attention reads rolled_keys_
  // Activations, reused across passes: [n, dim], [n, q_dim], [n, kv_dim], [n, hidden_dim].
  std::vector<float> x_, xb_, q_, k_, v_, att_, proj_, gate_, up_;
  std::vector<float> col_sums_, last_probs_;  // policy statistics
  const float* seed_ = nullptr;  // seed_col_sums, for the next attention() with col_sums
  int seed_stride_ = 0;
  // attention_batch's: per sequence its statistics, and the calls.
  std::vector<std::vector<float>> batch_col_sums_, batch_last_probs_;
  std::vector<kernels::cpu::AttentionArgs> batch_args_;
  std::vector<float> rolled_keys_;            // rolling positions: rotated keys
  std::vector<int32_t> rolled_pos_;
};

}  // namespace kvb::engine
