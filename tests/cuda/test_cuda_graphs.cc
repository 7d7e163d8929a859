// Decode steps as CUDA graphs (kernels/cuda/graph.h, cuda_of(engine).set_graphs; issue 16 "launch
// overhead"). The law: a captured step launches the same kernels with the same arguments as the
// step launched op by op, so with graphs on every step's logits, the device rows (lengths,
// positions, K/V bits), the index's keep-sets and the host traffic per step are identical to
// graphs off, for every registered policy and the variant flags that change the engine's path;
// the steps that qualify (decode_step_capturable: all but SubGen and weighted subgen_kcenter,
// which replace attention) all ran as graphs, most of them as in-place updates of the previous
// step's executable graph; policy_ms still measures the hooks (their events are graph nodes).
// The same for a decode batch (Engine::decode_batch). SmolLM2-135M, f32 and bf16 (the
// bf16 rows on the streamed and the tensor-core decode kernels), and stories260K in f32. Without
// a GPU every case skips.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "decode_batch_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/runtime.h"
#include "kernels/policies/policy.h"
#include "workers/engine/engine.h"
#include "workers/engine/cuda_engine.h"
#include "workers/engine/generate.h"
#include "workers/engine/model.h"
#include "workers/formats/model_load.h"
#include "workers/model_session.h"

