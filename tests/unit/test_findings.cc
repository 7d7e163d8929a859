// A paper's claims with verdicts (results/findings.h; the rule in configs/README.md "Findings"),
// on hand-built databases whose contrasts are worked out by hand in each case's comment; and the
// `findings:` section of a sweep config (harness/findings_config.h): what it reads, what it
// refuses before a sweep starts.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "harness/findings_config.h"
#include "harness/sweep_config.h"
#include "results/analysis.h"
#include "results/findings.h"
#include "results/stats.h"
#include "results/store.h"
#include "tasks/fed_tokens.h"
#include "tasks/task.h"

namespace kvb::results {
namespace {

namespace fs = std::filesystem;

struct U {
  std::string sample, policy, budget;
  double value;
  std::map<std::string, std::string> options = {};
  std::string model = "m";
};

// A database of ok units of task `task` with one metric each.
Store make_db(const std::string& name, const std::string& task, const std::string& metric,
              bool higher_is_better, const std::vector<U>& units) {
  const fs::path dir = fs::path(KVB_BINARY_DIR) / "test_findings";
  fs::create_directories(dir);
  const std::string path = (dir / (name + ".db")).string();
  fs::remove(path);
  Store store = Store::open(path, Mode::kReadWrite);
  RunInfo info;
  info.config_text = "x";
  info.git_rev = "r";
  info.kvbench_version = "0";
  info.host = "h";
  const int64_t run = store.begin_run(info);
  std::vector<UnitRow> rows;
  for (const U& u : units) {
    UnitRow row;
    row.model = u.model;
    row.spec.model_sha256 = std::string(64, 'a');
    row.spec.task = task;
    row.spec.sample_id = u.sample;
    row.spec.policy = u.policy;
    row.spec.policy_options = u.options;
    row.spec.kv_budget_spec = u.budget;
    rows.push_back(row);
  }
  const std::vector<std::string> keys = store.register_units(run, rows);
  store.mark_running(run, keys, 1, "h");
  std::vector<UnitResult> results;
  for (size_t i = 0; i < units.size(); ++i) {
    UnitResult r;
    r.unit_key = keys[i];
    r.metrics = {{metric, units[i].value, higher_is_better}};
    results.push_back(r);
  }
  store.write_bundle(results);
  return store;
}

Claim compare_claim(const std::string& policy, const std::vector<std::string>& budgets,
                    Expect expect, double margin, bool percent = false,
                    const std::string& metric = "recall", const std::string& task = "niah") {
  Claim c;
  c.id = "c";
  c.text = "a claim";
  c.task = task;
  c.metric = metric;
  c.expect = expect;
  c.margin = margin;
  c.margin_percent = percent;
  for (const std::string& b : budgets) {
    FindingInstance inst;
    inst.label = b;
    inst.cells = {{1, policy, {}, b}, {-1, "full", {}, ""}};
    inst.against = 1;
    c.instances.push_back(inst);
  }
  return c;
}

std::vector<FindingRow> run(const Store& s, const Claim& c,
                            const std::vector<FindingBaseline>& baselines = {}) {
  Findings f;
  f.paper = "P";
  f.baselines = baselines;
  f.claims = {c};
  return evaluate_findings(s, f);
}

// d is the same on every sample: the interval collapses to it, and the verdict is decided at the
// margin's boundary exactly as the table says (>= for at_least's reproduced, <= for better's not).
TEST(Findings, EqualContrastsDecideAtTheMarginBoundaries) {
  // recall: full 1, 1, 0; h2o 1, 1, 0: d = 0, 0, 0 (mean 0, lo = hi = 0).
  const Store s = make_db("equal", "niah", "recall", true,
                          {{"a", "full", "", 1},
                           {"b", "full", "", 1},
                           {"c", "full", "", 0},
                           {"a", "h2o", "128", 1},
                           {"b", "h2o", "128", 1},
                           {"c", "h2o", "128", 0}});
  auto verdict = [&](Expect e, double m) { return run(s, compare_claim("h2o", {"128"}, e, m)); };
  std::vector<FindingRow> r = verdict(Expect::kAtLeast, 0);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].n, 3);
  EXPECT_EQ(r[0].contrast, 0);
  EXPECT_EQ(r[0].lo, 0);
  EXPECT_EQ(r[0].hi, 0);
  EXPECT_EQ(r[0].verdict, "reproduced");  // lo 0 >= -0
  EXPECT_EQ(r[0].budget, "128");
  EXPECT_EQ(verdict(Expect::kBetter, 0)[0].verdict, "not reproduced");  // hi 0 <= 0
  EXPECT_EQ(verdict(Expect::kWorse, 0)[0].verdict, "not reproduced");   // lo 0 >= -0
  EXPECT_EQ(verdict(Expect::kBetter, 0.5)[0].verdict, "not reproduced");
}

