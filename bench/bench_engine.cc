// End-to-end engine throughput on the CPU: prefill tokens/s and decode tokens/s of SmolLM2-135M
// (and stories260K) at a given context length. Decode is timed after a prefill of `context`
// tokens, as the mean over 32 single-token steps. Tokens are a fixed pseudo-random sequence, so
// runs are comparable. bm_decode_batch: B sequences of `context` tokens each (a bundle's units
// after the shared prefill, policy full) stepped together by EngineBase::decode_batch; its tok/s
// counts every sequence's tokens (B x 32 per iteration), and B = 1 is the same step alone.
// Usage: bench_engine [--benchmark_filter=...] (model paths from the build).
// scripts/compare_llamacpp.py section 5 reads bm_decode_batch against llama.cpp's decode.
#include <benchmark/benchmark.h>

#include <fstream>
#include <map>
#include <memory>

#include "workers/engine/forward.h"
#include "workers/engine/model.h"
#include "workers/engine/sampler.h"

namespace {

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
  std::unique_ptr<kvb::engine::Model> model;
  std::unique_ptr<Engine> engine;
};

Loaded* load(const std::string& path) {
  static std::map<std::string, Loaded> cache;
  auto it = cache.find(path);
  if (it != cache.end()) return &it->second;
  if (!std::ifstream(path).good()) return nullptr;
  Loaded l;
  l.model = kvb::engine::load_model(path);
  l.engine = std::make_unique<Engine>(*l.model);
  return &(cache[path] = std::move(l));
}

void bm_prefill(benchmark::State& state, std::string path) {
  Loaded* l = load(path);
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

void bm_decode(benchmark::State& state, std::string path) {
  Loaded* l = load(path);
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

void bm_decode_batch(benchmark::State& state, std::string path) {
  Loaded* l = load(path);
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

}  // namespace

BENCHMARK_MAIN();
