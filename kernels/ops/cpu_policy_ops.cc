// CpuPolicyOps: the host instance of the policy ops table.
#include "kernels/ops/cpu_policy_ops.h"

#include <algorithm>
#include <limits>
#include <bit>
#include <cmath>
#include <utility>

#include "common/error.h"
#include "kernels/cpu/budget.h"
#include "kernels/cpu/exp_exact.h"
#include "kernels/cpu/gqa.h"
#include "kernels/cpu/history_bits.h"
#include "kernels/cpu/kcenter.h"
#include "kernels/cpu/leverage.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/select.h"
#include "kernels/ops/slot_state.h"

namespace kvb::kernels::ops {

SlotRows::SlotRows(SlotType type, int layers, int heads)
    : type_(type), layers_(layers), heads_(heads) {
  KVB_CHECK(layers >= 0 && heads >= 0) << "slot rows of " << layers << " x " << heads;
  lengths_.assign(static_cast<size_t>(layers) * heads, 0);
}

size_t SlotRows::bytes() const {
  size_t slots = 0;
  for (int32_t l : lengths_) slots += l;
  return slots * (type_ == SlotType::kF32 ? sizeof(float) : sizeof(uint64_t));
}

namespace {

// Host rows: SlotState's vectors, one per (layer, head), whose sizes are the lengths.
class CpuRows final : public SlotRows {
 public:
  CpuRows(SlotType type, int layers, int heads)
      : SlotRows(type, layers, heads), f32_(layers, heads), u64_(layers, heads) {}
  std::unique_ptr<SlotRows> clone() const override { return std::make_unique<CpuRows>(*this); }
  std::vector<float>& f32(int layer, int head) {
    KVB_ASSERT(type() == SlotType::kF32);
    return f32_.at(layer, head);
  }
  std::vector<uint64_t>& u64(int layer, int head) {
    KVB_ASSERT(type() == SlotType::kU64);
    return u64_.at(layer, head);
  }
  const std::vector<float>& f32(int layer, int head) const {
    return const_cast<CpuRows*>(this)->f32(layer, head);
  }
  const std::vector<uint64_t>& u64(int layer, int head) const {
    return const_cast<CpuRows*>(this)->u64(layer, head);
  }
  // Lengths follow the vectors after every op.
  void sync_length(int layer, int head) {
    const size_t n = type() == SlotType::kF32 ? f32_.at(layer, head).size()
                                              : u64_.at(layer, head).size();
    set_length(layer, head, static_cast<int>(n));
  }

 private:
  SlotState<float> f32_;
  SlotState<uint64_t> u64_;
};

CpuRows& host(SlotRows& rows) {
  auto* r = dynamic_cast<CpuRows*>(&rows);
  KVB_CHECK(r != nullptr) << "policy state made by another ops instance reached the CPU ops";
  return *r;
}
const CpuRows& host(const SlotRows& rows) { return host(const_cast<SlotRows&>(rows)); }

void check_layer(const SlotRows& rows, int layer) {
  KVB_CHECK(layer >= 0 && layer < rows.layers())
      << "policy ops: layer " << layer << " of rows for " << rows.layers() << " layers";
}

}  // namespace

// SubGen's device ops: an instance without them (the CPU's: its policy keeps host sketches).
namespace {
[[noreturn]] void no_subgen_ops(const PolicyOps& ops, const char* op) {
  KVB_FAIL() << "policy ops: " << op << " is a device op (SubGen, and weighted subgen_kcenter's "
             << "query, on a device); this "
             << (ops.on_device() ? "device" : "host") << " instance has no SubGen sketches";
}
}  // namespace

std::unique_ptr<SubgenState> PolicyOps::make_subgen_state(const kernels::cpu::SubgenParams&, int,
                                                          int) {
  no_subgen_ops(*this, "make_subgen_state");
}
void PolicyOps::subgen_query(const SubgenState*, const SubgenAttend&, const kernels::KvIndex&) {
  no_subgen_ops(*this, "subgen_query");
}
void PolicyOps::subgen_absorb(SubgenState&, int, const kernels::KvIndex&,
                              std::span<const SubgenAbsorb>, uint64_t) {
  no_subgen_ops(*this, "subgen_absorb");
}
std::vector<float> PolicyOps::read_keys(const kernels::KvIndex&, int, int, int, int) {
  no_subgen_ops(*this, "read_keys");
}
kernels::cpu::SubgenSketch PolicyOps::read_subgen(const SubgenState&, int, int) {
  no_subgen_ops(*this, "read_subgen");
}

PolicyOps& cpu_policy_ops() {
  static CpuPolicyOps ops;  // stateless
  return ops;
}

PolicyOps& ops_of(const LayerStats& stats) { return stats.ops ? *stats.ops : cpu_policy_ops(); }

SlotRows& rows_of(SlotRowsPtr& rows, PolicyOps& ops, SlotType type, int layers, int heads) {
  if (!rows) rows = SlotRowsPtr(ops.make_rows(type, layers, heads));
  return *rows;
}

std::unique_ptr<SlotRows> CpuPolicyOps::make_rows(SlotType type, int layers, int heads) {
  return std::make_unique<CpuRows>(type, layers, heads);
}

void CpuPolicyOps::require_own(const SlotRows& rows) const { (void)host(rows); }

void CpuPolicyOps::resize(SlotRows& rows, int layer, std::span<const int32_t> lengths) {
  CpuRows& r = host(rows);
  check_layer(rows, layer);
  KVB_CHECK(static_cast<int>(lengths.size()) <= rows.heads())
      << "policy ops: " << lengths.size() << " lengths for " << rows.heads() << " heads";
  for (size_t h = 0; h < lengths.size(); ++h) {
    const int head = static_cast<int>(h);
    if (rows.type() == SlotType::kF32) {
      r.f32(layer, head).resize(lengths[h], 0.0f);
    } else {
      r.u64(layer, head).resize(lengths[h], 0);
    }
    r.sync_length(layer, head);
  }
}

void CpuPolicyOps::accumulate(SlotRows& rows, int layer, const float* src, size_t head_stride,
                              size_t row_stride, int group, GqaReduce how) {
  CpuRows& r = host(rows);
  check_layer(rows, layer);
  std::vector<float> add;
  for (int h = 0; h < rows.heads(); ++h) {
    std::vector<float>& row = r.f32(layer, h);
    const int len = static_cast<int>(row.size());
    add.resize(len);
    cpu::reduce_gqa(src + h * head_stride, row_stride, group, len, how, add.data());
    for (int s = 0; s < len; ++s) row[s] += add[s];
  }
}

void CpuPolicyOps::history_bits(SlotRows& bits, const LayerStats& st,
                                const kernels::KvIndex& cache_index, int history,
                                bool inv_position) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CpuRows& r = host(bits);
  check_layer(bits, st.layer);
  const int heads = cache.shape().num_kv_heads;
  KVB_CHECK(bits.heads() == heads) << "history bits for " << bits.heads() << " heads, cache "
                                   << heads;
  const int group = st.num_heads / heads;
  const kernels::LayerKvView view = cache.layer(st.layer);
  for (int h = 0; h < heads; ++h) {
    kernels::cpu::HeadHistoryArgs a;
    a.len = cache.length(st.layer, h);
    a.n_new = st.n_new;
    a.last_w = st.last_w;
    a.group = group;
    a.history = history;
    a.inv_position = inv_position;
    a.last_probs = st.last_probs + static_cast<size_t>(h) * group * st.last_w * st.stride;
    a.stride = st.stride;
    a.positions = view.position(h);
    kernels::cpu::update_history_bits(a, r.u64(st.layer, h));
    r.sync_length(st.layer, h);
  }
}

void CpuPolicyOps::append_norms(SlotRows& rows, int layer, std::span<const int32_t> before,
                                const float* vectors, int n, int src_heads, int dim,
                                int expand) {
  CpuRows& r = host(rows);
  check_layer(rows, layer);
  KVB_CHECK(rows.type() == SlotType::kF32 && static_cast<int>(before.size()) == rows.heads() &&
            n >= 0 && dim >= 1 && expand >= 1 && (n == 0 || vectors != nullptr) &&
            (rows.heads() - 1) / expand < src_heads)
      << "append_norms: " << before.size() << " rows of " << rows.heads() << ", " << n
      << " vectors of " << src_heads << " heads of " << dim << ", expand " << expand;
  for (int h = 0; h < rows.heads(); ++h) {
    const int src = h / expand;
    std::vector<float>& norm = r.f32(layer, h);
    if (before[h] == 0) norm.clear();  // a fresh cache (the policy may serve several sequences)
    KVB_CHECK(static_cast<int>(norm.size()) == before[h])
        << "append_norms: head " << h << " holds " << norm.size() << " entries, not "
        << before[h];
    for (int t = 0; t < n; ++t) {
      const float* v = vectors + (static_cast<size_t>(t) * src_heads + src) * dim;
      double sum = 0;  // f32 entries, squares accumulated in f64
      for (int i = 0; i < dim; ++i) sum += static_cast<double>(v[i]) * v[i];
      norm.push_back(static_cast<float>(std::sqrt(sum)));
    }
    r.sync_length(layer, h);
  }
}

