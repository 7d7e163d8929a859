// Engine: the block stack of engine.h over a Backend.
#include "workers/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/error.h"
#include "workers/engine/cpu_backend.h"

namespace kvb::engine {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace

bool decode_step_capturable(const policies::Policy* policy, const policies::StatsRequest& req,
                            bool host_rows, bool device_ops) {
  if (host_rows) return false;
  if (!policy) return true;
  if (policy->replaces_attention()) return false;
  const bool asks = req.col_sums || req.last_w > 0 || req.pre_rope_keys || req.pre_rope_queries;
  return !asks || (device_ops && policy->decides_with_ops());
}

namespace {
// Ends a step's capture that an exception interrupted (Backend::abort_graph).
struct GraphScope {
  Backend* be = nullptr;
  GraphScope() = default;
  GraphScope(const GraphScope&) = delete;
  GraphScope& operator=(const GraphScope&) = delete;
  ~GraphScope() {
    if (be) be->abort_graph();
  }
  void end() {
    Backend* b = be;
    be = nullptr;
    b->end_graph();
  }
};
}  // namespace

Engine::Engine(const Model& model, std::unique_ptr<Backend> backend, kernels::Communicator* tp)
    : model_(model), backend_(std::move(backend)), tp_(tp && tp->size() > 1 ? tp : nullptr) {
  KVB_CHECK(backend_ != nullptr) << "engine without a backend";
}

Engine::Engine(const Model& model, kernels::Communicator* tp, DType dtype, KvRows kv_rows)
    : Engine(model, std::make_unique<CpuBackend>(model, tp, dtype, kv_rows), tp) {}

void Engine::decode_each(std::span<const int32_t> tokens,
                         std::span<kernels::KvCache* const> caches,
                         std::span<policies::Policy* const> policies, std::vector<float>* logits,
                         double* seq_policy_ms) {
  const size_t B = tokens.size();
  KVB_CHECK(caches.size() == B && policies.size() == B && logits != nullptr)
      << "decode_batch: " << B << " tokens, " << caches.size() << " caches, " << policies.size()
      << " policies";
  const size_t V = static_cast<size_t>(config().vocab_size);
  logits->resize(B * V);
  std::vector<float> one;
  for (size_t b = 0; b < B; ++b) {
    const double p0 = policy_ms();
    forward(tokens.subspan(b, 1), *caches[b], LogitsMode::kLast, &one, policies[b],
            policies[b] ? PolicyHook::kDecode : PolicyHook::kNone);
    if (seq_policy_ms) seq_policy_ms[b] += policy_ms() - p0;
    std::copy(one.begin(), one.end(), logits->begin() + static_cast<std::ptrdiff_t>(b * V));
  }
}

kernels::KvCache Engine::new_cache(int initial_capacity,
                                        const policies::Policy* policy) const {
  const ModelConfig& c = model_.config;
  const int heads = policy && policy->gqa_expand() ? c.num_heads : c.num_kv_heads;
  const bool rolling = policy && policy->rolling_positions();
  return kernels::KvCache({c.num_layers, heads, c.head_dim, backend_->f16_rows(), rolling},
                          initial_capacity, !backend_->on_device());
}

void Engine::forward(std::span<const int32_t> tokens, kernels::KvCache& cache,
                          LogitsMode mode, std::vector<float>* logits, policies::Policy* policy,
                          PolicyHook hook, PrefillRecord* record) {
  const ModelConfig& c = model_.config;
  const int n = static_cast<int>(tokens.size());
  KVB_CHECK(n > 0) << "forward: no tokens";
  check_layer(0);  // before anything of the pass is done: a pass stopped here changed nothing
  Backend& be = *backend_;
  const int32_t pos0 = cache.next_position();
  pos_.resize(n);
  for (int t = 0; t < n; ++t) {
    const int32_t id = tokens[t];
    KVB_CHECK(id >= 0 && id < c.vocab_size)
        << "token id " << id << " at index " << t << " outside the vocabulary [0, "
        << c.vocab_size << ")";
    pos_[t] = pos0 + t;
  }
  KVB_CHECK(record == nullptr || !record->continues || continues_prefill())
      << "forward: this engine cannot continue a recorded prefill (prefix reuse is CPU-only)";
  cache.reserve_extra(n);
  be.begin_pass(tokens, pos_.data(), cache, n);
  const float scale = c.softmax_scale();
  const policies::StatsRequest req =
      forward_stats_request(n, cache, c.num_layers, policy, &hook, record, &prefills_);
  const int last_w = std::min(req.last_w, n);
  const size_t kv_elems = static_cast<size_t>(n) * c.num_kv_heads * c.head_dim;
  // A policy deciding with device ops reads the pre-RoPE keys on the device; a recorded prefill
  // keeps them on the host.
  const bool device_keys = req.pre_rope_keys && policy && policy->decides_with_ops() &&
                           be.policy_ops().on_device();
  const bool device_queries = req.pre_rope_queries && policy && policy->decides_with_ops() &&
                              be.policy_ops().on_device();
  const size_t q_elems = static_cast<size_t>(n) * c.num_heads * c.head_dim;
  // A decode step whose host code never waits for the device runs its layers as one graph
  // where the backend has graphs on.
  GraphScope graph;
  if (n == 1 && hook != PolicyHook::kPrefill && record == nullptr &&
      decode_step_capturable(policy, req, cache.host_rows(), be.policy_ops().on_device()) &&
      be.begin_graph()) {
    graph.be = &be;
  }

  for (int l = 0; l < c.num_layers; ++l) {
    // Between the layers of a pass over several tokens (a prompt's; a one-token pass is
    // checked at its start, and a captured step's host code must not stop halfway).
    if (l > 0 && n > 1 && !graph.be) check_layer(l);
    project_qkv(l, n);
    pre_rope_dev_ = device_keys ? be.stash(Act::kK, kv_elems) : nullptr;
    if (req.pre_rope_keys && (!device_keys || record)) {
      pre_rope_k_.resize(kv_elems);
      be.download(Act::kK, kv_elems, pre_rope_k_.data());
    }
    pre_rope_q_dev_ = device_queries ? be.stash(Act::kQ, q_elems) : nullptr;
    if (req.pre_rope_queries && (!device_queries || record)) {
      pre_rope_q_.resize(q_elems);
      be.download(Act::kQ, q_elems, pre_rope_q_.data());
    }
    attend_layer(l, n, cache, policy, hook, req, last_w, scale, record);
    finish_layer(l, n);
  }
  cache.advance_position(n);
  be.end_layers(n);
  if (graph.be) graph.end();
  if (hook == PolicyHook::kPrefill && policy && policy->rerotates()) continue_after_rerotation(cache);
  if (record) {  // the continued sums are in record->col_sums now
    record->seed_col_sums = {};
    record->seed_strides = {};
  }

  if (mode != LogitsMode::kNone) {
    KVB_CHECK(logits != nullptr) << "forward: logits requested into a null vector";
    const int first = mode == LogitsMode::kLast ? n - 1 : 0;
    be.rmsnorm(Act::kXb, Act::kX, -1, Norm::kAttn, first, n - first);
    be.classify(n - first, logits);
  }
  be.end_pass(cache);
  if (be.on_device()) policy_ms_ += be.take_policy_ms();
}

void Engine::decode_batch(std::span<const int32_t> tokens,
                               std::span<kernels::KvCache* const> caches,
                               std::span<policies::Policy* const> policies,
                               std::vector<float>* logits, double* seq_policy_ms) {
  const int B = static_cast<int>(tokens.size());
  if (B <= 1) {
    decode_each(tokens, caches, policies, logits, seq_policy_ms);
    return;
  }
  const ModelConfig& c = model_.config;
  KVB_CHECK(static_cast<int>(caches.size()) == B && static_cast<int>(policies.size()) == B &&
            logits != nullptr)
      << "decode_batch: " << B << " tokens, " << caches.size() << " caches, " << policies.size()
      << " policies";
  Backend& be = *backend_;
  pos_.resize(B);
  hooks_.resize(B);
  reqs_.resize(B);
  for (int b = 0; b < B; ++b) {
    kernels::KvCache& cache = *caches[b];
    for (int o = 0; o < b; ++o) {
      KVB_CHECK(caches[o] != caches[b]) << "decode_batch: sequences " << o << " and " << b
                                        << " share a cache";
    }
    policies::Policy* policy = policies[b];
    KVB_CHECK(tokens[b] >= 0 && tokens[b] < c.vocab_size)
        << "token id " << tokens[b] << " of sequence " << b << " outside the vocabulary [0, "
        << c.vocab_size << ")";
    pos_[b] = cache.next_position();
    hooks_[b] = PolicyHook::kDecode;
    reqs_[b] = forward_stats_request(1, cache, c.num_layers, policy, &hooks_[b], nullptr,
                                     &prefills_);
    cache.reserve_extra(1);
  }
  be.begin_pass(tokens, pos_.data(), *caches[0], 1);
  for (int b = 1; b < B; ++b) be.bind_sequence(*caches[b]);
  GraphScope graph;  // as forward(): one graph when every sequence's step qualifies
  bool capturable = true;
  for (int b = 0; b < B && capturable; ++b) {
    capturable = decode_step_capturable(policies[b], reqs_[b], caches[b]->host_rows(),
                                        be.policy_ops().on_device());
  }
  if (capturable && be.begin_graph()) graph.be = &be;
  const float scale = c.softmax_scale();
  const size_t kv_elems = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  const bool device_ops = be.policy_ops().on_device();
  for (int l = 0; l < c.num_layers; ++l) {
    project_qkv(l, B);
    if (attention_batches(l, caches, policies)) {
      attend_layer_batch(l, caches, policies, scale, seq_policy_ms);
      be.select_rows(0);
      finish_layer(l, B);
      continue;
    }
    for (int b = 0; b < B; ++b) {
      be.select_rows(b);
      pre_rope_dev_ = nullptr;
      pre_rope_q_dev_ = nullptr;
      if (reqs_[b].pre_rope_queries) {
        const size_t q_row = static_cast<size_t>(c.num_heads) * c.head_dim;
        if (device_ops && policies[b]->decides_with_ops()) {
          pre_rope_q_dev_ = be.stash(Act::kQ, q_row);  // the selected row's queries
        } else {
          pre_rope_q_.resize(q_row);
          be.download(Act::kQ, q_row, pre_rope_q_.data());
        }
      }
      if (reqs_[b].pre_rope_keys) {
        if (device_ops && policies[b]->decides_with_ops()) {
          pre_rope_dev_ = be.stash(Act::kK, kv_elems);  // the selected row's keys
        } else {
          pre_rope_k_.resize(kv_elems);
          be.download(Act::kK, kv_elems, pre_rope_k_.data());
        }
      }
      const double p0 = policy_ms_;
      span_seq_ = b;
      attend_layer(l, 1, *caches[b], policies[b], hooks_[b], reqs_[b],
                   std::min(reqs_[b].last_w, 1), scale, nullptr);
      span_seq_ = -1;
      if (seq_policy_ms) seq_policy_ms[b] += policy_ms_ - p0;
    }
    be.select_rows(0);
    finish_layer(l, B);
  }
  for (int b = 0; b < B; ++b) caches[b]->advance_position(1);
  be.end_layers(1);
  if (graph.be) graph.end();
  be.rmsnorm(Act::kXb, Act::kX, -1, Norm::kAttn, 0, B);
  be.classify(B, logits);
  be.end_pass(*caches[0]);
  if (be.on_device()) {
    // Device spans complete at end_pass: each goes to the sequence whose hook it timed.
    policy_ms_ += be.take_policy_ms(&span_ms_);
    KVB_CHECK(span_ms_.size() == span_owner_.size())
        << "decode_batch: " << span_ms_.size() << " policy spans for " << span_owner_.size()
        << " begun";
    if (seq_policy_ms) {
      for (size_t i = 0; i < span_ms_.size(); ++i) seq_policy_ms[span_owner_[i]] += span_ms_[i];
    }
  }
  span_owner_.clear();
}

void Engine::project_qkv(int l, int n) {
  const ModelConfig& c = model_.config;
  Backend& be = *backend_;
  be.rmsnorm(Act::kXb, Act::kX, l, Norm::kAttn, 0, n);
  be.linear_qkv(l, n);
  if (c.qk_norm) {  // Qwen3, Gemma 3: per-head RMSNorm of Q and K, before RoPE (and pre-RoPE keys)
    be.head_rmsnorm(Act::kQ, l, QkNorm::kQ, c.num_heads, n);
    be.head_rmsnorm(Act::kK, l, QkNorm::kK, c.num_kv_heads, n);
  }
}

void Engine::finish_layer(int l, int n) {
  const ModelConfig& c = model_.config;
  Backend& be = *backend_;
  auto residual = [&](Norm post) {
    if (c.post_norms) {
      be.reduce_norm_add(Act::kX, Act::kProj, l, post, n);
    } else {
      be.reduce_add(Act::kX, Act::kProj, n);
    }
  };
  be.linear(Act::kProj, Act::kAtt, l, Mat::kWo, n);
  residual(Norm::kPostAttn);
  be.rmsnorm(Act::kXb, Act::kX, l, Norm::kFfn, 0, n);
  be.linear_gate_up(l, n);
  be.glu(n);
  be.linear(Act::kProj, Act::kGate, l, Mat::kDown, n);
  residual(Norm::kPostFfn);
}

void Engine::begin_span() {
  if (span_seq_ >= 0) span_owner_.push_back(span_seq_);
  backend_->begin_policy_span();
}

void Engine::rerotate_layer(int l, kernels::KvCache& cache) {
  const ModelConfig& c = model_.config;
  KVB_USAGE_CHECK(!c.has_sliding_layers())
      << "positions: rerotate on a model with sliding-window layers: their windows keep the "
      << "tokens' own positions, which the re-rotated layers' next tokens would precede; run the "
      << "policy without it";
  backend_->rerotate_keys(l, c.rope_of(l), cache);
}

void Engine::continue_after_rerotation(kernels::KvCache& cache) {
  // kvpress continues at the compressed cache's length (cache.get_seq_length(): layer 0's); the
  // longest head's keeps every position increasing along each head's slots.
  int longest = 0;
  for (int l = 0; l < cache.shape().num_layers; ++l) {
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      longest = std::max(longest, cache.length(l, h));
    }
  }
  if (tp_) longest = kernels::all_max(*tp_, longest);
  move_position(cache, longest - cache.next_position());
}