namespace kvb {
namespace {

namespace cu = kvb::kernels::cuda;
using engine::DType;
using testing_batch::Variant;

const std::string kSmol = std::string(KVB_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kStories = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";

struct StepRun {
  std::vector<std::vector<float>> logits;  // after the prompt, then after each decode step
  kernels::KvCache device;                 // the device rows at the end
  std::vector<std::vector<int32_t>> keep;  // the index's positions per (layer, head)
  engine::TransferCounters moved;          // over the decode steps
  cu::GraphCounters graphs;                // over the decode steps (captures, updates, ...)
  double policy_ms = 0;                    // over the decode steps
};

std::string label(const Variant& v) {
  std::string s = v.policy.empty() ? "(no policy)" : v.policy;
  for (const auto& [k, val] : v.options) s += " " + k + "=" + val;
  return s;
}

bool capturable(const engine::Model& m, const Variant& v) {
  std::unique_ptr<policies::Policy> p = testing_batch::make(m, v, 8);
  return engine::decode_step_capturable(p.get(), p ? p->decode_request() : policies::StatsRequest{},
                                        /*host_rows=*/false, /*device_ops=*/true);
}

// Prefill then `steps` teacher-forced decode steps (fixed tokens: both runs see the same).
StepRun run_steps(engine::Engine& eng, const engine::Model& m, const Variant& v, int budget,
                  const std::vector<int32_t>& prompt, int steps, bool graphs) {
  engine::cuda_of(eng).set_graphs(graphs);
  StepRun r;
  std::unique_ptr<policies::Policy> policy = testing_batch::make(m, v, budget);
  kernels::KvCache cache = eng.new_cache(0, policy.get());
  std::vector<float> logits;
  engine::prefill_prompt(eng, cache, prompt, policy.get(), &logits);
  r.logits.push_back(logits);
  const engine::TransferCounters t0 = eng.transfer_counters();
  const cu::GraphCounters g0 = engine::cuda_of(eng).graph_counters();
  const double ms0 = eng.policy_ms();
  const int V = m.config.vocab_size;
  for (int t = 0; t < steps; ++t) {
    const int32_t token = (3 + 17 * t) % V;
    eng.forward({&token, 1}, cache, engine::LogitsMode::kLast, &logits, policy.get(),
                engine::PolicyHook::kDecode);
    r.logits.push_back(logits);
  }
  const engine::TransferCounters t1 = eng.transfer_counters();
  const cu::GraphCounters& g1 = engine::cuda_of(eng).graph_counters();
  r.moved.d2h_copies = t1.d2h_copies - t0.d2h_copies;
  r.moved.h2d_copies = t1.h2d_copies - t0.h2d_copies;
  r.moved.stream_syncs = t1.stream_syncs - t0.stream_syncs;
  r.moved.d2h_bytes = t1.d2h_bytes - t0.d2h_bytes;
  r.moved.h2d_bytes = t1.h2d_bytes - t0.h2d_bytes;
  r.graphs.captures = g1.captures - g0.captures;
  r.graphs.updates = g1.updates - g0.updates;
  r.graphs.instantiations = g1.instantiations - g0.instantiations;
  r.graphs.aborted = g1.aborted - g0.aborted;
  r.graphs.last_nodes = g1.last_nodes;
  r.policy_ms = eng.policy_ms() - ms0;
  r.device = engine::cuda_of(eng).download_device_rows(cache);
  const auto& sh = cache.shape();
  for (int l = 0; l < sh.num_layers; ++l) {
    const kernels::LayerKvView view = cache.layer(l);
    for (int h = 0; h < sh.num_kv_heads; ++h) {
      r.keep.emplace_back(view.position(h), view.position(h) + cache.length(l, h));
    }
  }
  engine::cuda_of(eng).set_graphs(false);
  return r;
}

// Device rows bit for bit: lengths, positions, keys, values.
void expect_same_rows(const kernels::KvCache& a, const kernels::KvCache& b) {
  ASSERT_EQ(a.shape().num_layers, b.shape().num_layers);
  ASSERT_EQ(a.shape().num_kv_heads, b.shape().num_kv_heads);
  EXPECT_EQ(a.next_position(), b.next_position());
  const size_t row = static_cast<size_t>(a.shape().head_dim) * sizeof(float);
  for (int l = 0; l < a.shape().num_layers; ++l) {
    const kernels::LayerKvView va = a.layer(l), vb = b.layer(l);
    for (int h = 0; h < a.shape().num_kv_heads; ++h) {
      const int len = a.length(l, h);
      ASSERT_EQ(len, b.length(l, h)) << "layer " << l << " head " << h;
      if (len == 0) continue;
      EXPECT_EQ(0, std::memcmp(va.position(h), vb.position(h), len * sizeof(int32_t)))
          << "positions, layer " << l << " head " << h;
      EXPECT_EQ(0, std::memcmp(va.key(h, 0), vb.key(h, 0), row * len))
          << "keys, layer " << l << " head " << h;
      EXPECT_EQ(0, std::memcmp(va.value(h, 0), vb.value(h, 0), row * len))
          << "values, layer " << l << " head " << h;
    }
  }
}

// Every variant, graphs off then on, on `eng`: the law, and the graph counters.
void check_every_variant(engine::Engine& eng, const engine::Model& m,
                         const std::vector<int32_t>& prompt, int steps) {
  const int budget = std::max(8, static_cast<int>(prompt.size()) / 3);
  int64_t updates = 0, captured_variants = 0;
  for (const Variant& v : testing_batch::variants()) {
    SCOPED_TRACE(label(v));
    const StepRun off = run_steps(eng, m, v, budget, prompt, steps, false);
    const StepRun on = run_steps(eng, m, v, budget, prompt, steps, true);
    ASSERT_EQ(off.logits.size(), on.logits.size());
    for (size_t s = 0; s < off.logits.size(); ++s) {
      ASSERT_EQ(off.logits[s], on.logits[s]) << "logits after step " << s << " (0: the prompt)";
    }
    expect_same_rows(off.device, on.device);
    EXPECT_EQ(off.keep, on.keep);
    EXPECT_EQ(off.moved.d2h_copies, on.moved.d2h_copies);
    EXPECT_EQ(off.moved.h2d_copies, on.moved.h2d_copies);
    EXPECT_EQ(off.moved.stream_syncs, on.moved.stream_syncs);
    EXPECT_EQ(off.moved.d2h_bytes, on.moved.d2h_bytes);
    EXPECT_EQ(off.moved.h2d_bytes, on.moved.h2d_bytes);
    EXPECT_EQ(off.graphs.captures, 0);
    EXPECT_EQ(on.graphs.aborted, 0);
    const bool want = capturable(m, v);
    EXPECT_EQ(on.graphs.captures, want ? steps : 0);
    EXPECT_EQ(on.graphs.updates + on.graphs.instantiations, on.graphs.captures);
    std::printf("  %-44s graphs %lld/%d: %lld updated in place, %lld instantiated, %zu nodes\n",
                label(v).c_str(), static_cast<long long>(on.graphs.captures), steps,
                static_cast<long long>(on.graphs.updates),
                static_cast<long long>(on.graphs.instantiations), on.graphs.last_nodes);
    if (want) {
      ++captured_variants;
      updates += on.graphs.updates;
      // A decode step has at least one launch per layer.
      EXPECT_GE(on.graphs.last_nodes, static_cast<size_t>(m.config.num_layers));
    }
    // Hooks that work at decode on the device are timed by events inside the graph.
    std::unique_ptr<policies::Policy> p = testing_batch::make(m, v, budget);
    if (want && p && p->decides_with_ops()) {
      const policies::StatsRequest req = p->decode_request();
      if (req.col_sums || req.last_w > 0 || req.pre_rope_keys) {
        EXPECT_GT(off.policy_ms, 0);
        EXPECT_GT(on.policy_ms, 0);
      }
    }
  }
  EXPECT_GT(captured_variants, 10);
  // Steady steps keep the previous step's graph topology: updated in place, not rebuilt.
  EXPECT_GT(updates, captured_variants);
}

// stories260K (no tokenizer needed: a fixed prompt of ids), f32: the law without SmolLM2, so
// the first device stage (scripts/device_check.sh first) runs it.
TEST(CudaGraphsStories, F32EveryPolicyStepsAsLaunchedOneByOne) {
  if (!cu::has_device()) GTEST_SKIP() << "no CUDA device visible";
  if (!std::ifstream(kStories).good()) GTEST_SKIP() << kStories << " missing";
  std::unique_ptr<engine::Model> m = engine::load_model(kStories);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((5 + 37 * i) % m->config.vocab_size);
  engine::Engine eng(*m, engine::cuda_backend(*m, DType::kF32));
  check_every_variant(eng, *m, prompt, 12);
}

class CudaGraphsSmol : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cu::has_device()) GTEST_SKIP() << "no CUDA device visible";
    if (!std::ifstream(kSmol).good()) GTEST_SKIP() << kSmol << " missing (scripts/fetch_models.sh)";
    lm_ = workers::load_model_and_tokenizer(kSmol, "");
    prompt_ = workers::encode_prompt(
        lm_, "Explain in simple words why the sky is blue during the day and red at sunset.",
        /*chat=*/true, "");
  }
  workers::LoadedModel lm_;
  std::vector<int32_t> prompt_;
};

