// CpuBackend: the block stack's ops on the CPU (f32, OpenMP; optionally bf16 weights), over the
// host KvCache.
#include "workers/engine/cpu_backend.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "common/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_bf16.h"
#include "kernels/cpu/qmatmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/f16.h"

namespace kvb::engine {

namespace cpu = kvb::kernels::cpu;

namespace {
std::vector<uint16_t> to_bf16(const std::vector<float>& w) {
  std::vector<uint16_t> out(w.size());
  cpu::round_to_bf16(w.data(), w.size(), out.data());
  return out;
}
}  // namespace

namespace {
// Rows [row0, row0 + rows) of a stored matrix of k columns in its own blocks, or nothing (type
// 0) when qmatmul does not take its type (F32, F16, BF16, Q2_K, ...: the f32 product runs).
template <class QMat>
QMat file_blocks(const Model& model, const std::string& name, uint64_t row0, uint64_t rows,
                 int k) {
  QMat q;
  StoredTensors::Info ti;
  KVB_CHECK(model.stored->info(name, &ti)) << model.path << ": no tensor named '" << name << "'";
  if (!cpu::qmatmul_supports(ti.type)) return q;
  const size_t row_bytes = cpu::qrow_bytes(ti.type, k);
  KVB_CHECK(ti.dims.size() == 2 && ti.dims[0] == static_cast<uint64_t>(k) &&
            ti.dims[1] >= row0 + rows && ti.num_bytes == ti.dims[1] * row_bytes)
      << model.path << ": tensor '" << name << "' is not a matrix of rows of " << k
      << " elements";
  q.type = ti.type;
  q.row_bytes = row_bytes;
  q.bytes = model.stored->bytes(name, row0 * row_bytes, rows * row_bytes);
  return q;
}
}  // namespace

CpuBackend::CpuBackend(const Model& model, kernels::Communicator* tp, DType dtype, KvRows kv_rows)
    : model_(model),
      tp_(tp && tp->size() > 1 ? tp : nullptr),
      dtype_(dtype),
      f16_rows_(kv_rows == KvRows::kF16 ||
                (kv_rows == KvRows::kDtypeDefault && dtype == DType::kNative)) {
  KVB_CHECK(!model.native_blocks || dtype_ == DType::kNative)
      << model.path << " was loaded for --dtype native (its quantized matrices were not "
      << "dequantized) and cannot run as " << dtype_name(dtype_);
  if (dtype_ == DType::kNative) {
    KVB_USAGE_CHECK(model.stored != nullptr)
        << "--dtype native multiplies in a GGUF model's own quantized blocks, and " << model.path
        << " is not a GGUF file (use --dtype f32 or bf16)";
    KVB_USAGE_CHECK(tp_ == nullptr)
        << "--dtype native runs a model on one rank (tensor-parallel groups: --dtype f32 or bf16)";
    const Model& g = model;
    const ModelConfig& c = model.config;
    const int D = c.dim, H = c.hidden_dim;
    const uint64_t QD = static_cast<uint64_t>(c.num_heads) * c.head_dim;
    const uint64_t KVD = static_cast<uint64_t>(c.num_kv_heads) * c.head_dim;
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      QLayer q;
      if (c.fused_qkv) {  // Q's rows, then K's, then V's (model_load.cc)
        q.wq = file_blocks<QMat>(g, b + "attn_qkv.weight", 0, QD, D);
        q.wk = file_blocks<QMat>(g, b + "attn_qkv.weight", QD, KVD, D);
        q.wv = file_blocks<QMat>(g, b + "attn_qkv.weight", QD + KVD, KVD, D);
      } else {
        q.wq = file_blocks<QMat>(g, b + "attn_q.weight", 0, QD, D);
        q.wk = file_blocks<QMat>(g, b + "attn_k.weight", 0, KVD, D);
        q.wv = file_blocks<QMat>(g, b + "attn_v.weight", 0, KVD, D);
      }
      q.wo = file_blocks<QMat>(g, b + "attn_output.weight", 0, D, static_cast<int>(QD));
      if (c.fused_gate_up) {  // the gate's rows first
        q.w_gate = file_blocks<QMat>(g, b + "ffn_up.weight", 0, H, D);
        q.w_up = file_blocks<QMat>(g, b + "ffn_up.weight", H, H, D);
      } else {
        q.w_gate = file_blocks<QMat>(g, b + "ffn_gate.weight", 0, H, D);
        q.w_up = file_blocks<QMat>(g, b + "ffn_up.weight", 0, H, D);
      }
      q.w_down = file_blocks<QMat>(g, b + "ffn_down.weight", 0, D, H);
      q_layers_.push_back(std::move(q));
    }
    q_embed_ = file_blocks<QMat>(g, "token_embd.weight", 0, c.vocab_size, D);
    if (!c.tied_embeddings) q_output_ = file_blocks<QMat>(g, "output.weight", 0, c.vocab_size, D);
    fast_exp_ = q_classifier().type != 0;
    for (const QLayer& q : q_layers_) {
      for (const QMat* m : {&q.wq, &q.wk, &q.wv, &q.wo, &q.w_gate, &q.w_up, &q.w_down}) {
        fast_exp_ = fast_exp_ || m->type != 0;
      }
    }
    return;
  }
  if (dtype_ != DType::kBf16) return;
  bf16_layers_.reserve(model.layers.size());
  for (const LayerWeights& w : model.layers) {
    bf16_layers_.push_back({to_bf16(w.wq), to_bf16(w.wk), to_bf16(w.wv), to_bf16(w.wo),
                            to_bf16(w.w_gate), to_bf16(w.w_up), to_bf16(w.w_down)});
  }
  const size_t out_elems = static_cast<size_t>(model.config.vocab_size) * model.config.dim;
  const std::vector<float>& out = model.output.empty() ? model.token_embedding : model.output;
  KVB_CHECK(out.size() >= out_elems) << "the classifier holds " << out.size()
                                     << " weights, fewer than vocab_size x dim = " << out_elems;
  bf16_output_.resize(out_elems);
  cpu::round_to_bf16(out.data(), out_elems, bf16_output_.data());
}

