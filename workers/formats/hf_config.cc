// config.json / tokenizer_config.json of a Hugging Face checkpoint folder (hf_config.h). Keys and
// defaults follow transformers 4.53's LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config and
// Gemma3TextConfig; rope_scaling "llama3" follows modeling_rope_utils._compute_llama3_parameters.
#include "workers/formats/hf_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "workers/formats/model_header.h"

namespace kvb::engine {
namespace {

using json = nlohmann::json;
constexpr uint64_t kMaxJsonBytes = 16ull << 20;

json read_json_file(const std::string& path) {
  std::error_code ec;
  KVB_USAGE_CHECK(std::filesystem::is_regular_file(path, ec))
      << path << ": missing (a Hugging Face checkpoint folder needs it)";
  const uint64_t bytes = std::filesystem::file_size(path, ec);
  KVB_CHECK(!ec && bytes <= kMaxJsonBytes) << path << ": " << bytes << " bytes; more than "
                                           << kMaxJsonBytes << " is not a plausible config";
  std::ifstream in(path);
  KVB_CHECK(in.good()) << "cannot open " << path;
  json root;
  try {
    root = json::parse(in);
  } catch (const json::exception& e) {
    KVB_FAIL() << path << ": not valid JSON: " << e.what();
  }
  KVB_CHECK(root.is_object()) << path << ": the top level must be a JSON object";
  return root;
}

// Keys whose null transformers reads as "none" or as the very default kvbench takes when the key
// is absent (transformers writes "rope_scaling": null, "sliding_window": null, "head_dim": null).
// A null anywhere else is refused: transformers keeps None there (and fails, or reads it as False
// where kvbench's default is true), so filling in a default would run a model it does not.
bool null_means_default(const std::string& k, const std::string& arch) {
  for (const char* n :
       {"architectures", "rope_scaling", "sliding_window", "layer_types", "attn_logit_softcapping",
        "final_logit_softcapping", "use_sliding_window", "attention_bias", "mlp_bias"}) {
    if (k == n) return true;
  }
  // None: hidden_size / num_attention_heads, and as many KV heads as heads (LlamaConfig,
  // MistralConfig, Qwen2Config, Phi3Config). Qwen3's head_dim default is 128 but its None means
  // hidden_size / heads; Gemma3TextConfig keeps None: both refused.
  if (k == "head_dim") return arch == "llama" || arch == "qwen2" || arch == "phi3";
  if (k == "num_key_value_heads") return arch != "gemma3" && !arch.empty();
  return false;
}

// Typed, range-checked access to config.json; null counts as absent only where
// null_means_default says so, and is an error naming the key elsewhere.
struct Config {
  std::string path;
  json root;
  std::string arch;  // kvbench's arch once known ("" while the family is being read)
  bool has(const std::string& k) const {
    const auto it = root.find(k);
    if (it == root.end()) return false;
    if (!it->is_null()) return true;
    KVB_CHECK(null_means_default(k, arch))
        << path << ": key '" << k << "' is null, which transformers does not read as the "
        << "default: give the value (or, where the key has a default, leave it out)";
    return false;
  }
  int64_t integer(const std::string& k, int64_t lo, int64_t hi, const int64_t* def) const {
    if (!has(k)) {
      KVB_CHECK(def != nullptr) << path << ": key '" << k << "' is missing (expected an integer "
                                << lo << ".." << hi << ")";
      return *def;
    }
    const json& v = root[k];
    KVB_CHECK(v.is_number_integer())
        << path << ": key '" << k << "' is " << v.dump() << ", expected an integer";
    const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)
                          ? INT64_MAX
                          : v.get<int64_t>();
    KVB_CHECK(x >= lo && x <= hi) << path << ": key '" << k << "' = " << x << " is out of range ("
                                  << lo << ".." << hi << ")";
    return x;
  }
  int need_int(const std::string& k, int64_t hi) const {
    return static_cast<int>(integer(k, 1, hi, nullptr));
  }
  int opt_int(const std::string& k, int64_t hi, int64_t def) const {
    return static_cast<int>(integer(k, 1, hi, &def));
  }
  static float positive(const std::string& where, const json& v) {
    KVB_CHECK(v.is_number()) << where << " is " << v.dump() << ", expected a number";
    const double x = v.get<double>();
    KVB_CHECK(std::isfinite(x) && x > 0 && std::isfinite(static_cast<float>(x)))
        << where << " = " << x << " is not a finite positive number";
    return static_cast<float>(x);
  }
  float opt_positive(const std::string& k, double def) const {
    return has(k) ? positive(path + ": key '" + k + "'", root[k]) : static_cast<float>(def);
  }
  bool opt_bool(const std::string& k, bool def) const {
    if (!has(k)) return def;
    KVB_CHECK(root[k].is_boolean())
        << path << ": key '" << k << "' is " << root[k].dump() << ", expected true or false";
    return root[k].get<bool>();
  }
  std::string opt_string(const std::string& k, const std::string& def) const {
    if (!has(k)) return def;
    KVB_CHECK(root[k].is_string())
        << path << ": key '" << k << "' is " << root[k].dump() << ", expected a string";
    return root[k].get<std::string>();
  }
};

// transformers class -> kvbench arch (the GGUF architecture names).
struct Family {
  const char* hf_class;
  const char* model_type;
  const char* arch;
};
constexpr Family kFamilies[] = {
    {"LlamaForCausalLM", "llama", "llama"},         {"MistralForCausalLM", "mistral", "llama"},
    {"Qwen2ForCausalLM", "qwen2", "qwen2"},         {"Qwen3ForCausalLM", "qwen3", "qwen3"},
    {"Gemma3ForCausalLM", "gemma3_text", "gemma3"}, {"Phi3ForCausalLM", "phi3", "phi3"}};

std::string supported_classes() {
  std::string s;
  for (const Family& f : kFamilies) s += (s.empty() ? "" : ", ") + std::string(f.hf_class);
  return s;
}

// A list of `n` finite positive numbers at rope_scaling.<k> (LongRoPE's factor sets).
std::vector<float> factor_list(const json& rs, const std::string& key, const char* k, size_t n) {
  KVB_CHECK(rs.contains(k) && rs[k].is_array() && rs[k].size() == n)
      << key << "." << k << "' must be a list of " << n << " numbers (rotary dimensions / 2)";
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) {
    f[i] = Config::positive(key + "." + k + "[" + std::to_string(i) + "]'", rs[k][i]);
  }
  return f;
}