void CpuPolicyOps::scale(SlotRows& rows, int layer, std::span<const int32_t> first,
                         float factor) {
  CpuRows& r = host(rows);
  check_layer(rows, layer);
  KVB_CHECK(rows.type() == SlotType::kF32 && static_cast<int>(first.size()) <= rows.heads())
      << "scale: " << first.size() << " heads of " << rows.heads() << " rows";
  for (size_t h = 0; h < first.size(); ++h) {
    std::vector<float>& row = r.f32(layer, static_cast<int>(h));
    KVB_CHECK(first[h] >= 0 && first[h] <= static_cast<int>(row.size()))
        << "scale: entries from " << first[h] << " of a row of " << row.size();
    for (size_t s = first[h]; s < row.size(); ++s) row[s] *= factor;
  }
}

void CpuPolicyOps::popcount(const SlotRows& bits, int layer, SlotRows& out, int out_layer) {
  const CpuRows& b = host(bits);
  CpuRows& o = host(out);
  check_layer(bits, layer);
  check_layer(out, out_layer);
  KVB_CHECK(out.heads() == bits.heads() && bits.type() == SlotType::kU64 &&
            out.type() == SlotType::kF32)
      << "popcount: " << out.heads() << " f32 rows for " << bits.heads() << " u64 rows";
  for (int h = 0; h < bits.heads(); ++h) {
    const std::vector<uint64_t>& src = b.u64(layer, h);
    std::vector<float>& dst = o.f32(out_layer, h);
    dst.resize(src.size());
    for (size_t s = 0; s < src.size(); ++s) dst[s] = static_cast<float>(std::popcount(src[s]));
    o.sync_length(out_layer, h);
  }
}

void CpuPolicyOps::window_sum(SlotRows& out, int out_layer, const LayerStats& st,
                              std::span<const int32_t> lengths, WindowReduce how, int queries) {
  CpuRows& r = host(out);
  check_layer(out, out_layer);
  const int stride_w = st.last_w;  // the rows' layout
  KVB_CHECK(st.last_probs != nullptr && stride_w >= 1 && queries >= 0 && queries <= stride_w)
      << "window_sum needs the last-w probabilities (last_w = " << stride_w << ", queries "
      << queries << ")";
  const int w = queries > 0 ? queries : stride_w;  // the rows summed
  KVB_CHECK(static_cast<int>(lengths.size()) == out.heads() && out.heads() == st.num_heads)
      << "window_sum: " << lengths.size() << " lengths for " << out.heads() << " rows of "
      << st.num_heads << " query heads";
  for (int q = 0; q < out.heads(); ++q) {
    const int n = lengths[q];
    KVB_CHECK(n >= 0 && n <= st.stride) << "window_sum: query head " << q << " sums " << n
                                        << " slots, stats stride " << st.stride;
    std::vector<float>& row = r.f32(out_layer, q);
    row.assign(n, 0.0f);
    const float* probs = st.last_probs + static_cast<size_t>(q) * stride_w * st.stride;
    if (how == WindowReduce::kWeightedMean) {
      std::vector<double> acc(n, 0.0);
      for (int a = 0; a < w; ++a) {
        const float* p = probs + static_cast<size_t>(a) * st.stride;
        const double weight = static_cast<double>(n + a);
        for (int j = 0; j < n; ++j) acc[j] += static_cast<double>(p[j]) * weight;
      }
      for (int j = 0; j < n; ++j) row[j] = static_cast<float>(acc[j] / static_cast<double>(w));
      r.sync_length(out_layer, q);
      continue;
    }
    for (int a = 0; a < w; ++a) {
      const float* p = probs + static_cast<size_t>(a) * st.stride;
      for (int j = 0; j < n; ++j) row[j] += p[j];
    }
    if (how == WindowReduce::kMean) {
      // Divide (not multiply by 1/w) so that mean equals torch's .mean rounding.
      for (int j = 0; j < n; ++j) row[j] /= static_cast<float>(w);
    }
    r.sync_length(out_layer, q);
  }
}

void CpuPolicyOps::reduce_heads(const SlotRows& in, int in_layer, int group, GqaReduce how,
                                SlotRows& out, int out_layer) {
  const CpuRows& src = host(in);
  CpuRows& dst = host(out);
  check_layer(in, in_layer);
  check_layer(out, out_layer);
  KVB_CHECK(&in != &out && group >= 1 && in.type() == SlotType::kF32 &&
            out.type() == SlotType::kF32 && in.heads() == out.heads() * group)
      << "reduce_heads: " << in.heads() << " rows into " << out.heads() << " by groups of "
      << group;
  std::vector<float> gathered;  // the group's rows, contiguous: cpu::reduce_gqa's input
  for (int h = 0; h < out.heads(); ++h) {
    const int n = in.length(in_layer, h * group);
    gathered.resize(static_cast<size_t>(group) * n);
    for (int g = 0; g < group; ++g) {
      const std::vector<float>& row = src.f32(in_layer, h * group + g);
      KVB_CHECK(static_cast<int>(row.size()) == n)
          << "reduce_heads: row " << h * group + g << " holds " << row.size() << " entries, the "
          << "group's first " << n;
      std::copy(row.begin(), row.end(), gathered.begin() + static_cast<size_t>(g) * n);
    }
    std::vector<float>& o = dst.f32(out_layer, h);
    o.resize(n);
    cpu::reduce_gqa(gathered.data(), n, group, n, how, o.data());
    dst.sync_length(out_layer, h);
  }
}

void CpuPolicyOps::pool(const SlotRows& in, int in_layer, SlotRows& out, int out_layer,
                        int kernel, cpu::PoolKind kind) {
  const CpuRows& src = host(in);
  CpuRows& dst = host(out);
  check_layer(in, in_layer);
  check_layer(out, out_layer);
  KVB_CHECK(&in != &out && in.type() == SlotType::kF32 && out.type() == SlotType::kF32 &&
            in.heads() == out.heads() && kernel >= 1 && kernel % 2 == 1)
      << "pool: " << in.heads() << " rows into " << out.heads() << ", kernel " << kernel
      << " (odd, >= 1)";
  for (int h = 0; h < in.heads(); ++h) {
    const std::vector<float>& x = src.f32(in_layer, h);
    std::vector<float>& y = dst.f32(out_layer, h);
    y.resize(x.size());
    if (!x.empty()) {
      cpu::pool1d(x.data(), y.data(), 1, static_cast<int>(x.size()), kernel, kind);
    }
    dst.sync_length(out_layer, h);
  }
}

std::vector<int32_t> CpuPolicyOps::count_top_across_heads(const SlotRows& scores, int score_layer,
                                                          const kernels::KvIndex& cache_index,
                                                          int layer, int64_t k) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  const CpuRows& r = host(scores);
  check_layer(scores, score_layer);
  const int heads = scores.heads();
  KVB_CHECK(heads <= cache.shape().num_kv_heads)
      << "count_top_across_heads: " << heads << " score rows, cache " << cache.shape().num_kv_heads;
  std::vector<int32_t> lengths(heads);
  int ld = 0;
  for (int h = 0; h < heads; ++h) {
    lengths[h] = scores.length(score_layer, h);
    KVB_CHECK(lengths[h] <= cache.length(layer, h))
        << "count_top_across_heads: head " << h << " scores " << lengths[h] << " slots of "
        << cache.length(layer, h);
    ld = std::max(ld, static_cast<int>(lengths[h]));
  }
  // Ranking ties go to the more recent position (then the lower head): true positions, since a
  // cache that was compressed before holds gaps.
  std::vector<float> flat(static_cast<size_t>(heads) * ld);      // (heads, ld)
  std::vector<int32_t> positions(flat.size());                    // (heads, ld)
  const kernels::LayerKvView view = cache.layer(layer);
  for (int h = 0; h < heads; ++h) {
    const std::vector<float>& row = r.f32(score_layer, h);
    // data() + offset: with every row empty (ld 0) the vectors are empty and [] would be UB.
    std::copy(row.begin(), row.end(), flat.data() + static_cast<size_t>(h) * ld);
    const int32_t* pos = view.position(h);
    std::copy(pos, pos + lengths[h], positions.data() + static_cast<size_t>(h) * ld);
  }
  const kernels::cpu::RaggedScores ragged{flat.data(), positions.data(), lengths.data(), heads,
                                          ld};
  KVB_CHECK(k >= 0) << "count_top_across_heads: k " << k;
  int64_t total = 0;
  for (int32_t n : lengths) total += n;
  std::vector<int32_t> counts(heads);
  kernels::cpu::global_topk_counts(ragged, static_cast<int>(std::min(k, total)), counts.data());
  return counts;
}

