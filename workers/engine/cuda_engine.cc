// CudaEngine: the block stack of forward.cc on one GPU, with the policies on a host mirror
// (cuda_engine.h). Compiled only with KVB_WITH_CUDA.
#include "workers/engine/cuda_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"
#include "workers/engine/cuda_engine_kernels.h"

namespace kvb::engine {

namespace cu = kvb::kernels::cuda;
using Clock = std::chrono::steady_clock;

namespace {
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
template <typename T>
void ensure(cu::DeviceBuffer<T>& b, size_t count) {
  if (b.size() < count) b = cu::DeviceBuffer<T>(std::max<size_t>(count, b.size() * 3 / 2));
}
// Round to bf16 (nearest even) and back, as the device stores a bf16 cache (finite inputs;
// NaN stays NaN).
float bf16_round(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  if ((b & 0x7fffffffu) > 0x7f800000u) return f;
  b += 0x7fffu + ((b >> 16) & 1u);
  b &= 0xffff0000u;
  float r;
  std::memcpy(&r, &b, sizeof r);
  return r;
}
}  // namespace

// One layer's weights: matrices in the engine's dtype (one of the two buffers is used).
struct CudaEngine::DeviceLayer {
  cu::DeviceBuffer<float> attn_norm, ffn_norm, bq, bk, bv;
  struct Matrix {
    cu::DeviceBuffer<float> f32;
    cu::DeviceBuffer<__nv_bfloat16> bf16;
    const void* ptr(DType t) const {
      return t == DType::kBf16 ? static_cast<const void*>(bf16.data()) : f32.data();
    }
  };
  Matrix wq, wk, wv, wo, w_gate, w_up, w_down;
};

struct CudaEngine::Scratch {
  cu::DeviceBuffer<float> x, xb, q, k, v, kx, vx, att, proj, gate, up, logits;
  cu::DeviceBuffer<__nv_bfloat16> x16;
  cu::DeviceBuffer<int32_t> tokens, pos, qpos, slots, iota;
  cu::DeviceBuffer<float> col_sums, last_probs, rolled;
  cu::DeviceBuffer<unsigned char> rolled_kv;  // rolled keys in the cache dtype
};

CudaEngine::CudaEngine(const Model& model, DType dtype, int gpu)
    : model_(model), dtype_(dtype), gpu_(gpu), host_(model), s_(std::make_unique<Scratch>()) {
  const int count = cu::device_count();
  if (count == 0) KVB_FAIL() << "--device cuda: no GPU visible";
  KVB_CHECK(gpu >= 0 && gpu < count)
      << "--device cuda: GPU index " << gpu << " but " << count << " GPU(s) are visible";
  KVB_CUDA_CHECK(cudaSetDevice(gpu));
  cudaDeviceProp prop{};
  KVB_CUDA_CHECK(cudaGetDeviceProperties(&prop, gpu));
  device_name_ = std::string(prop.name) + " (cuda:" + std::to_string(gpu) + ")";
  const ModelConfig& c = model.config;
  KVB_CHECK(c.head_dim <= cu::kMaxHeadDim) << "--device cuda: head_dim " << c.head_dim
                                           << " above the attention kernel's " << cu::kMaxHeadDim;
  KVB_CUDA_CHECK(cudaStreamCreate(&stream_));
  upload_weights();
}

CudaEngine::~CudaEngine() {
  if (stream_) cudaStreamDestroy(stream_);  // errors at teardown cannot be reported; ignored
}

void CudaEngine::upload_weights() {
  const ModelConfig& c = model_.config;
  cu::DeviceBuffer<float> staging;
  auto vec = [&](const std::vector<float>& v) {
    cu::DeviceBuffer<float> d(v.size());
    d.upload(v.data(), v.size());
    weight_bytes_ += d.bytes();
    return d;
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
    d.bq = vec(w.bq);
    d.bk = vec(w.bk);
    d.bv = vec(w.bv);
    matrix(w.wq, d.wq);
    matrix(w.wk, d.wk);
    matrix(w.wv, d.wv);
    matrix(w.wo, d.wo);
    matrix(w.w_gate, d.w_gate);
    matrix(w.w_up, d.w_up);
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

kernels::KvCache CudaEngine::download_device_cache() const {
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return dev_ ? dev_->download() : kernels::KvCache();
}

kernels::KvCache CudaEngine::new_cache(int initial_capacity, const policies::Policy* policy) const {
  return host_.new_cache(initial_capacity, policy);
}

void CudaEngine::gemm(float* y, const float* x, const void* w, const float* bias, int n, int k,
                      int m) {
  if (dtype_ == DType::kF32) {
    cu::matmul(y, x, static_cast<const float*>(w), bias, n, k, m, stream_);
    return;
  }
  ensure(s_->x16, static_cast<size_t>(n) * k);
  cu::f32_to_bf16(s_->x16.data(), x, static_cast<size_t>(n) * k, stream_);
  cu::matmul(y, s_->x16.data(), static_cast<const __nv_bfloat16*>(w), bias, n, k, m, stream_);
}

size_t CudaEngine::kv_logical_bytes(const kernels::KvCache& cache) const {
  return static_cast<size_t>(cache.total_slots()) *
         kv_slot_bytes(cache.shape().head_dim, dtype_);
}

size_t CudaEngine::kv_physical_bytes(const kernels::KvCache& cache) const {
  // The full fingerprint, not the address: the next unit's cache may sit where the last one did,
  // and a cache compressed on the host is not on the device until the next forward().
  // (matches() only reads; it takes a non-const cache for KvCache::layer().)
  if (dev_ && bound_.matches(const_cast<kernels::KvCache&>(cache))) return dev_->physical_bytes();
  const kernels::KvCacheShape& sh = cache.shape();
  return static_cast<size_t>(sh.num_layers) * sh.num_kv_heads * cache.capacity() *
         kv_slot_bytes(sh.head_dim, dtype_);
}

// The device cache must hold exactly the host mirror, with room for n more slots per head.
void CudaEngine::bind_cache(kernels::KvCache& cache, int n) {
  const kernels::KvCacheShape& sh = cache.shape();
  bool same = dev_ && bound_.matches(cache);
  int longest = 0, room = 0;
  for (int l = 0; l < sh.num_layers; ++l) {
    for (int h = 0; h < sh.num_kv_heads; ++h) {
      longest = std::max(longest, cache.length(l, h));
      if (!same) continue;
      same = dev_->length(l, h) == cache.length(l, h);
      room = l == 0 && h == 0 ? dev_->capacity(l, h) : std::min(room, dev_->capacity(l, h));
    }
  }
  const int need = longest + n;
  if (same && room >= need) return;
  // (Re)build from the mirror: a different sequence, or a head about to overflow (grow 1.5x).
  int cap = std::max(cache.capacity(), need);
  if (same) cap = std::max(cap, room + room / 2);
  dev_.reset();  // free first: the old and new caches need not fit together
  dev_ = std::make_unique<cu::DeviceKvCache>(
      sh, dtype_ == DType::kBf16 ? cu::KvDtype::kBf16 : cu::KvDtype::kF32, cap);
  dev_->upload(cache);
  mirror_bytes_ += cache.logical_bytes();
  ++cache_uploads_;
}

void CudaEngine::forward(std::span<const int32_t> tokens, kernels::KvCache& cache, LogitsMode mode,
                         std::vector<float>* logits, policies::Policy* policy, PolicyHook hook,
                         PrefillRecord* record) {
  const ModelConfig& c = model_.config;
  const int n = static_cast<int>(tokens.size());
  KVB_CHECK(n > 0) << "forward: no tokens";
  KVB_USAGE_CHECK(!policy || !policy->replaces_attention())
      << "policy " << policy->config().name
      << " replaces the engine's attention (SubGen's estimator); it runs on --device cpu only";
  KVB_CUDA_CHECK(cudaSetDevice(gpu_));
  const int D = c.dim, H = c.hidden_dim, hd = c.head_dim;
  const int QD = c.num_heads * hd, KVD = c.num_kv_heads * hd;
  const size_t N = n;
  Scratch& s = *s_;
  ensure(s.x, N * D);
  ensure(s.xb, N * D);
  ensure(s.q, N * QD);
  ensure(s.k, N * KVD);
  ensure(s.v, N * KVD);
  ensure(s.att, N * QD);
  ensure(s.proj, N * D);
  ensure(s.gate, N * H);
  ensure(s.up, N * H);
  ensure(s.tokens, N);
  ensure(s.pos, N);

  const int32_t pos0 = cache.next_position();
  tokens_h_.resize(N);
  pos_h_.resize(N);
  for (int t = 0; t < n; ++t) {
    const int32_t id = tokens[t];
    KVB_CHECK(id >= 0 && id < c.vocab_size)
        << "token id " << id << " at index " << t << " outside the vocabulary [0, " << c.vocab_size
        << ")";
    tokens_h_[t] = id;
    pos_h_[t] = pos0 + t;
  }
  cache.reserve_extra(n);
  bind_cache(cache, n);
  KVB_CUDA_CHECK(
      cudaMemcpyAsync(s.tokens.data(), tokens_h_.data(), N * 4, cudaMemcpyHostToDevice, stream_));
  KVB_CUDA_CHECK(
      cudaMemcpyAsync(s.pos.data(), pos_h_.data(), N * 4, cudaMemcpyHostToDevice, stream_));
  gpu::embed_rows(s.x.data(), embedding_.data(), s.tokens.data(), n, D, stream_);

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const policies::StatsRequest req =
      forward_stats_request(n, cache, c.num_layers, policy, &hook, record, &prefills_);
  const int last_w = std::min(req.last_w, n);

  for (int l = 0; l < c.num_layers; ++l) {
    const DeviceLayer& w = layers_[l];
    cu::rmsnorm(s.xb.data(), s.x.data(), w.attn_norm.data(), n, D, c.norm_eps, stream_);
    gemm(s.q.data(), s.xb.data(), w.wq.ptr(dtype_), w.bq.data(), n, D, QD);
    gemm(s.k.data(), s.xb.data(), w.wk.ptr(dtype_), w.bk.data(), n, D, KVD);
    gemm(s.v.data(), s.xb.data(), w.wv.ptr(dtype_), w.bv.data(), n, D, KVD);
    if (req.pre_rope_keys) {
      pre_rope_k_.resize(N * KVD);
      KVB_CUDA_CHECK(cudaMemcpyAsync(pre_rope_k_.data(), s.k.data(), N * KVD * 4,
                                     cudaMemcpyDeviceToHost, stream_));
      KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
      mirror_bytes_ += N * KVD * 4;
    }
    attend_layer(l, n, cache, policy, hook, req, last_w, scale, record);
    gemm(s.proj.data(), s.att.data(), w.wo.ptr(dtype_), nullptr, n, QD, D);
    gpu::add_inplace(s.x.data(), s.proj.data(), N * D, stream_);

    cu::rmsnorm(s.xb.data(), s.x.data(), w.ffn_norm.data(), n, D, c.norm_eps, stream_);
    gemm(s.gate.data(), s.xb.data(), w.w_gate.ptr(dtype_), nullptr, n, D, H);
    gemm(s.up.data(), s.xb.data(), w.w_up.ptr(dtype_), nullptr, n, D, H);
    cu::swiglu(s.gate.data(), s.up.data(), N * H, stream_);
    gemm(s.proj.data(), s.gate.data(), w.w_down.ptr(dtype_), nullptr, n, H, D);
    gpu::add_inplace(s.x.data(), s.proj.data(), N * D, stream_);
  }
  cache.advance_position(n);
  dev_->advance_position(n);

  if (mode != LogitsMode::kNone) {
    KVB_CHECK(logits != nullptr) << "forward: logits requested into a null vector";
    const int first = mode == LogitsMode::kLast ? n - 1 : 0;
    const int rows = n - first;
    const size_t out = static_cast<size_t>(rows) * c.vocab_size;
    ensure(s.logits, out);
    cu::rmsnorm(s.xb.data(), s.x.data() + static_cast<size_t>(first) * D, final_norm_.data(), rows,
                D, c.norm_eps, stream_);
    const void* wout = dtype_ == DType::kBf16  ? static_cast<const void*>(output_bf16_.data())
                       : model_.output.empty() ? static_cast<const void*>(embedding_.data())
                                               : output_f32_.data();
    gemm(s.logits.data(), s.xb.data(), wout, nullptr, rows, D, c.vocab_size);
    logits->resize(out);
    KVB_CUDA_CHECK(
        cudaMemcpyAsync(logits->data(), s.logits.data(), out * 4, cudaMemcpyDeviceToHost, stream_));
  }
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  bound_.capture(cache);
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    peak_bytes_ = std::max(peak_bytes_, total_b - free_b);
  }
}

void CudaEngine::mirror_append(int l, int n, kernels::KvCache& cache) {
  const ModelConfig& c = model_.config;
  const int hd = c.head_dim, ckv = cache.shape().num_kv_heads;
  const size_t count = static_cast<size_t>(n) * c.num_kv_heads * hd;
  k_h_.resize(count);
  v_h_.resize(count);
  KVB_CUDA_CHECK(
      cudaMemcpyAsync(k_h_.data(), s_->k.data(), count * 4, cudaMemcpyDeviceToHost, stream_));
  KVB_CUDA_CHECK(
      cudaMemcpyAsync(v_h_.data(), s_->v.data(), count * 4, cudaMemcpyDeviceToHost, stream_));
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  mirror_bytes_ += 2 * count * 4;
  if (dtype_ == DType::kBf16) {  // the device stores bf16: the mirror holds the same values
    for (size_t i = 0; i < count; ++i) {
      k_h_[i] = bf16_round(k_h_[i]);
      v_h_[i] = bf16_round(v_h_[i]);
    }
  }
  const int model_group = c.num_heads / c.num_kv_heads;
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < ckv; ++h) {
      const int src = ckv == c.num_kv_heads ? h : h / model_group;
      const size_t off = (static_cast<size_t>(t) * c.num_kv_heads + src) * hd;
      cache.append(l, h, &k_h_[off], &v_h_[off], pos_h_[t]);
    }
  }
}