// rope_scaling: null / "default", "linear" (positions / factor), "llama3" (per-frequency
// divisors, computed as transformers does from the f32 inverse frequencies), "yarn" (not for
// Phi-3, whose config reads "yarn" and "su" as "longrope"; not for Gemma 3) and "longrope"
// (Phi-3 only). YaRN and LongRoPE go through the GGUF reader's code (model_header.h), with
// transformers 4.53's choices where they differ from a GGUF's keys: YaRN's factor must equal
// max_position_embeddings / rope_scaling.original_max_position_embeddings when the latter is
// given (transformers uses that ratio, llama.cpp the factor: a folder where they differ is
// refused); an explicit rope_scaling.attention_factor replaces the derived one; LongRoPE's original
// context is the top-level original_max_position_embeddings (default 4096, Phi3Config), and its set
// is chosen once for the run by max_position_embeddings, as the GGUF path does (transformers picks
// per call by the sequence length: the two agree once a sequence exceeds the original context, or
// when the context does not).
void read_rope_scaling(const Config& cfg, ModelConfig* c) {
  kernels::cpu::RopeParams* rope = &c->rope;
  if (!cfg.has("rope_scaling")) return;
  const json& rs = cfg.root["rope_scaling"];
  const std::string key = cfg.path + ": key 'rope_scaling";
  KVB_CHECK(rs.is_object()) << key << "' must be an object or null";
  const char* type_key = rs.contains("rope_type") ? "rope_type" : "type";
  KVB_CHECK(rs.contains(type_key) && rs[type_key].is_string())
      << key << ".rope_type' is missing or not a string";
  std::string type = rs[type_key];
  const bool phi3 = c->arch == "phi3";
  if (phi3 && (type == "su" || type == "yarn")) type = "longrope";  // Phi3Config's renaming
  auto num = [&](const char* k) {
    KVB_CHECK(rs.contains(k)) << key << "." << k << "' is missing (rope_type " << type << ")";
    return Config::positive(key + "." + k + "'", rs[k]);
  };
  auto opt_num = [&](const char* k, double def) {
    return rs.contains(k) && !rs[k].is_null() ? Config::positive(key + "." + k + "'", rs[k])
                                              : static_cast<float>(def);
  };
  const bool yarn_ok = !phi3 && c->arch != "gemma3";
  KVB_USAGE_CHECK(type == "default" || type == "linear" || type == "llama3" ||
                  (type == "yarn" && yarn_ok) || (type == "longrope" && phi3))
      << key << "." << type_key << "' is '" << type << "', which kvbench does not support for "
      << cfg.root.value("architectures", json::array({c->arch})).dump()
      << " (supported: default, linear, llama3; yarn for Llama, Mistral, Qwen2, Qwen3; longrope "
      << "for Phi3ForCausalLM)";
  if (type == "default") return;
  if (type == "yarn" || type == "longrope") c->rope_scaling = type;
  if (type == "linear") {
    rope->linear_scale = num("factor");
    return;
  }
  if (type == "yarn") {
    for (const char* k : {"mscale", "mscale_all_dim", "truncate"}) {
      KVB_USAGE_CHECK(!rs.contains(k) || rs[k].is_null())
          << key << "." << k << "' is set; kvbench supports YaRN without it (DeepSeek's variant)";
    }
    float factor = num("factor");
    int orig = c->max_seq_len;
    if (rs.contains("original_max_position_embeddings")) {
      const json& o = rs["original_max_position_embeddings"];
      KVB_CHECK(o.is_number_integer() && o.get<int64_t>() >= 1 && o.get<int64_t>() <= (1 << 24))
          << key << ".original_max_position_embeddings' is " << o.dump()
          << ", expected an integer 1.." << (1 << 24);
      orig = o.get<int>();
      // transformers 4.53 then takes max_position_embeddings / original as the factor, llama.cpp
      // rope_scaling.factor: refused where the two readings would run different models.
      const float implied = static_cast<float>(static_cast<double>(c->max_seq_len) / orig);
      KVB_USAGE_CHECK(std::fabs(implied - factor) <= 1e-6f * factor)
          << key << ".factor' is " << factor << " but max_position_embeddings / "
          << "rope_scaling.original_max_position_embeddings = " << c->max_seq_len << " / " << orig
          << " = " << implied << " (transformers 4.53 uses the latter, llama.cpp the former); set "
          << "max_position_embeddings to factor x original (" << factor * orig
          << ") so that they agree";
    }
    KVB_CHECK(factor >= 1.0f && factor <= 1024.0f)
        << key << "' gives a yarn factor of " << factor << " (max_position_embeddings "
        << c->max_seq_len << " / original " << orig << ", or .factor); expected 1..1024";
    KVB_CHECK(rope->theta > 1.0f) << cfg.path << ": key 'rope_theta' = " << rope->theta
                                  << " with yarn scaling; expected a base above 1";
    c->rope_original_context = orig;
    rope->freq_factors = yarn_freq_factors(*rope, factor, orig, opt_num("beta_fast", 32.0),
                                           opt_num("beta_slow", 1.0));
    rope->attn_factor = rs.contains("attention_factor") && !rs["attention_factor"].is_null()
                            ? num("attention_factor")
                            : yarn_attn_factor(factor);
    return;
  }
  if (type == "longrope") {
    const size_t half = static_cast<size_t>(rope->rot_dim / 2);
    const std::vector<float> long_f = factor_list(rs, key, "long_factor", half);
    const std::vector<float> short_f = factor_list(rs, key, "short_factor", half);
    const int orig = cfg.opt_int("original_max_position_embeddings", 1 << 24, 4096);
    c->rope_original_context = orig;
    c->rope_factor_set = c->max_seq_len > orig ? "long" : "short";
    rope->freq_factors = c->max_seq_len > orig ? long_f : short_f;
    rope->attn_factor = rs.contains("attention_factor") && !rs["attention_factor"].is_null()
                            ? num("attention_factor")
                            : longrope_attn_factor(c->max_seq_len, orig);
    return;
  }
  const double factor = num("factor"), low = num("low_freq_factor"), high = num("high_freq_factor");
  const double old_ctx = num("original_max_position_embeddings");
  KVB_CHECK(high > low) << key << ".high_freq_factor' (" << high
                        << ") must exceed low_freq_factor (" << low << ")";
  const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  const int half = rope->rot_dim / 2;
  rope->freq_factors.assign(half, 1.0f);
  for (int i = 0; i < half; ++i) {
    const float inv_freq =  // as torch: 1 / base ** (2i / dim) in f32
        1.0f / std::pow(rope->theta, static_cast<float>(2 * i) / static_cast<float>(rope->rot_dim));
    const double wavelen = 2 * M_PI / inv_freq;
    double scaled = inv_freq;
    if (wavelen > low_wavelen) {
      scaled = inv_freq / factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq;
    }
    rope->freq_factors[i] = static_cast<float>(inv_freq / scaled);
  }
}

