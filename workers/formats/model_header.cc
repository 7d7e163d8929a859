// Header-only model configuration for GGUF and llama2.c files (workers/formats/model_header.h):
// the checks the loaders rely on, done once here for the loaders and `kvbench validate` alike.
#include "workers/formats/model_header.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace kvb::engine {
namespace {

const char* const kSupportedArchs[] = {"llama", "qwen2", "qwen3", "gemma3", "phi3"};

std::string supported_archs() {
  std::string s;
  for (const char* a : kSupportedArchs) s += (s.empty() ? "" : ", ") + std::string(a);
  return s;
}

std::string dims_str(const std::vector<uint64_t>& dims) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? ", " : "") << dims[i];
  os << "]";
  return os.str();
}

// A tensor the loader reads: present, with the shape load_f32(name, dims) will ask for.
void expect_tensor(const formats::GgufFile& g, const std::string& name,
                   const std::vector<uint64_t>& dims) {
  const formats::GgufTensorInfo* t = g.find_tensor(name);
  KVB_CHECK(t != nullptr) << g.path() << ": no tensor named '" << name << "' (the file has "
                          << g.tensors().size() << " tensors; the loader needs it)";
  KVB_CHECK(t->dims == dims) << g.path() << ": tensor '" << name << "' has shape "
                             << dims_str(t->dims) << " (ggml order), expected " << dims_str(dims);
}

// A float setting that must be finite and positive (NaN or inf would poison every logit).
float positive_finite(const formats::GgufFile& g, const std::string& key, double def) {
  const double v = g.get_float_or(key, def);
  KVB_CHECK(std::isfinite(v) && v > 0 && std::isfinite(static_cast<float>(v)))
      << g.path() << ": metadata " << key << " = " << v
      << " is not a finite positive number; fix the file's metadata (default " << def << ")";
  return static_cast<float>(v);
}

// Gemma 3 as llama.cpp's LLM_ARCH_GEMMA3 and transformers' Gemma3TextModel run it: embeddings
// times sqrt(dim); norms after attention and after the MLP; GeGLU (tanh GELU); every sixth layer
// (l % 6 == 5) global with rope.freq_base, the others sliding over attention.sliding_window
// positions with base 10000 (rope_local_base_freq; the GGUF carries no key for it); the softmax
// scale 1/sqrt(head_dim), except 1/sqrt(dim / heads) for the 62-layer 27B (query_pre_attn_scalar).
// The GGUF's norm weights already hold Gemma's (1 + w).
void read_gemma3_settings(const formats::GgufFile& g, ModelConfig* c) {
  const std::string key = "gemma3.attention.sliding_window";
  const int64_t w = g.get_int(key);
  KVB_CHECK(w > 0 && w <= (1 << 24)) << g.path() << ": metadata " << key << " = " << w
                                     << " is out of range (1.." << (1 << 24) << ")";
  c->embed_scale = std::sqrt(static_cast<float>(c->dim));
  c->post_norms = true;
  c->ffn_act = FfnAct::kGeluTanh;
  c->window.assign(c->num_layers, 0);
  for (int l = 0; l < c->num_layers; ++l) c->window[l] = l % 6 < 5 ? static_cast<int>(w) : 0;
  c->rope_local = c->rope;
  c->rope_local.theta = 10000.0f;
  c->rope_local.linear_scale = 1.0f;
  c->rope_local.freq_factors.clear();
  c->rope_local.attn_factor = 1.0f;
  if (c->num_layers == 62) {
    c->attn_scale = 1.0f / std::sqrt(static_cast<float>(c->dim / c->num_heads));
  }
}

// An optional integer setting in [lo, hi]; `def` when the key is absent.
int64_t int_in_range(const formats::GgufFile& g, const std::string& key, int64_t def, int64_t lo,
                     int64_t hi) {
  const int64_t v = g.get_int_or(key, def);
  KVB_CHECK(v >= lo && v <= hi) << g.path() << ": metadata " << key << " = " << v
                                << " is out of range (" << lo << ".." << hi << ")";
  return v;
}