void CpuPolicyOps::keep_top(const SlotRows& scores, int score_layer,
                            const kernels::KvIndex& cache_index, std::span<const KeepTop> heads,
                            std::span<SlotRows* const> state, kernels::EvictionPlan& plan) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  const CpuRows& sc = host(scores);
  const int layer = plan.layer();
  check_layer(scores, score_layer);
  std::vector<int32_t> keep;
  for (const KeepTop& t : heads) {
    KVB_CHECK(t.score_head >= 0 && t.score_head < scores.heads() && 0 <= t.k &&
              t.k < t.prefix && t.prefix <= t.len && t.head >= 0 &&
              t.head < cache.shape().num_kv_heads && t.len == cache.length(layer, t.head) &&
              t.prefix <= scores.length(score_layer, t.score_head))
        << "keep_top: head " << t.head << " keeps " << t.k << " of [0, " << t.prefix
        << ") of " << t.len << " slots by a score row of "
        << scores.length(score_layer, t.score_head);
    const float* score = sc.f32(score_layer, t.score_head).data();
    if (t.k == t.prefix - 1) {
      // One slot goes: the lowest-ranked of the prefix (the same one top-k leaves out).
      const int victim = kernels::cpu::select_argmin(score, nullptr, t.prefix);
      plan.evict(t.head, victim);
      for (SlotRows* rows : state) {
        CpuRows& r = host(*rows);
        if (rows->type() == SlotType::kF32) {
          erase_slot(r.f32(layer, t.head), victim);
        } else {
          erase_slot(r.u64(layer, t.head), victim);
        }
        r.sync_length(layer, t.head);
      }
      continue;
    }
    keep.resize(t.len);
    const int got = kernels::cpu::select_topk(score, t.prefix, t.k, keep.data());
    keep.resize(got);
    for (int s = t.prefix; s < t.len; ++s) keep.push_back(s);
    for (SlotRows* rows : state) {
      CpuRows& r = host(*rows);
      if (rows->type() == SlotType::kF32) {
        compact(r.f32(layer, t.head), keep);
      } else {
        compact(r.u64(layer, t.head), keep);
      }
      r.sync_length(layer, t.head);
    }
    plan.keep(t.head, keep);
  }
}

void CpuPolicyOps::divide_by_query_counts(SlotRows& rows, int layer,
                                          std::span<const int32_t> before, int n_queries) {
  CpuRows& r = host(rows);
  check_layer(rows, layer);
  KVB_CHECK(rows.type() == SlotType::kF32 && static_cast<int>(before.size()) <= rows.heads() &&
            n_queries >= 1)
      << "divide_by_query_counts: " << before.size() << " heads of " << rows.heads()
      << " rows, " << n_queries << " queries";
  for (size_t h = 0; h < before.size(); ++h) {
    std::vector<float>& row = r.f32(layer, static_cast<int>(h));
    const int len = static_cast<int>(row.size());
    KVB_CHECK(before[h] >= 0 && len <= before[h] + n_queries)
        << "divide_by_query_counts: head " << h << " holds " << len << " entries, "
        << before[h] << " before a block of " << n_queries << " queries";
    for (int s = 0; s < len; ++s) {
      row[s] /= static_cast<float>(n_queries - std::max(0, s - before[h]));
    }
  }
}

namespace {
// sum_i x[i]^2 of one row of d floats, f64 FMAs in index order (the CUDA twins' sq_norm).
double sq_norm(const float* x, int d) {
  double sq = 0;
  for (int i = 0; i < d; ++i) sq = std::fma(static_cast<double>(x[i]), x[i], sq);
  return sq;
}

// The common check of an op over a layer of the cache's host rows into f32 rows `out`.
void check_cache_op(const SlotRows& out, int out_layer, const kernels::KvCache& cache, int layer,
                    const char* op) {
  check_layer(out, out_layer);
  KVB_CHECK(cache.host_rows() && layer >= 0 && layer < cache.shape().num_layers &&
            out.type() == SlotType::kF32 && out.heads() <= cache.shape().num_kv_heads)
      << op << ": " << out.heads() << " rows over layer " << layer << " of a cache of "
      << cache.shape().num_kv_heads << " heads" << (cache.host_rows() ? "" : " without host rows");
}
}  // namespace

void CpuPolicyOps::cosine_to_mean(SlotRows& out, int out_layer, const kernels::KvIndex& cache_index,
                                  int layer, CacheRows which, int chunk) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CpuRows& r = host(out);
  check_cache_op(out, out_layer, cache, layer, "cosine_to_mean");
  KVB_CHECK(chunk >= 0) << "cpu policy ops: cosine_to_mean chunk " << chunk;
  const kernels::LayerKvView view = cache.rows_f32(layer);
  const int d = view.head_dim;
  std::vector<double> norms, mean(d);
  for (int h = 0; h < out.heads(); ++h) {
    const int len = cache.length(layer, h);
    auto row_of = [&](int j) { return which == CacheRows::kKeys ? view.key(h, j) : view.value(h, j); };
    norms.resize(len);
    std::vector<float>& o = r.f32(out_layer, h);
    o.resize(len);
    const int step = chunk > 0 ? chunk : std::max(len, 1);
    for (int c0 = 0; c0 < len; c0 += step) {  // each run of slots with its own anchor
      const int c1 = std::min(len, c0 + step);
      std::fill(mean.begin(), mean.end(), 0.0);
      for (int j = c0; j < c1; ++j) {
        const float* x = row_of(j);
        norms[j] = std::sqrt(sq_norm(x, d));
        const double inv = std::max(norms[j], 1e-12);
        for (int i = 0; i < d; ++i) mean[i] += x[i] / inv;
      }
      double sq = 0;
      for (int i = 0; i < d; ++i) {
        mean[i] /= (c1 - c0);
        sq = std::fma(mean[i], mean[i], sq);
      }
      const double anchor_norm = std::max(std::sqrt(sq), 1e-8);
      for (int j = c0; j < c1; ++j) {
        const float* x = row_of(j);
        double dot = 0;
        for (int i = 0; i < d; ++i) dot = std::fma(static_cast<double>(x[i]), mean[i], dot);
        o[j] = static_cast<float>(dot / (std::max(norms[j], 1e-8) * anchor_norm));
      }
    }
    r.sync_length(out_layer, h);
  }
}

void CpuPolicyOps::cache_norms(SlotRows& out, int out_layer, const kernels::KvIndex& cache_index,
                               int layer, CacheRows which, bool squared) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CpuRows& r = host(out);
  check_cache_op(out, out_layer, cache, layer, "cache_norms");
  const kernels::LayerKvView view = cache.rows_f32(layer);
  for (int h = 0; h < out.heads(); ++h) {
    const int len = cache.length(layer, h);
    std::vector<float>& o = r.f32(out_layer, h);
    o.resize(len);
    for (int j = 0; j < len; ++j) {
      const float* x = which == CacheRows::kKeys ? view.key(h, j) : view.value(h, j);
      const double sq = sq_norm(x, view.head_dim);
      o[j] = static_cast<float>(squared ? sq : std::sqrt(sq));
    }
    r.sync_length(out_layer, h);
  }
}

void CpuPolicyOps::normalize_chunks(SlotRows& rows, int layer, int chunk) {
  CpuRows& r = host(rows);
  check_layer(rows, layer);
  KVB_CHECK(rows.type() == SlotType::kF32 && chunk >= 0)
      << "normalize_chunks: chunks of " << chunk << " entries";
  for (int h = 0; h < rows.heads(); ++h) {
    std::vector<float>& row = r.f32(layer, h);
    const int len = static_cast<int>(row.size());
    const int step = chunk == 0 ? std::max(len, 1) : chunk;
    for (int c0 = 0; c0 < len; c0 += step) {
      const int c1 = std::min(len, c0 + step);
      double sum = 0;
      for (int s = c0; s < c1; ++s) sum += row[s];
      if (sum == 0) continue;
      for (int s = c0; s < c1; ++s) row[s] = static_cast<float>(row[s] / sum);
    }
  }
}

void CpuPolicyOps::combine(SlotRows& rows, int layer, const SlotRows& in, int in_layer,
                           Combine how) {
  CpuRows& r = host(rows);
  const CpuRows& b = host(in);
  check_layer(rows, layer);
  check_layer(in, in_layer);
  KVB_CHECK(rows.type() == SlotType::kF32 && in.type() == SlotType::kF32 &&
            in.heads() >= rows.heads() && (&in != &rows || in_layer != layer))
      << "combine: " << rows.heads() << " rows with " << in.heads() << " rows";
  for (int h = 0; h < rows.heads(); ++h) {
    std::vector<float>& row = r.f32(layer, h);
    const std::vector<float>& by = b.f32(in_layer, h);
    KVB_CHECK(row.size() == by.size())
        << "combine: head " << h << " rows of " << row.size() << " and " << by.size();
    if (how == Combine::kMul) {
      for (size_t s = 0; s < row.size(); ++s) row[s] *= by[s];
    } else {
      for (size_t s = 0; s < row.size(); ++s) row[s] += by[s];
    }
  }
}

void CpuPolicyOps::fill_prefix(SlotRows& rows, int layer, int count, float value) {
  CpuRows& r = host(rows);
  check_layer(rows, layer);
  KVB_CHECK(rows.type() == SlotType::kF32 && count >= 0)
      << "fill_prefix of " << count << " entries";
  for (int h = 0; h < rows.heads(); ++h) {
    std::vector<float>& row = r.f32(layer, h);
    std::fill(row.begin(), row.begin() + std::min<size_t>(count, row.size()), value);
  }
}