void Engine::move_position(kernels::KvCache& cache, int delta) {
  cache.advance_position(delta);
  backend_->moved_position(cache, delta);
}

void Engine::reconstruct_context(policies::Policy& policy, kernels::KvCache& cache,
                                 std::span<const int32_t> prompt) {
  KVB_CHECK(policy.reconstructs_context()) << "reconstruct_context: the policy reconstructs none";
  const ModelConfig& c = model_.config;
  KVB_USAGE_CHECK(!c.has_sliding_layers())
      << "a policy that reconstructs the context (kvzip) on a model with sliding-window layers: "
      << "their windows would keep the reconstruction's tokens; choose another policy";
  const int end = cache.next_position();
  for (const policies::ReplayPass& pass : policy.replay_passes(prompt)) {
    policy.begin_replay(pass);
    forward(pass.tokens, cache, LogitsMode::kNone, nullptr, &policy, PolicyHook::kPrefill);
    move_position(cache, end - cache.next_position());  // back to the prompt's end
  }
  policy.end_replay();
  for (int l = 0; l < c.num_layers; ++l) {
    run_hook(l, cache, [&](kernels::EvictionPlan& p) { policy.on_replayed_layer(l, cache, p); });
  }
}

template <typename Hook>
void Engine::run_hook(int layer, kernels::KvCache& cache, Hook&& hook) {
  Backend& be = *backend_;
  const bool device_time = be.on_device();
  const auto t0 = Clock::now();
  if (device_time) begin_span();
  plan_.reset(layer, cache.shape().num_kv_heads);
  hook(plan_);
  be.apply_plan(plan_, cache);
  if (device_time) {
    be.end_policy_span();
  } else {
    policy_ms_ += ms_since(t0);
  }
}