// layer_types (transformers >= 4.53 writes it for every family that has it): one entry per layer,
// each "sliding_attention" or "full_attention". Gemma 3 reads its windows from it (read_gemma3);
// the other families only have it checked.
// Qwen2/Qwen3 mark sliding layers only with use_sliding_window, which kvbench refuses, so a sliding
// entry there describes a model kvbench would run differently.
void check_layer_types(const Config& cfg, const ModelConfig& c) {
  if (!cfg.has("layer_types")) return;
  const json& lt = cfg.root["layer_types"];
  KVB_CHECK(lt.is_array() && lt.size() == static_cast<size_t>(c.num_layers))
      << cfg.path << ": key 'layer_types' must list one entry per layer (" << c.num_layers
      << "); it is " << (lt.is_array() ? "a list of " + std::to_string(lt.size()) : "not a list");
  for (int l = 0; l < c.num_layers; ++l) {
    KVB_CHECK(lt[l] == "sliding_attention" || lt[l] == "full_attention")
        << cfg.path << ": key 'layer_types[" << l << "]' is " << lt[l].dump()
        << ", expected \"sliding_attention\" or \"full_attention\"";
    KVB_USAGE_CHECK(lt[l] == "full_attention" || (c.arch != "qwen2" && c.arch != "qwen3"))
        << cfg.path << ": key 'layer_types[" << l << "]' is \"sliding_attention\"; kvbench does "
        << "not run Qwen's sliding layers (use_sliding_window)";
  }
}