template <typename F>
void CudaEngine::run_hook(int l, kernels::KvCache& cache, F&& hook_fn) {
  const auto t0 = Clock::now();
  const kernels::KvCacheShape& sh = cache.shape();
  snapshot_positions(cache, l, &before_);
  hook_fn();
  // Other layers must be untouched: the mirror applies one layer's keep-lists per hook.
  for (int ll = 0; ll < sh.num_layers; ++ll) {
    for (int h = 0; h < sh.num_kv_heads && ll != l; ++h) {
      KVB_CHECK(cache.length(ll, h) == dev_->length(ll, h))
          << "--device cuda: the policy changed layer " << ll << " from layer " << l
          << "'s hook; the GPU engine's host mirror applies a hook's evictions to its own layer "
             "only";
    }
  }
  int ld = 0;
  if (derive_keep_lists(before_, cache, l, &slots_h_, &counts_h_, &ld)) {
    ensure(s_->slots, slots_h_.size());
    KVB_CUDA_CHECK(cudaMemcpyAsync(s_->slots.data(), slots_h_.data(), slots_h_.size() * 4,
                                   cudaMemcpyHostToDevice, stream_));
    mirror_bytes_ += slots_h_.size() * 4;
    dev_->keep_slots(l, s_->slots.data(), ld, counts_h_.data(), stream_);
    for (int h = 0; h < sh.num_kv_heads; ++h) {
      KVB_CHECK(dev_->length(l, h) == cache.length(l, h))
          << "--device cuda: device cache layer " << l << " head " << h << " holds "
          << dev_->length(l, h) << " slots after keep_slots, the mirror " << cache.length(l, h);
    }
  }
  policy_ms_ += ms_since(t0);
}