namespace {
// One partition's softmax of the per-slot standard deviations of its rows normalised by the
// reference partition's per-channel range (lag_scores' contract), into a[0, lag).
void lag_softmax(const float* const* rows, const float* const* ref, int lag, int d, double* lo,
                 double* hi, double* a) {
  for (int c = 0; c < d; ++c) {
    lo[c] = hi[c] = ref[0][c];
    for (int t = 1; t < lag; ++t) {
      lo[c] = std::min(lo[c], static_cast<double>(ref[t][c]));
      hi[c] = std::max(hi[c], static_cast<double>(ref[t][c]));
    }
  }
  double top = 0;
  for (int t = 0; t < lag; ++t) {
    double mean = 0;
    for (int c = 0; c < d; ++c) {
      mean += hi[c] == lo[c] ? 0.0 : (rows[t][c] - lo[c]) / (hi[c] - lo[c]);
    }
    mean /= d;
    double ss = 0;
    for (int c = 0; c < d; ++c) {
      const double z = hi[c] == lo[c] ? 0.0 : (rows[t][c] - lo[c]) / (hi[c] - lo[c]);
      ss = std::fma(z - mean, z - mean, ss);
    }
    a[t] = d > 1 ? std::sqrt(ss / (d - 1)) : 0.0;
    top = t == 0 ? a[t] : std::max(top, a[t]);
  }
  double sum = 0;
  for (int t = 0; t < lag; ++t) {
    a[t] = std::exp(a[t] - top);
    sum += a[t];
  }
  for (int t = 0; t < lag; ++t) a[t] /= sum;
}
}  // namespace

void CpuPolicyOps::lag_scores(SlotRows& out, int out_layer, const kernels::KvIndex& cache_index,
                              int layer, int sinks, int lag) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CpuRows& r = host(out);
  KVB_CHECK(sinks >= 0 && lag >= 1) << "lag_scores with sinks " << sinks << ", lag " << lag;
  check_cache_op(out, out_layer, cache, layer, "lag_scores");
  const kernels::LayerKvView view = cache.rows_f32(layer);
  const int d = view.head_dim;
  std::vector<double> lo(d), hi(d), ak(lag), av(lag);
  std::vector<const float*> rows(lag), ref(lag);
  for (int h = 0; h < out.heads(); ++h) {
    const int n = cache.length(layer, h);
    std::vector<float>& o = r.f32(out_layer, h);
    o.assign(n, 1.0f);
    if (n < sinks + 2 * lag) {
      for (int j = sinks; j < n; ++j) {
        o[j] = static_cast<float>(static_cast<double>(j - sinks) / (n - sinks));
      }
      r.sync_length(out_layer, h);
      continue;
    }
    const int parts = (n - sinks) / lag;
    for (int p = 0; p + 1 < parts; ++p) {
      const int first = sinks + p * lag;
      for (int which = 0; which < 2; ++which) {
        for (int t = 0; t < lag; ++t) {
          rows[t] = which == 0 ? view.key(h, first + t) : view.value(h, first + t);
          ref[t] = which == 0 ? view.key(h, first + lag + t) : view.value(h, first + lag + t);
        }
        lag_softmax(rows.data(), ref.data(), lag, d, lo.data(), hi.data(),
                    which == 0 ? ak.data() : av.data());
      }
      for (int t = 0; t < lag; ++t) ak[t] = (ak[t] + av[t]) / 2;
      for (int t = 0; t < lag; ++t) {
        int rank = 0;
        for (int u = 0; u < lag; ++u) rank += ak[u] < ak[t] || (ak[u] == ak[t] && u < t);
        o[first + t] = static_cast<float>(static_cast<double>(rank) / lag);
      }
    }
    r.sync_length(out_layer, h);
  }
}

namespace {
// y = x rotated by `rot` (PairRotation: f64 from the f32 entries, explicit fused multiply-adds).
void rotate_pairs(const float* x, int d, const PairRotation& rot, double* y) {
  for (int i = 0; i < d; ++i) y[i] = x[i];
  const int half = rot.rot_dim / 2;
  for (int i = 0; i < half; ++i) {
    const int a = rot.adjacent ? 2 * i : i;
    const int b = rot.adjacent ? 2 * i + 1 : i + half;
    const double xa = x[a], xb = x[b], c = rot.cos[i], s = rot.sin[i];
    y[a] = std::fma(xa, c, -(xb * s));
    y[b] = std::fma(xa, s, xb * c);
  }
}
}  // namespace

void CpuPolicyOps::query_moments(SlotRows& out, int out_layer, const LayerStats& st, int head_dim,
                                 int first, const PairRotation& rot, bool covariance) {
  CpuRows& r = host(out);
  check_layer(out, out_layer);
  const int d = head_dim, m = st.n_new - first;
  KVB_CHECK(out.type() == SlotType::kF32 && out.heads() == st.num_heads && first >= 0 && m >= 1 &&
            st.pre_rope_queries != nullptr && rot.rot_dim >= 0 && rot.rot_dim <= d &&
            rot.rot_dim % 2 == 0 && rot.cos.size() == static_cast<size_t>(rot.rot_dim / 2) &&
            rot.sin.size() == rot.cos.size())
      << "query_moments: " << out.heads() << " rows for " << st.num_heads << " query heads, "
      << "queries [" << first << ", " << st.n_new << ") of " << d << " dimensions, rotation of "
      << rot.rot_dim << (st.pre_rope_queries ? "" : ", no pre-RoPE queries");
  std::vector<double> y(d), mean(d), cov;
  for (int q = 0; q < out.heads(); ++q) {
    auto query = [&](int t) {
      return st.pre_rope_queries + (static_cast<size_t>(t) * st.num_heads + q) * d;
    };
    std::fill(mean.begin(), mean.end(), 0.0);
    for (int t = first; t < st.n_new; ++t) {
      rotate_pairs(query(t), d, rot, y.data());
      for (int i = 0; i < d; ++i) mean[i] += y[i];
    }
    for (int i = 0; i < d; ++i) mean[i] /= m;
    std::vector<float>& o = r.f32(out_layer, q);
    o.assign(covariance ? d + static_cast<size_t>(d) * d : d, 0.0f);
    for (int i = 0; i < d; ++i) o[i] = static_cast<float>(mean[i]);
    if (covariance) {
      cov.assign(static_cast<size_t>(d) * d, 0.0);
      for (int t = first; t < st.n_new; ++t) {
        rotate_pairs(query(t), d, rot, y.data());
        for (int i = 0; i < d; ++i) y[i] -= mean[i];
        for (int i = 0; i < d; ++i) {  // the upper triangle; e_i e_j == e_j e_i exactly
          double* row = &cov[static_cast<size_t>(i) * d];
          for (int j = i; j < d; ++j) row[j] = std::fma(y[i], y[j], row[j]);
        }
      }
      for (int i = 0; i < d; ++i) {
        for (int j = i; j < d; ++j) {
          const float v = static_cast<float>(cov[static_cast<size_t>(i) * d + j] / m);
          o[d + static_cast<size_t>(i) * d + j] = v;
          o[d + static_cast<size_t>(j) * d + i] = v;
        }
      }
    }
    r.sync_length(out_layer, q);
  }
}

void CpuPolicyOps::quadratic_scores(SlotRows& out, int out_layer,
                                    const kernels::KvIndex& cache_index, int layer,
                                    const SlotRows& moments, int moments_layer, int group, double a,
                                    double b) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CpuRows& r = host(out);
  const CpuRows& mr = host(moments);
  check_layer(out, out_layer);
  check_layer(moments, moments_layer);
  const int heads = out.heads();
  KVB_CHECK(cache.host_rows() && layer >= 0 && layer < cache.shape().num_layers &&
            out.type() == SlotType::kF32 && moments.type() == SlotType::kF32 &&
            moments.heads() == heads && group >= 1 && heads % group == 0 &&
            heads / group <= cache.shape().num_kv_heads)
      << "quadratic_scores: " << heads << " rows of " << moments.heads() << " moments, group "
      << group << ", over a cache of " << cache.shape().num_kv_heads << " heads";
  const kernels::LayerKvView view = cache.rows_f32(layer);
  const int d = view.head_dim;
  std::vector<double> kb;
  for (int q = 0; q < heads; ++q) {
    const std::vector<float>& mo = mr.f32(moments_layer, q);
    KVB_CHECK(mo.size() == static_cast<size_t>(d + d * d) ||
              (b == 0 && mo.size() == static_cast<size_t>(d)))
        << "quadratic_scores: query head " << q << "'s moments hold " << mo.size()
        << " entries for " << d << " dimensions";
    const int h = q / group, len = cache.length(layer, h);
    std::vector<float>& o = r.f32(out_layer, q);
    o.resize(len);
    // kB slots at a time, their keys transposed ([l][jj]) so that each step vectorises across
    // slots; every slot's sums still run in index order (the bits of one slot at a time).
    constexpr int kB = 8;
    kb.resize(static_cast<size_t>(d) * kB);
    for (int j0 = 0; j0 < len; j0 += kB) {
      const int nb = std::min(kB, len - j0);
      for (int jj = 0; jj < kB; ++jj) {
        const float* k = view.key(h, j0 + std::min(jj, nb - 1));  // a short block repeats
        for (int l = 0; l < d; ++l) kb[static_cast<size_t>(l) * kB + jj] = k[l];
      }
      double dot[kB] = {}, quad[kB] = {};
      for (int i = 0; i < d; ++i) {
        const double m = mo[i];
        const double* ki = &kb[static_cast<size_t>(i) * kB];
        for (int jj = 0; jj < kB; ++jj) dot[jj] = std::fma(ki[jj], m, dot[jj]);
      }
      if (b != 0) {
        for (int i = 0; i < d; ++i) {
          const float* c = &mo[d + static_cast<size_t>(i) * d];
          double inner[kB] = {};
          for (int l = 0; l < d; ++l) {
            const double cl = c[l];
            const double* kl = &kb[static_cast<size_t>(l) * kB];
            for (int jj = 0; jj < kB; ++jj) inner[jj] = std::fma(cl, kl[jj], inner[jj]);
          }
          const double* ki = &kb[static_cast<size_t>(i) * kB];
          for (int jj = 0; jj < kB; ++jj) quad[jj] = std::fma(ki[jj], inner[jj], quad[jj]);
        }
      }
      for (int jj = 0; jj < nb; ++jj) {
        o[j0 + jj] = static_cast<float>(b == 0 ? a * dot[jj] : std::fma(b, quad[jj], a * dot[jj]));
      }
    }
    r.sync_length(out_layer, q);
  }
}

