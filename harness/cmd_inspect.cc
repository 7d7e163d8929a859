// `kvbench inspect MODEL`: what kvbench will run, read from the model file's header alone (no
// weights): architecture, sizes, context, the kind of every layer (global, or sliding window with
// its RoPE base), the tokenizer, where the chat template comes from and which format kvbench
// recognizes in it, and the KV-cache bytes per slot and per token. One table (md, csv, jsonl).
#include <algorithm>
#include <boost/program_options.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/error.h"
#include "common/table.h"
#include "harness/cli.h"
#include "harness/model_info.h"
#include "workers/formats/gguf.h"
#include "workers/formats/hf_config.h"
#include "kernels/formats/safetensors.h"
#include "workers/model_session.h"
#include "workers/formats/model_header.h"
#include "workers/tokenizer/tokenizer.h"

namespace kvb::harness {
namespace {

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// `scaled`: the frequency factors are yarn's or longrope's (named by rope_global_text), not
// llama3's.
std::string rope_text(const kernels::cpu::RopeParams& r, bool scaled = false) {
  std::string s = std::string(r.style == kernels::cpu::RopeStyle::kNeox ? "neox" : "norm") +
                  ", base " + num(r.theta) + ", " + std::to_string(r.rot_dim) + " dims";
  if (r.linear_scale != 1.0f) s += ", linear scaling " + num(r.linear_scale);
  if (!r.freq_factors.empty() && !scaled) s += ", llama3 frequency factors";
  return s;
}

// The global layers' RoPE with how its scaling was derived ("yarn factor 4 from 32768 tokens ...").
std::string rope_global_text(const engine::ModelConfig& c, const formats::GgufFile* g) {
  std::string s = rope_text(c.rope, c.rope_scaling == "yarn" || c.rope_scaling == "longrope");
  const std::string p = c.arch + ".";
  if (c.rope_scaling == "yarn") {
    // A Hugging Face folder's factor is in its frequency factors (no GGUF key to quote).
    if (g) {
      s += ", yarn factor " + num(g->get_float_or(p + "rope.scaling.factor", 1.0));
    } else {
      s += ", yarn";
    }
    s += " over an original context of " + std::to_string(c.rope_original_context);
  } else if (c.rope_scaling == "longrope") {
    s += ", longrope with the " + c.rope_factor_set + " factors (context " +
         std::to_string(c.max_seq_len) + (c.rope_factor_set == "long" ? " > " : " <= ") +
         "original " + std::to_string(c.rope_original_context) + "; fixed for the run)";
  } else if (!c.rope.freq_factors.empty() || (g && g->find_tensor("rope_freqs.weight"))) {
    s += ", per-dimension frequency factors (rope_freqs.weight)";
  }
  if (c.rope.attn_factor != 1.0f) s += ", cos/sin x " + num(c.rope.attn_factor);
  return s;
}

// "global 0-17", or "sliding 0-4 6-10 12-16 (window 512, RoPE base 10000); global 5 11 17".
std::string layer_kinds(const engine::ModelConfig& c) {
  std::string sliding, global;
  for (int l = 0; l < c.num_layers; ++l) {
    std::string& list = c.sliding(l) ? sliding : global;
    const bool run_continues = l > 0 && c.sliding(l - 1) == c.sliding(l);
    const bool run_ends = l + 1 == c.num_layers || c.sliding(l + 1) != c.sliding(l);
    if (!run_continues) list += (list.empty() ? "" : " ") + std::to_string(l);
    if (run_continues && run_ends) list += "-" + std::to_string(l);
  }
  if (sliding.empty()) return "global " + global;
  const int window = *std::max_element(c.window.begin(), c.window.end());
  const std::string rope = c.rope_local.rot_dim > 0 ? rope_text(c.rope_local) : "as global";
  std::string s =
      "sliding " + sliding + " (window " + std::to_string(window) + ", RoPE " + rope + ")";
  if (global.empty()) {
    s += "; no global layer: the window alone bounds the cache and eviction policies have no "
         "layer to act on (only full runs)";
  } else {
    s += "; global " + global;
  }
  return s;
}

}  // namespace

int cmd_inspect(const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  po::options_description desc(
      "usage: kvbench inspect MODEL [--format md|csv|jsonl]\n\n"
      "Reads a model's header (a GGUF or llama2.c file, or a Hugging Face checkpoint folder's\n"
      "config.json and safetensors headers; no weights are loaded) with the loader's own\n"
      "checks and prints what kvbench will run: architecture, sizes, context length, the kind of\n"
      "every layer (global, or sliding window with its own RoPE base), the tokenizer, the chat\n"
      "template's source and the format kvbench recognizes in it (a task with chat: true needs\n"
      "one), and the KV-cache bytes per slot (f32 on the CPU, bf16 on a GPU) and per token.\n\n"
      "options");
  std::string format = "md";
  desc.add_options()("help,h", "print this help")(
      "model", po::value<std::string>(),
      "model: GGUF file, llama2.c checkpoint or Hugging Face checkpoint folder")(
      "format", po::value<std::string>(&format)->default_value("md"), "md, csv or jsonl");
  po::positional_options_description pos;
  pos.add("model", 1);
  po::variables_map vm;
  if (!parse_command_line(args, desc, &pos, "inspect", &vm)) return 0;
  KVB_USAGE_CHECK(vm.count("model")) << "kvbench inspect: give a model file (see kvbench inspect --help)";
  KVB_USAGE_CHECK(format == "md" || format == "csv" || format == "jsonl")
      << "--format '" << format << "': expected md, csv or jsonl";
  const std::string path = vm["model"].as<std::string>();
  const ModelInfo info = read_model_info(path);  // existence, format, the loader's header checks

  engine::ModelConfig c;
  std::string tokenizer = "none (llama2.c: give its tokenizer.bin)";
  std::string chat_source = "none";
  std::unique_ptr<formats::GgufFile> g;
  if (info.format == "gguf") {
    g = formats::GgufFile::open(path);
    c = engine::read_gguf_config(*g);
    const std::string model = g->get_string_or("tokenizer.ggml.model", "");
    tokenizer = model.empty() ? "none in the file" : "GGUF " + model;
    if (g->has("tokenizer.ggml.pre")) tokenizer += " (pre " + g->get_string("tokenizer.ggml.pre") + ")";
    tokenizer += ", add BOS " + std::string(g->get_int_or("tokenizer.ggml.add_bos_token", 0)
                                                ? "yes" : "no");
    const std::string tmpl = g->get_string_or("tokenizer.chat_template", "");
    if (!tmpl.empty()) {
      chat_source = "GGUF tokenizer.chat_template (" + std::to_string(tmpl.size()) + " bytes)";
    }
  } else if (info.format == "hf") {
    c = engine::read_hf_config(path, *formats::SafetensorsSet::open_dir(path));
    const engine::HfTokenizerConfig tc = engine::read_hf_tokenizer_config(path);
    std::error_code ec;
    if (!std::filesystem::is_regular_file(std::filesystem::path(path) / "tokenizer.json", ec)) {
      tokenizer = "none in the folder (give --tokenizer)";
    } else {
      // Loaded, because BOS may come from tokenizer.json's post-processor; a tokenizer.json
      // kvbench cannot read is reported here rather than failing the whole inspection.
      try {
        const workers::LoadedModel lm = workers::load_tokenizer_only(path, "");
        tokenizer = "HF tokenizer.json (" + std::to_string(lm.tokenizer->vocab_size()) +
                    " tokens), add BOS " + (lm.add_bos ? "yes" : "no");
      } catch (const Error& e) {
        tokenizer = std::string("HF tokenizer.json, not readable by kvbench: ") + e.what();
      }
    }
    if (!tc.chat_template.empty()) {
      chat_source = tc.chat_template_source + " (" + std::to_string(tc.chat_template.size()) +
                    " bytes)";
    }
  } else {
    c = engine::read_llama2c_header(path).config;
  }
  const size_t f32_slot = 2 * sizeof(float) * c.head_dim + sizeof(int32_t);
  const size_t bf16_slot = 2 * 2 * c.head_dim + sizeof(int32_t);
  int global_layers = 0;
  size_t window_slots = 0;  // what the sliding layers hold at most, per KV head
  for (int l = 0; l < c.num_layers; ++l) {
    if (c.sliding(l)) {
      window_slots += static_cast<size_t>(c.window[l] - 1);
    } else {
      ++global_layers;
    }
  }

  Table t({"field", "value"});
  t.add({"file", path});
  t.add({"format", info.format});
  t.add({"architecture", c.arch});
  t.add({"name", c.name});
  t.add({"weights", info.weight_type + ", " + num(info.num_params / 1e6) + " M parameters"});
  t.add({"context length", std::to_string(c.max_seq_len)});
  t.add({"layers", std::to_string(c.num_layers)});
  t.add({"layer kinds", layer_kinds(c)});
  t.add({"dim / ffn", std::to_string(c.dim) + " / " + std::to_string(c.hidden_dim) +
                          (c.ffn_act == engine::FfnAct::kGeluTanh ? " (GeGLU, tanh GELU)"
                                                                  : " (SwiGLU)")});
  t.add({"heads / KV heads / head_dim", std::to_string(c.num_heads) + " / " +
                                            std::to_string(c.num_kv_heads) + " / " +
                                            std::to_string(c.head_dim)});
  t.add({"RoPE (global layers)", rope_global_text(c, g.get())});
  std::string extras;
  if (c.qkv_bias) extras += "QKV bias; ";
  if (c.qk_norm) extras += "per-head q/k RMSNorm; ";
  const bool hf = c.format == "hf";
  if (c.fused_qkv) extras += hf ? "fused QKV (qkv_proj); " : "fused QKV (attn_qkv); ";
  if (c.fused_gate_up) {
    extras +=
        hf ? "fused gate/up (gate_up_proj, gate first); " : "fused gate/up (ffn_up, gate first); ";
  }
  if (c.post_norms) extras += "post-attention and post-MLP norms; ";
  if (c.embed_scale != 1.0f) extras += "embeddings x " + num(c.embed_scale) + "; ";
  extras += c.tied_embeddings ? "tied classifier" : "own classifier";
  t.add({"block", extras});
  t.add({"vocabulary", std::to_string(c.vocab_size)});
  t.add({"tokenizer", tokenizer});
  t.add({"chat template", chat_source});
  t.add({"chat format kvbench renders",
         info.chat_template == "none"       ? "none (chat-wrapped tasks are refused)"
         : info.chat_template_error.empty() ? "the model's own Jinja template (minja)"
                                            : "none: " + info.chat_template_error});
  t.add({"KV bytes per slot", std::to_string(f32_slot) + " (f32, CPU); " +
                                  std::to_string(bf16_slot) + " (bf16, GPU)"});
  const size_t per_token = static_cast<size_t>(global_layers) * c.num_kv_heads * f32_slot;
  std::string growth = std::to_string(per_token) + " per token over " +
                       std::to_string(global_layers) + " global layers (f32, full)";
  if (window_slots > 0) {
    growth += ", plus at most " + std::to_string(window_slots * c.num_kv_heads * f32_slot) +
              " held by the sliding layers' windows";
  }
  t.add({"KV bytes (full cache)", growth});
  t.print(std::cout, format);
  return 0;
}

}  // namespace kvb::harness