void Engine::check_cache_heads(const kernels::KvCache& cache) const {
  const ModelConfig& c = model_.config;
  const int ckv = cache.shape().num_kv_heads;  // num_kv_heads, or num_heads when GQA is expanded
  KVB_CHECK(ckv == c.num_kv_heads || ckv == c.num_heads)
      << "cache has " << ckv << " KV heads; the model " << c.num_kv_heads << " (or " << c.num_heads
      << " expanded)";
}

policies::LayerStats Engine::prepare_layer(int l, int n, kernels::KvCache& cache,
                                                policies::Policy* policy, PolicyHook* hook,
                                                const policies::StatsRequest& req, bool rope_keys) {
  const ModelConfig& c = model_.config;
  Backend& be = *backend_;
  const bool rolling = policy && policy->rolling_positions();
  // New K/V into the cache (expanded caches get a copy per query head).
  if (rope_keys && !rolling) be.rope(Act::kK, l, c.num_kv_heads, n);
  be.append_kv(l, n, cache);
  policies::LayerStats stats;
  stats.layer = l;
  stats.n_new = n;
  stats.num_heads = c.num_heads;
  stats.pre_rope_keys = !req.pre_rope_keys ? nullptr
                        : pre_rope_dev_     ? pre_rope_dev_
                                            : pre_rope_k_.data();
  stats.pre_rope_queries = !req.pre_rope_queries ? nullptr
                           : pre_rope_q_dev_       ? pre_rope_q_dev_
                                                   : pre_rope_q_.data();
  stats.rope = &c.rope_of(l);
  stats.block_end = cache.next_position() + n;  // the cache advances after the pass
  if (req.output_projection && *hook != PolicyHook::kNone) {
    stats.wo = be.output_projection(l, &stats.wo_bf16);
    stats.wo_dim = c.dim;
  }
  stats.ops = &be.policy_ops();
  if (*hook == PolicyHook::kDecode && policy->evict_before_attention()) {
    run_hook(l, cache, [&](kernels::EvictionPlan& p) { policy->on_decode_layer(stats, cache, p); });
    *hook = PolicyHook::kNone;
  }
  return stats;
}