// ppl is lower-is-better: values are negated, so h2o's higher perplexity is a negative contrast,
// and a percent margin is taken of full's mean perplexity over the paired samples.
TEST(Findings, LowerIsBetterIsNegatedAndPercentMarginsScaleAgainstsMean) {
  // full ppl 10, 12 (mean 11); h2o 11, 13: d = -11 - (-10) = -1 and -13 - (-12) = -1.
  const Store s = make_db("ppl", "perplexity", "ppl", false,
                          {{"a", "full", "", 10},
                           {"b", "full", "", 12},
                           {"a", "h2o", "0.2 ratio", 11},
                           {"b", "h2o", "0.2 ratio", 13}});
  // 10% of 11 = 1.1: lo = -1 >= -1.1, reproduced.
  std::vector<FindingRow> r =
      run(s, compare_claim("h2o", {"0.2 ratio"}, Expect::kAtLeast, 10, true, "ppl", "perplexity"));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].contrast, -1);
  EXPECT_NEAR(r[0].margin, 1.1, 1e-12);
  EXPECT_EQ(r[0].verdict, "reproduced");
  // 5% of 11 = 0.55: hi = -1 < -0.55, not reproduced.
  r = run(s, compare_claim("h2o", {"0.2 ratio"}, Expect::kAtLeast, 5, true, "ppl", "perplexity"));
  EXPECT_NEAR(r[0].margin, 0.55, 1e-12);
  EXPECT_EQ(r[0].verdict, "not reproduced");
  // worse by more than 0.5 (absolute): hi = -1 < -0.5, reproduced.
  r = run(s, compare_claim("h2o", {"0.2 ratio"}, Expect::kWorse, 0.5, false, "ppl", "perplexity"));
  EXPECT_EQ(r[0].verdict, "reproduced");
}

