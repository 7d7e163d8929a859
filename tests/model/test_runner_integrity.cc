// The runner's integrity guarantees (issue 14), on stories260K: a unit that throws std::bad_alloc
// ends `oom` and its bundle's other units finish, and so does a unit over the resident-memory
// cap (--max-rss-gb); a model whose logits are not finite fails the
// unit with an error naming the step instead of an empty "ok" prediction; a shared prefill counts
// toward every unit that used it, in ttft_ms and against the unit time limit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "common/error.h"
#include "workers/runner.h"

namespace kvb {
namespace {

const std::string kModel = std::string(KVB_SHARED_DIR) + "/models/stories260K/stories260K.bin";
const std::string kTok = std::string(KVB_SHARED_DIR) + "/models/stories260K/tok512.bin";

tasks::Sample story() {
  tasks::Sample s;
  s.id = "story";
  s.chat = false;
  s.context =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park. One day, she saw a big, red ball.";
  s.question = " Then Lily";
  s.max_new_tokens = 8;
  return s;
}

std::vector<policies::PolicyConfig> policies_of(const workers::LoadedModel& lm,
                                                const std::vector<std::string>& names) {
  const auto& c = lm.model->config;
  std::vector<policies::PolicyConfig> pcs;
  for (const std::string& name : names) {
    policies::PolicyConfig pc;
    pc.name = name;
    pc.kv_budget = name == "full" ? 0 : 16;
    pc.shape = {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.max_seq_len};
    pcs.push_back(pc);
  }
  return pcs;
}

TEST(RunnerIntegrity, BadAllocEndsTheUnitOomAndTheBundleGoesOn) {
  workers::LoadedModel lm = workers::load_model_and_tokenizer(kModel, kTok);
  engine::Engine eng(*lm.model);
  const auto pcs = policies_of(lm, {"full", "h2o", "snapkv"});
  workers::RunSettings rs;
  rs.faults.bad_alloc_unit = 1;  // h2o
  std::vector<std::optional<workers::UnitFailure>> failures;
  const auto outs = workers::run_bundle(lm, eng, story(), pcs, rs, true, &failures);
  ASSERT_EQ(failures.size(), 3u);
  ASSERT_TRUE(failures[1].has_value());
  EXPECT_EQ(failures[1]->status, workers::FailureStatus::kOom);
  EXPECT_NE(failures[1]->message.find("sample story, policy h2o"), std::string::npos)
      << failures[1]->message;
  EXPECT_NE(failures[1]->message.find("out of host memory"), std::string::npos);
  EXPECT_FALSE(failures[0].has_value());
  EXPECT_FALSE(failures[2].has_value());
  EXPECT_EQ(outs[0].m.generated_tokens, 8);
  EXPECT_EQ(outs[2].m.generated_tokens, 8);
  // Without `failures` the exception propagates as it was (eval's path).
  EXPECT_THROW(workers::run_bundle(lm, eng, story(), pcs, rs, true), std::bad_alloc);
}

// --max-rss-gb (RunSettings::max_rss_bytes): under a cap below the process's resident set every
// unit ends `oom` with a message naming the cap, and the bundle goes on; a cap far above it
// changes nothing (the same tokens as without one).
TEST(RunnerIntegrity, ResidentMemoryCapEndsUnitsOom) {
  workers::LoadedModel lm = workers::load_model_and_tokenizer(kModel, kTok);
  engine::Engine eng(*lm.model);
  const auto pcs = policies_of(lm, {"full", "h2o", "snapkv"});
  workers::RunSettings rs;
  const auto free_run = workers::run_bundle(lm, eng, story(), pcs, rs, true);
  rs.max_rss_bytes = size_t{1} << 20;  // 1 MiB: below any process's resident set
  std::vector<std::optional<workers::UnitFailure>> failures;
  (void)workers::run_bundle(lm, eng, story(), pcs, rs, true, &failures);
  ASSERT_EQ(failures.size(), 3u);
  for (const auto& f : failures) {
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->status, workers::FailureStatus::kOom);
    EXPECT_NE(f->message.find("sample story: the worker's resident memory, "), std::string::npos)
        << f->message;
    EXPECT_NE(f->message.find("MiB, is above the cap of 1 MiB (--max-rss-gb"), std::string::npos)
        << f->message;
  }
  EXPECT_THROW(workers::run_bundle(lm, eng, story(), pcs, rs, true), workers::UnitMemoryLimit);
  rs.max_rss_bytes = size_t{1} << 46;  // 64 TiB
  failures.clear();
  const auto capped = workers::run_bundle(lm, eng, story(), pcs, rs, true, &failures);
  for (size_t i = 0; i < pcs.size(); ++i) {
    EXPECT_FALSE(failures[i].has_value()) << pcs[i].name;
    EXPECT_EQ(capped[i].prediction.text, free_run[i].prediction.text) << pcs[i].name;
    EXPECT_EQ(capped[i].m.generated_tokens, 8);
  }
}

TEST(RunnerIntegrity, FailuresAreClassifiedByType) {
  auto classify = [](auto thrower) {
    try {
      thrower();
    } catch (...) {
      return workers::current_failure("ctx");
    }
    return workers::UnitFailure{workers::FailureStatus::kCrashed, "nothing thrown"};
  };
  using workers::FailureStatus;
  EXPECT_EQ(classify([] { throw std::bad_alloc(); }).status, FailureStatus::kOom);
  // A huge std::vector throws length_error before it asks the allocator.
  EXPECT_EQ(classify([] {
              std::vector<double> v;
              v.resize(std::numeric_limits<size_t>::max() / 4);
            }).status,
            FailureStatus::kOom);
  EXPECT_EQ(classify([] { throw workers::UnitTimeout("slow"); }).status, FailureStatus::kTimeout);
  EXPECT_EQ(classify([] { throw workers::UnitMemoryLimit("big"); }).status, FailureStatus::kOom);
  const workers::UnitFailure other = classify([] { throw std::out_of_range("map::at"); });
  EXPECT_EQ(other.status, FailureStatus::kError);
  EXPECT_EQ(other.message, "ctx: map::at");
  EXPECT_EQ(classify([] { throw Error("bad sample"); }).status, FailureStatus::kError);
  // What is not a std::exception (a library's own type) is the unit's error too, saying so.
  const workers::UnitFailure foreign = classify([] { throw 42; });
  EXPECT_EQ(foreign.status, FailureStatus::kError);
  EXPECT_EQ(foreign.message, "ctx: an exception that is not a std::exception (it carries no message)");
  // A failed device allocation (KVB_CUDA_CHECK on cudaErrorMemoryAllocation) is the unit's oom.
  const workers::UnitFailure device = classify([] {
    throw Error("cudaMalloc(&p, bytes): cudaErrorMemoryAllocation: out of memory",
                ErrorKind::kOutOfMemory);
  });
  EXPECT_EQ(device.status, FailureStatus::kOom);
  EXPECT_NE(device.message.find("ctx: out of device memory"), std::string::npos) << device.message;
  EXPECT_STREQ(workers::to_string(FailureStatus::kOom), "oom");
}

// A copy of stories260K whose weights are all NaN (llama2.c: 7 int32 of config, then f32).
std::string nan_model() {
  const std::string path = std::string(KVB_BINARY_DIR) + "/stories260K_nan.bin";
  std::filesystem::copy_file(kModel, path, std::filesystem::copy_options::overwrite_existing);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  const auto size = std::filesystem::file_size(path);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  f.seekp(7 * 4);
  for (uint64_t off = 7 * 4; off + 4 <= size; off += 4) f.write(reinterpret_cast<const char*>(&nan), 4);
  return path;
}

TEST(RunnerIntegrity, NonFiniteLogitsFailTheUnitNamingTheStep) {
  workers::LoadedModel lm = workers::load_model_and_tokenizer(nan_model(), kTok);
  engine::Engine eng(*lm.model);
  const auto pcs = policies_of(lm, {"full", "h2o"});
  std::vector<std::optional<workers::UnitFailure>> failures;
  workers::run_bundle(lm, eng, story(), pcs, {}, true, &failures);
  for (size_t i = 0; i < pcs.size(); ++i) {
    ASSERT_TRUE(failures[i].has_value()) << pcs[i].name << " ended ok on NaN weights";
    EXPECT_EQ(failures[i]->status, workers::FailureStatus::kError);
    EXPECT_NE(failures[i]->message.find("sample story: the logits after the prompt's prefill are "
                                        "not finite"),
              std::string::npos)
        << failures[i]->message;
  }
  // Perplexity reads every step's logits: the first step fails.
  tasks::Sample ppl;
  ppl.id = "ppl";
  ppl.kind = tasks::SampleKind::kPerplexity;
  ppl.text = "Once upon a time, there was a little girl.";
  try {
    workers::run_sample(lm, eng, ppl, pcs[0], {});
    ADD_FAILURE() << "perplexity on NaN weights did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("perplexity step 1 are not finite"), std::string::npos)
        << e.what();
  }
}

// A shared prefill made slow (1 s, a test hook inside the timed pass) is part of every unit's
// time to first token and of its time against the limit.
TEST(RunnerIntegrity, SharedPrefillCountsTowardTtftAndTheTimeLimit) {
  workers::LoadedModel lm = workers::load_model_and_tokenizer(kModel, kTok);
  engine::Engine eng(*lm.model);
  const auto pcs = policies_of(lm, {"full", "h2o", "snapkv"});
  workers::RunSettings rs;
  rs.faults.shared_prefill_sleep_ms = 1000;
  const auto outs = workers::run_bundle(lm, eng, story(), pcs, rs, true);
  for (const auto& o : outs) {
    EXPECT_TRUE(o.m.prefill_shared);
    EXPECT_GE(o.m.prefill_ms, 1000.0);
    EXPECT_GE(o.m.ttft_ms, o.m.prefill_ms);
  }
  // The 1 s shared pass alone is over a 0.5 s limit, so every unit that used it times out, and
  // says that the shared pass counted (each unit's own work on stories260K takes milliseconds on
  // an idle machine; before the fix the limit saw only that and the units ended ok).
  rs.time_limit_s = 0.5;
  std::vector<std::optional<workers::UnitFailure>> failures;
  workers::run_bundle(lm, eng, story(), pcs, rs, true, &failures);
  for (size_t i = 0; i < pcs.size(); ++i) {
    ASSERT_TRUE(failures[i].has_value()) << pcs[i].name << " ended ok past its time limit";
    EXPECT_EQ(failures[i]->status, workers::FailureStatus::kTimeout);
    EXPECT_NE(failures[i]->message.find("in the prefill shared"), std::string::npos)
        << failures[i]->message;
    // The limit as the user wrote it (it said "0.500000 s"), and whole milliseconds.
    EXPECT_NE(failures[i]->message.find("unit time limit of 0.5 s exceeded after "),
              std::string::npos)
        << failures[i]->message;
    EXPECT_EQ(failures[i]->message.find(".000"), std::string::npos) << failures[i]->message;
  }
}

}  // namespace
}  // namespace kvb