// Gemma 3 text: sliding layers from layer_types (or every sliding_window_pattern-th layer
// global), their own RoPE base, softmax scale from query_pre_attn_scalar.
void read_gemma3(const Config& cfg, ModelConfig* c) {
  const int window = cfg.opt_int("sliding_window", 1 << 24, 4096);
  c->window.assign(c->num_layers, 0);
  if (cfg.has("layer_types")) {
    check_layer_types(cfg, *c);
    const json& lt = cfg.root["layer_types"];
    for (int l = 0; l < c->num_layers; ++l) {
      c->window[l] = lt[l] == "sliding_attention" ? window : 0;
    }
  } else {
    const std::string k =
        cfg.has("sliding_window_pattern") ? "sliding_window_pattern" : "_sliding_window_pattern";
    const int pattern = cfg.opt_int(k, 1024, 6);
    for (int l = 0; l < c->num_layers; ++l) c->window[l] = (l + 1) % pattern ? window : 0;
  }
  c->rope_local = c->rope;
  c->rope_local.theta = cfg.opt_positive("rope_local_base_freq", 10000.0);
  c->rope_local.linear_scale = 1.0f;
  c->rope_local.freq_factors.clear();
  c->attn_scale = 1.0f / std::sqrt(cfg.opt_positive("query_pre_attn_scalar", 256.0));
  c->embed_scale = std::sqrt(static_cast<float>(c->dim));
  c->post_norms = true;
  c->ffn_act = FfnAct::kGeluTanh;
  for (const char* k : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    KVB_USAGE_CHECK(!cfg.has(k)) << cfg.path << ": key '" << k
                                 << "' is set; kvbench runs Gemma 3 without soft-capping (null)";
  }
}

}  // namespace

bool hf_norms_add_one(const ModelConfig& c) { return c.arch == "gemma3"; }