std::vector<float>& CpuBackend::buf(Act a) {
  // In Act's order.
  std::vector<float>* const table[] = {&x_, &xb_, &q_, &k_, &v_, &att_, &proj_, &gate_, &up_};
  const size_t i = static_cast<size_t>(a);
  KVB_CHECK(i < std::size(table)) << "unknown activation " << i;
  return *table[i];
}

float* CpuBackend::rows(Act a) {
  const ModelConfig& c = model_.config;
  const size_t width = a == Act::kQ || a == Act::kAtt   ? static_cast<size_t>(c.num_heads) * c.head_dim
                       : a == Act::kK || a == Act::kV ? static_cast<size_t>(c.num_kv_heads) * c.head_dim
                       : a == Act::kGate || a == Act::kUp ? static_cast<size_t>(c.hidden_dim)
                                                          : static_cast<size_t>(c.dim);
  return buf(a).data() + static_cast<size_t>(row0_) * width;
}

void CpuBackend::begin_pass(std::span<const int32_t> tokens, const int32_t* positions,
                            kernels::KvCache& cache, int cache_rows) {
  (void)cache;  // the host cache is the storage
  (void)cache_rows;
  const ModelConfig& c = model_.config;
  const size_t N = tokens.size();
  const int D = c.dim, H = c.hidden_dim, hd = c.head_dim;
  const size_t QD = static_cast<size_t>(c.num_heads) * hd, KVD = static_cast<size_t>(c.num_kv_heads) * hd;
  x_.resize(N * D);
  xb_.resize(N * D);
  q_.resize(N * QD);
  k_.resize(N * KVD);
  v_.resize(N * KVD);
  att_.resize(N * QD);
  proj_.resize(N * D);
  gate_.resize(N * H);
  up_.resize(N * H);
  for (size_t t = 0; t < N; ++t) {
    if (q_embed_.type != 0) {  // the row's blocks, dequantized as the loader would
      cpu::dequantize(q_embed_.type, &q_embed_.bytes[tokens[t] * q_embed_.row_bytes], &x_[t * D],
                      D);
      continue;
    }
    std::memcpy(&x_[t * D], &model_.token_embedding[tokens[t] * static_cast<size_t>(D)],
                D * sizeof(float));
  }
  if (c.embed_scale != 1.0f) {
    for (size_t i = 0; i < N * D; ++i) x_[i] *= c.embed_scale;
  }
  pos_ = positions;
  row0_ = 0;
  rolled_layer_ = -1;
}