void CpuPolicyOps::softmax(SlotRows& rows, int layer, int first) {
  CpuRows& r = host(rows);
  check_layer(rows, layer);
  KVB_CHECK(rows.type() == SlotType::kF32 && first >= 0) << "softmax from entry " << first;
  for (int h = 0; h < rows.heads(); ++h) {
    std::vector<float>& row = r.f32(layer, h);
    const int n = static_cast<int>(row.size());
    if (first >= n) continue;
    double top = row[first];
    for (int j = first + 1; j < n; ++j) top = std::max(top, static_cast<double>(row[j]));
    std::vector<double> e(n - first);
    double sum = 0;
    for (int j = first; j < n; ++j) {
      e[j - first] = std::exp(static_cast<double>(row[j]) - top);
      sum += e[j - first];
    }
    for (int j = first; j < n; ++j) row[j] = static_cast<float>(e[j - first] / sum);
  }
}

void CpuPolicyOps::add_scalar(SlotRows& rows, int layer, float value) {
  CpuRows& r = host(rows);
  check_layer(rows, layer);
  KVB_CHECK(rows.type() == SlotType::kF32) << "add_scalar on u64 rows";
  for (int h = 0; h < rows.heads(); ++h) {
    for (float& x : r.f32(layer, h)) x += value;
  }
}

void CpuPolicyOps::fill_top(SlotRows& rows, int layer, std::span<const int32_t> k, float value,
                            const SlotRows* by, int by_layer) {
  CpuRows& r = host(rows);
  check_layer(rows, layer);
  const CpuRows& b = by ? host(*by) : r;
  if (by) check_layer(*by, by_layer);
  const int from = by ? by_layer : layer;
  KVB_CHECK(rows.type() == SlotType::kF32 && b.type() == SlotType::kF32 &&
            static_cast<int>(k.size()) <= rows.heads() && b.heads() >= static_cast<int>(k.size()))
      << "fill_top of " << k.size() << " heads of " << rows.heads() << " rows";
  std::vector<int32_t> top;
  for (int h = 0; h < static_cast<int>(k.size()); ++h) {
    std::vector<float>& row = r.f32(layer, h);
    const std::vector<float>& order = b.f32(from, h);
    const int n = static_cast<int>(row.size());
    KVB_CHECK(k[h] >= 0 && order.size() == row.size())
        << "fill_top: head " << h << " fills " << k[h] << " of " << n << " entries by a row of "
        << order.size();
    top.resize(std::min(k[h], n));
    const int got = kernels::cpu::select_topk(order.data(), n, k[h], top.data());
    for (int i = 0; i < got; ++i) row[top[i]] = value;
  }
}

void CpuPolicyOps::projected_value_norms(SlotRows& out, int out_layer,
                                         const kernels::KvIndex& cache_index, int layer,
                                         const void* wo, bool wo_bf16, int dim, int group) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CpuRows& r = host(out);
  check_layer(out, out_layer);
  const int heads = out.heads();
  KVB_CHECK(cache.host_rows() && layer >= 0 && layer < cache.shape().num_layers &&
            out.type() == SlotType::kF32 && wo != nullptr && !wo_bf16 && dim >= 1 &&
            group >= 1 && heads % group == 0 && heads / group <= cache.shape().num_kv_heads)
      << "projected_value_norms: " << heads << " rows, group " << group << ", a "
      << (wo ? (wo_bf16 ? "bf16" : "f32") : "missing") << " output projection of " << dim
      << " rows (the host instance reads f32), over a cache of " << cache.shape().num_kv_heads
      << " heads";
  const kernels::LayerKvView view = cache.rows_f32(layer);
  const int d = view.head_dim;
  const size_t qd = static_cast<size_t>(heads) * d;
  const float* w = static_cast<const float*>(wo);
  std::vector<float> wt(static_cast<size_t>(d) * dim);  // the head's columns, [i][o]
  std::vector<double> z(dim);
  for (int q = 0; q < heads; ++q) {
    for (int i = 0; i < d; ++i) {
      for (int o = 0; o < dim; ++o) wt[static_cast<size_t>(i) * dim + o] = w[o * qd + q * d + i];
    }
    const int h = q / group, len = cache.length(layer, h);
    std::vector<float>& row = r.f32(out_layer, q);
    row.resize(len);
    for (int j = 0; j < len; ++j) {
      const float* v = view.value(h, j);
      std::fill(z.begin(), z.end(), 0.0);
      for (int i = 0; i < d; ++i) {
        const double vi = v[i];
        const float* col = &wt[static_cast<size_t>(i) * dim];
        for (int o = 0; o < dim; ++o) z[o] = std::fma(vi, static_cast<double>(col[o]), z[o]);
      }
      double l1 = 0;
      for (int o = 0; o < dim; ++o) l1 += std::fabs(z[o]);
      row[j] = static_cast<float>(l1);
    }
    r.sync_length(out_layer, q);
  }
}

namespace {
// kvpress NonCausalAttnPress's mask value for the padding of the last chunk (-1e-9, not -1e9).
constexpr float kPadLogit = -1e-9f;
}  // namespace

void CpuPolicyOps::chunk_attention_sums(SlotRows& out, int out_layer,
                                        const kernels::KvIndex& cache_index, int layer,
                                        const LayerStats& st, int first, int count, int chunk) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CpuRows& r = host(out);
  check_layer(out, out_layer);
  const int heads = out.heads(), n = st.n_new;
  const int kv = cache.shape().num_kv_heads;
  KVB_CHECK(cache.host_rows() && layer >= 0 && layer < cache.shape().num_layers &&
            out.type() == SlotType::kF32 && heads == st.num_heads && heads >= 1 && kv >= 1 &&
            heads % kv == 0 && chunk >= 1 && first >= 0 && count >= 1 && first + count <= n &&
            st.pre_rope_queries != nullptr && st.rope != nullptr)
      << "chunk_attention_sums: " << heads << " rows for " << st.num_heads
      << " query heads over a cache of " << kv << " heads, chunks of " << chunk << ", tokens ["
      << first << ", " << first + count << ") of " << n << " queries"
      << (st.pre_rope_queries && st.rope ? "" : " (no pre-RoPE queries or RoPE)");
  for (int h = 0; h < kv; ++h) {
    KVB_CHECK(cache.length(layer, h) == n)
        << "chunk_attention_sums: head " << h << " holds " << cache.length(layer, h)
        << " slots, not the block's " << n << " (a prompt's prefill into an empty cache)";
  }
  const int group = heads / kv, d = cache.shape().head_dim;
  // The range's queries after RoPE, at their positions (the engine's rotation): y[t - first].
  const float* q0 = st.pre_rope_queries + static_cast<size_t>(first) * heads * d;
  std::vector<float> y(q0, q0 + static_cast<size_t>(count) * heads * d);
  std::vector<int32_t> pos(count);
  for (int t = 0; t < count; ++t) pos[t] = st.block_end - n + first + t;
  kernels::cpu::rope(y.data(), pos.data(), count, heads, d, *st.rope);
  for (int q = 0; q < heads; ++q) r.f32(out_layer, q).resize(count);
  const kernels::LayerKvView view = cache.rows_f32(layer);
  // A padded query's row (logit 0 on every real key of an r-slot chunk, kPadLogit on the
  // padding): its probability of each real key, 1 / s.
  auto pad_share = [&](int real) {
    double s = 0;
    for (int j = 0; j < real; ++j) s += 1.0;  // expf(0 - 0)
    const double e = std::exp(kPadLogit - 0.0f);
    for (int j = real; j < chunk; ++j) s += e;
    return 1.0 / s;
  };