Engine::StatsShape Engine::stats_shape(int l, const kernels::KvCache& cache,
                                                 PolicyHook hook, const policies::StatsRequest& req,
                                                 int last_w, bool record,
                                                 policies::LayerStats* stats) const {
  StatsShape sh;
  if (hook != PolicyHook::kNone || record) {
    for (int h = 0; h < cache.shape().num_kv_heads; ++h) {
      sh.stride = std::max(sh.stride, cache.length(l, h));
    }
    sh.col_sums = req.col_sums;
    sh.last_w = last_w;
    stats->stride = sh.stride;
  }
  return sh;
}

void Engine::after_attention(int l, kernels::KvCache& cache, policies::Policy* policy,
                                  PolicyHook hook, const policies::StatsRequest& req,
                                  PrefillRecord* record, policies::LayerStats stats) {
  const ModelConfig& c = model_.config;
  Backend& be = *backend_;
  // A policy that decides with ops reads the statistics where attention wrote them; others
  // read them on the host (on a device: a copy and a sync, eviction overhead).
  const bool stats_stay = hook != PolicyHook::kNone && policy->decides_with_ops();
  policies::LayerStats host = stats;
  if ((stats.col_sums || stats.last_probs) && (record || !stats_stay)) {
    const bool device_time = hook != PolicyHook::kNone && be.on_device();
    if (device_time) begin_span();
    const double ms = be.stats_to_host(&host);
    if (device_time) {
      be.end_policy_span();
    } else if (hook != PolicyHook::kNone) {
      policy_ms_ += ms;
    }
    if (!stats_stay) stats = host;
  }
  if (record) {
    const size_t rows = static_cast<size_t>(c.num_heads) * stats.stride;
    record->strides[l] = stats.stride;
    if (host.col_sums) record->col_sums[l].assign(host.col_sums, host.col_sums + rows);
    if (host.last_probs) {
      record->last_probs[l].assign(host.last_probs, host.last_probs + rows * host.last_w);
    }
    if (req.pre_rope_keys) record->pre_rope_keys[l] = pre_rope_k_;
    if (req.pre_rope_queries) record->pre_rope_queries[l] = pre_rope_q_;
  }
  // The layer's output used the full cache; the policy's decision shapes what later steps see.
  if (hook == PolicyHook::kPrefill) {
    run_hook(l, cache,
             [&](kernels::EvictionPlan& p) { policy->on_prefill_layer(stats, cache, p); });
    if (policy->rerotates()) {  // timed as the policy's: a hook that plans nothing
      run_hook(l, cache, [&](kernels::EvictionPlan&) { rerotate_layer(l, cache); });
    }
    if (policy->prunes_key_channels()) {  // ThinK: the key channels of what the policy kept
      run_hook(l, cache,
               [&](kernels::EvictionPlan& p) { policy->on_prefill_channels(stats, cache, p); });
    }
  } else if (hook == PolicyHook::kDecode) {
    run_hook(l, cache, [&](kernels::EvictionPlan& p) { policy->on_decode_layer(stats, cache, p); });
  }
}