std::vector<HfTensorSpec> hf_layer_tensors(const ModelConfig& c, int layer) {
  const uint64_t D = c.dim, H = c.hidden_dim, hd = c.head_dim;
  const uint64_t QD = c.num_heads * hd, KVD = c.num_kv_heads * hd;
  const bool g = hf_norms_add_one(c);
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  using L = LayerWeights;
  std::vector<HfTensorSpec> t = {{p + "input_layernorm.weight", {D}, &L::attn_norm, g}};
  if (c.fused_qkv) {  // Phi-3: Q rows, then K, then V
    t.push_back({p + "self_attn.qkv_proj.weight",
                 {QD + 2 * KVD, D},
                 nullptr,
                 false,
                 {&L::wq, &L::wk, &L::wv},
                 {QD, KVD, KVD}});
  } else {
    t.push_back({p + "self_attn.q_proj.weight", {QD, D}, &L::wq});
    t.push_back({p + "self_attn.k_proj.weight", {KVD, D}, &L::wk});
    t.push_back({p + "self_attn.v_proj.weight", {KVD, D}, &L::wv});
  }
  t.push_back({p + "self_attn.o_proj.weight", {D, QD}, &L::wo});
  if (c.fused_gate_up) {  // Phi-3: gate rows, then up (gate_up_proj(x).chunk(2))
    t.push_back({p + "mlp.gate_up_proj.weight",
                 {2 * H, D},
                 nullptr,
                 false,
                 {&L::w_gate, &L::w_up},
                 {H, H}});
  } else {
    t.push_back({p + "mlp.gate_proj.weight", {H, D}, &L::w_gate});
    t.push_back({p + "mlp.up_proj.weight", {H, D}, &L::w_up});
  }
  t.push_back({p + "mlp.down_proj.weight", {D, H}, &L::w_down});
  if (c.qkv_bias) {
    t.push_back({p + "self_attn.q_proj.bias", {QD}, &L::bq});
    t.push_back({p + "self_attn.k_proj.bias", {KVD}, &L::bk});
    t.push_back({p + "self_attn.v_proj.bias", {KVD}, &L::bv});
  }
  if (c.qk_norm) {
    t.push_back({p + "self_attn.q_norm.weight", {hd}, &L::q_norm, g});
    t.push_back({p + "self_attn.k_norm.weight", {hd}, &L::k_norm, g});
  }
  if (c.post_norms) {  // Gemma: post_attention_layernorm is the norm *after* attention
    t.push_back({p + "post_attention_layernorm.weight", {D}, &L::post_attn_norm, g});
    t.push_back({p + "pre_feedforward_layernorm.weight", {D}, &L::ffn_norm, g});
    t.push_back({p + "post_feedforward_layernorm.weight", {D}, &L::post_ffn_norm, g});
  } else {
    t.push_back({p + "post_attention_layernorm.weight", {D}, &L::ffn_norm, g});
  }
  return t;
}