#pragma omp parallel if (heads > 1)
  {
    std::vector<float> kt(static_cast<size_t>(d) * chunk), lg(chunk), e(chunk);
    std::vector<double> col(chunk);
#pragma omp for schedule(dynamic, 1)
    for (int q = 0; q < heads; ++q) {
      const int h = q / group;
      float* o = r.f32(out_layer, q).data();
      for (int c0 = first; c0 < first + count; c0 += chunk) {
        const int real = std::min(chunk, first + count - c0);
        // The chunk's keys transposed ([i][j]): each step vectorises across keys, every key's
        // sum still in index order.
        for (int j = 0; j < real; ++j) {
          const float* k = view.key(h, c0 + j);
          for (int i = 0; i < d; ++i) kt[static_cast<size_t>(i) * chunk + j] = k[i];
        }
        std::fill(col.begin(), col.begin() + real, 0.0);
        for (int t = c0; t < c0 + real; ++t) {
          const float* yt = &y[(static_cast<size_t>(t - first) * heads + q) * d];
          std::fill(lg.begin(), lg.begin() + real, 0.0f);
          for (int i = 0; i < d; ++i) {
            const float yi = yt[i];
            const float* ki = &kt[static_cast<size_t>(i) * chunk];
            for (int j = 0; j < real; ++j) lg[j] = std::fma(yi, ki[j], lg[j]);
          }
          float m = lg[0];
          for (int j = 1; j < real; ++j) m = std::max(m, lg[j]);
          if (real < chunk) m = std::max(m, kPadLogit);
          for (int j = 0; j < real; ++j) lg[j] -= m;
          kernels::cpu::exp_floats(e.data(), lg.data(), real);
          double s = 0;
          for (int j = 0; j < real; ++j) s += e[j];
          if (real < chunk) {
            const double ep = std::exp(kPadLogit - m);
            for (int j = real; j < chunk; ++j) s += ep;
          }
          for (int j = 0; j < real; ++j) col[j] += e[j] / s;
        }
        if (real < chunk) {
          const double p = pad_share(real);
          for (int t = real; t < chunk; ++t) {
            for (int j = 0; j < real; ++j) col[j] += p;
          }
        }
        for (int j = 0; j < real; ++j) o[c0 - first + j] = static_cast<float>(col[j]);
      }
    }
  }
  for (int q = 0; q < heads; ++q) r.sync_length(out_layer, q);
}

namespace {
// replay_attention_max's normaliser: 8 f64 partial sums, lane k taking e[j] for j = k mod 8 in
// increasing j, combined ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)).
double replay_normaliser(const float* e, int n) {
  double s[8] = {};
  int j0 = 0;
  for (; j0 + 8 <= n; j0 += 8) {
    for (int k = 0; k < 8; ++k) s[k] += static_cast<double>(e[j0 + k]);
  }
  for (int k = 0; j0 + k < n; ++k) s[k] += static_cast<double>(e[j0 + k]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}
}  // namespace

void CpuPolicyOps::replay_attention_max(SlotRows& out, int out_layer,
                                        const kernels::KvIndex& cache_index, int layer,
                                        const LayerStats& st, int sinks, int first, int count) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  CpuRows& r = host(out);
  check_layer(out, out_layer);
  const int heads = out.heads(), m = st.n_queries;
  const int kv = cache.shape().num_kv_heads, d = cache.shape().head_dim;
  KVB_CHECK(cache.host_rows() && layer >= 0 && layer < cache.shape().num_layers &&
            out.type() == SlotType::kF32 && heads == kv && st.num_heads % kv == 0 &&
            st.last_queries != nullptr && m >= 1 && sinks >= 0 && sinks <= first && count >= 0)
      << "replay_attention_max: " << heads << " rows over a cache of " << kv << " heads, "
      << st.num_heads << " query heads, " << m << " queries, sinks " << sinks << ", slots ["
      << first << ", " << first + count << ")";
  for (int h = 0; h < kv; ++h) {
    KVB_CHECK(first + count <= cache.length(layer, h) - m)
        << "replay_attention_max: head " << h << " holds " << cache.length(layer, h)
        << " slots: the chunk [" << first << ", " << first + count << ") and the block's " << m
        << " keys overlap";
  }
  const int group = st.num_heads / kv;
  const int keys = sinks + count + m;  // the sinks, the chunk, the block (causal)
  const float div = std::sqrt(static_cast<float>(d));
  const kernels::LayerKvView view = cache.rows_f32(layer);
  // Per query head its maxima (then the group's maximum, exact in any order): a thread per
  // query head.
  std::vector<std::vector<float>> per_query(st.num_heads, std::vector<float>(count, 0.0f));
#pragma omp parallel if (st.num_heads > 1)
  {
    std::vector<float> kt(static_cast<size_t>(d) * keys), lgs(4 * static_cast<size_t>(keys)),
        e(keys);
#pragma omp for schedule(dynamic, 1)
    for (int q = 0; q < st.num_heads; ++q) {
      const int h = q / group;
      const int len = cache.length(layer, h);
      // The keys transposed ([i][j]): each step vectorises across keys, every key's sum still in
      // index order.
      auto slot = [&](int j) { return j < sinks ? j : j < sinks + count ? first + j - sinks
                                                                        : len - m + j - sinks - count; };
      for (int j = 0; j < keys; ++j) {
        const float* k = view.key(h, slot(j));
        for (int i = 0; i < d; ++i) kt[static_cast<size_t>(i) * keys + j] = k[i];
      }
      float* o = per_query[q].data();
      // kQ queries at a time over blocks of kBlock keys: kQ x kBlock chains in registers share
      // each key load (each key's chain still in index order); the last query's span of keys
      // covers the others' (they read only their own).
      constexpr int kQ = 4, kBlock = 32;
      for (int t0 = 0; t0 < m; t0 += kQ) {
        const int tq = std::min(kQ, m - t0);
        const int span = sinks + count + t0 + tq;
        const float* ys[kQ];
        for (int a = 0; a < kQ; ++a) {
          ys[a] = st.last_queries +
                  (static_cast<size_t>(t0 + std::min(a, tq - 1)) * st.num_heads + q) * d;
        }
        int j0 = 0;
        for (; j0 + kBlock <= span; j0 += kBlock) {
          float acc[kQ][kBlock] = {};
          for (int i = 0; i < d; ++i) {
            const float* ki = &kt[static_cast<size_t>(i) * keys + j0];
            for (int a = 0; a < kQ; ++a) {
              const float ya = ys[a][i];
              for (int j = 0; j < kBlock; ++j) acc[a][j] = std::fma(ya, ki[j], acc[a][j]);
            }
          }
          for (int a = 0; a < tq; ++a) {
            for (int j = 0; j < kBlock; ++j) lgs[a * keys + j0 + j] = acc[a][j] / div;
          }
        }
        for (int a = 0; a < tq && j0 < span; ++a) {
          float* lg = &lgs[static_cast<size_t>(a) * keys];
          std::fill(lg + j0, lg + span, 0.0f);
          for (int i = 0; i < d; ++i) {
            const float ya = ys[a][i];
            const float* ki = &kt[static_cast<size_t>(i) * keys];
            for (int j = j0; j < span; ++j) lg[j] = std::fma(ya, ki[j], lg[j]);
          }
          for (int j = j0; j < span; ++j) lg[j] /= div;
        }
        for (int a = 0; a < tq; ++a) {
          const int real = sinks + count + t0 + a + 1;
          float* lg = &lgs[static_cast<size_t>(a) * keys];
          // The maximum in 16 lanes (exact in any order).
          float lane_max[16];
          std::fill_n(lane_max, 16, -std::numeric_limits<float>::infinity());
          int j = 0;
          for (; j + 16 <= real; j += 16) {
            for (int k = 0; k < 16; ++k) lane_max[k] = std::max(lane_max[k], lg[j + k]);
          }
          for (int k = 0; j + k < real; ++k) lane_max[k] = std::max(lane_max[k], lg[j + k]);
          float mx = lane_max[0];
          for (int k = 1; k < 16; ++k) mx = std::max(mx, lane_max[k]);
          for (int k = 0; k < real; ++k) lg[k] -= mx;
          kernels::cpu::exp_floats(e.data(), lg, real);
          const double z = replay_normaliser(e.data(), real);
          for (int k = 0; k < count; ++k) {
            o[k] = std::max(o[k], static_cast<float>(e[sinks + k] / z));
          }
        }
      }
    }
  }
  for (int h = 0; h < kv; ++h) {
    std::vector<float>& row = r.f32(out_layer, h);
    row.assign(count, 0.0f);
    for (int g = 0; g < group; ++g) {
      const std::vector<float>& x = per_query[h * group + g];
      for (int j = 0; j < count; ++j) row[j] = std::max(row[j], x[j]);
    }
    r.sync_length(out_layer, h);
  }
}

void CpuPolicyOps::cumsum(SlotRows& rows, int layer) {
  CpuRows& r = host(rows);
  check_layer(rows, layer);
  KVB_CHECK(rows.type() == SlotType::kF32) << "cumsum on u64 rows";
  for (int h = 0; h < rows.heads(); ++h) {
    std::vector<float>& row = r.f32(layer, h);
    for (size_t j = 1; j < row.size(); ++j) row[j] += row[j - 1];
  }
}

