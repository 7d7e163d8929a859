// CudaBackend: the block stack's ops on one GPU; the K/V rows live on the device, owned by each
// sequence's KvCache index (cuda_backend.h). This file: the sequence side (passes, caches,
// attention, policies' statistics and plans, transfers); cuda_backend_dense.cc: the weights and
// the dense ops. Compiled only with KVB_WITH_CUDA.
#include "workers/engine/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>

#include "common/error.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rope.h"
#include "workers/engine/cuda_backend_state.h"
#include "workers/engine/cuda_engine_kernels.h"

namespace kvb::engine {

namespace cu = kvb::kernels::cuda;
using Clock = std::chrono::steady_clock;

using cuda_backend_detail::ensure;
using cuda_backend_detail::ms_since;
using cuda_backend_detail::rows_of;

CudaBackend::CudaBackend(const Model& model, DType dtype, int gpu)
    : model_(model), dtype_(dtype), gpu_(gpu), s_(std::make_unique<Scratch>()) {
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
  ops_ = std::make_unique<cu::CudaPolicyOps>(stream_);
  graph_ = std::make_unique<cu::StepGraph>(stream_);
  upload_weights();
  // Every layer's RoPE frequencies on the device once: a rope call then copies nothing (before,
  // each of a decode step's 2 x layers calls staged them from pageable memory, uncounted).
  rope_tables_.reserve(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) rope_tables_.emplace_back(c.rope_of(l), c.head_dim);
}

CudaBackend::~CudaBackend() {
  graph_.reset();
  ops_.reset();
  for (cudaEvent_t e : span_begin_) cudaEventDestroy(e);
  for (cudaEvent_t e : span_end_) cudaEventDestroy(e);
  if (stream_) {  // errors at teardown cannot be reported; ignored
    cudaStreamSynchronize(stream_);
    cu::release_cublas_workspace(stream_);
    cudaStreamDestroy(stream_);
  }
}

policies::PolicyOps& CudaBackend::policy_ops() { return *ops_; }

TransferCounters CudaBackend::counters() const {
  TransferCounters t = counters_;
  const cu::CudaPolicyOps::Transfers& ops = ops_->transfers();
  t.d2h_copies += ops.d2h_copies;
  t.stream_syncs += ops.stream_syncs;
  t.d2h_bytes += ops.d2h_bytes;
  t.h2d_copies += ops.h2d_copies;
  t.h2d_bytes += ops.h2d_bytes;
  return t;
}

void CudaBackend::stats_to_device(policies::LayerStats* stats) {
  const size_t rows = static_cast<size_t>(stats->num_heads) * stats->stride;
  if (stats->col_sums) {
    ensure(s_->col_sums, rows);
    copy_h2d(s_->col_sums.data(), stats->col_sums, rows * 4);
    stats->col_sums = s_->col_sums.data();
  }
  if (stats->last_probs) {
    ensure(s_->last_probs, rows * stats->last_w);
    copy_h2d(s_->last_probs.data(), stats->last_probs, rows * stats->last_w * 4);
    stats->last_probs = s_->last_probs.data();
  }
  if (stats->pre_rope_keys) {
    const ModelConfig& c = model_.config;
    const size_t count = static_cast<size_t>(stats->n_new) * c.num_kv_heads * c.head_dim;
    ensure(s_->pre_k, count);
    copy_h2d(s_->pre_k.data(), stats->pre_rope_keys, count * 4);
    stats->pre_rope_keys = s_->pre_k.data();
  }
  if (stats->pre_rope_queries) {
    const ModelConfig& c = model_.config;
    const size_t count = static_cast<size_t>(stats->n_new) * c.num_heads * c.head_dim;
    ensure(s_->pre_q, count);
    copy_h2d(s_->pre_q.data(), stats->pre_rope_queries, count * 4);
    stats->pre_rope_queries = s_->pre_q.data();
  }
}

void CudaBackend::begin_policy_span() {
  if (spans_ == static_cast<int>(span_begin_.size())) {
    cudaEvent_t b = nullptr, e = nullptr;
    KVB_CUDA_CHECK(cudaEventCreate(&b));
    KVB_CUDA_CHECK(cudaEventCreate(&e));
    span_begin_.push_back(b);
    span_end_.push_back(e);
  }
  // In a captured step the event is a node of the graph (recorded when the graph runs).
  KVB_CUDA_CHECK(cudaEventRecordWithFlags(span_begin_[spans_], stream_,
                                          graph_->active() ? cudaEventRecordExternal : 0));
}

void CudaBackend::end_policy_span() {
  KVB_CUDA_CHECK(cudaEventRecordWithFlags(span_end_[spans_], stream_,
                                          graph_->active() ? cudaEventRecordExternal : 0));
  ++spans_;
}

void CudaBackend::set_graphs(bool on) {
  KVB_CHECK(!graph_->active()) << "--device cuda: CUDA graphs switched during a captured step";
  graphs_ = on;
}

bool CudaBackend::begin_graph() {
  // The backend's first capturable step runs op by op whatever the setting: it loads the
  // decode kernels (lazily loaded modules) outside any capture.
  const bool first = !warmed_;
  warmed_ = true;
  if (!graphs_ || first) return false;
  spans_at_graph_ = spans_;
  graph_->begin();
  return true;
}

void CudaBackend::end_graph() {
  try {
    graph_->end_and_launch();
  } catch (...) {
    if (!graph_->pending()) record_dropped_spans();  // the step's graph never ran
    throw;
  }
}

void CudaBackend::abort_graph() noexcept {
  if (!graph_->abort()) record_dropped_spans();
}

void CudaBackend::record_dropped_spans() noexcept {
  // The policy spans begun since begin_graph were events of a graph that did not run; recorded
  // now (empty spans), so that take_policy_ms finds every span it counts recorded.
  for (int i = spans_at_graph_; i < spans_; ++i) {
    cudaEventRecord(span_begin_[i], stream_);
    cudaEventRecord(span_end_[i], stream_);
  }
}

double CudaBackend::take_policy_ms(std::vector<double>* per_span) {
  if (per_span) per_span->clear();
  if (spans_ == 0) return 0;
  if (cudaEventQuery(span_end_[spans_ - 1]) == cudaErrorNotReady) {
    const auto t0 = Clock::now();
    KVB_CUDA_CHECK(cudaEventSynchronize(span_end_[spans_ - 1]));
    counters_.sync_wait_ms += ms_since(t0);
    ++counters_.stream_syncs;
  }
  double ms = 0;
  for (int i = 0; i < spans_; ++i) {
    float span = 0;
    KVB_CUDA_CHECK(cudaEventElapsedTime(&span, span_begin_[i], span_end_[i]));
    ms += span;
    if (per_span) per_span->push_back(span);
  }
  spans_ = 0;
  return ms;
}

void CudaBackend::copy_d2h(void* dst, const void* src, size_t bytes) {
  cu::require_not_capturing(stream_, "a copy to the host");
  KVB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  ++counters_.d2h_copies;
  counters_.d2h_bytes += bytes;
}

void CudaBackend::copy_h2d(void* dst, const void* src, size_t bytes) {
  cu::upload_async(dst, src, bytes, stream_);  // staged in pinned memory inside a capture
  ++counters_.h2d_copies;
  counters_.h2d_bytes += bytes;
}

void CudaBackend::sync() {
  cu::require_not_capturing(stream_, "a wait for the device");
  const auto t0 = Clock::now();
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  counters_.sync_wait_ms += ms_since(t0);
  ++counters_.stream_syncs;
}

kernels::KvCache CudaBackend::download_device_rows(const kernels::KvCache& cache) const {
  KVB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const cu::DeviceKvCache* rows = rows_of(cache);
  return rows ? rows->download() : kernels::KvCache();
}

float* CudaBackend::act(Act a) const {
  Scratch& s = *s_;
  // In Act's order.
  float* const table[] = {s.x.data(),   s.xb.data(),   s.q.data(),    s.k.data(), s.v.data(),
                          s.att.data(), s.proj.data(), s.gate.data(), s.up.data()};
  const size_t i = static_cast<size_t>(a);
  KVB_CHECK(i < std::size(table)) << "unknown activation " << i;
  return table[i];
}

float* CudaBackend::rows_at(Act a) const { return rows_at(a, row0_); }

float* CudaBackend::rows_at(Act a, int row) const {
  const ModelConfig& c = model_.config;
  size_t width = c.dim;
  switch (a) {
    case Act::kQ:
    case Act::kAtt: width = static_cast<size_t>(c.num_heads) * c.head_dim; break;
    case Act::kK:
    case Act::kV: width = static_cast<size_t>(c.num_kv_heads) * c.head_dim; break;
    case Act::kGate:
    case Act::kUp: width = c.hidden_dim; break;
    default: break;
  }
  return act(a) + static_cast<size_t>(row) * width;
}

void CudaBackend::select_rows(int row0) {
  KVB_CHECK(row0 >= 0 && row0 < static_cast<int>(pos_h_.size()))
      << "--device cuda: row " << row0 << " of a pass of " << pos_h_.size();
  row0_ = row0;
  rolled_layer_ = -1;  // another sequence's rolled keys are not this one's
}

void CudaBackend::bind_sequence(kernels::KvCache& cache) { bind_cache(cache, 1); }

void CudaBackend::rerotate_keys(int layer, const kernels::cpu::RopeParams& rope,
                                kernels::KvCache& cache) {
  cu::DeviceKvCache* rows = rows_of(cache);
  if (!rows) {
    Backend::rerotate_keys(layer, rope, cache);
    return;
  }
  const int64_t c0 = rows->h2d_copies();
  const size_t b0 = rows->h2d_bytes();
  rows->rerotate_keys(layer, rope, stream_);
  count_uploads(*rows, c0, b0);
  cache.renumber_positions(layer);
}

void CudaBackend::moved_position(kernels::KvCache& cache, int delta) {
  if (cu::DeviceKvCache* rows = rows_of(cache)) rows->advance_position(delta);
}

Backend::KvBytes CudaBackend::kv_bytes(const kernels::KvCache& cache) const {
  KvBytes b;
  const kernels::KvCacheShape& sh = cache.shape();
  b.pruned_channels = cache.pruned_key_elements() * (dtype_ == DType::kBf16 ? 2 : 4);
  b.logical = static_cast<size_t>(cache.total_slots()) * kv_slot_bytes(sh.head_dim, dtype_) -
              b.pruned_channels;
  if (const cu::DeviceKvCache* rows = rows_of(cache)) {
    b.physical = rows->physical_bytes();
  } else {  // not on the device yet: what binding it would allocate at least
    b.physical = static_cast<size_t>(sh.num_layers) * sh.num_kv_heads * cache.capacity() *
                 kv_slot_bytes(sh.head_dim, dtype_);
  }
  return b;
}

void CudaBackend::trim_storage(kernels::KvCache& cache, int extra) {
  KVB_CHECK(extra >= 0) << "trim_storage: extra slots must be >= 0, got " << extra;
  const cu::DeviceKvCache* rows = rows_of(cache);
  if (!rows) return;
  const kernels::KvCacheShape& sh = cache.shape();
  const size_t want = static_cast<size_t>(sh.num_layers) * sh.num_kv_heads *
                      (rows->max_length() + extra) * rows->bytes_per_slot();
  if (want >= rows->physical_bytes()) return;
  KVB_CUDA_CHECK(cudaSetDevice(gpu_));
  std::unique_ptr<kernels::DeviceRows> trimmed = rows->fork(extra);
  ++counters_.stream_syncs;  // fork() synchronises the device
  cache.set_device_rows(std::move(trimmed));
}

// The cache's device rows, with room for n more slots per head: created at a sequence's first
// pass (uploaded from host rows when a cache made elsewhere brings some, which it then drops),
// grown on the device when a head would overflow (1.5x).
void CudaBackend::bind_cache(kernels::KvCache& cache, int n) {
  const kernels::KvCacheShape& sh = cache.shape();
  const cu::KvDtype want = dtype_ == DType::kBf16 ? cu::KvDtype::kBf16 : cu::KvDtype::kF32;
  cu::DeviceKvCache* rows = rows_of(cache);
  int longest = 0, room = 0;
  bool same = rows != nullptr;
  for (int l = 0; l < sh.num_layers; ++l) {
    for (int h = 0; h < sh.num_kv_heads; ++h) {
      longest = std::max(longest, cache.length(l, h));
      if (!rows) continue;
      same = same && rows->length(l, h) == cache.length(l, h);
      room = l == 0 && h == 0 ? rows->capacity(l, h) : std::min(room, rows->capacity(l, h));
    }
  }
  KVB_CHECK(!rows || rows->dtype() == want)
      << "--device cuda: this cache's device rows are " << cu::kv_dtype_name(rows->dtype())
      << ", the engine stores " << cu::kv_dtype_name(want) << " (a cache is not shared between "
      << "engines of different dtypes)";
  // The index changed behind the device's back (an edit that bypassed the engine)?
  KVB_CHECK(!rows || same)
      << "--device cuda: the cache's index no longer matches its device rows; evict only "
         "through the engine (policies' eviction plans)";
  const int need = longest + n;
  if (rows && room >= need) {
    dev_ = rows;
    bound_.push_back(dev_);
    return;
  }
  if (rows) {  // a head about to overflow
    std::unique_ptr<cu::DeviceKvCache> bigger = rows->grown(std::max(need, room + room / 2));
    ++counters_.stream_syncs;  // grown() synchronises the device
    dev_ = bigger.get();
    bound_.push_back(dev_);
    cache.set_device_rows(std::move(bigger));
    return;
  }
  KVB_CHECK(longest == 0 || cache.host_rows())
      << "--device cuda: a cache of " << longest << " tokens whose rows are on no device "
      << "(an index-only cache must stay with the engine that filled it)";
  cache.set_device_rows(nullptr);  // free first: the old and new rows need not fit together
  auto fresh = std::make_unique<cu::DeviceKvCache>(sh, want, std::max(cache.capacity(), need));
  if (longest > 0) {  // host rows made elsewhere (a CPU cache handed to the GPU)
    fresh->upload(cache);
    ++counters_.h2d_copies;
    counters_.h2d_bytes += cache.logical_bytes();
    ++counters_.stream_syncs;  // upload() synchronises the device
    ++cache_uploads_;
  }
  dev_ = fresh.get();
  bound_.push_back(dev_);  // end_layers advances its next position with the index's
  cache.set_device_rows(std::move(fresh));
  if (cache.host_rows()) cache.drop_host_rows();  // the device's rows are the storage now
}

void CudaBackend::begin_pass(std::span<const int32_t> tokens, const int32_t* positions,
                             kernels::KvCache& cache, int cache_rows) {
  const ModelConfig& c = model_.config;
  KVB_CUDA_CHECK(cudaSetDevice(gpu_));
  const int n = static_cast<int>(tokens.size());
  const size_t N = n;
  const int D = c.dim, H = c.hidden_dim, hd = c.head_dim;
  const size_t QD = static_cast<size_t>(c.num_heads) * hd;
  const size_t KVD = static_cast<size_t>(c.num_kv_heads) * hd;
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
  rolled_layer_ = -1;
  x16_src_ = nullptr;  // buffers may have moved
  gu_pending_ = 0;
  row0_ = 0;
  bound_.clear();
  tokens_h_.assign(tokens.begin(), tokens.end());
  pos_h_.assign(positions, positions + n);
  KVB_CHECK(cache_rows >= 1 && cache_rows <= n)
      << "--device cuda: a pass of " << n << " rows with " << cache_rows << " for its first cache";
  bind_cache(cache, cache_rows);  // a decode batch's first sequence appends one row, not n
  copy_h2d(s.tokens.data(), tokens_h_.data(), N * 4);
  copy_h2d(s.pos.data(), pos_h_.data(), N * 4);
  gpu::embed_rows(s.x.data(), embedding_.data(), s.tokens.data(), n, D,
                  model_.config.embed_scale, stream_);
}

void CudaBackend::rope(Act a, int layer, int heads, int n) {
  cu::rope(rows_at(a), s_->pos.data() + row0_, n, heads, rope_tables_[layer], stream_);
}

void CudaBackend::rope_rows(Act a, int layer, const int32_t* positions, int rows) {
  ensure(s_->qpos, static_cast<size_t>(rows));
  copy_h2d(s_->qpos.data(), positions, static_cast<size_t>(rows) * 4);
  cu::rope(rows_at(a), s_->qpos.data(), rows, 1, rope_tables_[layer], stream_);
}

void CudaBackend::download(Act a, size_t count, float* dst, size_t offset) {
  copy_d2h(dst, rows_at(a) + offset, count * 4);
  sync();
}

const void* CudaBackend::output_projection(int layer, bool* bf16) {
  *bf16 = dtype_ == DType::kBf16;
  return layers_[layer].wo.ptr(dtype_);
}

const float* CudaBackend::stash(Act a, size_t count) {
  // One buffer per activation: a layer's pre-RoPE keys and queries are stashed together.
  cu::DeviceBuffer<float>& buf = a == Act::kQ ? s_->stash_q : s_->stash;
  ensure(buf, count);
  KVB_CUDA_CHECK(cudaMemcpyAsync(buf.data(), rows_at(a), count * 4, cudaMemcpyDeviceToDevice,
                                 stream_));
  return buf.data();
}

void CudaBackend::append_kv(int l, int n, kernels::KvCache& cache) {
  const ModelConfig& c = model_.config;
  const int hd = c.head_dim, ckv = cache.shape().num_kv_heads;
  Scratch& s = *s_;
  const size_t N = n;
  dev_ = rows_of(cache);  // the sequence of the selected rows (decode batches bind several)
  KVB_CHECK(dev_ != nullptr) << "--device cuda: append to a cache without device rows";
  const float* k_new = rows_at(Act::kK);
  const float* v_new = rows_at(Act::kV);
  if (ckv != c.num_kv_heads) {  // GQA expanded: one copy per query head
    ensure(s.kx, N * ckv * hd);
    ensure(s.vx, N * ckv * hd);
    gpu::expand_gqa(s.kx.data(), k_new, n, c.num_kv_heads, ckv, hd, stream_);
    gpu::expand_gqa(s.vx.data(), v_new, n, c.num_kv_heads, ckv, hd, stream_);
    k_new = s.kx.data();
    v_new = s.vx.data();
  }
  const int64_t c0 = dev_->h2d_copies();
  const size_t b0 = dev_->h2d_bytes();
  dev_->append(l, k_new, v_new, s.pos.data() + row0_, n, stream_);
  count_uploads(*dev_, c0, b0);  // none up to kMaxParamHeads heads: lengths by kernel argument

  // The index: positions are known here, nothing comes back from the device.
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < ckv; ++h) cache.append(l, h, nullptr, nullptr, pos_h_[row0_ + t]);
  }
}