const std::vector<float>& CpuBackend::norm_weight(int layer, Norm which) const {
  if (layer < 0) return model_.final_norm;
  const LayerWeights& w = model_.layers[layer];
  const std::vector<float>& v = which == Norm::kAttn       ? w.attn_norm
                                : which == Norm::kFfn      ? w.ffn_norm
                                : which == Norm::kPostAttn ? w.post_attn_norm
                                                           : w.post_ffn_norm;
  KVB_CHECK(v.size() == static_cast<size_t>(model_.config.dim))
      << "layer " << layer << " has no norm " << static_cast<int>(which) << " of dim "
      << model_.config.dim << " (size " << v.size() << ")";
  return v;
}

void CpuBackend::rmsnorm(Act out, Act in, int layer, Norm which, int row0, int rows) {
  const ModelConfig& c = model_.config;
  const std::vector<float>& w = norm_weight(layer, which);
  cpu::rmsnorm(buf(out).data(), buf(in).data() + static_cast<size_t>(row0) * c.dim, w.data(),
               rows, c.dim, c.norm_eps);
}

void CpuBackend::head_rmsnorm(Act a, int layer, QkNorm which, int heads, int n) {
  const ModelConfig& c = model_.config;
  const LayerWeights& w = model_.layers[layer];
  const std::vector<float>& weight = which == QkNorm::kQ ? w.q_norm : w.k_norm;
  KVB_CHECK(weight.size() == static_cast<size_t>(c.head_dim))
      << "layer " << layer << " has no " << (which == QkNorm::kQ ? "q_norm" : "k_norm")
      << " of head_dim " << c.head_dim << " (size " << weight.size() << ")";
  float* x = buf(a).data();  // [n, heads, head_dim] = [n * heads, head_dim] rows
  cpu::rmsnorm(x, x, weight.data(), n * heads, c.head_dim, c.norm_eps);
}

const void* CpuBackend::output_projection(int layer, bool* bf16) {
  const ModelConfig& c = model_.config;
  KVB_USAGE_CHECK(tp_ == nullptr)
      << "a policy that reads the output projection (critical: true) runs on one rank (tensor "
         "parallelism splits it)";
  *bf16 = false;
  const LayerWeights& w = model_.layers[layer];
  const size_t count = static_cast<size_t>(c.dim) * c.num_heads * c.head_dim;
  if (w.wo.size() == count) return w.wo.data();
  KVB_CHECK(dtype_ == DType::kNative && q_layers_[layer].wo.type != 0)
      << "layer " << layer << "'s output projection has neither f32 rows nor blocks";
  const QMat& q = q_layers_[layer].wo;
  wo_f32_.resize(count);
  cpu::dequantize(q.type, q.bytes.data(), wo_f32_.data(), count);
  return wo_f32_.data();
}