// RoPE scaling: rope.scaling.type none, linear, yarn or longrope ("su"), and the attention factor
// on cos/sin. rope.scaling.attn_factor, when present, multiplies it as llama.cpp does (a LongRoPE
// GGUF from convert_hf_to_gguf holds the whole factor there). LongRoPE (Phi-3) takes its divisors
// from rope_factors_long.weight or rope_factors_short.weight: like llama.cpp, the long set when
// the context in use exceeds rope.scaling.original_context_length, fixed for the run; kvbench's
// context in use is the model's context_length, so a long-context GGUF runs with the long set at
// every length (transformers switches per call by the current length). Without the key, the
// factor is sqrt(1 + ln(context / original) / ln(original)) (transformers' default). YaRN's factor
// is rope.scaling.factor, as llama.cpp reads it (transformers 4.53 instead takes
// max_position_embeddings / original_max_position_embeddings when the latter is given; a
// config.json can make the two disagree, a GGUF carries only the factor).
void read_rope_scaling(const formats::GgufFile& g, const std::string& p, ModelConfig* c) {
  const std::string& path = g.path();
  const bool has_long = g.find_tensor("rope_factors_long.weight") != nullptr;
  const bool has_short = g.find_tensor("rope_factors_short.weight") != nullptr;
  const bool has_freqs = g.find_tensor("rope_freqs.weight") != nullptr;
  const uint64_t half = static_cast<uint64_t>(c->rope.rot_dim / 2);
  std::string scaling = g.get_string_or(p + "rope.scaling.type", "none");
  if (scaling == "su") scaling = "longrope";  // the name Phi-3's first configs used
  if (scaling == "none" && (has_long || has_short)) scaling = "longrope";
  KVB_USAGE_CHECK(scaling == "none" || scaling == "linear" || scaling == "yarn" ||
                  scaling == "longrope")
      << path << ": " << p << "rope.scaling.type '" << scaling
      << "' is not supported (supported: none, linear, yarn, longrope)";
  KVB_CHECK(!(has_long || has_short) || scaling == "longrope")
      << path << ": rope_factors_long/short.weight present but " << p << "rope.scaling.type is '"
      << scaling << "'; LongRoPE factors need type longrope (or no type)";
  KVB_CHECK(!has_freqs || (scaling != "yarn" && scaling != "longrope"))
      << path << ": rope_freqs.weight together with " << scaling
      << " scaling; a file gives one set of frequency factors";
  if (has_freqs) expect_tensor(g, "rope_freqs.weight", {half});
  c->rope_scaling = scaling;
  const bool has_attn = g.has(p + "rope.scaling.attn_factor");
  if (has_attn) c->rope.attn_factor = positive_finite(g, p + "rope.scaling.attn_factor", 1.0);
  if (scaling == "linear" || scaling == "yarn") {
    KVB_CHECK(g.has(p + "rope.scaling.factor"))
        << path << ": " << p << "rope.scaling.type is " << scaling << " but " << p
        << "rope.scaling.factor is missing";
  }
  if (scaling == "linear") {
    c->rope.linear_scale = positive_finite(g, p + "rope.scaling.factor", 1.0);
  } else if (scaling == "yarn") {
    const float factor = positive_finite(g, p + "rope.scaling.factor", 1.0);
    KVB_CHECK(c->rope.theta > 1.0f)  // the correction range divides by ln(theta)
        << path << ": " << p << "rope.freq_base = " << c->rope.theta
        << " with yarn scaling; expected a base above 1";
    KVB_CHECK(factor >= 1.0f && factor <= 1024.0f)
        << path << ": " << p << "rope.scaling.factor = " << factor
        << " is out of range for yarn (1..1024)";
    // Keys whose meaning moved between llama.cpp versions (or that no Qwen2.5 GGUF carries):
    // refused rather than guessed.
    KVB_USAGE_CHECK(g.get_float_or(p + "rope.scaling.yarn_log_multiplier", 0.0) == 0.0)
        << path << ": " << p << "rope.scaling.yarn_log_multiplier (DeepSeek's mscale_all_dim) is "
        << "not supported";
    KVB_USAGE_CHECK(g.get_float_or(p + "rope.scaling.yarn_ext_factor", 1.0) == 1.0)
        << path << ": " << p << "rope.scaling.yarn_ext_factor other than 1 is not supported";
    KVB_USAGE_CHECK(!g.has(p + "rope.scaling.yarn_attn_factor"))
        << path << ": " << p << "rope.scaling.yarn_attn_factor is not supported (kvbench derives "
        << "the attention factor 0.1 ln(factor) + 1 and multiplies rope.scaling.attn_factor)";
    const int orig = static_cast<int>(
        int_in_range(g, p + "rope.scaling.original_context_length", c->max_seq_len, 1, 1 << 24));
    const double beta_fast = positive_finite(g, p + "rope.scaling.yarn_beta_fast", 32.0);
    const double beta_slow = positive_finite(g, p + "rope.scaling.yarn_beta_slow", 1.0);
    c->rope_original_context = orig;
    c->rope.freq_factors = yarn_freq_factors(c->rope, factor, orig, beta_fast, beta_slow);
    // transformers' get_mscale: 0.1 ln(factor) + 1 (llama.cpp: the same times attn_factor).
    c->rope.attn_factor *= yarn_attn_factor(factor);
  } else if (scaling == "longrope") {
    const char* present = has_long ? "only the long" : has_short ? "only the short" : "neither";
    KVB_CHECK(has_long && has_short)
        << path << ": LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight "
        << "(the file has " << present << ")";
    expect_tensor(g, "rope_factors_long.weight", {half});
    expect_tensor(g, "rope_factors_short.weight", {half});
    const int orig = static_cast<int>(int_in_range(g, p + "rope.scaling.original_context_length",
                                                   c->max_seq_len, 2, c->max_seq_len));
    c->rope_original_context = orig;
    c->rope_factor_set = c->max_seq_len > orig ? "long" : "short";
    if (!has_attn) c->rope.attn_factor = longrope_attn_factor(c->max_seq_len, orig);
  }
}

