// CudaBackend's attention side (cuda_backend.h): rolled keys, attention over a sequence's
// device rows (and over a decode batch's, cuda::attention_batch), statistics to the host, and a
// policy's replacement attention. Compiled only with KVB_WITH_CUDA.
#include <chrono>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rope.h"
#include "workers/engine/cuda_backend.h"
#include "workers/engine/cuda_backend_state.h"
#include "workers/engine/cuda_engine_kernels.h"

namespace kvb::engine {

namespace cu = kvb::kernels::cuda;
using Clock = std::chrono::steady_clock;
using cuda_backend_detail::ensure;
using cuda_backend_detail::ms_since;
using cuda_backend_detail::rows_of;

void CudaBackend::roll_keys(int l, kernels::KvCache& cache) {
  const int hd = model_.config.head_dim, ckv = cache.shape().num_kv_heads;
  Scratch& s = *s_;
  dev_ = rows_of(cache);
  KVB_CHECK(dev_ != nullptr) << "--device cuda: rolled keys of a cache without device rows";
  int slots = 0, longest = 0;
  for (int h = 0; h < ckv; ++h) {
    slots = std::max(slots, dev_->offset(l, h) + dev_->capacity(l, h));
    longest = std::max(longest, dev_->length(l, h));
  }
  const size_t elems = static_cast<size_t>(slots) * hd;
  ensure(s.rolled, elems);
  ensure(s.iota, static_cast<size_t>(std::max(longest, 1)));
  gpu::iota(s.iota.data(), longest, stream_);
  const cu::DeviceLayerKvView view = dev_->layer(l);
  gpu::widen_to_f32(s.rolled.data(), view.keys, view.dtype, elems, stream_);
  for (int h = 0; h < ckv; ++h) {
    const int len = dev_->length(l, h);
    if (len == 0) continue;
    cu::rope(s.rolled.data() + static_cast<size_t>(dev_->offset(l, h)) * hd, s.iota.data(), len, 1,
             rope_tables_[l], stream_);
  }
  if (view.dtype == cu::KvDtype::kBf16) {
    ensure(s.rolled_kv, elems * sizeof(__nv_bfloat16));
    cu::f32_to_bf16(reinterpret_cast<__nv_bfloat16*>(s.rolled_kv.data()), s.rolled.data(), elems,
                    stream_);
  }
  rolled_layer_ = l;
}

void CudaBackend::attention(int l, int n, float scale, kernels::KvCache& cache, bool col_sums,
                            int last_w, int stride, policies::LayerStats* stats) {
  Scratch& s = *s_;
  dev_ = rows_of(cache);  // bound at begin_pass / bind_sequence
  KVB_CHECK(dev_ != nullptr) << "--device cuda: attention over a cache without device rows";
  cu::DeviceLayerKvView view = dev_->layer(l);
  if (rolled_layer_ == l) {
    view.keys = view.dtype == cu::KvDtype::kF32 ? static_cast<void*>(s.rolled.data())
                                                : static_cast<void*>(s.rolled_kv.data());
  }
  cu::AttentionArgs args;
  args.out = rows_at(Act::kAtt);
  args.q = rows_at(Act::kQ);
  args.kv = view;
  args.n = n;
  args.num_heads = model_.config.num_heads;
  args.scale = scale;
  const size_t rows = static_cast<size_t>(args.num_heads) * stride;
  if (col_sums) {
    ensure(s.col_sums, rows);
    args.col_sums = s.col_sums.data();
  }
  if (last_w > 0) {
    ensure(s.last_probs, rows * last_w);
    args.last_probs = s.last_probs.data();
    args.last_w = last_w;
  }
  args.stats_stride = stride;
  args.window = model_.config.sliding(l) ? model_.config.window[l] : 0;
  // bf16 caches prefill on the tensor cores (issue 16 item 4); an f32 cache keeps the exact
  // f32 kernel, the precision reference (the flag is ignored there).
  args.tensor_core_prefill = true;
  args.decode_kernel = decode_kernel_;
  cu::attention(args, stream_);
  // Device pointers until stats_to_host.
  stats->col_sums = args.col_sums;
  stats->last_probs = args.last_probs;
  stats->last_w = args.last_w;
}

void CudaBackend::attention_batch(int l, float scale, std::span<const BatchAttention> items) {
  Scratch& s = *s_;
  const ModelConfig& c = model_.config;
  size_t sum_rows = 0, prob_rows = 0;
  for (const BatchAttention& it : items) {
    const size_t rows = static_cast<size_t>(c.num_heads) * it.stride;
    if (it.col_sums) sum_rows += rows;
    prob_rows += rows * it.last_w;
  }
  ensure(s.col_sums, sum_rows);
  ensure(s.last_probs, prob_rows);
  batch_args_.assign(items.size(), cu::AttentionArgs{});
  size_t sum_at = 0, prob_at = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchAttention& it = items[i];
    KVB_CHECK(it.row >= 0 && it.row < static_cast<int>(pos_h_.size()) && it.cache != nullptr &&
              it.stats != nullptr)
        << "--device cuda: attention_batch item " << i << " (row " << it.row << ")";
    cu::DeviceKvCache* rows = rows_of(*it.cache);
    KVB_CHECK(rows != nullptr) << "--device cuda: attention over a cache without device rows";
    cu::AttentionArgs& a = batch_args_[i];
    a.out = rows_at(Act::kAtt, it.row);
    a.q = rows_at(Act::kQ, it.row);
    a.kv = rows->layer(l);
    a.n = 1;
    a.num_heads = c.num_heads;
    a.scale = scale;
    const size_t n_rows = static_cast<size_t>(c.num_heads) * it.stride;
    if (it.col_sums) {
      a.col_sums = s.col_sums.data() + sum_at;
      sum_at += n_rows;
    }
    if (it.last_w > 0) {
      a.last_probs = s.last_probs.data() + prob_at;
      a.last_w = it.last_w;
      prob_at += n_rows * it.last_w;
    }
    a.stats_stride = it.stride;
    a.window = c.sliding(l) ? c.window[l] : 0;
    a.tensor_core_prefill = true;
    a.decode_kernel = decode_kernel_;
  }
  batch_launches_ += cu::attention_batch(batch_args_, stream_);
  ++batch_calls_;
  batch_seqs_ += static_cast<int64_t>(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    // Device pointers until stats_to_host.
    items[i].stats->col_sums = batch_args_[i].col_sums;
    items[i].stats->last_probs = batch_args_[i].last_probs;
    items[i].stats->last_w = batch_args_[i].last_w;
  }
  rolled_layer_ = -1;  // the stack batches no rolled keys; none stay bound to a later call
}