void Engine::attend_layer(int l, int n, kernels::KvCache& cache, policies::Policy* policy,
                               PolicyHook hook, const policies::StatsRequest& req, int last_w,
                               float scale, PrefillRecord* record) {
  const ModelConfig& c = model_.config;
  Backend& be = *backend_;
  check_cache_heads(cache);
  if (c.sliding(l)) {
    sliding_layer(l, n, scale, cache);
    return;
  }
  policies::LayerStats stats = prepare_layer(l, n, cache, policy, &hook, req, true);
  const int ckv = cache.shape().num_kv_heads;
  if (policy && policy->rolling_positions()) {
    // Positions are indices in the cache: query i of the block sits at len - n + i of its head;
    // keys are rotated by their slot index for this attention (the cache keeps them raw).
    const int cache_group = c.num_heads / ckv;
    qpos_.resize(static_cast<size_t>(n) * c.num_heads);
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < c.num_heads; ++h) {
        qpos_[static_cast<size_t>(t) * c.num_heads + h] =
            cache.length(l, h / cache_group) - n + t;
      }
    }
    be.rope_rows(Act::kQ, l, qpos_.data(), n * c.num_heads);
    be.roll_keys(l, cache);
  } else {
    be.rope(Act::kQ, l, c.num_heads, n);
  }
  // The block's last queries after RoPE, for a policy that reads them (or a record of them).
  if (req.last_queries > 0 && (hook != PolicyHook::kNone || record)) {
    const int q = std::min(req.last_queries, n);
    const size_t row = static_cast<size_t>(c.num_heads) * c.head_dim;
    last_q_.resize(q * row);
    be.download(Act::kQ, last_q_.size(), last_q_.data(), (n - q) * row);
    stats.last_queries = last_q_.data();
    stats.n_queries = q;
    if (record) record->last_queries[l] = last_q_;
  }

  if (policy && policy->replaces_attention()) {
    policies::AttendArgs a;
    a.layer = l;
    a.n = n;
    a.num_heads = c.num_heads;
    a.head_dim = c.head_dim;
    a.scale = scale;
    a.prefill = hook == PolicyHook::kPrefill;
    plan_.reset(l, ckv);
    be.attend_replaced(*policy, a, cache, &plan_);
    be.apply_plan(plan_, cache);
    return;
  }
  const StatsShape sh = stats_shape(l, cache, hook, req, last_w, record != nullptr, &stats);
  if (sh.col_sums && record && !record->seed_col_sums.empty()) {
    const std::vector<float>& seed = record->seed_col_sums[l];
    KVB_CHECK(seed.size() == static_cast<size_t>(c.num_heads) * record->seed_strides[l])
        << "forward: layer " << l << "'s column sums to continue hold " << seed.size()
        << " entries, not " << c.num_heads << " x " << record->seed_strides[l];
    be.seed_col_sums(seed.data(), record->seed_strides[l]);
  }
  be.attention(l, n, scale, cache, sh.col_sums, sh.last_w, sh.stride, &stats);
  after_attention(l, cache, policy, hook, req, record, stats);
}

