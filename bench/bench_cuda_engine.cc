// End-to-end GPU engine benchmark (workers/engine/cuda_engine.h): prefill and decode tokens/s,
// eviction overhead as a share of the decode step, peak device memory, for SmolLM2-135M (when
// models/ has it) and a random-weight model of Llama-3-8B's shape built in memory (32 layers,
// hidden 4096, 32 heads, 8 KV heads, FFN 14336, vocab 128256; every dimension settable), over
// contexts (default 4K..32K) x policies (full, snapkv, ada_snapkv, h2o) x budgets (128..2048).
// Prefill: one pass over `context` pseudo-random tokens with the policy's prefill hook; decode:
// `--steps` single-token steps after it, each with the decode hook. Policy share = policy_ms
// (device time between CUDA events around each hook and its plan's application, statistics
// copies included for host-side hooks) / decode time. Without a GPU: one line, exit 0.
//   bench_cuda_engine [--dtype bf16|f32] [--contexts 4096,8192] [--budgets 128,2048]
//     [--policies full,h2o | all] [--steps 32] [--models smollm2,llama8b] [--layers 32 --dim 4096
//     --heads 32 --kv-heads 8 --ffn 14336 --vocab 128256] [--pool-keep-mib 0]
//     [--decode-kernels default,streamed,grouped,tensor --repeat 5]  (each row on each decode
//     attention kernel, kernels/cuda/attention.h kDecode*, in turn, repeat rounds: an
//     interleaved A/B) [--batch 8]  (sequences decoding together, as a bundle's units:
//     decode t/s is the batch's) [--graphs off,on]  (decode steps launched one by one, or each
//     captured and launched as one CUDA graph, kernels/cuda/graph.h; in turn within a round;
//     `graphs` = steps that ran as a graph / steps, `nodes` = the last graph's nodes)
#include <omp.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/runtime.h"
#include "kernels/policies/policy.h"
#include "workers/engine/cuda_engine.h"
#include "workers/engine/generate.h"
#include "workers/engine/model.h"
#include "workers/formats/model_load.h"

namespace {

using namespace kvb;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::vector<int> int_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::stoi(x));
  return v;
}
std::vector<std::string> str_list(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(x);
  return v;
}

// Uniform in [-a, a) from a counter hash (splitmix64), filled in parallel: 8B weights in seconds.
void fill(std::vector<float>& v, size_t n, uint64_t seed, float a) {
  v.resize(n);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    v[i] = a * (static_cast<float>(z >> 40) / 8388608.0f - 1.0f);
  }
}

std::unique_ptr<engine::Model> random_llama(int layers, int dim, int heads, int kv_heads, int ffn,
                                            int vocab) {
  auto m = std::make_unique<engine::Model>();
  engine::ModelConfig& c = m->config;
  c.arch = "llama";
  c.name = "random-llama-" + std::to_string(layers) + "x" + std::to_string(dim);
  c.format = "memory";
  c.dim = dim;
  c.hidden_dim = ffn;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = dim / heads;
  c.vocab_size = vocab;
  c.max_seq_len = 131072;
  c.norm_eps = 1e-5f;
  c.rope.rot_dim = c.head_dim;
  c.rope.theta = 500000.0f;
  const size_t D = dim, QD = static_cast<size_t>(heads) * c.head_dim,
               KVD = static_cast<size_t>(kv_heads) * c.head_dim, H = ffn;
  const float a = 1.0f / std::sqrt(static_cast<float>(dim));
  m->layers.resize(layers);
  uint64_t seed = 1;
  for (engine::LayerWeights& w : m->layers) {
    w.attn_norm.assign(D, 1.0f);
    w.ffn_norm.assign(D, 1.0f);
    fill(w.wq, QD * D, seed++, a);
    fill(w.wk, KVD * D, seed++, a);
    fill(w.wv, KVD * D, seed++, a);
    fill(w.wo, D * QD, seed++, a);
    fill(w.w_gate, H * D, seed++, a);
    fill(w.w_up, H * D, seed++, a);
    fill(w.w_down, D * H, seed++, 1.0f / std::sqrt(static_cast<float>(ffn)));
  }
  fill(m->token_embedding, static_cast<size_t>(vocab) * D, seed++, 1.0f);
  fill(m->output, static_cast<size_t>(vocab) * D, seed++, a);
  m->final_norm.assign(D, 1.0f);
  return m;
}