// One budget fails: the claim over both is not reproduced; the interval of a varying contrast is
// paired_bootstrap's own.
TEST(Findings, OneFailingBudgetFailsTheClaimAndIntervalsAreTheBootstraps) {
  // At 128: h2o - full = 0, -1, 0, 0 (a miss on b). At 256: 0, 0, 0, 0.
  std::vector<U> u;
  for (const char* id : {"a", "b", "c", "d"}) u.push_back({id, "full", "", 1});
  for (const char* id : {"a", "c", "d"}) u.push_back({id, "h2o", "128", 1});
  u.push_back({"b", "h2o", "128", 0});
  for (const char* id : {"a", "b", "c", "d"}) u.push_back({id, "h2o", "256", 1});
  const Store s = make_db("two", "niah", "recall", true, u);
  // better by more than 0: at 256 d = 0 everywhere, so hi = 0 <= 0, not reproduced; at 128 the
  // mean is -0.25 and the interval is the bootstrap's.
  const std::vector<FindingRow> r =
      run(s, compare_claim("h2o", {"128", "256"}, Expect::kAtLeast, 0));
  ASSERT_EQ(r.size(), 3u);
  const PairedComparison pc = paired_bootstrap({0, -1, 0, 0}, {0, 0, 0, 0}, 10000, 0);
  EXPECT_EQ(r[0].budget, "128");
  EXPECT_EQ(r[0].contrast, -0.25);
  EXPECT_EQ(r[0].lo, pc.lo);
  EXPECT_EQ(r[0].hi, pc.hi);
  // Resamples of {0, -1, 0, 0}: means in {0, -0.25, -0.5, -0.75, -1}; lo < 0 and hi = 0, so the
  // interval holds -0 (the margin): inconclusive.
  EXPECT_LT(pc.lo, 0);
  EXPECT_EQ(pc.hi, 0);
  EXPECT_EQ(r[0].verdict, "inconclusive");
  EXPECT_EQ(r[1].budget, "256");
  EXPECT_EQ(r[1].verdict, "reproduced");  // d all 0: lo 0 >= -0
  EXPECT_EQ(r[2].budget, "all");
  EXPECT_EQ(r[2].verdict, "inconclusive");  // one reproduced, one inconclusive
  EXPECT_EQ(r[2].n, -1);
  // With a margin of 0.1 worse-than-full refuted at 128? at_least with m = 0: tested above. Now
  // `worse` by more than 0: at 256 lo = 0 >= -0, not reproduced, so the claim is not reproduced.
  const std::vector<FindingRow> w = run(s, compare_claim("h2o", {"128", "256"}, Expect::kWorse, 0));
  EXPECT_EQ(w[1].verdict, "not reproduced");
  EXPECT_EQ(w[2].verdict, "not reproduced");
  EXPECT_EQ(w[2].why, "1 of 2 budgets not reproduced");
}

// A baseline that full misses makes every claim on the task inconclusive, saying why; `above`
// takes the Wilson interval's low end of 0/1 scores.
TEST(Findings, AFailedBaselineMakesTheClaimInconclusive) {
  // full recall 1, 0 (mean 0.5); h2o the same: d = 0, reproduced without a baseline.
  const Store s = make_db(
      "base", "niah", "recall", true,
      {{"a", "full", "", 1}, {"b", "full", "", 0}, {"a", "h2o", "128", 1}, {"b", "h2o", "128", 0}});
  const Claim c = compare_claim("h2o", {"128"}, Expect::kAtLeast, 0);
  EXPECT_EQ(run(s, c)[0].verdict, "reproduced");
  std::vector<FindingRow> r = run(s, c, {{"niah", "recall", false, 0.9}});
  EXPECT_EQ(r[0].verdict, "inconclusive");
  EXPECT_EQ(r[0].why.rfind("baseline: full's recall is 0.500", 0), 0u) << r[0].why;
  EXPECT_EQ(r[0].contrast, 0);  // the measurement is still shown
  EXPECT_EQ(run(s, c, {{"niah", "recall", false, 0.5}})[0].verdict, "reproduced");  // 0.5 >= 0.5
  // Wilson for 1 of 2 at 95% (z = 1.959964, z^2 = 3.841459): center (0.5 + 0.960365) / (1 +
  // 1.920729) = 0.5, half = 1.959964 / 2.920729 * sqrt(0.125 + 3.841459 / 16) = 0.671049 *
  // 0.604228 = 0.405467: low end 0.094533, so a bar above 0.1 is missed and one above 0.09 cleared.
  EXPECT_EQ(run(s, c, {{"niah", "recall", true, 0.1}})[0].verdict, "inconclusive");
  EXPECT_EQ(run(s, c, {{"niah", "recall", true, 0.09}})[0].verdict, "reproduced");
  // A baseline of another task does not apply.
  EXPECT_EQ(run(s, c, {{"ruler", "recall", false, 0.9}})[0].verdict, "reproduced");
}

