// End-to-end engine throughput on the CPU: prefill tokens/s and decode tokens/s of SmolLM2-135M
// (and stories260K) at a given context length. Decode is timed after a prefill of `context`
// tokens, as the mean over 32 single-token steps. Tokens are a fixed pseudo-random sequence, so
// runs are comparable. bm_decode_batch: B sequences of `context` tokens each (a bundle's units
// after the shared prefill, policy full) stepped together by Engine::decode_batch; its tok/s
// counts every sequence's tokens (B x 32 per iteration), and B = 1 is the same step alone.
// bm_bf16_*: the same three with --dtype bf16 weights (CpuBackend), named apart so that filters
// on bm_decode_batch keep reading f32 only; `wide` is a random-weight Llama of TinyLlama-1.1B's
// layer shapes (dim 2048, hidden 5632, 32 heads, 4 KV heads, vocabulary 32000) cut to 4 layers,
// written to a per-process file in $TMPDIR on first use.
// Usage: bench_engine [--benchmark_filter=...] (model paths from the build).
// scripts/compare_llamacpp.py section 5 reads bm_decode_batch against llama.cpp's decode.
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>

#include "workers/engine/engine.h"
#include "workers/engine/model.h"
#include "workers/engine/sampler.h"
#include "workers/formats/model_load.h"
#include "tests/tp_test_model.h"

namespace {

using kvb::engine::DType;
using kvb::engine::Engine;
using kvb::engine::LogitsMode;

std::vector<int32_t> tokens(int n, int vocab) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) {
    t[i] = static_cast<int32_t>(kvb::engine::counter_uniform(7, i) * (vocab - 10)) + 10;
  }
  return t;
}

struct Loaded {
  const kvb::engine::Model* model = nullptr;
  std::unique_ptr<Engine> engine;
};

const char kWide[] = "wide";  // the random-weight model of the header comment

// The model at `path` (or the generated `wide` one) with an engine of `dtype`; one model is
// shared by both dtypes' engines. Null when the file is missing.
Loaded* load(const std::string& path, DType dtype) {
  static std::map<std::string, std::unique_ptr<kvb::engine::Model>> models;
  static std::map<std::pair<std::string, DType>, Loaded> cache;
  auto it = cache.find({path, dtype});
  if (it != cache.end()) return &it->second;
  auto& model = models[path];
  if (!model) {
    if (path == kWide) {
      const char* tmp = std::getenv("TMPDIR");
      const std::string file = std::string(tmp ? tmp : "/tmp") + "/kvb_bench_wide_" +
                               std::to_string(getpid()) + ".gguf";
      kvb::testing::RandomLlamaShape shape;
      shape.dim = 2048, shape.hidden_dim = 5632, shape.layers = 4, shape.heads = 32;
      shape.kv_heads = 4, shape.vocab = 32000, shape.context = 4096;
      if (!kvb::testing::write_random_llama_gguf(file, shape)) return nullptr;
      model = kvb::engine::load_model(file);
      std::remove(file.c_str());
    } else {
      if (!std::ifstream(path).good()) return nullptr;
      model = kvb::engine::load_model(path);
    }
  }
  Loaded l;
  l.model = model.get();
  l.engine = std::make_unique<Engine>(*l.model, nullptr, dtype);
  return &(cache[{path, dtype}] = std::move(l));
}

void bm_prefill(benchmark::State& state, std::string path, DType dtype = DType::kF32) {
  Loaded* l = load(path, dtype);
  if (!l) {
    state.SkipWithError(("model missing: " + path).c_str());
    return;
  }
  const int n = static_cast<int>(state.range(0));
  std::vector<int32_t> ids = tokens(n, l->model->config.vocab_size);
  std::vector<float> logits;
  for (auto _ : state) {
    kvb::kernels::KvCache cache = l->engine->new_cache(n);
    l->engine->forward(ids, cache, LogitsMode::kLast, &logits);
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(n) * state.iterations(), benchmark::Counter::kIsRate);
}