void CpuPolicyOps::gather(const SlotRows& in, int in_layer, std::span<const int32_t> indices,
                          std::span<const int32_t> counts, SlotRows& out, int out_layer) {
  const CpuRows& a = host(in);
  CpuRows& r = host(out);
  check_layer(in, in_layer);
  check_layer(out, out_layer);
  const int heads = static_cast<int>(counts.size());
  KVB_CHECK(in.type() == SlotType::kF32 && out.type() == SlotType::kF32 && &in != &out &&
            heads <= out.heads() && heads <= in.heads())
      << "gather: " << heads << " heads from " << in.heads() << " rows into " << out.heads();
  size_t total = 0;
  for (int h = 0; h < heads; ++h) {
    KVB_CHECK(counts[h] >= 0) << "gather: head " << h << " gathers " << counts[h] << " entries";
    total += static_cast<size_t>(counts[h]);
  }
  KVB_CHECK(total == indices.size())
      << "gather: " << indices.size() << " indices for counts summing to " << total;
  size_t o = 0;
  for (int h = 0; h < heads; ++h) {
    const std::vector<float>& row = a.f32(in_layer, h);
    std::vector<float> got(counts[h]);
    for (int t = 0; t < counts[h]; ++t, ++o) {
      const int32_t i = indices[o];
      KVB_CHECK(i >= 0 && static_cast<size_t>(i) < row.size())
          << "gather: index " << i << " of head " << h << "'s row of " << row.size();
      got[t] = row[i];
    }
    r.f32(out_layer, h) = std::move(got);
    r.sync_length(out_layer, h);
  }
}

void CpuPolicyOps::slice(const SlotRows& in, int in_layer, int first, int count, SlotRows& out,
                         int out_layer) {
  const CpuRows& a = host(in);
  CpuRows& r = host(out);
  check_layer(in, in_layer);
  check_layer(out, out_layer);
  KVB_CHECK(in.type() == SlotType::kF32 && out.type() == SlotType::kF32 && &in != &out &&
            out.heads() <= in.heads() && first >= 0 && count >= 0)
      << "slice: entries [" << first << ", " << first + count << ") of " << in.heads()
      << " rows into " << out.heads();
  for (int h = 0; h < out.heads(); ++h) {
    const std::vector<float>& row = a.f32(in_layer, h);
    KVB_CHECK(static_cast<size_t>(first + count) <= row.size())
        << "slice: entries [" << first << ", " << first + count << ") of head " << h
        << "'s row of " << row.size();
    r.f32(out_layer, h).assign(row.begin() + first, row.begin() + first + count);
    r.sync_length(out_layer, h);
  }
}

void CpuPolicyOps::pad_with_max(const SlotRows& in, int in_layer, int before, int after,
                                SlotRows& out, int out_layer) {
  const CpuRows& a = host(in);
  CpuRows& r = host(out);
  check_layer(in, in_layer);
  check_layer(out, out_layer);
  KVB_CHECK(in.type() == SlotType::kF32 && out.type() == SlotType::kF32 && &in != &out &&
            out.heads() <= in.heads() && before >= 0 && after >= 0)
      << "pad_with_max: " << before << " and " << after << " entries around " << in.heads()
      << " rows into " << out.heads();
  bool any = false;
  float top = 0;
  for (int h = 0; h < out.heads(); ++h) {
    for (float x : a.f32(in_layer, h)) {
      top = any ? std::max(top, x) : x;
      any = true;
    }
  }
  for (int h = 0; h < out.heads(); ++h) {
    const std::vector<float>& row = a.f32(in_layer, h);
    std::vector<float>& o = r.f32(out_layer, h);
    o.assign(before, top);
    o.insert(o.end(), row.begin(), row.end());
    o.insert(o.end(), after, top);
    r.sync_length(out_layer, h);
  }
}

void CpuPolicyOps::standardize(SlotRows& rows, int layer) {
  CpuRows& r = host(rows);
  check_layer(rows, layer);
  KVB_CHECK(rows.type() == SlotType::kF32) << "standardize on u64 rows";
  // Each run of kStandardizeRun entries summed in index order, the runs' sums in (head, run) order
  // (a device sums the runs in parallel).
  auto sum_runs = [&](auto&& term) {
    double total = 0;
    for (int h = 0; h < rows.heads(); ++h) {
      const std::vector<float>& row = r.f32(layer, h);
      for (size_t b = 0; b < row.size(); b += kStandardizeRun) {
        const size_t end = std::min(row.size(), b + kStandardizeRun);
        double run = 0;
        for (size_t j = b; j < end; ++j) run = term(run, row[j]);
        total += run;
      }
    }
    return total;
  };
  size_t count = 0;
  for (int h = 0; h < rows.heads(); ++h) count += r.f32(layer, h).size();
  if (count == 0) return;
  const double mean =
      sum_runs([](double acc, float x) { return acc + x; }) / static_cast<double>(count);
  const double sq = sum_runs([mean](double acc, float x) {
    const double dx = x - mean;
    return std::fma(dx, dx, acc);
  });
  const double sd =
      count < 2 ? 1e-6 : std::max(std::sqrt(sq / static_cast<double>(count - 1)), 1e-6);
  for (int h = 0; h < rows.heads(); ++h) {
    for (float& x : r.f32(layer, h)) x = static_cast<float>((x - mean) / sd);
  }
}

void CpuPolicyOps::leverage_scores(SlotRows& out, int out_layer, const LayerStats& st,
                                   int key_heads, int head_dim, int first, int count,
                                   const float* sketch, int k) {
  CpuRows& r = host(out);
  check_layer(out, out_layer);
  const int heads = out.heads();
  KVB_CHECK(out.type() == SlotType::kF32 && heads <= key_heads && st.pre_rope_keys != nullptr &&
            sketch != nullptr && k >= 1 && k <= kMaxSketch && first >= 0 && count >= 1 &&
            first + count <= st.n_new && head_dim >= 1)
      << "leverage_scores: " << heads << " rows of " << key_heads << " key heads, tokens ["
      << first << ", " << first + count << ") of " << st.n_new << ", a sketch of " << k
      << " columns (at most " << kMaxSketch << ")"
      << (st.pre_rope_keys ? "" : " (no pre-RoPE keys)");
  const int d = head_dim;
  for (int h = 0; h < heads; ++h) r.f32(out_layer, h).resize(count);
  bool failed = false;
#pragma omp parallel if (heads > 1)
  {
    std::vector<double> mean(d), x(static_cast<size_t>(count) * k), g(static_cast<size_t>(k) * k),
        l(static_cast<size_t>(k) * k), y(k);
#pragma omp for schedule(dynamic, 1)
    for (int h = 0; h < heads; ++h) {
      auto key = [&](int t) {
        return st.pre_rope_keys + (static_cast<size_t>(first + t) * key_heads + h) * d;
      };
      std::fill(mean.begin(), mean.end(), 0.0);
      for (int t = 0; t < count; ++t) {
        const float* kt = key(t);
        for (int i = 0; i < d; ++i) mean[i] += kt[i];
      }
      for (int i = 0; i < d; ++i) mean[i] /= count;
      const float* phi = sketch + static_cast<size_t>(h) * d * k;
      std::fill(x.begin(), x.end(), 0.0);
      for (int t = 0; t < count; ++t) {
        const float* kt = key(t);
        double* xt = &x[static_cast<size_t>(t) * k];
        for (int i = 0; i < d; ++i) {
          const double ci = kt[i] - mean[i];
          const float* pi = phi + static_cast<size_t>(i) * k;
          for (int c = 0; c < k; ++c) xt[c] = std::fma(ci, static_cast<double>(pi[c]), xt[c]);
        }
      }
      // The Gram matrix's upper triangle in t order, mirrored (each entry its own sum).
      std::fill(g.begin(), g.end(), 0.0);
      for (int t = 0; t < count; ++t) {
        const double* xt = &x[static_cast<size_t>(t) * k];
        for (int a = 0; a < k; ++a) {
          const double xa = xt[a];
          double* ga = &g[static_cast<size_t>(a) * k];
          for (int b = a; b < k; ++b) ga[b] = std::fma(xa, xt[b], ga[b]);
        }
      }
      for (int a = 0; a < k; ++a) {
        for (int b = 0; b < a; ++b) {
          g[static_cast<size_t>(a) * k + b] = g[static_cast<size_t>(b) * k + a];
        }
      }
      std::vector<float>& o = r.f32(out_layer, h);
      if (!kernels::cpu::cholesky_with_jitter(g.data(), k, l.data())) {
#pragma omp atomic write
        failed = true;
        continue;
      }
      for (int t = 0; t < count; ++t) {
        o[t] = static_cast<float>(
            kernels::cpu::solve_sq_norm(l.data(), &x[static_cast<size_t>(t) * k], k, y.data()));
      }
    }
  }
  KVB_CHECK(!failed) << "leverage_scores: layer " << st.layer
                     << "'s keys have no positive definite Gram matrix, even with a jitter of 100 "
                        "(kvpress's chol_with_jitter fails too)";
  for (int h = 0; h < heads; ++h) r.sync_length(out_layer, h);
}