double CudaBackend::stats_to_host(policies::LayerStats* stats) {
  const auto t0 = Clock::now();
  const size_t rows = static_cast<size_t>(stats->num_heads) * stats->stride;
  if (stats->col_sums) {
    col_sums_.resize(rows);
    copy_d2h(col_sums_.data(), stats->col_sums, rows * 4);
    stats->col_sums = col_sums_.data();
  }
  if (stats->last_probs) {
    last_probs_.resize(rows * stats->last_w);
    copy_d2h(last_probs_.data(), stats->last_probs, rows * stats->last_w * 4);
    stats->last_probs = last_probs_.data();
  }
  sync();
  return ms_since(t0);
}

// A policy that replaces attention runs here only if it attends with ops (SubGen, weighted
// subgen_kcenter: Policy::attends_with_ops): its attend() gets the device queries and output,
// the ops table and this backend's attention, and copies nothing (cuda_backend.h). One that
// attends on the host (reading the cache's K/V rows there) is refused: a device's cache holds
// no rows on the host.
void CudaBackend::attend_replaced(policies::Policy& policy, policies::AttendArgs args,
                                  const kernels::KvCache& cache, kernels::EvictionPlan* plan) {
  KVB_USAGE_CHECK(policy.attends_with_ops())
      << "--device cuda: policy " << policy.config().name
      << " replaces attention on the host only (its attend() reads K/V rows there); run it on "
         "the CPU, or write its attention on the policy ops (Policy::attends_with_ops)";
  // Queries, policy state and rows stay on the device (the policy works through ops_;
  // its `exact` is this backend's attention, what `full` computes). Nothing waits.
  args.q = rows_at(Act::kQ);
  args.out = rows_at(Act::kAtt);
  args.ops = ops_.get();
  // attention() reads the rows and writes kAtt; it takes the index non-const for the
  // statistics paths, which this call does not use.
  kernels::KvCache& rows = const_cast<kernels::KvCache&>(cache);
  args.exact = [this, &rows, &args] {
    policies::LayerStats none;
    attention(args.layer, args.n, args.scale, rows, false, 0, 0, &none);
  };
  policy.attend(args, cache, *plan);
}

}  // namespace kvb::engine