void CpuBackend::linear(Act out, Act in, int layer, Mat which, int n) {
  const ModelConfig& c = model_.config;
  const LayerWeights& w = model_.layers[layer];
  const int D = c.dim, H = c.hidden_dim;
  const int QD = c.num_heads * c.head_dim, KVD = c.num_kv_heads * c.head_dim;
  auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };
  float* y = buf(out).data();
  const float* x = buf(in).data();
  if (dtype_ == DType::kNative) {
    const QLayer& q = q_layers_[layer];
    switch (which) {
      case Mat::kWq: return native_or_f32(q.wq, y, x, w.wq.data(), bias(w.bq), n, D, QD);
      case Mat::kWk: return native_or_f32(q.wk, y, x, w.wk.data(), bias(w.bk), n, D, KVD);
      case Mat::kWv: return native_or_f32(q.wv, y, x, w.wv.data(), bias(w.bv), n, D, KVD);
      case Mat::kWo: return native_or_f32(q.wo, y, x, w.wo.data(), nullptr, n, QD, D);
      case Mat::kGate: return native_or_f32(q.w_gate, y, x, w.w_gate.data(), nullptr, n, D, H);
      case Mat::kUp: return native_or_f32(q.w_up, y, x, w.w_up.data(), nullptr, n, D, H);
      case Mat::kDown: return native_or_f32(q.w_down, y, x, w.w_down.data(), nullptr, n, H, D);
    }
  }
  if (dtype_ == DType::kBf16) {
    const Bf16Layer& h = bf16_layers_[layer];
    switch (which) {
      case Mat::kWq: return cpu::matmul_bf16(y, x, h.wq.data(), bias(w.bq), n, D, QD);
      case Mat::kWk: return cpu::matmul_bf16(y, x, h.wk.data(), bias(w.bk), n, D, KVD);
      case Mat::kWv: return cpu::matmul_bf16(y, x, h.wv.data(), bias(w.bv), n, D, KVD);
      case Mat::kWo: return cpu::matmul_bf16(y, x, h.wo.data(), nullptr, n, QD, D);
      case Mat::kGate: return cpu::matmul_bf16(y, x, h.w_gate.data(), nullptr, n, D, H);
      case Mat::kUp: return cpu::matmul_bf16(y, x, h.w_up.data(), nullptr, n, D, H);
      case Mat::kDown: return cpu::matmul_bf16(y, x, h.w_down.data(), nullptr, n, H, D);
    }
  }
  switch (which) {
    case Mat::kWq: return cpu::matmul(y, x, w.wq.data(), bias(w.bq), n, D, QD);
    case Mat::kWk: return cpu::matmul(y, x, w.wk.data(), bias(w.bk), n, D, KVD);
    case Mat::kWv: return cpu::matmul(y, x, w.wv.data(), bias(w.bv), n, D, KVD);
    case Mat::kWo: return cpu::matmul(y, x, w.wo.data(), nullptr, n, QD, D);
    case Mat::kGate: return cpu::matmul(y, x, w.w_gate.data(), nullptr, n, D, H);
    case Mat::kUp: return cpu::matmul(y, x, w.w_up.data(), nullptr, n, D, H);
    case Mat::kDown: return cpu::matmul(y, x, w.w_down.data(), nullptr, n, H, D);
  }
}

void CpuBackend::native_or_f32(const QMat& q, float* y, const float* x, const float* w_f32,
                               const float* bias, int n, int k, int m) {
  if (q.type == 0) {
    KVB_CHECK(w_f32 != nullptr) << "a matrix has neither f32 weights nor blocks";
    return cpu::matmul(y, x, w_f32, bias, n, k, m);
  }
  xq_.resize(static_cast<size_t>(n) * (k / 32));
  cpu::quantize_q8_act(x, n, k, xq_.data());
  cpu::qmatmul(y, xq_.data(), q.bytes.data(), q.type, bias, n, k, m);
}

void CpuBackend::native_xb_products(int layer, int n, std::initializer_list<XbProduct> products) {
  const int k = model_.config.dim;
  bool quantized = false;
  for (const XbProduct& p : products) {
    if (p.q->type == 0) {
      linear(p.out, Act::kXb, layer, p.which, n);
      continue;
    }
    if (!quantized) {
      xq_.resize(static_cast<size_t>(n) * (k / 32));
      cpu::quantize_q8_act(buf(Act::kXb).data(), n, k, xq_.data());
      quantized = true;
    }
    cpu::qmatmul(buf(p.out).data(), xq_.data(), p.q->bytes.data(), p.q->type,
                 p.bias && !p.bias->empty() ? p.bias->data() : nullptr, n, k, p.m);
  }
}

void CpuBackend::linear_qkv(int layer, int n) {
  if (dtype_ != DType::kNative) return Backend::linear_qkv(layer, n);
  const ModelConfig& c = model_.config;
  const LayerWeights& w = model_.layers[layer];
  const QLayer& q = q_layers_[layer];
  const int QD = c.num_heads * c.head_dim, KVD = c.num_kv_heads * c.head_dim;
  native_xb_products(layer, n,
                     {{Act::kQ, Mat::kWq, &q.wq, &w.bq, QD},
                      {Act::kK, Mat::kWk, &q.wk, &w.bk, KVD},
                      {Act::kV, Mat::kWv, &q.wv, &w.bv, KVD}});
}

void CpuBackend::linear_gate_up(int layer, int n) {
  if (dtype_ != DType::kNative) return Backend::linear_gate_up(layer, n);
  const QLayer& q = q_layers_[layer];
  const int H = model_.config.hidden_dim;
  native_xb_products(layer, n,
                     {{Act::kGate, Mat::kGate, &q.w_gate, nullptr, H},
                      {Act::kUp, Mat::kUp, &q.w_up, nullptr, H}});
}

