// SubGen's streaming attention sketch (seed 003, Algorithm 1; POLICIES.md `subgen`): per (layer,
// KV head) a weighted reservoir M of s (key, value) pairs for the numerator, greedy delta-clusters
// of the keys with t uniform samples each for the partition function, and the estimator
// z / tau over them plus optional exact tokens in one normalizer. CPU reference; the view and
// argument structs are plain pointers and sizes so that a CUDA twin can share them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/subgen_counter.h"

namespace kvb::kernels::cpu {

// ---- counter-based randomness ----------------------------------------------------------------

// mix64, counter_uniform: kernels/cpu/subgen_counter.h (shared with the CUDA twins).

// The counter of one token's draws: the stream (seed, layer, KV head) and the token's sequence
// position as the step. Slots: M's reservoir j uses slot j, a cluster's sample j uses
// kClusterSlot + j, so the two structures draw independent coins.
struct SubgenCounter {
  uint64_t seed = 0;
  uint32_t layer = 0;
  uint32_t head = 0;
  uint64_t step = 0;
};
constexpr uint64_t kClusterSlot = uint64_t{1} << 32;

// ---- state --------------------------------------------------------------------------------

struct SubgenParams {
  int head_dim = 0;
  int s = 0;             // reservoir slots of M (>= 1)
  int t = 0;             // samples per cluster (>= 1)
  int max_clusters = 0;  // capacity of the cluster table (>= 1), from the budget
  double delta2 = 0;     // squared clustering radius delta^2 (L2 in post-RoPE key space)
};

// Host-owned state of one stream (one layer, one KV head). Empty until the first absorbed token;
// after it, M holds s pairs and every cluster t samples (the paper's initialisation).
struct SubgenSketch {
  double mu = 0;         // sum over absorbed tokens of |v|^2 (double: a long running sum)
  int64_t absorbed = 0;  // tokens streamed in
  int64_t forced = 0;    // tokens farther than delta from every representative that joined the
                         // nearest cluster because the table was full (see subgen_absorb)
  std::vector<float> m_keys, m_values;  // [s, head_dim] each, once absorbed > 0
  std::vector<float> reps;              // [clusters, head_dim]: first key of each cluster
  std::vector<float> samples;           // [clusters, t, head_dim]
  std::vector<int64_t> counts;          // [clusters]: n_i
  int clusters() const { return static_cast<int>(counts.size()); }
};

// |v|^2 accumulated in double in coordinate order; the reservoir probability and the query-time
// weight mu / (s |v|^2) both use it, so they agree bit for bit.
double value_sqnorm(const float* v, int head_dim);

// Whether the squared distances (subgen_absorb's nearest representative, subgen_count_clusters
// on every path, subgen_auto_delta2) fuse each coordinate's square into the sum, s = fma(d, d,
// s). They do, on every build: the fma is written out (std::fma, _mm256_fmadd_pd), since the
// compiler's own contraction of `s += d * d` differed between loops of one build under some
// tunings (issue 31). Measured once on the real function with inputs whose fused and unfused
// sums differ, so the CUDA twin (kernels/cuda/subgen_sketch.h) takes the CPU's actual rounding
// and makes the same decisions bit for bit. |v|^2 needs no such choice: a float times a float
// is exact in double, so fused and unfused sums agree.
bool subgen_distance_fuses();

// Streams one token into the sketch (Algorithm 1 lines 4-6):
//  - M: with p = |v|^2 / (mu + |v|^2), each of the s slots independently takes (k, v) when
//    counter_uniform(.., slot j) < p; then mu += |v|^2. When mu + |v|^2 == 0 (every value so far
//    is zero) p is taken as 1: any sample is then right and its weight is 0 (see subgen_query).
//  - Clusters: the nearest representative (squared L2 in double, ties to the lower index); if it
//    is within delta (dist^2 <= delta2), n_i += 1 and each of the t samples independently
//    becomes k with p = 1/n_i; otherwise k starts a new cluster (representative k, t copies,
//    n = 1). A key with no representative within delta when the table already holds
//    max_clusters clusters joins its nearest cluster as above (counted in `forced`): the cap is
//    what keeps the sketch inside the budget, and is not in the paper.
// key, value: [head_dim].
void subgen_absorb(const SubgenParams& p, const SubgenCounter& counter, const float* key,
                   const float* value, SubgenSketch& sketch);

// A read-only view of a sketch for queries (s = 0 or clusters = 0: contributes nothing).
struct SubgenSketchView {
  const float* m_keys = nullptr;    // [s, head_dim]
  const float* m_values = nullptr;  // [s, head_dim]
  int s = 0;
  double mu = 0;
  const float* samples = nullptr;   // [clusters, t, head_dim]
  const int64_t* counts = nullptr;  // [clusters]
  int clusters = 0;
  int t = 0;
};
SubgenSketchView subgen_view(const SubgenSketch& sketch, const SubgenParams& p);

// One query against a sketch plus exact tokens.
struct SubgenQueryArgs {
  const float* q = nullptr;  // [head_dim], post-RoPE
  int head_dim = 0;
  float scale = 0;  // logits are <q, k> * scale (the paper's exp(<q,k>) with 1/sqrt(d))
  SubgenSketchView sketch;
  const float* exact_keys = nullptr;    // [n_exact, head_dim] (rows contiguous)
  const float* exact_values = nullptr;  // [n_exact, head_dim]
  const float* exact_bias = nullptr;    // [n_exact] added to the exact logits; nullable (none)
  int n_exact = 0;
  float* out = nullptr;  // [head_dim]
};

// out = (z + sum_exact e^{l_j} v_j) / (tau + sum_exact e^{l_j}) with
//   z   = sum over M's slots of mu / (s |v|^2) * e^{l} v   (slots with |v|^2 = 0 skipped)
//   tau = sum over clusters of n_i / t * sum over its samples of e^{l}
// and every e^{l} taken as exp(l - c), c the largest logit over M, the samples and the exact
// tokens (one shared shift, so the ratio is unchanged). Logits in f32 (fixed-order dot, as
// cpu::attention), exponentials and sums in double. An empty sketch and no exact tokens, or a
// normalizer that underflows to 0, give zeros.
void subgen_query(const SubgenQueryArgs& args);

// ---- budget --------------------------------------------------------------------------------

// Memory in token equivalents (POLICIES.md `subgen`), one token = one key + one value vector:
//   s (M's pairs, counted once the sketch holds a token) + clusters * (t + 1) / 2 (a cluster
//   holds t + 1 key vectors: its representative and its samples) + exact (sinks + recent slots).
// Scalars (mu, the counts n_i) are not counted.
double subgen_memory_tokens(const SubgenSketch& sketch, int s, int t, int exact_tokens);
// Bytes of a sketch: its vectors (M, representatives, samples) and counters (n_i, mu, absorbed);
// 0 while it holds no token.
size_t subgen_sketch_bytes(const SubgenSketch& sketch);
// Clusters that fit: floor(2 * (kv_budget - s - sinks - recent) / (t + 1)), or 0 if none.
int subgen_max_clusters(int kv_budget, int s, int t, int sinks, int recent);

// Clusters the rule of subgen_absorb forms (without a cap) on keys streamed in order with
// threshold delta2; stops counting past `limit` (returns limit + 1 then). keys: [n, ld]. With
// finite keys a key joins as soon as some representative is within delta2 (a distance summed
// only until it passes delta2); otherwise by its nearest, as subgen_absorb finds it. The same
// count either way (subgen_count_clusters_by_nearest, always the nearest: the reference the
// tests hold it to).
int subgen_count_clusters(const float* keys, int n, int ld, int head_dim, double delta2, int limit);
int subgen_count_clusters_by_nearest(const float* keys, int n, int ld, int head_dim, double delta2,
                                     int limit);
// The "some representative within" rule one representative at a time, whatever the active path
// (subgen_count_clusters takes 4 at a time on the AVX2 path: the tests hold both to the nearest
// rule).
int subgen_count_clusters_scalar(const float* keys, int n, int ld, int head_dim, double delta2,
                                 int limit);

// `delta: auto`: the smallest squared radius (to the bisection's resolution) whose clustering of
// `keys` (in order) has at most max_clusters clusters. 0 when the distinct keys already fit;
// otherwise bisection on delta2 over [0, max_j |k_j - k_0|^2] (the upper end gives exactly one
// cluster, so the result always fits) for `iterations` halvings, keeping the feasible end. The
// count is not strictly monotone in delta for a first-come clustering; the result is feasible
// by construction, and near-minimal. keys: [n, ld]; max_clusters >= 1.
double subgen_auto_delta2(const float* keys, int n, int ld, int head_dim, int max_clusters,
                          int iterations = 24);

}  // namespace kvb::kernels::cpu