// One sliding window for every layer (Mistral: llama.attention.sliding_window; Phi-3:
// phi3.attention.sliding_window): absent or 0 means none. A window that covers the whole context
// can never bind, so it counts as none (the layers stay global and policies act on them).
// transformers applies Phi-3's window (Phi-3-mini-4k: 2047 of 4096); llama.cpp ignores it since its
// PR 13676 ("Phi SWA is currently disabled"). kvbench follows transformers, the golden reference,
// so past 2047 tokens a Phi-3-mini-4k run differs from llama.cpp's, and only full runs on it.
void read_sliding_window(const formats::GgufFile& g, const std::string& p, ModelConfig* c) {
  const std::string key = p + "attention.sliding_window";
  const int64_t w = int_in_range(g, key, 0, 0, 1 << 24);
  if (w == 0) return;
  KVB_USAGE_CHECK(c->arch == "llama" || c->arch == "phi3")
      << g.path() << ": metadata " << key << " = " << w << ": a sliding window is supported for "
      << "llama (Mistral) and phi3 only; the " << c->arch << " layout of window layers is not";
  if (w >= c->max_seq_len) return;
  c->window.assign(c->num_layers, static_cast<int>(w));
  c->rope_local = kernels::cpu::RopeParams{};  // rot_dim 0: sliding layers rotate with `rope`
  c->rope_local.rot_dim = 0;
}

}  // namespace