// Options pick a policy entry by subset; two matching option sets, or none, are inconclusive with
// the reason, as is a contrast of fewer than 2 paired samples.
TEST(Findings, AmbiguousMissingAndUnpairedCellsAreInconclusive) {
  const Store s =
      make_db("opts", "niah", "recall", true,
              {{"a", "full", "", 1},
               {"b", "full", "", 1},
               {"a", "h2o", "128", 1, {{"prefill", "oneshot"}, {"heavy_fraction", "0.5"}}},
               {"b", "h2o", "128", 1, {{"prefill", "oneshot"}, {"heavy_fraction", "0.5"}}},
               {"a", "h2o", "128", 0, {{"prefill", "streaming"}, {"heavy_fraction", "0.5"}}},
               {"b", "h2o", "128", 0, {{"prefill", "streaming"}, {"heavy_fraction", "0.5"}}},
               {"a", "window", "128", 0}});
  Claim c = compare_claim("h2o", {"128"}, Expect::kAtLeast, 0);
  c.instances[0].cells[0].options = {{"heavy_fraction", "0.5"}};
  std::vector<FindingRow> r = run(s, c);
  EXPECT_EQ(r[0].verdict, "inconclusive");
  EXPECT_NE(r[0].why.find("ambiguous"), std::string::npos) << r[0].why;
  EXPECT_EQ(r[0].n, -1);
  // prefill=streaming: d = -1, -1, worse than full by 1.
  c.instances[0].cells[0].options = {{"prefill", "streaming"}};
  r = run(s, c);
  EXPECT_EQ(r[0].n, 2);
  EXPECT_EQ(r[0].contrast, -1);
  EXPECT_EQ(r[0].verdict, "not reproduced");
  c.instances[0].cells[0].options = {{"prefill", "oneshot"}};
  EXPECT_EQ(run(s, c)[0].verdict, "reproduced");  // d = 0, 0
  c.instances[0].cells[0].options = {{"prefill", "none"}};
  r = run(s, c);
  EXPECT_EQ(r[0].verdict, "inconclusive");
  EXPECT_EQ(r[0].why, "no ok units of h2o prefill=none at 128");
  // window has one sample: n = 1.
  r = run(s, compare_claim("window", {"128"}, Expect::kWorse, 0));
  EXPECT_EQ(r[0].n, 1);
  EXPECT_EQ(r[0].verdict, "inconclusive");
  // Per model: a second model's rows come after the first's (names sorted).
  r = run(s, compare_claim("h2o", {"256"}, Expect::kWorse, 0));
  EXPECT_EQ(r[0].why, "no ok units of h2o at 256");
}

// A weighted contrast of four cells: the difference of two gains, per sample.
TEST(Findings, WeightedContrastIsTheDifferenceOfGains) {
  // gain of ada over snap: at 128 = 1, 1, 1 (ada 1, snap 0); at 1024 = 0, 0, 0 (both 1).
  // d = (1 - 0) - (1 - 1) = 1 per sample: better by more than 0.5, reproduced.
  std::vector<U> u;
  for (const char* id : {"a", "b", "c"}) {
    u.push_back({id, "ada", "128", 1});
    u.push_back({id, "snap", "128", 0});
    u.push_back({id, "ada", "1024", 1});
    u.push_back({id, "snap", "1024", 1});
  }
  const Store s = make_db("contrast", "niah", "recall", true, u);
  Claim c;
  c.id = "trend";
  c.text = "t";
  c.task = "niah";
  c.metric = "recall";
  c.expect = Expect::kBetter;
  c.margin = 0.5;
  c.instances = {{"-",
                  {{1, "ada", {}, "128"},
                   {-1, "snap", {}, "128"},
                   {-1, "ada", {}, "1024"},
                   {1, "snap", {}, "1024"}},
                  -1}};
  const std::vector<FindingRow> r = run(s, c);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].n, 3);
  EXPECT_EQ(r[0].contrast, 1);
  EXPECT_EQ(r[0].verdict, "reproduced");
  EXPECT_EQ(r[0].budget, "-");
}