void CpuPolicyOps::erase(SlotRows& rows, int layer, std::span<const RowErase> heads) {
  CpuRows& r = host(rows);
  check_layer(rows, layer);
  for (const RowErase& e : heads) {
    KVB_CHECK(e.head >= 0 && e.head < rows.heads() && e.first >= 0 && e.count >= 0 &&
              e.first + e.count <= rows.length(layer, e.head))
        << "erase: entries [" << e.first << ", " << e.first + e.count << ") of head " << e.head
        << " of " << rows.heads() << ", holding "
        << (e.head >= 0 && e.head < rows.heads() ? rows.length(layer, e.head) : -1);
    if (rows.type() == SlotType::kF32) {
      std::vector<float>& v = r.f32(layer, e.head);
      v.erase(v.begin() + e.first, v.begin() + e.first + e.count);
    } else {
      std::vector<uint64_t>& v = r.u64(layer, e.head);
      v.erase(v.begin() + e.first, v.begin() + e.first + e.count);
    }
    r.sync_length(layer, e.head);
  }
}

void CpuPolicyOps::kcenter_keep(const kernels::KvIndex& cache_index,
                                std::span<const KCenterKeep> heads, SlotRows* log_sizes,
                                kernels::EvictionPlan& plan) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  const int layer = plan.layer();
  const int nh = cache.shape().num_kv_heads;
  KVB_CHECK(cache.host_rows()) << "kcenter_keep: the CPU ops read host rows; the cache has none";
  if (log_sizes) check_layer(*log_sizes, layer);
  const kernels::LayerKvView view = cache.rows_f32(layer);
  std::vector<int32_t> keep;
  std::vector<float> bias;
  for (const KCenterKeep& t : heads) {
    const int len = t.head >= 0 && t.head < nh ? cache.length(layer, t.head) : -1;
    KVB_CHECK(len >= 0 && 0 <= t.prefix && t.prefix <= len && t.k >= 0 &&
              (!log_sizes || t.head < log_sizes->heads()))
        << "kcenter_keep: head " << t.head << " of " << nh << " keeps " << t.k
        << " centres of [0, " << t.prefix << ") of " << len << " slots";
    kernels::cpu::kcenter_keep_list(view.key(t.head, 0), t.prefix, len, view.head_dim, t.k,
                                    &keep, log_sizes ? &bias : nullptr);
    if (log_sizes) {
      CpuRows& r = host(*log_sizes);
      r.f32(layer, t.head) = bias;
      r.sync_length(layer, t.head);
    }
    plan.keep(t.head, keep);
  }
}

std::vector<float> CpuPolicyOps::read_cache_rows(const kernels::KvIndex& cache_index, int layer,
                                                 int head, int first, int count, CacheRows which) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  KVB_CHECK(cache.host_rows() && layer >= 0 && layer < cache.shape().num_layers && head >= 0 &&
            head < cache.shape().num_kv_heads && first >= 0 && count >= 0 &&
            first + count <= cache.length(layer, head))
      << "read_cache_rows: slots [" << first << ", " << first + count << ") of layer " << layer
      << " head " << head << (cache.host_rows() ? "" : " of a cache without host rows");
  const kernels::LayerKvView view = cache.rows_f32(layer);
  const int d = view.head_dim;
  std::vector<float> out(static_cast<size_t>(count) * d);
  for (int j = 0; j < count; ++j) {
    const float* x = which == CacheRows::kKeys ? view.key(head, first + j)
                                               : view.value(head, first + j);
    std::copy(x, x + d, out.begin() + static_cast<size_t>(j) * d);
  }
  return out;
}

std::vector<int32_t> CpuPolicyOps::read_keep_list(const kernels::EvictionPlan& plan, int head,
                                                  int len) {
  KVB_CHECK(!plan.on_device()) << "read_keep_list: the host ops were given a plan of device lists";
  std::vector<int32_t> out;
  plan.keep_list(head, len, &out);
  return out;
}

void CpuPolicyOps::write_rows(SlotRows& rows, int layer, std::span<const float> values,
                              int length) {
  CpuRows& r = host(rows);
  check_layer(rows, layer);
  KVB_CHECK(rows.type() == SlotType::kF32 && length >= 0 &&
            values.size() == static_cast<size_t>(rows.heads()) * length)
      << "write_rows: " << values.size() << " values for " << rows.heads() << " rows of "
      << length;
  for (int h = 0; h < rows.heads(); ++h) {
    r.f32(layer, h).assign(values.begin() + static_cast<size_t>(h) * length,
                           values.begin() + static_cast<size_t>(h + 1) * length);
    r.sync_length(layer, h);
  }
}

void CpuPolicyOps::channel_square_means(const kernels::KvIndex& cache_index, int layer,
                                        CacheRows which, std::vector<double>* out) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  KVB_CHECK(cache.host_rows() && layer >= 0 && layer < cache.shape().num_layers)
      << "channel_square_means: layer " << layer
      << (cache.host_rows() ? "" : " of a cache without host rows");
  const kernels::LayerKvView view = cache.rows_f32(layer);
  const int d = view.head_dim, heads = view.num_kv_heads;
  out->assign(static_cast<size_t>(heads) * d, 0.0);
  for (int h = 0; h < heads; ++h) {
    const int len = cache.length(layer, h);
    if (len == 0) continue;
    double* acc = out->data() + static_cast<size_t>(h) * d;
    for (int s = 0; s < len; ++s) {
      const float* x = which == CacheRows::kKeys ? view.key(h, s) : view.value(h, s);
      for (int c = 0; c < d; ++c) {
        const double e = x[c];
        acc[c] += e * e;  // exact: the square of an f32 fits a double
      }
    }
    for (int c = 0; c < d; ++c) acc[c] /= len;
  }
}

namespace {
// window_attention's rows on the host.
class CpuWindowProbs final : public WindowProbs {
 public:
  std::vector<float>& reset(int heads, int w, int stride) {
    rows_.assign(static_cast<size_t>(heads) * w * stride, 0.0f);
    data_ = rows_.data();
    heads_ = heads;
    w_ = w;
    stride_ = stride;
    return rows_;
  }

 private:
  std::vector<float> rows_;
};
}  // namespace

std::unique_ptr<WindowProbs> CpuPolicyOps::make_window_probs() {
  return std::make_unique<CpuWindowProbs>();
}

void CpuPolicyOps::window_attention(WindowProbs& out, const kernels::KvIndex& cache_index,
                                    int layer, const LayerStats& st, int w) {
  const kernels::KvCache& cache = kernels::storage_of(cache_index);
  auto* probs = dynamic_cast<CpuWindowProbs*>(&out);
  KVB_CHECK(probs != nullptr) << "window_attention: probabilities made by another ops instance";
  const int heads = cache.shape().num_kv_heads, d = cache.shape().head_dim;
  const int qh = st.num_heads;
  KVB_CHECK(cache.host_rows() && layer >= 0 && layer < cache.shape().num_layers &&
            st.last_queries != nullptr && w >= 1 && w <= st.n_queries && heads >= 1 &&
            qh % heads == 0)
      << "window_attention: layer " << layer << ", a window of " << w << " of "
      << st.n_queries << " queries, " << qh << " query heads over " << heads << " cache heads"
      << (cache.host_rows() ? "" : ", a cache without host rows");
  const int group = qh / heads;
  int longest = 0;
  for (int h = 0; h < heads; ++h) longest = std::max(longest, cache.length(layer, h));
  std::vector<float>& rows = probs->reset(qh, w, longest);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const kernels::LayerKvView view = cache.rows_f32(layer);
  // Query heads are independent (each writes its own rows, in the same order on any thread):
  // the same bits with any number of threads.
  const int64_t work = static_cast<int64_t>(qh) * w * longest * d;
#pragma omp parallel for schedule(dynamic, 1) if (qh > 1 && work > (int64_t{1} << 20))
  for (int q = 0; q < qh; ++q) {
    std::vector<double> logit(longest);
    const int h = q / group;
    const int len = cache.length(layer, h);
    const int32_t* pos = view.position(h);
    for (int i = 0; i < w; ++i) {
      const float* query =
          st.last_queries + (static_cast<size_t>(st.n_queries - w + i) * qh + q) * d;
      const int32_t at = st.block_end - w + i;
      const int visible = static_cast<int>(std::upper_bound(pos, pos + len, at) - pos);
      if (visible == 0) continue;
      double top = -INFINITY;
      for (int s = 0; s < visible; ++s) {
        const float* key = view.key(h, s);
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += static_cast<double>(query[c]) * key[c];
        logit[s] = dot * scale;
        top = std::max(top, logit[s]);
      }
      double sum = 0;
      for (int s = 0; s < visible; ++s) sum += (logit[s] = std::exp(logit[s] - top));
      float* o = rows.data() + (static_cast<size_t>(q) * w + i) * longest;
      for (int s = 0; s < visible; ++s) o[s] = static_cast<float>(logit[s] / sum);
    }
  }
}

std::vector<float> CpuPolicyOps::read_f32(const SlotRows& rows, int layer, int head) {
  check_layer(rows, layer);
  return host(rows).f32(layer, head);
}

std::vector<uint64_t> CpuPolicyOps::read_u64(const SlotRows& rows, int layer, int head) {
  check_layer(rows, layer);
  return host(rows).u64(layer, head);
}

}  // namespace kvb::kernels::ops