void CpuBackend::reduce_add(Act x, Act y, int n) {
  const size_t count = static_cast<size_t>(n) * model_.config.dim;
  std::vector<float>& yb = buf(y);
  // Row-parallel projections: each rank's product over its heads (columns) is a partial sum.
  if (tp_) tp_->all_reduce_sum(yb.data(), count);
  std::vector<float>& xb = buf(x);
  for (size_t i = 0; i < count; ++i) xb[i] += yb[i];
}

void CpuBackend::reduce_norm_add(Act x, Act y, int layer, Norm which, int n) {
  const size_t count = static_cast<size_t>(n) * model_.config.dim;
  std::vector<float>& yb = buf(y);
  if (tp_) tp_->all_reduce_sum(yb.data(), count);
  cpu::rmsnorm(yb.data(), yb.data(), norm_weight(layer, which).data(), n, model_.config.dim,
               model_.config.norm_eps);
  std::vector<float>& xb = buf(x);
  for (size_t i = 0; i < count; ++i) xb[i] += yb[i];
}

void CpuBackend::glu(int n) {
  const size_t count = static_cast<size_t>(n) * model_.config.hidden_dim;
  if (model_.config.ffn_act == FfnAct::kGeluTanh) {
    if (dtype_ == DType::kNative) {
      cpu::geglu_sigmoid(gate_.data(), up_.data(), count);
    } else {
      cpu::geglu_tanh(gate_.data(), up_.data(), count);
    }
  } else {
    cpu::swiglu(gate_.data(), up_.data(), count);
  }
}

void CpuBackend::rope(Act a, int layer, int heads, int n) {
  cpu::rope(rows(a), pos_ + row0_, n, heads, model_.config.head_dim, model_.config.rope_of(layer));
}

void CpuBackend::rope_rows(Act a, int layer, const int32_t* positions, int count) {
  cpu::rope(rows(a), positions, count, 1, model_.config.head_dim,
            model_.config.rope_of(layer));
}

void CpuBackend::download(Act a, size_t count, float* dst, size_t offset) {
  const std::vector<float>& b = buf(a);
  const float* from = rows(a) + offset;
  KVB_CHECK(from + count <= b.data() + b.size())
      << "download of " << count << " floats past the " << b.size() << " of the activation";
  std::copy(from, from + count, dst);
}

void CpuBackend::append_kv(int l, int n, kernels::KvCache& cache) {
  append_block_rows(model_.config, l, n, rows(Act::kK), rows(Act::kV), pos_ + row0_, cache);
}

void CpuBackend::roll_keys(int l, kernels::KvCache& cache) {
  const int hd = model_.config.head_dim, ckv = cache.shape().num_kv_heads;
  const kernels::LayerKvView view = cache.layer(l);
  rolled_keys_.resize(static_cast<size_t>(ckv) * view.capacity * hd);
  for (int h = 0; h < ckv; ++h) {
    const int len = cache.length(l, h);
    float* dst = &rolled_keys_[static_cast<size_t>(h) * view.capacity * hd];
    if (view.keys16) {
      kernels::f16_to_f32(view.key16(h, 0), dst, static_cast<size_t>(len) * hd);
    } else {
      std::memcpy(dst, view.key(h, 0), static_cast<size_t>(len) * hd * sizeof(float));
    }
    rolled_pos_.resize(len);
    for (int s = 0; s < len; ++s) rolled_pos_[s] = s;
    cpu::rope(dst, rolled_pos_.data(), len, 1, hd, model_.config.rope_of(l));
    if (cache.shape().f16) {  // rounded as an f16 cache rounds its (rotated) keys
      const size_t count = static_cast<size_t>(len) * hd;
      f16_round_.resize(count);
      kernels::f32_to_f16(dst, f16_round_.data(), count);
      kernels::f16_to_f32(f16_round_.data(), dst, count);
    }
  }
  rolled_layer_ = l;
}