bool Engine::attention_batches(int l, std::span<kernels::KvCache* const> caches,
                                    std::span<policies::Policy* const> policies) const {
  const ModelConfig& c = model_.config;
  if (c.sliding(l)) return false;
  const int ckv = caches[0]->shape().num_kv_heads;
  for (size_t b = 0; b < caches.size(); ++b) {
    const policies::Policy* p = policies[b];
    if (caches[b]->shape().num_kv_heads != ckv || reqs_[b].pre_rope_keys ||
        reqs_[b].pre_rope_queries ||
        reqs_[b].last_queries > 0) {
      return false;
    }
    if (p && (p->rolling_positions() || p->replaces_attention())) return false;
  }
  return true;
}

void Engine::attend_layer_batch(int l, std::span<kernels::KvCache* const> caches,
                                     std::span<policies::Policy* const> policies, float scale,
                                     double* seq_policy_ms) {
  const ModelConfig& c = model_.config;
  Backend& be = *backend_;
  const int B = static_cast<int>(caches.size());
  // Every row's keys in one RoPE (no sequence rolls its positions), then per sequence its
  // append and any before-attention hook, every row's queries in one RoPE, one attention for
  // all, and per sequence its statistics and hook: per sequence the ops of attend_layer in its
  // order, the same bits.
  for (int b = 0; b < B; ++b) check_cache_heads(*caches[b]);
  be.select_rows(0);
  be.rope(Act::kK, l, c.num_kv_heads, B);
  batch_stats_.resize(B);
  batch_hooks_.resize(B);
  batch_items_.resize(B);
  pre_rope_dev_ = nullptr;
  pre_rope_q_dev_ = nullptr;
  for (int b = 0; b < B; ++b) {
    be.select_rows(b);
    const double p0 = policy_ms_;
    span_seq_ = b;
    batch_hooks_[b] = hooks_[b];
    batch_stats_[b] =
        prepare_layer(l, 1, *caches[b], policies[b], &batch_hooks_[b], reqs_[b], false);
    span_seq_ = -1;
    if (seq_policy_ms) seq_policy_ms[b] += policy_ms_ - p0;
  }
  be.select_rows(0);
  be.rope(Act::kQ, l, c.num_heads, B);
  for (int b = 0; b < B; ++b) {
    const StatsShape sh = stats_shape(l, *caches[b], batch_hooks_[b], reqs_[b],
                                      std::min(reqs_[b].last_w, 1), false, &batch_stats_[b]);
    batch_items_[b] = {b, caches[b], sh.col_sums, sh.last_w, sh.stride, &batch_stats_[b]};
  }
  be.attention_batch(l, scale, batch_items_);
  for (int b = 0; b < B; ++b) {
    be.select_rows(b);
    const double p0 = policy_ms_;
    span_seq_ = b;
    after_attention(l, *caches[b], policies[b], batch_hooks_[b], reqs_[b], nullptr,
                    batch_stats_[b]);
    span_seq_ = -1;
    if (seq_policy_ms) seq_policy_ms[b] += policy_ms_ - p0;
  }
}

