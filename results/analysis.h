// The comparisons `kvbench query` and `kvbench report` compute in C++ rather than SQL: per-cell
// scores with Student-t intervals, the paired comparison to `full`, cost (memory and latency) by
// context length, the NIAH grid, and the Pareto front of score vs KV bytes. A Filter restricts
// every one of them by model, task, policy, budget or metric; its values reach SQL only as bound
// parameters.
#pragma once

#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/table.h"
#include "results/stats.h"
#include "results/store.h"

namespace kvb::results {

// `--filter KEY=V1,V2` (repeatable; values of one key OR, keys AND). Keys: model, task, policy,
// kv_budget (`budget` is read as its older spelling), metric. Units of `full` pass any policy or budget filter: they are the reference every
// comparison is made against.
struct Filter {
  std::map<std::string, std::vector<std::string>> allow;
  static Filter parse(const std::vector<std::string>& specs);
  // SQL conditions (" AND ...") on units `u` (and metrics `m` when with_metric), appending the
  // values to *params as ?N parameters.
  std::string sql(std::vector<std::string>* params, bool with_metric) const;
  // Usage error naming any value that matches nothing in the database, with what it holds.
  void check_against(const Store& store) const;
};

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A budget as shown ('-' for none, as configured otherwise) and its sort order (numbers
// ascending, fractions after them by the share kept: "0.5 ratio" as 0.5, "0.25 compression_ratio"
// as 0.75; none first).
std::string budget_label(const std::string& spec);
double budget_order(const std::string& label);
// The label of an axis of these budgets, naming which convention it shows: tokens per head,
// the fraction kept ("0.5 ratio") or kvpress's fraction removed ("0.25 compression_ratio").
std::string budget_axis_label(const std::vector<std::string>& labels);
// units.policy_options (canonical JSON of a string map) as a map; a value that is not a JSON
// string keeps its JSON text. Not an object, or not JSON: empty.
std::map<std::string, std::string> options_of_json(const std::string& json);
// The policy a table shows for a unit: its name, or, where the database holds units of that name
// with more than one option set (h2o with prefill oneshot and streaming), the name and its
// options ("h2o prefill=streaming"), so that the variants are not averaged together. A
// composition (options with `then`) is always labelled with its options.
// `policy` followed by its options ("h2o prefill=streaming"), in key order.
std::string label_with_options(const std::string& policy,
                               const std::map<std::string, std::string>& options);
class PolicyLabels {
 public:
  explicit PolicyLabels(const Store& store);
  std::string operator()(const std::string& policy, const std::string& options_json) const;

 private:
  std::set<std::string> varied_;
};
// Policies in display order: full first, then by name.
bool policy_before(const std::string& a, const std::string& b);

struct ScoreCell {
  std::string model, task, metric, policy, budget;  // budget: budget_label
  bool higher_is_better = true;
  MeanCI ci;                    // over the cell's ok units with a value
  std::vector<double> values;   // those values, in sample order
  // kvpress's compression ratio, the mean over those units of the fraction of the prompt's tokens
  // the budget removes per head, max(0, 1 - kv_budget / prompt_tokens); 0 for `full`.
  double compression_ratio = 0;
  double kv_bytes_peak = kNaN;  // mean over those units
  int ok = 0, error = 0, failed = 0, unfinished = 0;  // unit status counts of the cell's units
};
std::vector<ScoreCell> score_cells(const Store& store, const Filter& filter);

struct PairedRow {
  std::string model, task, policy, budget, metric;
  bool higher_is_better = true;
  double mean = 0, full_mean = 0;
  PairedComparison pc;  // of (policy - full), 10,000 resamples, seed 0
};
std::vector<PairedRow> vs_full(const Store& store, const Filter& filter);
// Why vs_full has no rows, in a sentence for the user (issue 34: not an empty table without a
// word): the database has no `full` unit that finished ok, or no other policy's ok units share a
// sample with one. Empty when `rows` is not empty.
std::string vs_full_missing(const Store& store, const std::vector<PairedRow>& rows);

// Means over the ok units of (model, task, policy, budget, context length); context_length -1:
// none.
struct CostRow {
  std::string model, task, policy, budget;
  int context_length = -1;
  int n = 0;
  double prompt_tokens = 0, kv_final = 0, kv_peak = 0, physical_peak = 0, policy_state = 0;
  double occupancy_mean = 0;
  int occupancy_peak = 0;
  double prefill_ms = 0, decode_p50 = 0, decode_p99 = 0 /* max */, tokens_per_s = 0;
  double policy_ms = 0;
  double prefill_shared = 0;  // share of the units whose prefill was shared with other policies
  // Units that decoded in a batch (measurements.decode_batch > 1): counted in n, left out of the
  // decode columns, which average units that decoded alone (NaN when there are none).
  int batched = 0;
  // Units whose shared prefill started from an earlier prompt's prefix (measurements.
  // prefill_reused > 0): counted in n, left out of prefill_ms, which averages units that
  // prefilled their whole prompt (NaN when there are none).
  int reused = 0;
};
std::vector<CostRow> cost_rows(const Store& store, const Filter& filter);

struct GridCell {
  std::string model, policy, budget;
  int context_length = 0;
  double depth = 0;
  int n = 0;
  double recall = 0;
};
std::vector<GridCell> niah_grid(const Store& store, const Filter& filter);

// The non-dominated cells of one (model, task, metric): no other cell has fewer or equal KV bytes and
// a better or equal score with one of them strictly better. Returned sorted by bytes.
std::vector<ScoreCell> pareto_front(const std::vector<ScoreCell>& cells_of_one_metric);

// The tables (md/csv/html through common/table.h).
Table summary_table(const std::vector<ScoreCell>& cells);
Table vs_full_table(const std::vector<PairedRow>& rows);
Table memory_table(const std::vector<CostRow>& rows);
Table latency_table(const std::vector<CostRow>& rows);
Table niah_table(const std::vector<GridCell>& cells);
Table failures_table(const Store& store, const Filter& filter);
Table pareto_table(const std::vector<ScoreCell>& cells);  // every cell, front marked
// Whether a metric is a score, not bookkeeping: perplexity's token counts (tokens*) and NLL sums
// (nll_sum*) are aggregation helpers, with no score plot and no column in paper_table.
bool is_score_metric(const std::string& name);
// The methods x tasks table of KV-cache papers (Ada-KV's Table 1, kvpress's leaderboard): a row per
// model, policy and budget; a column per task and higher-is-better metric ("task" alone when the
// task has one), each cell the mean and its interval (score_ci) as "mean (lo, hi)"; then
// `average`, the mean of the row's task means with a stratified percentile bootstrap
// (mean_of_means_ci), empty where the row lacks a column. `digits` decimals.
Table paper_table(const std::vector<ScoreCell>& cells, int digits = 3);

// "%.4f" (or "" for NaN).
std::string fixed(double v, int digits = 4);
// A bootstrap p-value as a table shows it: 4 decimals, or "< 1e-4" (1/resamples) when no
// resample fell on the other side of 0, so that the bootstrap could not resolve it (0.0000 would
// claim an exact zero).
std::string p_value_text(double p, int resamples = 10000);

}  // namespace kvb::results
