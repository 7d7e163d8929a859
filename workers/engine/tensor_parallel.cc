// Sharding of a loaded model for tensor parallelism (weights stay [out, in] row-major: a block of
// output rows is contiguous; a block of input columns is gathered row by row).
#include "workers/engine/tensor_parallel.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "common/error.h"

namespace kvb::engine {

namespace {

// Rows [r0, r0 + rows) of a [*, cols] matrix.
std::vector<float> row_block(const std::vector<float>& w, size_t cols, size_t r0, size_t rows) {
  if (w.empty()) return {};
  return std::vector<float>(w.begin() + r0 * cols, w.begin() + (r0 + rows) * cols);
}

// Columns [c0, c0 + n) of a [rows, cols] matrix.
std::vector<float> col_block(const std::vector<float>& w, size_t rows, size_t cols, size_t c0,
                             size_t n) {
  std::vector<float> out(rows * n);
  for (size_t r = 0; r < rows; ++r) {
    std::copy_n(w.begin() + r * cols + c0, n, out.begin() + r * n);
  }
  return out;
}

}  // namespace

std::vector<int> valid_tp_degrees(int num_heads, int num_kv_heads, int hidden_dim) {
  const int g = std::gcd(std::gcd(num_heads, num_kv_heads), hidden_dim);
  std::vector<int> out;
  for (int d = 1; d <= g; ++d) {
    if (g % d == 0) out.push_back(d);
  }
  return out;
}

std::string tp_degree_error(const std::string& model, int num_heads, int num_kv_heads,
                            int hidden_dim, int degree) {
  if (degree >= 1 && num_heads % degree == 0 && num_kv_heads % degree == 0 &&
      hidden_dim % degree == 0) {
    return "";
  }
  std::ostringstream o;
  o << "model " << model << " cannot be split over " << degree << " GPUs per worker: ";
  if (degree < 1) {
    o << "the degree must be >= 1";
  } else if (num_kv_heads % degree != 0) {
    o << "its " << num_kv_heads << " KV heads do not divide by " << degree
      << " (each GPU holds whole KV heads with their " << num_heads / num_kv_heads
      << " query heads, so that a GQA group never straddles GPUs)";
  } else if (num_heads % degree != 0) {
    o << "its " << num_heads << " attention heads do not divide by " << degree;
  } else {
    o << "its FFN hidden size " << hidden_dim << " does not divide by " << degree;
  }
  o << "; valid --gpus-per-worker values for it: ";
  const std::vector<int> ok = valid_tp_degrees(num_heads, num_kv_heads, hidden_dim);
  for (size_t i = 0; i < ok.size(); ++i) o << (i ? ", " : "") << ok[i];
  return o.str();
}

Model shard_model(const Model& full, int rank, int size) {
  KVB_USAGE_CHECK(!full.native_blocks)
      << "--dtype native runs a model on one rank (tensor-parallel groups: --dtype f32 or bf16)";
  const ModelConfig& c = full.config;
  const std::string err = tp_degree_error(c.name, c.num_heads, c.num_kv_heads, c.hidden_dim, size);
  KVB_USAGE_CHECK(err.empty()) << err;
  KVB_CHECK(rank >= 0 && rank < size)
      << "tensor-parallel rank " << rank << " outside [0, " << size << ")";
  Model m;
  m.config = c;
  m.config.num_heads = c.num_heads / size;
  m.config.num_kv_heads = c.num_kv_heads / size;
  m.config.hidden_dim = c.hidden_dim / size;
  m.path = full.path;
  m.gguf = full.gguf;
  m.token_embedding = full.token_embedding;
  m.final_norm = full.final_norm;
  m.output = full.output;
  const size_t D = c.dim, hd = c.head_dim;
  const size_t QD = static_cast<size_t>(c.num_heads) * hd;
  const size_t H = c.hidden_dim;
  const size_t q0 = rank * m.config.num_heads * hd, qn = m.config.num_heads * hd;
  const size_t kv0 = rank * m.config.num_kv_heads * hd, kvn = m.config.num_kv_heads * hd;
  const size_t h0 = rank * m.config.hidden_dim, hn = m.config.hidden_dim;
  m.layers.resize(full.layers.size());
  for (size_t l = 0; l < full.layers.size(); ++l) {
    const LayerWeights& f = full.layers[l];
    LayerWeights& w = m.layers[l];
    w.attn_norm = f.attn_norm;
    w.ffn_norm = f.ffn_norm;
    w.wq = row_block(f.wq, D, q0, qn);
    w.wk = row_block(f.wk, D, kv0, kvn);
    w.wv = row_block(f.wv, D, kv0, kvn);
    w.bq = row_block(f.bq, 1, q0, qn);
    w.bk = row_block(f.bk, 1, kv0, kvn);
    w.bv = row_block(f.bv, 1, kv0, kvn);
    w.q_norm = f.q_norm;  // per head, the same for every head: every rank's heads use it
    w.k_norm = f.k_norm;
    w.post_attn_norm = f.post_attn_norm;  // after the all-reduce: the full sum is normed
    w.post_ffn_norm = f.post_ffn_norm;
    w.wo = col_block(f.wo, D, QD, q0, qn);
    w.w_gate = row_block(f.w_gate, D, h0, hn);
    w.w_up = row_block(f.w_up, D, h0, hn);
    w.w_down = col_block(f.w_down, D, H, h0, hn);
  }
  return m;
}

}  // namespace kvb::engine