void CudaBackend::set_decode_kernel(int kernel) {
  KVB_USAGE_CHECK(kernel == cu::kDecodeDefault || kernel == cu::kDecodeGrouped ||
                  kernel == cu::kDecodeStreamed || kernel == cu::kDecodeTensorCore)
      << "decode kernel " << kernel << ": use " << cu::kDecodeDefault << " (default), "
      << cu::kDecodeGrouped << " (grouped), " << cu::kDecodeStreamed << " (streamed) or "
      << cu::kDecodeTensorCore << " (tensor cores)";
  decode_kernel_ = kernel;
}

void CudaBackend::count_uploads(const cu::DeviceKvCache& rows, int64_t copies0, size_t bytes0) {
  counters_.h2d_copies += rows.h2d_copies() - copies0;
  counters_.h2d_bytes += rows.h2d_bytes() - bytes0;
}

void CudaBackend::apply_plan(const kernels::EvictionPlan& plan, kernels::KvCache& cache) {
  if (!plan.changes_any()) return;
  const kernels::KvCacheShape& sh = cache.shape();
  const int l = plan.layer();
  cu::DeviceKvCache* rows = rows_of(cache);
  if (plan.prunes_channels()) {
    // Key channels (a plan that holds no token decisions): the index counts them (host rows, if
    // any, are zeroed there and uploaded with them); the device rows zero them with one counted
    // upload of a channel mask and one launch.
    cache.apply(plan);
    if (!rows) return;
    const int64_t c0 = rows->h2d_copies();
    const size_t b0 = rows->h2d_bytes();
    rows->zero_key_channels(plan, stream_);
    count_uploads(*rows, c0, b0);
    return;
  }
  if (plan.on_device()) {
    // The ops' lists, on the device already: the index takes the counts (its positions become
    // stale until host code reads them), the rows keep the listed slots, the counts travel as a
    // kernel argument. Nothing waits, nothing is uploaded (up to kMaxParamHeads heads).
    KVB_CHECK(rows != nullptr) << "--device cuda: a device eviction plan for layer " << l
                               << " of a cache without device rows";
    cache.apply(plan);
    const int64_t c0 = rows->h2d_copies();
    const size_t b0 = rows->h2d_bytes();
    rows->keep_slots(l, plan.device_slots(), plan.device_ld(), plan.device_counts().data(),
                     stream_, /*validated=*/true);
    count_uploads(*rows, c0, b0);
    return;
  }
  auto same_lengths = [&] {
    for (int h = 0; h < sh.num_kv_heads; ++h) {
      KVB_CHECK(rows->length(l, h) == cache.length(l, h))
          << "--device cuda: device cache layer " << l << " head " << h << " holds "
          << rows->length(l, h) << " slots after the plan, the index " << cache.length(l, h);
    }
  };
  bool victims_only = true;  // every changed head drops one slot (a decode step at the budget)
  for (int h = 0; h < sh.num_kv_heads; ++h) {
    victims_only &= plan.kind(h) != kernels::EvictionPlan::Kind::kKeep;
  }
  if (victims_only) {
    victims_h_.assign(sh.num_kv_heads, -1);
    for (int h = 0; h < sh.num_kv_heads; ++h) {
      if (plan.kind(h) == kernels::EvictionPlan::Kind::kVictim) victims_h_[h] = plan.victim(h);
    }
    cache.apply(plan);  // the index (and host rows), validating the victims
    if (!rows) return;  // host rows not on the device yet: uploaded at the cache's next pass
    // No keep list: the victims and lengths travel as kernel arguments; only the rows after
    // each victim move.
    const int64_t c0 = rows->h2d_copies();
    const size_t b0 = rows->h2d_bytes();
    rows->evict_slots(l, victims_h_.data(), stream_);
    count_uploads(*rows, c0, b0);
    same_lengths();
    return;
  }
  // Keep-lists [heads, ld] for the device, from the plan and the (host-known) lengths.
  int ld = 0;
  for (int h = 0; h < sh.num_kv_heads; ++h) ld = std::max(ld, cache.length(l, h));
  slots_h_.assign(static_cast<size_t>(sh.num_kv_heads) * ld, 0);
  counts_h_.assign(sh.num_kv_heads, 0);
  std::vector<int32_t>& list = keep_scratch_;
  for (int h = 0; h < sh.num_kv_heads; ++h) {
    plan.keep_list(h, cache.length(l, h), &list);
    counts_h_[h] = static_cast<int32_t>(list.size());
    std::copy(list.begin(), list.end(), slots_h_.begin() + static_cast<size_t>(h) * ld);
  }
  cache.apply(plan);  // the index (and host rows), validating the lists
  if (!rows) return;
  ensure(s_->slots, std::max<size_t>(slots_h_.size(), 1));
  copy_h2d(s_->slots.data(), slots_h_.data(), slots_h_.size() * 4);
  // The lists were validated against the index (cache.apply above): no device-side check, so
  // nothing waits; the counts and the new lengths travel as a kernel argument.
  const int64_t c0 = rows->h2d_copies();
  const size_t b0 = rows->h2d_bytes();
  rows->keep_slots(l, s_->slots.data(), ld, counts_h_.data(), stream_, /*validated=*/true);
  count_uploads(*rows, c0, b0);
  same_lengths();
}

void CudaBackend::end_layers(int n) {
  for (cu::DeviceKvCache* rows : bound_) rows->advance_position(n);
}

void CudaBackend::end_pass(kernels::KvCache& cache) {
  (void)cache;
  sync();
  graph_->after_sync();  // what a captured step freed or outgrew, now that its graph has run
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    peak_bytes_ = std::max(peak_bytes_, total_b - free_b);
  }
}

}  // namespace kvb::engine