std::vector<int32_t> tokens(int n, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i)
    t[i] = static_cast<int32_t>((i * 2654435761ull + 12345) % (vocab - 10)) + 10;
  return t;
}

// --decode-kernels: the decode attention kernels each row runs on (kernels/cuda/attention.h
// kDecode*), in turn; --repeat: rounds of them (A B A B ...: an interleaved A/B in one process).
std::vector<int> g_decode_kernels = {kvb::kernels::cuda::kDecodeDefault};
int g_repeat = 1;
// --batch: sequences per row decoding together (Engine::decode_batch; a bundle's units),
// each with its own policy and cache over the same prompt; decode t/s is then the batch's tokens
// per second and step ms a batch step.
int g_batch = 1;
// --graphs: each row's decode steps launched one by one (off) and/or as CUDA graphs (on).
std::vector<bool> g_graphs = {false};

// A whole int, all of v (strtol, no trailing characters, in int's range).
bool parse_int(const std::string& v, int* out) {
  if (v.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE || x < INT_MIN || x > INT_MAX) return false;
  *out = static_cast<int>(x);
  return true;
}
const char* kernel_name(int k) {
  return k == kvb::kernels::cuda::kDecodeGrouped      ? "grouped"
         : k == kvb::kernels::cuda::kDecodeStreamed   ? "streamed"
         : k == kvb::kernels::cuda::kDecodeTensorCore ? "tensor"
                                                      : "default";
}