void bm_decode(benchmark::State& state, std::string path, DType dtype = DType::kF32) {
  Loaded* l = load(path, dtype);
  if (!l) {
    state.SkipWithError(("model missing: " + path).c_str());
    return;
  }
  const int context = static_cast<int>(state.range(0));
  const int steps = 32;
  std::vector<int32_t> ids = tokens(context + steps, l->model->config.vocab_size);
  std::vector<float> logits;
  kvb::kernels::KvCache cache = l->engine->new_cache(context + steps);
  l->engine->forward({ids.data(), static_cast<size_t>(context)}, cache, LogitsMode::kNone, nullptr);
  int64_t decoded = 0;
  for (auto _ : state) {
    state.PauseTiming();
    // Restore the cache to `context` tokens (drop the decoded ones) without re-prefilling.
    kvb::kernels::KvCache c = cache;
    state.ResumeTiming();
    for (int s = 0; s < steps; ++s) {
      l->engine->forward({&ids[context + s], 1}, c, LogitsMode::kLast, &logits);
    }
    decoded += steps;
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(decoded), benchmark::Counter::kIsRate);
}

void bm_decode_batch(benchmark::State& state, std::string path, DType dtype = DType::kF32) {
  Loaded* l = load(path, dtype);
  if (!l) {
    state.SkipWithError(("model missing: " + path).c_str());
    return;
  }
  const int context = static_cast<int>(state.range(0));
  const int batch = static_cast<int>(state.range(1));
  const int steps = 32;
  std::vector<int32_t> ids = tokens(context + steps, l->model->config.vocab_size);
  std::vector<float> logits;
  kvb::kernels::KvCache cache = l->engine->new_cache(context + steps);
  l->engine->forward({ids.data(), static_cast<size_t>(context)}, cache, LogitsMode::kNone, nullptr);
  std::vector<kvb::policies::Policy*> policies(batch, nullptr);
  int64_t decoded = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<kvb::kernels::KvCache> caches(batch, cache);
    std::vector<kvb::kernels::KvCache*> ptrs;
    for (auto& c : caches) ptrs.push_back(&c);
    state.ResumeTiming();
    std::vector<int32_t> step(batch);
    for (int s = 0; s < steps; ++s) {
      for (int b = 0; b < batch; ++b) step[b] = ids[context + (s + b) % steps];
      l->engine->decode_batch(step, ptrs, policies, &logits);
    }
    decoded += static_cast<int64_t>(steps) * batch;
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(decoded), benchmark::Counter::kIsRate);
  state.counters["batch"] = batch;
}

const std::string kSmol = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kStories = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";

BENCHMARK_CAPTURE(bm_prefill, smollm2, kSmol)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->Iterations(1)->Repetitions(2);
BENCHMARK_CAPTURE(bm_decode, smollm2, kSmol)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK_CAPTURE(bm_decode_batch, smollm2, kSmol)
    ->ArgsProduct({{512, 2048}, {1, 4, 11}})
    ->UseRealTime()  // wall clock, as llama.cpp's side of scripts/compare_llamacpp.py
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->Repetitions(3);
BENCHMARK_CAPTURE(bm_prefill, stories260K, kStories)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_decode, stories260K, kStories)->Arg(256)->Unit(benchmark::kMillisecond);


void bm_bf16_prefill(benchmark::State& state, std::string path) {
  bm_prefill(state, path, DType::kBf16);
}
void bm_bf16_decode_batch(benchmark::State& state, std::string path) {
  bm_decode_batch(state, path, DType::kBf16);
}
void bm_f32_wide_prefill(benchmark::State& state) { bm_prefill(state, kWide); }
void bm_f32_wide_decode_batch(benchmark::State& state) { bm_decode_batch(state, kWide); }
void bm_bf16_wide_prefill(benchmark::State& state) { bm_prefill(state, kWide, DType::kBf16); }
void bm_bf16_wide_decode_batch(benchmark::State& state) {
  bm_decode_batch(state, kWide, DType::kBf16);
}

BENCHMARK_CAPTURE(bm_bf16_prefill, smollm2, kSmol)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->Iterations(1)->Repetitions(2);
BENCHMARK_CAPTURE(bm_bf16_decode_batch, smollm2, kSmol)
    ->ArgsProduct({{512, 2048}, {1, 4, 11}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->Repetitions(3);
BENCHMARK(bm_f32_wide_prefill)->Arg(128)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(bm_bf16_wide_prefill)->Arg(128)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(bm_f32_wide_decode_batch)->ArgsProduct({{128}, {1, 4}})->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(bm_bf16_wide_decode_batch)->ArgsProduct({{128}, {1, 4}})->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(1);
}  // namespace

BENCHMARK_MAIN();
