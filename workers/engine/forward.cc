// Engine::forward: the Llama/Qwen2 block stack over a ragged per-head KV cache (CPU, f32).
#include "workers/engine/forward.h"

#include <algorithm>
#include <chrono>
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

Engine::Engine(const Model& model, kernels::Communicator* tp)
    : model_(model), tp_(tp && tp->size() > 1 ? tp : nullptr) {}

kernels::KvCache Engine::new_cache(int initial_capacity, const policies::Policy* policy) const {
  const ModelConfig& c = model_.config;
  const int heads = policy && policy->gqa_expand() ? c.num_heads : c.num_kv_heads;
  return kernels::KvCache({c.num_layers, heads, c.head_dim}, initial_capacity);
}

void Engine::forward(std::span<const int32_t> tokens, kernels::KvCache& cache, LogitsMode mode,
                     std::vector<float>* logits, policies::Policy* policy, PolicyHook hook,
                     PrefillRecord* record) {
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
  const policies::StatsRequest req =
      forward_stats_request(n, cache, c.num_layers, policy, &hook, record, &prefills_);
  const int last_w = std::min(req.last_w, n);

  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = model_.layers[l];
    cpu::rmsnorm(xb_.data(), x_.data(), w.attn_norm.data(), n, D, c.norm_eps);
    cpu::matmul(q_.data(), xb_.data(), w.wq.data(), w.bq.empty() ? nullptr : w.bq.data(), n, D, QD);
    cpu::matmul(k_.data(), xb_.data(), w.wk.data(), w.bk.empty() ? nullptr : w.bk.data(), n, D, KVD);
    cpu::matmul(v_.data(), xb_.data(), w.wv.data(), w.bv.empty() ? nullptr : w.bv.data(), n, D, KVD);
    if (req.pre_rope_keys) pre_rope_k_.assign(k_.begin(), k_.begin() + N * KVD);
    attend_layer(l, n, cache, policy, hook, req, last_w, scale, record);
    cpu::matmul(proj_.data(), att_.data(), w.wo.data(), nullptr, n, QD, D);
    // Row-parallel projections: each rank's product over its heads (columns) is a partial sum.
    if (tp_) tp_->all_reduce_sum(proj_.data(), N * D);
    for (size_t i = 0; i < N * D; ++i) x_[i] += proj_[i];

    cpu::rmsnorm(xb_.data(), x_.data(), w.ffn_norm.data(), n, D, c.norm_eps);
    cpu::matmul(gate_.data(), xb_.data(), w.w_gate.data(), nullptr, n, D, H);
    cpu::matmul(up_.data(), xb_.data(), w.w_up.data(), nullptr, n, D, H);
    cpu::swiglu(gate_.data(), up_.data(), N * H);
    cpu::matmul(proj_.data(), gate_.data(), w.w_down.data(), nullptr, n, H, D);
    if (tp_) tp_->all_reduce_sum(proj_.data(), N * D);
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

void Engine::attend_layer(int l, int n, kernels::KvCache& cache, policies::Policy* policy,
                          PolicyHook hook, const policies::StatsRequest& req, int last_w,
                          float scale, PrefillRecord* record) {
  const ModelConfig& c = model_.config;
  const int hd = c.head_dim;
  const int ckv = cache.shape().num_kv_heads;  // num_kv_heads, or num_heads when GQA is expanded
  KVB_CHECK(ckv == c.num_kv_heads || ckv == c.num_heads)
      << "cache has " << ckv << " KV heads; the model " << c.num_kv_heads << " (or " << c.num_heads
      << " expanded)";
  const int model_group = c.num_heads / c.num_kv_heads;
  const bool rolling = policy && policy->rolling_positions();
  // New K/V into the cache (expanded caches get a copy per query head).
  if (!rolling) cpu::rope(k_.data(), pos_.data(), n, c.num_kv_heads, hd, c.rope);
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < ckv; ++h) {
      const int src = ckv == c.num_kv_heads ? h : h / model_group;
      const size_t off = (static_cast<size_t>(t) * c.num_kv_heads + src) * hd;
      cache.append(l, h, &k_[off], &v_[off], pos_[t]);
    }
  }
  policies::LayerStats stats;
  stats.layer = l;
  stats.n_new = n;
  stats.num_heads = c.num_heads;
  stats.pre_rope_keys = req.pre_rope_keys ? pre_rope_k_.data() : nullptr;
  if (hook == PolicyHook::kDecode && policy->evict_before_attention()) {
    const auto t0 = std::chrono::steady_clock::now();
    policy->on_decode_layer(stats, cache);
    policy_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    hook = PolicyHook::kNone;
  }

  kernels::LayerKvView view = cache.layer(l);
  const int cache_group = c.num_heads / ckv;
  if (rolling) {
    // Positions are indices in the cache: query i of the block sits at len - n + i of its head.
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < c.num_heads; ++h) {
        const int32_t idx = cache.length(l, h / cache_group) - n + t;
        cpu::rope(&q_[(static_cast<size_t>(t) * c.num_heads + h) * hd], &idx, 1, 1, hd, c.rope);
      }
    }
    rolled_keys_.resize(static_cast<size_t>(ckv) * view.capacity * hd);
    for (int h = 0; h < ckv; ++h) {
      const int len = cache.length(l, h);
      float* dst = &rolled_keys_[static_cast<size_t>(h) * view.capacity * hd];
      std::memcpy(dst, view.key(h, 0), static_cast<size_t>(len) * hd * sizeof(float));
      rolled_pos_.resize(len);
      for (int s = 0; s < len; ++s) rolled_pos_[s] = s;
      cpu::rope(dst, rolled_pos_.data(), len, 1, hd, c.rope);
    }
    view.keys = rolled_keys_.data();
  } else {
    cpu::rope(q_.data(), pos_.data(), n, c.num_heads, hd, c.rope);
  }

  if (policy && policy->replaces_attention()) {
    policies::AttendArgs a{l, n, c.num_heads, hd, scale, q_.data(), att_.data(),
                           hook == PolicyHook::kPrefill};
    policy->attend(a, cache);
    return;
  }
  cpu::AttentionArgs args{att_.data(), q_.data(), view, n, c.num_heads, scale};
  if (hook != PolicyHook::kNone || record) {
    int stride = 0;
    for (int h = 0; h < ckv; ++h) stride = std::max(stride, cache.length(l, h));
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
    stats.stride = stride;
    stats.col_sums = args.col_sums;
    stats.last_probs = args.last_probs;
    stats.last_w = args.last_w;
  }
  cpu::attention(args);
  if (record) {
    record->strides[l] = stats.stride;
    if (args.col_sums) record->col_sums[l].assign(args.col_sums, args.col_sums + col_sums_.size());
    if (args.last_probs) {
      record->last_probs[l].assign(args.last_probs, args.last_probs + last_probs_.size());
    }
    if (req.pre_rope_keys) record->pre_rope_keys[l] = pre_rope_k_;
  }
  // The layer's output used the full cache; the policy's decision shapes what later steps see.
  const auto t0 = std::chrono::steady_clock::now();
  if (hook == PolicyHook::kPrefill) policy->on_prefill_layer(stats, cache);
  if (hook == PolicyHook::kDecode) policy->on_decode_layer(stats, cache);
  if (hook != PolicyHook::kNone) {
    policy_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
}