void CudaEngine::attend_layer(int l, int n, kernels::KvCache& cache, policies::Policy* policy,
                              PolicyHook hook, const policies::StatsRequest& req, int last_w,
                              float scale, PrefillRecord* record) {
  const ModelConfig& c = model_.config;
  const int hd = c.head_dim;
  const int ckv = cache.shape().num_kv_heads;
  KVB_CHECK(ckv == c.num_kv_heads || ckv == c.num_heads)
      << "cache has " << ckv << " KV heads; the model " << c.num_kv_heads << " (or " << c.num_heads
      << " expanded)";
  Scratch& s = *s_;
  const size_t N = n;
  const bool rolling = policy && policy->rolling_positions();
  if (!rolling) cu::rope(s.k.data(), s.pos.data(), n, c.num_kv_heads, hd, c.rope, stream_);
  const float* k_new = s.k.data();
  const float* v_new = s.v.data();
  if (ckv != c.num_kv_heads) {  // GQA expanded: one copy per query head
    ensure(s.kx, N * ckv * hd);
    ensure(s.vx, N * ckv * hd);
    gpu::expand_gqa(s.kx.data(), s.k.data(), n, c.num_kv_heads, ckv, hd, stream_);
    gpu::expand_gqa(s.vx.data(), s.v.data(), n, c.num_kv_heads, ckv, hd, stream_);
    k_new = s.kx.data();
    v_new = s.vx.data();
  }
  dev_->append(l, k_new, v_new, s.pos.data(), n, stream_);
  mirror_append(l, n, cache);

  policies::LayerStats stats;
  stats.layer = l;
  stats.n_new = n;
  stats.num_heads = c.num_heads;
  stats.pre_rope_keys = req.pre_rope_keys ? pre_rope_k_.data() : nullptr;
  if (hook == PolicyHook::kDecode && policy->evict_before_attention()) {
    run_hook(l, cache, [&] { policy->on_decode_layer(stats, cache); });
    hook = PolicyHook::kNone;
  }

  cu::DeviceLayerKvView view = dev_->layer(l);
  const int cache_group = c.num_heads / ckv;
  if (rolling) {
    // Positions are indices in the cache: query i of the block sits at len - n + i of its head;
    // keys are rotated by their slot index into a copy of the layer (the cache keeps them raw).
    std::vector<int32_t> qpos(N * c.num_heads);
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < c.num_heads; ++h) {
        qpos[static_cast<size_t>(t) * c.num_heads + h] = cache.length(l, h / cache_group) - n + t;
      }
    }
    ensure(s.qpos, qpos.size());
    KVB_CUDA_CHECK(cudaMemcpyAsync(s.qpos.data(), qpos.data(), qpos.size() * 4,
                                   cudaMemcpyHostToDevice, stream_));
    cu::rope(s.q.data(), s.qpos.data(), n * c.num_heads, 1, hd, c.rope, stream_);
    int slots = 0, longest = 0;
    for (int h = 0; h < ckv; ++h) {
      slots = std::max(slots, dev_->offset(l, h) + dev_->capacity(l, h));
      longest = std::max(longest, dev_->length(l, h));
    }
    const size_t elems = static_cast<size_t>(slots) * hd;
    ensure(s.rolled, elems);
    ensure(s.iota, static_cast<size_t>(std::max(longest, 1)));
    gpu::iota(s.iota.data(), longest, stream_);
    gpu::widen_to_f32(s.rolled.data(), view.keys, view.dtype, elems, stream_);
    for (int h = 0; h < ckv; ++h) {
      const int len = dev_->length(l, h);
      if (len == 0) continue;
      cu::rope(s.rolled.data() + static_cast<size_t>(dev_->offset(l, h)) * hd, s.iota.data(), len,
               1, hd, c.rope, stream_);
    }
    if (view.dtype == cu::KvDtype::kF32) {
      view.keys = s.rolled.data();
    } else {
      ensure(s.rolled_kv, elems * sizeof(__nv_bfloat16));
      auto* dst = reinterpret_cast<__nv_bfloat16*>(s.rolled_kv.data());
      cu::f32_to_bf16(dst, s.rolled.data(), elems, stream_);
      view.keys = dst;
    }
  } else {
    cu::rope(s.q.data(), s.pos.data(), n, c.num_heads, hd, c.rope, stream_);
  }

  cu::AttentionArgs args;
  args.out = s.att.data();
  args.q = s.q.data();
  args.kv = view;
  args.n = n;
  args.num_heads = c.num_heads;
  args.scale = scale;
  size_t rows = 0;
  if (hook != PolicyHook::kNone || record) {
    int stride = 0;
    for (int h = 0; h < ckv; ++h) stride = std::max(stride, cache.length(l, h));
    rows = static_cast<size_t>(c.num_heads) * stride;
    if (req.col_sums) {
      ensure(s.col_sums, rows);
      args.col_sums = s.col_sums.data();
    }
    if (last_w > 0) {
      ensure(s.last_probs, rows * last_w);
      args.last_probs = s.last_probs.data();
      args.last_w = last_w;
    }
    args.stats_stride = stride;
    stats.stride = stride;
    stats.last_w = args.last_w;
  }
  cu::attention(args, stream_);
  if (args.col_sums || args.last_probs) {
    // The statistics to the host for the hook (counted as eviction overhead).
    const auto t0 = Clock::now();
    if (args.col_sums) {
      col_sums_.resize(rows);
      KVB_CUDA_CHECK(cudaMemcpyAsync(col_sums_.data(), args.col_sums, rows * 4,
                                     cudaMemcpyDeviceToHost, stream_));
      stats.col_sums = col_sums_.data();
      mirror_bytes_ += rows * 4;
    }
    if (args.last_probs) {
      last_probs_.resize(rows * last_w);
      KVB_CUDA_CHECK(cudaMemcpyAsync(last_probs_.data(), args.last_probs, rows * last_w * 4,
                                     cudaMemcpyDeviceToHost, stream_));
      stats.last_probs = last_probs_.data();
      mirror_bytes_ += rows * last_w * 4;
    }
    KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (hook != PolicyHook::kNone) policy_ms_ += ms_since(t0);
  }
  if (record) {
    record->strides[l] = stats.stride;
    if (stats.col_sums) record->col_sums[l] = col_sums_;
    if (stats.last_probs) record->last_probs[l] = last_probs_;
    if (req.pre_rope_keys) record->pre_rope_keys[l] = pre_rope_k_;
  }
  // The layer's output used the full cache; the policy's decision shapes what later steps see.
  if (hook == PolicyHook::kPrefill) {
    run_hook(l, cache, [&] { policy->on_prefill_layer(stats, cache); });
  } else if (hook == PolicyHook::kDecode) {
    run_hook(l, cache, [&] { policy->on_decode_layer(stats, cache); });
  }
}

void CudaEngine::apply_recorded_prefill(policies::Policy& policy, kernels::KvCache& cache,
                                        const PrefillRecord& record) {
  // Host-only: the mirror is compressed; bind_cache sees the change and uploads it.
  host_.apply_recorded_prefill(policy, cache, record);
}

}  // namespace kvb::engine