// YaRN (model_header.h) as transformers' _compute_yarn_parameters and ggml's rope_yarn compute
// it: dimension i keeps its own frequency (extrapolation) below the correction range
// [low, high] = [floor(d(beta_fast)), ceil(d(beta_slow))], takes frequency / factor
// (interpolation) above it, and a linear blend inside, where d(r) = rot_dim * ln(orig / (2 pi r))
// / (2 ln theta). Expressed as per-dimension divisors of the unscaled frequencies, so that the
// rope kernels need nothing new.
std::vector<float> yarn_freq_factors(const kernels::cpu::RopeParams& r, float factor, int orig,
                                     double beta_fast, double beta_slow) {
  const int dim = r.rot_dim, half = dim / 2;
  auto corr_dim = [&](double rotations) {
    return dim * std::log(orig / (rotations * 2 * M_PI)) / (2 * std::log(r.theta));
  };
  const double low = std::max(std::floor(corr_dim(beta_fast)), 0.0);
  double high = std::min(std::ceil(corr_dim(beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers: "prevent singularity"
  std::vector<float> f(half);
  for (int i = 0; i < half; ++i) {
    // The unscaled frequency exactly as cpu::rope computes it; the blend in f32 as transformers.
    const float base =
        1.0f / std::pow(r.theta, static_cast<float>(2 * i) / static_cast<float>(dim));
    const float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation = 1.0f - ramp;
    const float blended = base / factor * (1.0f - extrapolation) + base * extrapolation;
    f[i] = base / blended;
  }
  return f;
}

float yarn_attn_factor(float factor) {
  return factor <= 1.0f ? 1.0f : 0.1f * std::log(factor) + 1.0f;  // transformers' get_mscale
}

float longrope_attn_factor(int context, int original) {
  if (context <= original) return 1.0f;
  const double ratio = static_cast<double>(context) / original;
  return static_cast<float>(std::sqrt(1 + std::log(ratio) / std::log(original)));
}

ModelConfig read_gguf_config(const formats::GgufFile& g) {
  const std::string& path = g.path();
  ModelConfig c;
  const std::string arch = g.get_string("general.architecture");
  bool supported = false;
  for (const char* a : kSupportedArchs) supported |= arch == a;
  KVB_USAGE_CHECK(supported) << path << ": unsupported architecture '" << arch
                             << "' (key general.architecture); supported: " << supported_archs();
  c.arch = arch;
  c.format = "gguf";
  c.name = g.get_string_or("general.name", path.substr(path.find_last_of('/') + 1));
  const std::string p = arch + ".";
  // Sizes read as int64 and range-checked before narrowing: a u32 above INT_MAX must not wrap.
  auto sized = [&](const std::string& key, int64_t v, int64_t hi) {
    KVB_CHECK(v > 0 && v <= hi) << path << ": metadata " << key << " = " << v
                                << " is out of range (1.." << hi << ")";
    return static_cast<int>(v);
  };
  c.dim = sized(p + "embedding_length", g.get_int(p + "embedding_length"), 1 << 16);
  c.hidden_dim = sized(p + "feed_forward_length", g.get_int(p + "feed_forward_length"), 1 << 20);
  c.num_layers = sized(p + "block_count", g.get_int(p + "block_count"), 1024);
  c.num_heads = sized(p + "attention.head_count", g.get_int(p + "attention.head_count"), 1024);
  c.num_kv_heads = sized(p + "attention.head_count_kv",
                         g.get_int_or(p + "attention.head_count_kv", c.num_heads), c.num_heads);
  // No default: prompts, budgets and truncation are all bounded by it, and a guess (llama.cpp's
  // reader has none either) would run a long-context model short or a short one past its training.
  KVB_CHECK(g.has(p + "context_length"))
      << path << ": metadata " << p << "context_length is missing; kvbench bounds prompts and "
      << "budgets by the model's context, so the file must say it (convert_hf_to_gguf.py writes it "
      << "from max_position_embeddings)";
  c.max_seq_len = sized(p + "context_length", g.get_int(p + "context_length"), 1 << 24);
  c.norm_eps = positive_finite(g, p + "attention.layer_norm_rms_epsilon", 1e-5);
  KVB_CHECK(c.num_heads % c.num_kv_heads == 0)
      << path << ": head_count " << c.num_heads << " is not a multiple of head_count_kv "
      << c.num_kv_heads;
  const int64_t head_dim = g.get_int_or(p + "attention.key_length", c.dim / c.num_heads);
  KVB_CHECK(head_dim > 0 && head_dim <= 1024 && head_dim % 2 == 0)
      << path << ": head dimension " << head_dim << " unsupported (key " << p
      << "attention.key_length or embedding_length / head_count; expected even, 2..1024)";
  c.head_dim = static_cast<int>(head_dim);
  c.qkv_bias = arch == "qwen2";
  c.qk_norm = arch == "qwen3" || arch == "gemma3";  // per-head RMSNorm of q and k before RoPE
  c.fused_qkv = c.fused_gate_up = arch == "phi3";
  c.rope.style = arch == "llama" ? kernels::cpu::RopeStyle::kNorm : kernels::cpu::RopeStyle::kNeox;
  c.rope.theta = positive_finite(g, p + "rope.freq_base", 10000.0);
  const int64_t rot_dim = g.get_int_or(p + "rope.dimension_count", c.head_dim);
  KVB_CHECK(rot_dim > 0 && rot_dim <= c.head_dim && rot_dim % 2 == 0)
      << path << ": " << p << "rope.dimension_count = " << rot_dim << " (head_dim " << c.head_dim
      << "; expected even, 2..head_dim)";
  c.rope.rot_dim = static_cast<int>(rot_dim);
  read_rope_scaling(g, p, &c);
  if (arch == "gemma3") {
    read_gemma3_settings(g, &c);
  } else {
    read_sliding_window(g, p, &c);
  }

  const formats::GgufTensorInfo* emb = g.find_tensor("token_embd.weight");
  KVB_CHECK(emb && emb->dims.size() == 2)
      << path << ": tensor token_embd.weight missing or not 2-D";
  KVB_CHECK(emb->dims[1] <= (1u << 22))
      << path << ": token_embd.weight has " << emb->dims[1] << " rows, expected a vocabulary of "
      << "at most " << (1u << 22);
  c.vocab_size = static_cast<int>(emb->dims[1]);
  const uint64_t D = c.dim, H = c.hidden_dim, V = c.vocab_size;
  const uint64_t QD = static_cast<uint64_t>(c.num_heads) * c.head_dim;
  const uint64_t KVD = static_cast<uint64_t>(c.num_kv_heads) * c.head_dim;
  expect_tensor(g, "token_embd.weight", {D, V});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    expect_tensor(g, b + "attn_norm.weight", {D});
    if (c.fused_qkv) {
      expect_tensor(g, b + "attn_qkv.weight", {D, QD + 2 * KVD});  // Q rows, then K, then V
    } else {
      expect_tensor(g, b + "attn_q.weight", {D, QD});
      expect_tensor(g, b + "attn_k.weight", {D, KVD});
      expect_tensor(g, b + "attn_v.weight", {D, KVD});
    }
    if (c.qkv_bias) {
      expect_tensor(g, b + "attn_q.bias", {QD});
      expect_tensor(g, b + "attn_k.bias", {KVD});
      expect_tensor(g, b + "attn_v.bias", {KVD});
    }
    if (c.qk_norm) {
      const uint64_t hd = c.head_dim;
      expect_tensor(g, b + "attn_q_norm.weight", {hd});
      expect_tensor(g, b + "attn_k_norm.weight", {hd});
    }
    expect_tensor(g, b + "attn_output.weight", {QD, D});
    expect_tensor(g, b + "ffn_norm.weight", {D});
    if (c.fused_gate_up) {
      expect_tensor(g, b + "ffn_up.weight", {D, 2 * H});  // gate rows, then up
    } else {
      expect_tensor(g, b + "ffn_gate.weight", {D, H});
      expect_tensor(g, b + "ffn_up.weight", {D, H});
    }
    expect_tensor(g, b + "ffn_down.weight", {H, D});
    if (c.post_norms) {
      expect_tensor(g, b + "post_attention_norm.weight", {D});
      expect_tensor(g, b + "post_ffw_norm.weight", {D});
    }
  }
  expect_tensor(g, "output_norm.weight", {D});
  // A block past block_count would be left unread: the model would run with fewer layers than its
  // weights hold and still produce text (a file with block_count lowered by hand, or cut short).
  for (const formats::GgufTensorInfo& t : g.tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    const size_t dot = t.name.find('.', 4);
    const std::string num = t.name.substr(4, dot == std::string::npos ? dot : dot - 4);
    const bool digits =
        !num.empty() && num.size() <= 9 &&
        std::all_of(num.begin(), num.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    KVB_CHECK(digits && std::stoll(num) < c.num_layers)
        << path << ": tensor " << formats::quoted_name(t.name)
        << " belongs to no layer of metadata " << p << "block_count = " << c.num_layers
        << " (layers blk.0 to blk." << c.num_layers - 1
        << "); the file holds more layers than block_count says: fix block_count";
  }
  c.tied_embeddings = g.find_tensor("output.weight") == nullptr;
  if (!c.tied_embeddings) expect_tensor(g, "output.weight", {D, V});
  return c;
}

Llama2cHeader read_llama2c_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KVB_USAGE_CHECK(in.good()) << "cannot open model file '" << path << "': " << std::strerror(errno);
  in.seekg(0, std::ios::end);
  Llama2cHeader h;
  h.file_bytes = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  int32_t hdr[7];
  KVB_CHECK(h.file_bytes >= sizeof(hdr))
      << path << ": truncated llama2.c checkpoint: the header needs " << sizeof(hdr)
      << " bytes but the file has " << h.file_bytes << " bytes";
  in.read(reinterpret_cast<char*>(hdr), sizeof(hdr));
  KVB_CHECK(in.good()) << path << ": read error in the llama2.c header";
  ModelConfig& c = h.config;
  c.arch = "llama";
  c.format = "llama2c";
  c.dim = hdr[0];
  c.hidden_dim = hdr[1];
  c.num_layers = hdr[2];
  c.num_heads = hdr[3];
  c.num_kv_heads = hdr[4];
  c.tied_embeddings = hdr[5] > 0;
  const int64_t vocab = hdr[5] > 0 ? hdr[5] : -static_cast<int64_t>(hdr[5]);
  c.max_seq_len = hdr[6];
  auto in_range = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  KVB_CHECK(in_range(c.dim, 1, 65536) && in_range(c.hidden_dim, 1, 1 << 20) &&
            in_range(c.num_layers, 1, 1024) && in_range(c.num_heads, 1, 1024) &&
            in_range(c.num_kv_heads, 1, c.num_heads) && in_range(vocab, 1, 1 << 22) &&
            in_range(c.max_seq_len, 1, 1 << 24))
      << path << ": not a llama2.c checkpoint (header dim=" << c.dim
      << " hidden_dim=" << c.hidden_dim << " n_layers=" << c.num_layers
      << " n_heads=" << c.num_heads << " n_kv_heads=" << c.num_kv_heads << " vocab_size=" << hdr[5]
      << " seq_len=" << c.max_seq_len << " out of range)";
  KVB_CHECK(c.dim % c.num_heads == 0 && c.num_heads % c.num_kv_heads == 0)
      << path << ": dim " << c.dim << " / n_heads " << c.num_heads << " / n_kv_heads "
      << c.num_kv_heads << " do not divide";
  c.vocab_size = static_cast<int>(vocab);
  c.head_dim = c.dim / c.num_heads;
  KVB_CHECK(c.head_dim % 2 == 0) << path << ": head dimension " << c.head_dim
                                 << " (dim / n_heads) is odd; rope needs pairs";
  c.name = path.substr(path.find_last_of('/') + 1);
  c.norm_eps = 1e-5f;
  c.rope.style = kernels::cpu::RopeStyle::kNorm;
  c.rope.rot_dim = c.head_dim;
  c.rope.theta = 10000.0f;

  const uint64_t D = c.dim, H = c.hidden_dim, L = c.num_layers, V = c.vocab_size;
  const uint64_t KVD = static_cast<uint64_t>(c.num_kv_heads) * c.head_dim;
  const uint64_t S = c.max_seq_len, HD = c.head_dim;
  // The tensors of the legacy export, in file order (see load_llama2c).
  const uint64_t body =
      V * D + L * D + L * D * D + 2 * L * KVD * D + L * D * D + L * D + 3 * L * H * D + D;
  const uint64_t classifier = c.tied_embeddings ? 0 : V * D;
  h.num_params = body + classifier;
  const uint64_t expected = sizeof(hdr) + 4 * h.num_params;
  const uint64_t freq_tables = 4 * S * HD;  // two tables of S * HD/2 floats (legacy, unused)
  KVB_CHECK(h.file_bytes == expected || h.file_bytes == expected + freq_tables)
      << path << ": file size " << h.file_bytes << " does not match the header (expected "
      << expected << " or " << expected + freq_tables << " bytes)";
  h.freq_tables = h.file_bytes == expected + freq_tables;
  return h;
}

}  // namespace kvb::engine
