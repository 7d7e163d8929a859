// Google Benchmark: what isolating a chat template's render costs (render_sandbox.h). The same
// template (SmolLM2's, from the transformers fixture) on the same conversation, rendered by minja in
// this process (the baseline: what kvbench did before, unbounded) and through JinjaChatTemplate
// (a forked child under limits), with the process holding 0, 1 and 4 GiB of touched memory (a fork
// copies the page tables: the cost grows with the caller's resident set, as in a worker holding a
// model). Also the sandbox alone around an empty work (fork, pipe, wait).
#include <benchmark/benchmark.h>

#include <cstring>
#include <fstream>
#include <minja.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "workers/tokenizer/jinja_chat_template.h"
#include "workers/tokenizer/render_sandbox.h"

namespace {

using kvb::tokenizer::ChatMessage;
using kvb::tokenizer::JinjaChatTemplate;

std::string smollm2_template() {
  std::ifstream in(std::string(KVB_SOURCE_DIR) + "/tests/fixtures/tokenizer/chat_template_renders.json");
  const nlohmann::json doc = nlohmann::json::parse(in);
  for (const auto& f : doc["families"]) {
    if (f["name"] == "smollm2") return f["template"].get<std::string>();
  }
  return "";
}

const std::vector<ChatMessage> kConversation = {
    {"system", "You are a helpful assistant."},
    {"user", "Where is the needle?"},
    {"assistant", "In the haystack."},
    {"user", "Which line?"}};

// Memory the process holds while it renders (touched, so resident).
std::vector<char>& ballast(size_t mib) {
  static std::vector<char> b;
  if (b.size() != (mib << 20)) {
    b.assign(mib << 20, 0);
    for (size_t i = 0; i < b.size(); i += 4096) b[i] = 1;
  }
  return b;
}

void BM_RenderInProcess(benchmark::State& state) {
  ballast(static_cast<size_t>(state.range(0)));
  minja::Options o{};
  o.trim_blocks = true;
  o.lstrip_blocks = true;
  const auto root = minja::Parser::parse(smollm2_template(), o);
  using json = nlohmann::ordered_json;
  size_t bytes = 0;
  for (auto _ : state) {
    json msgs = json::array();
    for (const auto& m : kConversation) msgs.push_back({{"role", m.role}, {"content", m.content}});
    auto ctx = minja::Context::make(json({{"messages", msgs}, {"add_generation_prompt", true}}));
    bytes = root->render(ctx).size();
    benchmark::DoNotOptimize(bytes);
  }
  state.counters["out_bytes"] = static_cast<double>(bytes);
}

void BM_RenderSandboxed(benchmark::State& state) {
  ballast(static_cast<size_t>(state.range(0)));
  const JinjaChatTemplate t(smollm2_template(), "", "", "bench");
  size_t bytes = 0;
  for (auto _ : state) {
    bytes = t.render(kConversation, true).size();
    benchmark::DoNotOptimize(bytes);
  }
  state.counters["out_bytes"] = static_cast<double>(bytes);
}

void BM_SandboxEmptyWork(benchmark::State& state) {
  ballast(static_cast<size_t>(state.range(0)));
  const kvb::tokenizer::SandboxLimits limits;
  for (auto _ : state) {
    auto r = kvb::tokenizer::run_sandboxed([] { return std::string(); }, limits);
    benchmark::DoNotOptimize(r.status);
  }
}

// Interleaved by memory size: in-process, sandboxed, empty sandbox at 0, 1024, 4096 MiB.
BENCHMARK(BM_RenderInProcess)->Arg(0)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RenderSandboxed)->Arg(0)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SandboxEmptyWork)->Arg(0)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RenderInProcess)->Arg(1024)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RenderSandboxed)->Arg(1024)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SandboxEmptyWork)->Arg(1024)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RenderInProcess)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RenderSandboxed)->Arg(4096)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SandboxEmptyWork)->Arg(4096)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