void Engine::sliding_layer(int l, int n, float scale, kernels::KvCache& cache) {
  const ModelConfig& c = model_.config;
  Backend& be = *backend_;
  be.rope(Act::kK, l, c.num_kv_heads, n);
  be.append_kv(l, n, cache);
  be.rope(Act::kQ, l, c.num_heads, n);
  policies::LayerStats stats;
  be.attention(l, n, scale, cache, false, 0, 0, &stats);
  // The window is the layer's cache: the next query sees its own row and the window - 1 before.
  const int keep = c.window[l] - 1;
  const int ckv = cache.shape().num_kv_heads;
  plan_.reset(l, ckv);
  for (int h = 0; h < ckv; ++h) {
    const int len = cache.length(l, h);
    if (len - keep == 1) {
      plan_.evict(h, 0);
    } else if (len > keep) {
      window_keep_.resize(keep);
      for (int s = 0; s < keep; ++s) window_keep_[s] = len - keep + s;
      plan_.keep(h, window_keep_);
    }
  }
  if (plan_.changes_any()) be.apply_plan(plan_, cache);
}

void append_block_rows(const ModelConfig& c, int l, int n, const float* keys,
                       const float* values, const int32_t* positions, kernels::KvCache& cache) {
  const int hd = c.head_dim, ckv = cache.shape().num_kv_heads;
  const int model_group = c.num_heads / c.num_kv_heads;
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < ckv; ++h) {
      const int src = ckv == c.num_kv_heads ? h : h / model_group;
      const size_t off = (static_cast<size_t>(t) * c.num_kv_heads + src) * hd;
      cache.append(l, h, &keys[off], &values[off], positions[t]);
    }
  }
}

