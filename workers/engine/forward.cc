// Engine::forward: the Llama/Qwen2 block stack over a ragged per-head KV cache (CPU, f32).
#include "workers/engine/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"

namespace kvb::engine {

namespace cpu = kvb::kernels::cpu;

Engine::Engine(const Model& model) : model_(model) {}

kernels::KvCache Engine::new_cache(int initial_capacity) const {
  const ModelConfig& c = model_.config;
  return kernels::KvCache({c.num_layers, c.num_kv_heads, c.head_dim}, initial_capacity);
}

void Engine::forward(std::span<const int32_t> tokens, kernels::KvCache& cache, LogitsMode mode,
                     std::vector<float>* logits, policies::Policy* policy, PolicyHook hook) {
  const ModelConfig& c = model_.config;
  const int n = static_cast<int>(tokens.size());
  KVB_CHECK(n > 0) << "forward: no tokens";
  const int D = c.dim, H = c.hidden_dim, hd = c.head_dim;
  const int QD = c.num_heads * hd, KVD = c.num_kv_heads * hd;
  const size_t N = n;
  x_.resize(N * D);
  xb_.resize(N * D);
  q_.resize(N * QD);
  k_.resize(N * KVD);
  v_.resize(N * KVD);
  att_.resize(N * QD);
  proj_.resize(N * D);
  gate_.resize(N * H);
  up_.resize(N * H);
  pos_.resize(N);

  const int32_t pos0 = cache.next_position();
  for (int t = 0; t < n; ++t) {
    const int32_t id = tokens[t];
    KVB_CHECK(id >= 0 && id < c.vocab_size)
        << "token id " << id << " at index " << t << " outside the vocabulary [0, "
        << c.vocab_size << ")";
    std::memcpy(&x_[t * static_cast<size_t>(D)], &model_.token_embedding[id * static_cast<size_t>(D)],
                D * sizeof(float));
    pos_[t] = pos0 + t;
  }
  cache.reserve_extra(n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  if (!policy) hook = PolicyHook::kNone;
  KVB_CHECK(hook != PolicyHook::kDecode || n == 1) << "decode hook with " << n << " tokens";
  policies::StatsRequest req;
  if (hook == PolicyHook::kPrefill) req = policy->prefill_request(n);
  if (hook == PolicyHook::kDecode) req = policy->decode_request();
  const int last_w = std::min(req.last_w, n);

  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = model_.layers[l];
    cpu::rmsnorm(xb_.data(), x_.data(), w.attn_norm.data(), n, D, c.norm_eps);
    cpu::matmul(q_.data(), xb_.data(), w.wq.data(), w.bq.empty() ? nullptr : w.bq.data(), n, D, QD);
    cpu::matmul(k_.data(), xb_.data(), w.wk.data(), w.bk.empty() ? nullptr : w.bk.data(), n, D, KVD);
    cpu::matmul(v_.data(), xb_.data(), w.wv.data(), w.bv.empty() ? nullptr : w.bv.data(), n, D, KVD);
    if (req.pre_rope_keys) pre_rope_k_.assign(k_.begin(), k_.begin() + N * KVD);
    cpu::rope(q_.data(), pos_.data(), n, c.num_heads, hd, c.rope);
    cpu::rope(k_.data(), pos_.data(), n, c.num_kv_heads, hd, c.rope);
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const size_t off = (static_cast<size_t>(t) * c.num_kv_heads + h) * hd;
        cache.append(l, h, &k_[off], &v_[off], pos_[t]);
      }
    }
    cpu::AttentionArgs args{att_.data(), q_.data(), cache.layer(l), n, c.num_heads, scale};
    policies::LayerStats stats;
    if (hook != PolicyHook::kNone) {
      int stride = 0;
      for (int h = 0; h < c.num_kv_heads; ++h) stride = std::max(stride, cache.length(l, h));
      const size_t rows = static_cast<size_t>(c.num_heads) * stride;
      if (req.col_sums) {
        col_sums_.resize(rows);
        args.col_sums = col_sums_.data();
      }
      if (last_w > 0) {
        last_probs_.resize(rows * last_w);
        args.last_probs = last_probs_.data();
        args.last_w = last_w;
      }
      args.stats_stride = stride;
      stats = {l,
               n,
               c.num_heads,
               stride,
               args.col_sums,
               args.last_probs,
               args.last_w,
               req.pre_rope_keys ? pre_rope_k_.data() : nullptr};
    }
    cpu::attention(args);
    // The layer's output used the full cache; the policy's decision shapes what later steps see.
    if (hook == PolicyHook::kPrefill) policy->on_prefill_layer(stats, cache);
    if (hook == PolicyHook::kDecode) policy->on_decode_layer(stats, cache);
    cpu::matmul(proj_.data(), att_.data(), w.wo.data(), nullptr, n, QD, D);
    for (size_t i = 0; i < N * D; ++i) x_[i] += proj_[i];

    cpu::rmsnorm(xb_.data(), x_.data(), w.ffn_norm.data(), n, D, c.norm_eps);
    cpu::matmul(gate_.data(), xb_.data(), w.w_gate.data(), nullptr, n, D, H);
    cpu::matmul(up_.data(), xb_.data(), w.w_up.data(), nullptr, n, D, H);
    cpu::swiglu(gate_.data(), up_.data(), N * H);
    cpu::matmul(proj_.data(), gate_.data(), w.w_down.data(), nullptr, n, H, D);
    for (size_t i = 0; i < N * D; ++i) x_[i] += proj_[i];
  }
  cache.advance_position(n);

  if (mode == LogitsMode::kNone) return;
  KVB_CHECK(logits != nullptr) << "forward: logits requested into a null vector";
  const int first = mode == LogitsMode::kLast ? n - 1 : 0;
  const int rows = n - first;
  const float* x_rows = &x_[static_cast<size_t>(first) * D];
  cpu::rmsnorm(xb_.data(), x_rows, model_.final_norm.data(), rows, D, c.norm_eps);
  logits->resize(static_cast<size_t>(rows) * c.vocab_size);
  cpu::matmul(logits->data(), xb_.data(), model_.output_weight(), nullptr, rows, D, c.vocab_size);
}

}  // namespace kvb::engine