TEST_F(CudaGraphsSmol, F32EveryPolicyStepsAsLaunchedOneByOne) {
  engine::Engine eng(*lm_.model, engine::cuda_backend(*lm_.model, DType::kF32));
  check_every_variant(eng, *lm_.model, prompt_, 12);
}

TEST_F(CudaGraphsSmol, Bf16EveryPolicyStepsAsLaunchedOneByOneOnBothDecodeKernels) {
  engine::Engine eng(*lm_.model, engine::cuda_backend(*lm_.model, DType::kBf16));
  for (int kernel : {cu::kDecodeDefault, cu::kDecodeTensorCore}) {
    SCOPED_TRACE(kernel == cu::kDecodeDefault ? "default decode kernel" : "tensor cores");
    engine::cuda_of(eng).set_decode_kernel(kernel);
    check_every_variant(eng, *lm_.model, prompt_, 8);
  }
}

// A decode batch of the capturable variants, graphs off then on: each run keeps the batch law
// (every row equals the sequence decoded alone), and the two runs' rows are equal bit for bit.
TEST_F(CudaGraphsSmol, F32DecodeBatchStepsAsLaunchedOneByOne) {
  const engine::Model& m = *lm_.model;
  engine::Engine eng(m, engine::cuda_backend(m, DType::kF32));
  std::vector<Variant> vars;
  for (const Variant& v : testing_batch::variants()) {
    if (capturable(m, v)) vars.push_back(v);
  }
  ASSERT_GT(vars.size(), 10u);
  std::map<std::pair<int, int>, std::vector<float>> rows[2];
  int64_t captured = 0;
  for (int mode = 0; mode < 2; ++mode) {
    engine::cuda_of(eng).set_graphs(mode == 1);
    const int64_t c0 = engine::cuda_of(eng).graph_counters().captures;
    testing_batch::BatchRun run;
    testing_batch::run_variants_against_alone(
        eng, m, vars, 12, 10, 24, &run,
        [&](int b, int t, const std::vector<float>& row, const std::vector<float>& alone) {
          ASSERT_EQ(row, alone) << "sequence " << b << " (" << label(run.vars[b]) << ") step " << t
                                << (mode ? " (graphs)" : "");
          rows[mode][{b, t}] = row;
        });
    if (HasFatalFailure()) return;
    if (mode == 1) captured = engine::cuda_of(eng).graph_counters().captures - c0;
    EXPECT_EQ(run.batched_steps, 10);
  }
  engine::cuda_of(eng).set_graphs(false);
  ASSERT_EQ(rows[0].size(), rows[1].size());
  for (const auto& [key, row] : rows[0]) {
    EXPECT_EQ(row, rows[1][key]) << "sequence " << key.first << " step " << key.second;
  }
  // Every batch step and every alone step ran as a graph, and so did each token of a streamed
  // prefill (forward of one token with the decode hook), twice: the alone and the batch caches.
  int64_t streamed = 0;
  for (size_t b = 0; b < vars.size(); ++b) {
    std::unique_ptr<policies::Policy> p = testing_batch::make(m, vars[b], 12);
    if (p && p->prefill_mode() == policies::PrefillMode::kStreaming) {
      streamed += 2 * (24 + 3 * static_cast<int64_t>(b));
    }
  }
  EXPECT_GT(streamed, 0);  // h2o prefill=streaming is among the variants
  EXPECT_EQ(captured, 10 + static_cast<int64_t>(rows[1].size()) + streamed);
}

}  // namespace
}  // namespace kvb