// Two option sets of one policy are two rows of every table, not one averaged row (the paper
// configs sweep h2o with prefill oneshot and streaming side by side); a policy with one option
// set keeps its bare name.
TEST(PolicyVariants, TablesTellAPolicysOptionSetsApart) {
  const Store s = make_db("variants", "niah", "recall", true,
                          {{"a", "full", "", 1},
                           {"b", "full", "", 1},
                           {"a", "h2o", "128", 1, {{"prefill", "oneshot"}}},
                           {"b", "h2o", "128", 1, {{"prefill", "oneshot"}}},
                           {"a", "h2o", "128", 0, {{"prefill", "streaming"}}},
                           {"b", "h2o", "128", 0.5, {{"prefill", "streaming"}}},
                           {"a", "window", "128", 0, {{"gqa", "per_kv_head"}}}});
  std::vector<std::string> got;
  for (const ScoreCell& c : score_cells(s, {})) {
    got.push_back(c.policy + "|" + fixed(c.ci.mean, 2) + "|" + std::to_string(c.ok));
  }
  // Means: oneshot (1 + 1) / 2, streaming (0 + 0.5) / 2; each cell counts its own 2 units.
  EXPECT_EQ(got, (std::vector<std::string>{"full|1.00|2", "h2o prefill=oneshot|1.00|2",
                                           "h2o prefill=streaming|0.25|2", "window|0.00|1"}));
  got.clear();
  for (const PairedRow& p : vs_full(s, {})) got.push_back(p.policy + "|" + fixed(p.pc.mean_diff, 2));
  EXPECT_EQ(got, (std::vector<std::string>{"h2o prefill=oneshot|0.00",
                                           "h2o prefill=streaming|-0.75", "window|-1.00"}));
  EXPECT_EQ(options_of_json(R"({"a":"1","b":"x y"})"),
            (std::map<std::string, std::string>{{"a", "1"}, {"b", "x y"}}));
  EXPECT_TRUE(options_of_json("not json").empty());
}

// A composition (then:, kvpress's ComposedPress) is labelled with its second policy even where
// its first policy's name has one option set: "knorm" alone would read as knorm.
TEST(PolicyVariants, ACompositionIsAlwaysLabelledWithItsOptions) {
  const Store s =
      make_db("composed", "niah", "recall", true,
              {{"a", "full", "", 1},
               {"a", "knorm", "128", 0.5, {{"then", "lagkv"}, {"first_compression_ratio", "0.25"}}},
               {"a", "snapkv", "128", 1}});
  std::vector<std::string> got;
  for (const ScoreCell& c : score_cells(s, {})) got.push_back(c.policy);
  EXPECT_EQ(got, (std::vector<std::string>{"full", "knorm first_compression_ratio=0.25 then=lagkv",
                                           "snapkv"}));
}

// A fraction of the prompt is a fraction of what the model is fed: a perplexity sample's
// max_tokens, a truncated prompt's limit (the run's or the sample's).
TEST(RatioBudgets, AreTakenOfTheTokensTheModelIsFed) {
  tasks::Sample ppl;
  ppl.kind = tasks::SampleKind::kPerplexity;
  ppl.max_tokens = 1024;
  EXPECT_EQ(tasks::fed_prompt_tokens(ppl, 2334, 0), 1024);
  EXPECT_EQ(tasks::fed_prompt_tokens(ppl, 900, 0), 900);
  tasks::Sample long_prompt;
  long_prompt.max_prompt_tokens = 7500;
  EXPECT_EQ(tasks::fed_prompt_tokens(long_prompt, 9000, 0), 7500);
  EXPECT_EQ(tasks::fed_prompt_tokens(long_prompt, 9000, 4000), 4000);
  EXPECT_EQ(tasks::fed_prompt_tokens(tasks::Sample{}, 9000, 0), 9000);
  harness::BudgetEntry half;
  half.ratio = 0.5;
  EXPECT_EQ(half.tokens_for(tasks::fed_prompt_tokens(ppl, 2334, 0)), 512);  // not 1167
}

}  // namespace
}  // namespace kvb::results

