// A paper's claims checked against a results database, each with a verdict: reproduced, not
// reproduced or inconclusive (issue 36). The claims come from a sweep config's `findings:`
// (parsed in harness/findings_config.h); the rule is written in configs/README.md "Findings", and
// scripts/check_findings.py recomputes every verdict from the database on its own.
//
// A claim's instance is a contrast: per sample, d = sum of weight x value over its cells, each
// value oriented so that higher is better. Its mean and 95% interval come from paired_bootstrap
// (results/stats.h: 10,000 resamples, seed 0); the verdict compares that interval to the margin.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/table.h"
#include "results/store.h"

namespace kvb::results {

// One cell of a contrast: the ok units of a policy whose options include `options` (values as
// text) at one budget (its spec text: "256", "0.2 ratio"; "" for none).
struct FindingCell {
  double weight = 1;
  std::string policy;
  std::map<std::string, std::string> options;
  std::string budget;
  std::string label() const;  // "h2o prefill=streaming at 0.2 ratio"
};

enum class Expect { kAtLeast, kBetter, kWorse };
const char* expect_name(Expect e);  // "at_least", "better", "worse"

// The bar `full` must clear on a task before its claims count: a mean of at least `value`, or
// (above) a 95% score interval (score_ci) whose low end is above `value`.
struct FindingBaseline {
  std::string task, metric;
  bool above = false;
  double value = 0;
};

struct FindingInstance {
  std::string label;  // the compare cell's budget, or "-"
  std::vector<FindingCell> cells;
  int against = -1;  // the cell a percent margin is taken of (-1: none)
};

struct Claim {
  std::string id, text, task, metric;
  std::string model;     // "" : every model with units of the task, a verdict each
  std::string question;  // "" : any placement
  std::vector<FindingInstance> instances;
  Expect expect = Expect::kAtLeast;
  double margin = 0;  // in the metric's units, or a percent of against's mean
  bool margin_percent = false;
};

struct Findings {
  std::string paper;
  std::vector<FindingBaseline> baselines;
  std::vector<Claim> claims;
};

struct FindingRow {
  std::string paper, id, claim, model, budget, expect;
  int n = -1;  // -1: not computed (a combined row, or a claim that stopped before pairing)
  double contrast, lo, hi, margin;  // NaN where not computed
  std::string verdict;              // "reproduced", "not reproduced", "inconclusive"
  std::string why;
};

// Every claim's rows: per model, one per instance, and for a claim of several instances one more
// (budget "all") with the combined verdict.
std::vector<FindingRow> evaluate_findings(const Store& store, const Findings& findings);
// paper, id, model, kv_budget, n, contrast, lo, hi, margin, expect, verdict, why, claim.
Table findings_table(const std::vector<FindingRow>& rows);
// The rule in a sentence (the report prints it under the table).
extern const char kFindingsRule[];

}  // namespace kvb::results