bool can_share_prefill(const policies::Policy& policy) {
  return policy.prefill_mode() == policies::PrefillMode::kOneshot && !policy.gqa_expand() &&
         !policy.rolling_positions() && !policy.replaces_attention();
}

void Engine::apply_recorded_prefill(policies::Policy& policy, kernels::KvCache& cache,
                                    const PrefillRecord& rec) {
  KVB_CHECK(can_share_prefill(policy)) << "policy cannot use a shared prefill";
  const ModelConfig& c = model_.config;
  const int n = rec.n_new;
  const policies::StatsRequest req = policy.prefill_request(n);
  const int w = std::min(req.last_w, n);
  KVB_CHECK((!req.col_sums || !rec.col_sums[0].empty()) && w <= rec.last_w &&
            (!req.pre_rope_keys || !rec.pre_rope_keys[0].empty()))
      << "the recorded prefill lacks statistics this policy needs";
  const auto t0 = std::chrono::steady_clock::now();
  for (int l = 0; l < c.num_layers; ++l) {
    const int stride = rec.strides[l];
    policies::LayerStats st;
    st.layer = l;
    st.n_new = n;
    st.num_heads = c.num_heads;
    st.stride = stride;
    st.col_sums = req.col_sums ? rec.col_sums[l].data() : nullptr;
    if (w > 0) {
      // The policy's last w rows of the recorded last_w rows, per head.
      slice_.resize(static_cast<size_t>(c.num_heads) * w * stride);
      for (int h = 0; h < c.num_heads; ++h) {
        const float* src =
            &rec.last_probs[l][(static_cast<size_t>(h) * rec.last_w + (rec.last_w - w)) * stride];
        std::copy(src, src + static_cast<size_t>(w) * stride,
                  &slice_[static_cast<size_t>(h) * w * stride]);
      }
      st.last_probs = slice_.data();
      st.last_w = w;
    }
    st.pre_rope_keys = req.pre_rope_keys ? rec.pre_rope_keys[l].data() : nullptr;
    policy.on_prefill_layer(st, cache);
  }
  policy_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace kvb::engine