ModelConfig read_hf_config(const std::string& dir, const formats::SafetensorsSet& weights) {
  Config cfg{(std::filesystem::path(dir) / "config.json").string(), {}, ""};
  cfg.root = read_json_file(cfg.path);
  const std::string& path = cfg.path;
  const Family* fam = nullptr;
  std::string cls;
  if (cfg.has("architectures")) {
    const json& a = cfg.root["architectures"];
    KVB_CHECK(a.is_array() && !a.empty() && a[0].is_string())
        << path << ": key 'architectures' must be a non-empty list of class names";
    cls = a[0];
    for (const Family& f : kFamilies) fam = cls == f.hf_class ? &f : fam;
  } else {
    cls = cfg.opt_string("model_type", "");
    for (const Family& f : kFamilies) fam = cls == f.model_type ? &f : fam;
  }
  KVB_USAGE_CHECK(fam != nullptr) << path << ": unsupported architecture '" << cls
                                  << "' (key 'architectures', or 'model_type'); supported: "
                                  << supported_classes();
  ModelConfig c;
  c.arch = fam->arch;
  cfg.arch = c.arch;
  c.format = "hf";
  c.name = std::filesystem::path(dir).lexically_normal().filename().string();
  if (c.name.empty()) c.name = std::filesystem::path(dir).parent_path().filename().string();
  const std::string hf = fam->hf_class;
  const bool gemma = c.arch == "gemma3", qwen = c.arch == "qwen2" || c.arch == "qwen3";
  c.dim = cfg.need_int("hidden_size", 1 << 16);
  c.hidden_dim = cfg.need_int("intermediate_size", 1 << 20);
  c.num_layers = cfg.need_int("num_hidden_layers", 1024);
  c.num_heads = cfg.need_int("num_attention_heads", 1024);
  c.num_kv_heads = cfg.opt_int("num_key_value_heads", c.num_heads, c.num_heads);
  KVB_CHECK(c.num_heads % c.num_kv_heads == 0)
      << path << ": num_attention_heads " << c.num_heads << " is not a multiple of "
      << "num_key_value_heads " << c.num_kv_heads;
  c.vocab_size = cfg.need_int("vocab_size", 1 << 22);
  const bool phi3 = c.arch == "phi3";
  const int64_t max_pos_def = gemma                        ? 131072
                              : qwen                       ? 32768
                              : hf == "MistralForCausalLM" ? 131072
                              : phi3                       ? 4096
                                                           : 2048;
  c.max_seq_len = cfg.opt_int("max_position_embeddings", 1 << 24, max_pos_def);
  c.norm_eps = cfg.opt_positive("rms_norm_eps", phi3 ? 1e-5 : 1e-6);
  const int64_t hd_def = gemma ? 256 : c.arch == "qwen3" ? 128 : c.dim / c.num_heads;
  KVB_CHECK(cfg.has("head_dim") || gemma || c.arch == "qwen3" || c.dim % c.num_heads == 0)
      << path << ": hidden_size " << c.dim << " is not a multiple of num_attention_heads "
      << c.num_heads << " and key 'head_dim' is absent";
  c.head_dim = cfg.opt_int("head_dim", 1024, hd_def);
  KVB_CHECK(c.head_dim % 2 == 0) << path << ": key 'head_dim' (or hidden_size / heads) is "
                                 << c.head_dim << "; RoPE needs an even head dimension";
  const std::string act_key = gemma ? "hidden_activation" : "hidden_act";
  const std::string act = cfg.opt_string(act_key, gemma ? "gelu_pytorch_tanh" : "silu");
  KVB_USAGE_CHECK(act == (gemma ? "gelu_pytorch_tanh" : "silu"))
      << path << ": key '" << act_key << "' is '" << act << "'; " << hf << " runs with "
      << (gemma ? "gelu_pytorch_tanh" : "silu");
  KVB_USAGE_CHECK(!cfg.opt_bool("attention_bias", false) && !cfg.opt_bool("mlp_bias", false))
      << path << ": keys 'attention_bias' / 'mlp_bias' are true; kvbench supports the "
      << "families' bias-free projections (Qwen2's fixed q/k/v bias aside)";
  KVB_USAGE_CHECK(!cfg.opt_bool("use_sliding_window", false))
      << path << ": key 'use_sliding_window' is true; kvbench does not run Qwen's "
      << "max_window_layers scheme";
  // Partial RoPE (Phi-3): the first int(head_dim * partial_rotary_factor) dimensions rotate.
  c.rope.rot_dim = c.head_dim;
  if (cfg.has("partial_rotary_factor")) {
    const double prf = cfg.opt_positive("partial_rotary_factor", 1.0);
    KVB_USAGE_CHECK(phi3 || prf == 1.0) << path << ": key 'partial_rotary_factor' must be 1 for "
                                        << hf << " (partial RoPE is supported for Phi3ForCausalLM)";
    const int rot = static_cast<int>(c.head_dim * prf);
    KVB_CHECK(prf <= 1.0 && rot >= 2 && rot % 2 == 0)
        << path << ": key 'partial_rotary_factor' = " << prf << " gives " << rot
        << " rotary dimensions of head_dim " << c.head_dim
        << "; expected an even number 2..head_dim";
    c.rope.rot_dim = rot;
  }
  c.qkv_bias = c.arch == "qwen2";
  c.qk_norm = c.arch == "qwen3" || gemma;
  c.tied_embeddings = cfg.opt_bool("tie_word_embeddings", gemma);
  // HF checkpoints keep q/k rows unpermuted: rotate_half pairs (i, i + d/2), i.e. NEOX.
  c.rope.style = kernels::cpu::RopeStyle::kNeox;
  c.rope.theta = cfg.opt_positive("rope_theta", gemma ? 1e6 : 10000.0);
  c.fused_qkv = c.fused_gate_up = phi3;
  read_rope_scaling(cfg, &c);
  if (gemma) read_gemma3(cfg, &c);
  // Mistral, Phi-3: one window on every layer. A window no shorter than the context never binds, so
  // it is dropped (the layers stay global and eviction policies act on them).
  if ((hf == "MistralForCausalLM" || phi3) && cfg.has("sliding_window")) {
    const int window = cfg.opt_int("sliding_window", 1 << 24, 4096);
    if (window < c.max_seq_len) {
      c.window.assign(c.num_layers, window);
      c.rope_local = c.rope;
      if (phi3) c.rope_local.rot_dim = 0;  // as the GGUF path: sliding layers rotate with `rope`
    }
  }

  const uint64_t D = c.dim, V = c.vocab_size;
  weights.expect_tensor("model.embed_tokens.weight", {V, D});
  for (int l = 0; l < c.num_layers; ++l) {
    for (const HfTensorSpec& t : hf_layer_tensors(c, l)) weights.expect_tensor(t.name, t.shape);
  }
  weights.expect_tensor("model.norm.weight", {D});
  if (!c.tied_embeddings) weights.expect_tensor("lm_head.weight", {V, D});
  // After the tensors, which name a wrong num_hidden_layers more plainly (Gemma 3 checked it first:
  // its windows come from it).
  if (!gemma) check_layer_types(cfg, c);
  return c;
}