namespace kvb::harness {
namespace {

namespace fs = std::filesystem;

// A config of stories260K (../shared) with a findings: section appended.
std::string write_config(const std::string& name, const std::string& findings) {
  const fs::path dir = fs::path(KVB_BINARY_DIR) / "test_findings";
  fs::create_directories(dir);
  const fs::path path = dir / (name + ".yaml");
  std::ofstream(path) << "models:\n"
                         "  - path: " KVB_SHARED_DIR
                         "/models/stories260K/stories260K.bin\n"
                         "    tokenizer: " KVB_SHARED_DIR
                         "/models/stories260K/tok512.bin\n"
                         "tasks:\n"
                         "  - {name: niah, options: {context_lengths: [256], depths: [50]}}\n"
                         "policies:\n"
                         "  - full\n"
                         "  - {name: h2o, options: {prefill: [oneshot, streaming]}}\n"
                         "  - window\n"
                         "kv_budget: [64, {ratio: 0.2}]\n"
                      << findings;
  return path.string();
}

std::string error_of(const std::string& findings) {
  try {
    load_sweep_config(write_config("bad", findings));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(FindingsConfig, ReadsClaimsIntoInstances) {
  const SweepConfig cfg = load_sweep_config(write_config(
      "good",
      "findings:\n"
      "  paper: H2O\n"
      "  baselines:\n"
      "    - {task: niah, metric: recall, at_least: 0.9}\n"
      "  claims:\n"
      "    - id: near-full\n"
      "      claim: H2O stays near full\n"
      "      task: niah\n"
      "      metric: recall\n"
      "      compare: {policy: h2o, options: {prefill: streaming}, kv_budget: [64, {ratio: 0.2}]}\n"
      "      expect: at_least\n"
      "      margin: 5%\n"
      "    - id: local-collapses\n"
      "      claim: a window falls\n"
      "      task: niah\n"
      "      metric: recall\n"
      "      compare: {policy: window, kv_budget: 64}\n"
      "      against: {policy: h2o, options: {prefill: oneshot}}\n"
      "      expect: worse\n"
      "      margin: 0.1\n"));
  ASSERT_TRUE(cfg.findings.has_value());
  const results::Findings& f = *cfg.findings;
  EXPECT_EQ(f.paper, "H2O");
  ASSERT_EQ(f.baselines.size(), 1u);
  EXPECT_FALSE(f.baselines[0].above);
  EXPECT_EQ(f.baselines[0].value, 0.9);
  ASSERT_EQ(f.claims.size(), 2u);
  const results::Claim& a = f.claims[0];
  EXPECT_TRUE(a.margin_percent);
  EXPECT_EQ(a.margin, 5);
  ASSERT_EQ(a.instances.size(), 2u);
  EXPECT_EQ(a.instances[1].label, "0.2 ratio");
  EXPECT_EQ(a.instances[1].cells[0].label(), "h2o prefill=streaming at 0.2 ratio");
  EXPECT_EQ(a.instances[1].cells[1].label(), "full");
  EXPECT_EQ(a.instances[1].cells[1].weight, -1);
  // against without a budget takes the instance's.
  const results::Claim& b = f.claims[1];
  ASSERT_EQ(b.instances.size(), 1u);
  EXPECT_EQ(b.instances[0].cells[1].label(), "h2o prefill=oneshot at 64");
  EXPECT_EQ(b.expect, results::Expect::kWorse);
}

// The seed papers' configs state their claims, and every claim names cells of their matrix
// (configs/paper_*.yaml; SubGen's model is optional: scripts/fetch_models.sh gemma3).
TEST(FindingsConfig, ThePaperConfigsStateCheckedClaims) {
  const fs::path configs = fs::path(KVB_EXAMPLES_DIR) / ".." / "configs";
  const std::vector<std::pair<std::string, size_t>> papers = {
      {"paper_h2o", 6}, {"paper_scissorhands", 4}, {"paper_subgen", 5}, {"paper_adakv", 4}};
  for (const auto& [name, claims] : papers) {
    const fs::path path = configs / (name + ".yaml");
    const bool gemma = name == "paper_subgen";
    const fs::path model = fs::path(KVB_EXAMPLES_DIR) / ".." / "models" /
                           (gemma ? "gemma-3-270m-q4_k_m.gguf" : "SmolLM2-135M-Instruct.Q4_1.gguf");
    if (!fs::exists(model)) continue;  // SmolLM2 is fetched by scripts/test.sh; Gemma on demand
    const SweepConfig cfg = load_sweep_config(path.string());
    ASSERT_TRUE(cfg.findings.has_value()) << name;
    EXPECT_EQ(cfg.findings->claims.size(), claims) << name;
    EXPECT_EQ(cfg.dtype, "native") << name;
  }
}

TEST(FindingsConfig, RefusesClaimsTheMatrixCannotAnswer) {
  const std::string head =
      "findings:\n  paper: P\n  claims:\n    - id: x\n      claim: c\n      expect: at_least\n";
  // Ambiguous: h2o has two entries (prefill oneshot and streaming).
  EXPECT_NE(error_of(head + "      task: niah\n      metric: recall\n"
                            "      compare: {policy: h2o, kv_budget: 64}\n")
                .find("matches 2 entries of policies"),
            std::string::npos);
  EXPECT_NE(error_of(head + "      task: niah\n      metric: recall\n"
                            "      compare: {policy: window, kv_budget: 128}\n")
                .find("budget '128' is not in kv_budget: (64, 0.2 ratio)"),
            std::string::npos);
  EXPECT_NE(error_of(head + "      task: niah\n      metric: rouge\n"
                            "      compare: {policy: window, kv_budget: 64}\n")
                .find("'rouge' is not a metric of task niah"),
            std::string::npos);
  EXPECT_NE(error_of(head + "      task: xsum\n      metric: recall\n"
                            "      compare: {policy: window, kv_budget: 64}\n")
                .find("'xsum' is not a task of this config"),
            std::string::npos);
  EXPECT_NE(error_of(head + "      task: niah\n      metric: recall\n"
                            "      compare: {policy: snapkv, kv_budget: 64}\n")
                .find("snapkv at 64 matches no entry of policies"),
            std::string::npos);
  EXPECT_NE(error_of(head + "      task: niah\n      metric: recall\n"
                            "      compare: {policy: window, kv_budget: 64}\n      margin: -1\n")
                .find("must be >= 0"),
            std::string::npos);
  EXPECT_NE(error_of("findings:\n  paper: P\n  claims:\n    - id: x\n      claim: c\n"
                     "      expect: maybe\n      task: niah\n      metric: recall\n"
                     "      compare: {policy: window, kv_budget: 64}\n")
                .find("'maybe' is not at_least, better or worse"),
            std::string::npos);
  EXPECT_NE(error_of(head + "      task: niah\n      metric: recall\n"
                            "      compare: {policy: window}\n")
                .find("needs kv_budget"),
            std::string::npos);
  // The line of the bad key is named.
  EXPECT_NE(error_of(head + "      task: niah\n      metric: recall\n      typo: 1\n"
                            "      compare: {policy: window, kv_budget: 64}\n")
                .find("bad.yaml:19: findings.claims[0].typo: unknown key"),
            std::string::npos)
      << error_of(head +
                  "      task: niah\n      metric: recall\n      typo: 1\n"
                  "      compare: {policy: window, kv_budget: 64}\n");
}

}  // namespace
}  // namespace kvb::harness