void run_model(const engine::Model& m, engine::DType dtype, const std::vector<int>& contexts,
               const std::vector<int>& budgets, const std::vector<std::string>& pols, int steps) {
  const auto t0 = Clock::now();
  engine::Engine eng(m, engine::cuda_backend(m, dtype));
  std::printf("# %s on %s, %s: weights %.2f GiB uploaded in %.1f s\n", m.config.name.c_str(),
              eng.device_description().c_str(), engine::dtype_name(dtype),
              engine::cuda_of(eng).weight_bytes() / 1073741824.0, ms_since(t0) / 1000);
  std::printf(
      "%-22s %7s %-11s %6s %-8s %5s %12s %11s %9s %8s %10s %8s %8s %8s %9s %9s %10s %7s %6s\n",
      "model", "context", "policy", "budget", "kernel", "batch", "prefill t/s", "decode t/s",
      "step ms", "policy%", "host MiB", "d2h/step", "h2d/step", "sync/step", "wait ms", "peak GiB",
      "attn/layer", "graphs", "nodes");
  const auto& c = m.config;
  for (int ctx : contexts) {
    if (ctx + steps > c.max_seq_len) {
      std::printf("%-22s %7d (skipped: above the model's context %d)\n", c.name.c_str(), ctx,
                  c.max_seq_len);
      continue;
    }
    const std::vector<int32_t> prompt = tokens(ctx, c.vocab_size);
    for (const std::string& pname : pols) {
      for (int budget : (pname == "full" ? std::vector<int>{0} : budgets)) {
        for (int round = 0; round < g_repeat; ++round) {
          for (size_t run = 0; run < g_decode_kernels.size() * g_graphs.size(); ++run) {
            const int kernel = g_decode_kernels[run / g_graphs.size()];
            engine::cuda_of(eng).set_decode_kernel(kernel);
            engine::cuda_of(eng).set_graphs(g_graphs[run % g_graphs.size()]);
            policies::PolicyConfig pc;
            pc.name = pname;
            pc.kv_budget = budget;
            pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
            const int B = g_batch;
            std::vector<std::unique_ptr<policies::Policy>> owned;
            std::vector<policies::Policy*> policy;
            std::vector<kernels::KvCache> cache;
            for (int b = 0; b < B; ++b) {
              owned.push_back(policies::make_policy(pc));
              policy.push_back(owned.back().get());
              cache.push_back(eng.new_cache(ctx + steps, policy.back()));
            }
            std::vector<kernels::KvCache*> caches;
            for (kernels::KvCache& k : cache) caches.push_back(&k);
            std::vector<float> logits;
            const size_t moved0 = engine::mirror_bytes(eng);
            auto tp = Clock::now();
            for (int b = 0; b < B; ++b) {
              engine::prefill_prompt(eng, cache[b], prompt, policy[b], &logits);
            }
            const double prefill_ms = ms_since(tp);
            const double pol0 = eng.policy_ms();
            const engine::TransferCounters x0 = eng.transfer_counters();
            const int64_t calls0 = engine::cuda_of(eng).batch_attention_calls();
            const int64_t launches0 = engine::cuda_of(eng).batch_attention_launches();
            const int64_t graphs0 = engine::cuda_of(eng).graph_counters().captures;
            std::vector<int32_t> next(B);
            auto td = Clock::now();
            for (int s = 0; s < steps; ++s) {
              for (int b = 0; b < B; ++b) next[b] = 10 + s + b;
              if (B == 1) {
                eng.forward({next.data(), 1}, cache[0], engine::LogitsMode::kLast, &logits,
                            policy[0], engine::PolicyHook::kDecode);
              } else {
                eng.decode_batch(next, caches, policy, &logits);
              }
            }
            const double decode_ms = ms_since(td);
            // attn/layer: attention launches per batched layer (cuda::attention_batch; "-"
            // where no layer attended for the batch at once: one sequence, or a policy that
            // keeps its layers per sequence).
            const int64_t calls = engine::cuda_of(eng).batch_attention_calls() - calls0;
            char attn[16] = "-";
            if (calls > 0) {
              std::snprintf(attn, sizeof attn, "%.1f",
                            static_cast<double>(engine::cuda_of(eng).batch_attention_launches() - launches0) /
                                static_cast<double>(calls));
            }
            const double pol = eng.policy_ms() - pol0;
            const engine::TransferCounters x1 = eng.transfer_counters();
            // host MiB: bytes copied either way over prefill and decode; d2h/step, h2d/step and
            // sync/step: copies each way and stream syncs per decode step (cuda_backend.h); wait
            // ms: the host's time per step blocked in those syncs (step ms minus it: the host's
            // own time, launches included; if that is most of the step, launches bound it).
            char graphs[24] = "off";
            if (engine::cuda_of(eng).graphs()) {
              std::snprintf(graphs, sizeof graphs, "%lld/%d",
                            static_cast<long long>(engine::cuda_of(eng).graph_counters().captures - graphs0), steps);
            }
            std::printf(
                "%-22s %7d %-11s %6d %-8s %5d %12.0f %11.1f %9.3f %7.1f%% %10.1f %8.1f %8.1f "
                "%8.1f %9.3f %9.2f %10s %7s %6zu\n",
                c.name.c_str(), ctx, pname.c_str(), budget, kernel_name(kernel), B,
                static_cast<double>(ctx) * B * 1000.0 / prefill_ms, B * steps * 1000.0 / decode_ms,
                decode_ms / steps, 100.0 * pol / decode_ms,
                (engine::mirror_bytes(eng) - moved0) / 1048576.0,
                static_cast<double>(x1.d2h_copies - x0.d2h_copies) / steps,
                static_cast<double>(x1.h2d_copies - x0.h2d_copies) / steps,
                static_cast<double>(x1.stream_syncs - x0.stream_syncs) / steps,
                (x1.sync_wait_ms - x0.sync_wait_ms) / steps, eng.device_peak_bytes() / 1073741824.0,
                attn, graphs, engine::cuda_of(eng).graphs() ? engine::cuda_of(eng).graph_counters().last_nodes : size_t{0});
            std::fflush(stdout);
          }
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!kernels::cuda::has_device()) {
    std::printf(
        "bench_cuda_engine: no CUDA device (cudaGetDeviceCount found none); nothing to "
        "measure\n");
    return 0;
  }
  std::string dtype = "bf16", contexts = "4096,8192,16384,32768", budgets = "128,512,2048",
              pols = "full,snapkv,ada_snapkv,h2o", models = "smollm2,llama8b";
  int steps = 32, layers = 32, dim = 4096, heads = 32, kv_heads = 8, ffn = 14336, vocab = 128256;
  int pool_keep_mib = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_cuda_engine: %s needs a value (see the file's header)\n",
                   argv[i]);
      return 2;
    }
    const std::string v = argv[++i];
    bool ok = true;
    if (k == "--dtype")
      dtype = v;
    else if (k == "--contexts")
      contexts = v;
    else if (k == "--budgets")
      budgets = v;
    else if (k == "--policies")
      pols = v;
    else if (k == "--models")
      models = v;
    else if (k == "--steps")
      ok = parse_int(v, &steps);
    else if (k == "--layers")
      ok = parse_int(v, &layers);
    else if (k == "--dim")
      ok = parse_int(v, &dim);
    else if (k == "--heads")
      ok = parse_int(v, &heads);
    else if (k == "--kv-heads")
      ok = parse_int(v, &kv_heads);
    else if (k == "--ffn")
      ok = parse_int(v, &ffn);
    else if (k == "--vocab")
      ok = parse_int(v, &vocab);
    else if (k == "--pool-keep-mib")
      ok = parse_int(v, &pool_keep_mib);
    else if (k == "--decode-kernels") {
      namespace cu = kernels::cuda;
      g_decode_kernels.clear();
      for (const std::string& name : str_list(v)) {
        if (name == "default") {
          g_decode_kernels.push_back(cu::kDecodeDefault);
        } else if (name == "grouped") {
          g_decode_kernels.push_back(cu::kDecodeGrouped);
        } else if (name == "streamed") {
          g_decode_kernels.push_back(cu::kDecodeStreamed);
        } else if (name == "tensor") {
          g_decode_kernels.push_back(cu::kDecodeTensorCore);
        } else {
          std::fprintf(stderr,
                       "bench_cuda_engine: --decode-kernels %s: a list of default, "
                       "grouped, streamed, tensor\n",
                       v.c_str());
          return 2;
        }
      }
      if (g_decode_kernels.empty()) {
        std::fprintf(stderr, "bench_cuda_engine: --decode-kernels needs at least one kernel\n");
        return 2;
      }
    } else if (k == "--graphs") {
      g_graphs.clear();
      for (const std::string& mode : str_list(v)) {
        if (mode != "off" && mode != "on") {
          std::fprintf(stderr, "bench_cuda_engine: --graphs %s: a list of off, on\n", v.c_str());
          return 2;
        }
        g_graphs.push_back(mode == "on");
      }
      if (g_graphs.empty()) {
        std::fprintf(stderr, "bench_cuda_engine: --graphs needs off, on or both\n");
        return 2;
      }
    } else if (k == "--batch") {
      if (!parse_int(v, &g_batch) || g_batch < 1 || g_batch > 256) {
        std::fprintf(stderr, "bench_cuda_engine: --batch takes 1..256, got %s\n", v.c_str());
        return 2;
      }
    } else if (k == "--repeat") {
      if (!parse_int(v, &g_repeat) || g_repeat < 1 || g_repeat > 100) {
        std::fprintf(stderr, "bench_cuda_engine: --repeat takes 1..100, got %s\n", v.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "bench_cuda_engine: unknown option %s (see the file's header)\n",
                   k.c_str());
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "bench_cuda_engine: %s takes a whole number, got '%s'\n", k.c_str(),
                   v.c_str());
      return 2;
    }
  }
  if (pols == "all") {  // every registered policy with its default options; python needs a
    pols.clear();       // script and is benched by bench_python_policy
    for (const auto& info : policies::policy_registry()) {
      // duo_attention needs the authors' pattern folder for the model (patterns=DIR).
      if (info.name != "python" && info.name != "duo_attention") {
        pols += (pols.empty() ? "" : ",") + info.name;
      }
    }
  }
  try {
    // The default memory pool keeps this much freed memory across syncs (0: CUDA's default,
    // which returns it at each step's sync): kernels::cuda::keep_pool_memory, for an A/B.
    KVB_USAGE_CHECK(pool_keep_mib >= 0 && pool_keep_mib <= (1 << 20))
        << "--pool-keep-mib takes 0..1048576, got " << pool_keep_mib;
    if (pool_keep_mib > 0) {
      kernels::cuda::keep_pool_memory(static_cast<uint64_t>(pool_keep_mib) << 20);
    }
    std::printf("# memory pool keeps %d MiB across syncs\n", pool_keep_mib);
    const engine::DType dt = engine::parse_dtype(dtype);
    for (const std::string& name : str_list(models)) {
      if (name == "smollm2") {
        const std::string path = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
        if (!std::ifstream(path).good()) {
          std::printf("# smollm2 skipped: %s missing (scripts/fetch_models.sh)\n", path.c_str());
          continue;
        }
        run_model(*engine::load_model(path), dt, int_list(contexts), int_list(budgets),
                  str_list(pols), steps);
      } else if (name == "llama8b") {
        const auto t0 = Clock::now();
        std::unique_ptr<engine::Model> m = random_llama(layers, dim, heads, kv_heads, ffn, vocab);
        std::printf("# random weights: %.1f s on the host\n", ms_since(t0) / 1000);
        run_model(*m, dt, int_list(contexts), int_list(budgets), str_list(pols), steps);
      } else {
        std::fprintf(stderr, "bench_cuda_engine: --models takes smollm2,llama8b; got %s\n",
                     name.c_str());
        return 2;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_engine: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