bool can_share_prefill(const policies::Policy& policy) {
  return policy.prefill_mode() == policies::PrefillMode::kOneshot && !policy.gqa_expand() &&
         !policy.rolling_positions() && !policy.replaces_attention();
}

void Engine::apply_recorded_prefill(policies::Policy& policy, const kernels::KvCache& full,
                                         int extra, const PrefillRecord& rec,
                                         kernels::KvCache& cache) {
  KVB_CHECK(can_share_prefill(policy)) << "policy cannot use a shared prefill";
  KVB_CHECK(&full != &cache) << "apply_recorded_prefill: the prefill's cache is its own target";
  const bool host = full.host_rows();  // else an index whose rows a device keeps
  if (host) {
    cache = full.empty_copy(extra);
  } else {
    cache = full;
    cache.reserve_extra(extra);
  }
  const ModelConfig& c = model_.config;
  const int n = rec.n_new;
  const policies::StatsRequest req = policy.prefill_stats(n);
  const int w = std::min(req.last_w, n);
  const int q = std::min(req.last_queries, n);
  int g0 = 0;  // the first global layer: sliding-window layers record nothing
  while (g0 < c.num_layers && c.sliding(g0)) ++g0;
  KVB_CHECK(g0 == c.num_layers ||
            ((!req.col_sums || !rec.col_sums[g0].empty()) && w <= rec.last_w &&
             q <= rec.n_queries &&
             (!req.pre_rope_keys || !rec.pre_rope_keys[g0].empty()) &&
             (!req.pre_rope_queries || !rec.pre_rope_queries[g0].empty())))
      << "the recorded prefill lacks statistics this policy needs";
  Backend& be = *backend_;
  const int heads = cache.shape().num_kv_heads;
  const bool device_time = be.on_device();
  const auto t0 = Clock::now();
  if (device_time) begin_span();
  for (int l = 0; l < c.num_layers; ++l) {
    if (c.sliding(l)) {  // the window is the cache; policies act on global layers
      if (host) {
        plan_.reset(l, heads);
        cache.fill_layer(full, plan_);
      }
      continue;
    }
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
    st.pre_rope_queries = req.pre_rope_queries ? rec.pre_rope_queries[l].data() : nullptr;
    st.rope = &c.rope_of(l);
    st.block_end = full.next_position();  // the recorded pass has advanced it
    if (q > 0) {  // the policy's last q of the recorded queries
      const size_t row = static_cast<size_t>(c.num_heads) * c.head_dim;
      st.last_queries = rec.last_queries[l].data() + (rec.n_queries - q) * row;
      st.n_queries = q;
    }
    st.ops = &be.policy_ops();
    if (policy.decides_with_ops()) be.stats_to_device(&st);  // where the ops read them
    if (req.output_projection) {  // where the ops read it already
      st.wo = be.output_projection(l, &st.wo_bf16);
      st.wo_dim = c.dim;
    }
    plan_.reset(l, heads);
    if (host) {  // full's layer l is what cache's would be before this hook
      policy.on_prefill_layer(st, full, plan_);
      cache.fill_layer(full, plan_);
    } else {
      policy.on_prefill_layer(st, cache, plan_);
      be.apply_plan(plan_, cache);  // the index and the storage where it lives
    }
    if (policy.rerotates()) rerotate_layer(l, cache);
    if (policy.prunes_key_channels()) {  // ThinK: the key channels of what the policy kept
      plan_.reset(l, heads);
      policy.on_prefill_channels(st, cache, plan_);
      be.apply_plan(plan_, cache);
    }
  }
  if (device_time) {
    be.end_policy_span();
    policy_ms_ += be.take_policy_ms();
  } else {
    policy_ms_ += ms_since(t0);
  }
  if (policy.rerotates()) continue_after_rerotation(cache);
}

}  // namespace kvb::engine