HfTokenizerConfig read_hf_tokenizer_config(const std::string& dir) {
  namespace fs = std::filesystem;
  HfTokenizerConfig t;
  const std::string path = (fs::path(dir) / "tokenizer_config.json").string();
  std::error_code ec;
  if (fs::exists(path, ec)) {
    t.present = true;
    const json root = read_json_file(path);
    // A special token: a string, {"content": string, ...} (AddedToken), or null.
    auto token = [&](const char* k) -> std::string {
      if (!root.contains(k) || root[k].is_null()) return "";
      const json& v = root[k];
      if (v.is_string()) return v;
      KVB_CHECK(v.is_object() && v.contains("content") && v["content"].is_string())
          << path << ": key '" << k << "' must be a string, {\"content\": string} or null";
      return v["content"];
    };
    t.bos_token = token("bos_token");
    t.eos_token = token("eos_token");
    if (root.contains("add_bos_token") && !root["add_bos_token"].is_null()) {
      KVB_CHECK(root["add_bos_token"].is_boolean())
          << path << ": key 'add_bos_token' must be true or false";
      t.add_bos_token = root["add_bos_token"];
    }
    if (root.contains("chat_template") && !root["chat_template"].is_null()) {
      const json& ct = root["chat_template"];
      if (ct.is_string()) {
        t.chat_template = ct;
      } else {
        // A list of {"name", "template"}: the one named "default" is what apply_chat_template
        // uses without a template name.
        KVB_CHECK(ct.is_array()) << path << ": key 'chat_template' must be a string or a list";
        for (size_t i = 0; i < ct.size(); ++i) {
          KVB_CHECK(ct[i].is_object() && ct[i].contains("name") && ct[i]["name"].is_string() &&
                    ct[i].contains("template") && ct[i]["template"].is_string())
              << path << ": key 'chat_template[" << i << "]' must be {name, template} strings";
          if (ct[i]["name"] == "default") t.chat_template = ct[i]["template"];
        }
      }
      if (!t.chat_template.empty()) t.chat_template_source = "tokenizer_config.json chat_template";
    }
  }
  const fs::path jinja = fs::path(dir) / "chat_template.jinja";  // transformers >= 4.50 writes it
  if (t.chat_template.empty() && fs::is_regular_file(jinja, ec)) {
    const uint64_t bytes = fs::file_size(jinja, ec);
    KVB_CHECK(!ec && bytes <= kMaxJsonBytes)
        << jinja.string() << ": " << bytes << " bytes; a chat template above " << kMaxJsonBytes
        << " bytes is not plausible";
    std::ifstream in(jinja, std::ios::binary);
    std::ostringstream os;
    os << in.rdbuf();
    t.chat_template = os.str();
    t.chat_template_source = "chat_template.jinja";
  }
  return t;
}

}  // namespace kvb::engine