cpu::AttentionArgs CpuBackend::attention_args(int l, int n, float* out, const float* q,
                                              kernels::KvCache& cache, float scale,
                                              bool col_sums, int last_w, int stride,
                                              std::vector<float>* cs, std::vector<float>* lp) {
  const ModelConfig& c = model_.config;
  cpu::AttentionArgs args{out, q, cache.layer(l), n, c.num_heads, scale};
  const size_t rows = static_cast<size_t>(c.num_heads) * stride;
  if (col_sums) {
    cs->resize(rows);
    args.col_sums = cs->data();
  }
  if (last_w > 0) {
    lp->resize(rows * last_w);
    args.last_probs = lp->data();
    args.last_w = last_w;
  }
  args.stats_stride = stride;
  args.window = c.sliding(l) ? c.window[l] : 0;
  args.fast_exp = fast_exp_;
  return args;
}

void CpuBackend::attention(int l, int n, float scale, kernels::KvCache& cache, bool col_sums,
                           int last_w, int stride, policies::LayerStats* stats) {
  cpu::AttentionArgs args = attention_args(l, n, rows(Act::kAtt), rows(Act::kQ), cache, scale,
                                           col_sums, last_w, stride, &col_sums_, &last_probs_);
  if (rolled_layer_ == l) {  // f32 keys, beside f16 values where the cache holds f16 rows
    args.kv.keys = rolled_keys_.data();
    args.kv.keys16 = nullptr;
  }
  const float* seed = seed_;
  seed_ = nullptr;  // this call's only, also when the check below throws
  if (seed != nullptr && args.col_sums != nullptr) {
    KVB_CHECK(seed_stride_ <= stride)
        << "seed_col_sums: seed stride " << seed_stride_ << " beyond the pass's " << stride;
    for (int h = 0; h < model_.config.num_heads; ++h) {
      float* row = args.col_sums + static_cast<size_t>(h) * stride;
      std::copy(seed + static_cast<size_t>(h) * seed_stride_,
                seed + static_cast<size_t>(h + 1) * seed_stride_, row);
      std::fill(row + seed_stride_, row + stride, 0.0f);
    }
    args.accumulate_col_sums = true;
  }
  cpu::attention(args);
  stats->col_sums = args.col_sums;
  stats->last_probs = args.last_probs;
  stats->last_w = args.last_w;
}

void CpuBackend::attention_batch(int l, float scale, std::span<const BatchAttention> items) {
  const ModelConfig& c = model_.config;
  const size_t width = static_cast<size_t>(c.num_heads) * c.head_dim;
  const int B = static_cast<int>(items.size());
  batch_col_sums_.resize(B);
  batch_last_probs_.resize(B);
  batch_args_.resize(B);
  for (int b = 0; b < B; ++b) {
    const BatchAttention& it = items[b];
    batch_args_[b] = attention_args(l, 1, buf(Act::kAtt).data() + it.row * width,
                                    buf(Act::kQ).data() + it.row * width, *it.cache, scale,
                                    it.col_sums, it.last_w, it.stride, &batch_col_sums_[b],
                                    &batch_last_probs_[b]);
  }
  cpu::attention_batch(batch_args_);
  for (int b = 0; b < B; ++b) {
    items[b].stats->col_sums = batch_args_[b].col_sums;
    items[b].stats->last_probs = batch_args_[b].last_probs;
    items[b].stats->last_w = batch_args_[b].last_w;
  }
}

void CpuBackend::attend_replaced(policies::Policy& policy, policies::AttendArgs args,
                                 const kernels::KvCache& cache, kernels::EvictionPlan* plan) {
  args.q = rows(Act::kQ);
  args.out = rows(Act::kAtt);
  policy.attend(args, cache, *plan);
}

void CpuBackend::classify(int rows, std::vector<float>* logits) {
  const ModelConfig& c = model_.config;
  logits->resize(static_cast<size_t>(rows) * c.vocab_size);
  if (dtype_ == DType::kNative) {
    return native_or_f32(q_classifier(), logits->data(), xb_.data(), model_.output_weight(), nullptr,
                         rows, c.dim, c.vocab_size);
  }
  if (dtype_ == DType::kBf16) {
    return cpu::matmul_bf16(logits->data(), xb_.data(), bf16_output_.data(), nullptr, rows, c.dim,
                            c.vocab_size);
  }
  cpu::matmul(logits->data(), xb_.data(), model_.output_weight(), nullptr, rows, c.dim,
              c.vocab_size);
}

}  // namespace kvb::engine
