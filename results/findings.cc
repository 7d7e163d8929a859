// Verdicts of a paper's claims (results/findings.h; the rule: configs/README.md "Findings").
#include "results/findings.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>
#include <tuple>

#include "results/analysis.h"
#include "results/stats.h"

namespace kvb::results {

const char kFindingsRule[] =
    "Each claim's contrast is the mean over paired samples of sum(weight x value), values "
    "oriented so that higher is better (compare - against: positive means compare did better), "
    "with its 95% paired-bootstrap interval (10,000 resamples, seed 0). at_least is reproduced "
    "when the interval's low end is >= -margin and not reproduced when its high end is below "
    "-margin; better: low end > margin, not when the high end is <= margin; worse: high end "
    "< -margin, not when the low end is >= -margin; anything else is inconclusive, as is a "
    "claim whose baseline (full on the task) misses its bar, a missing cell or fewer than 2 "
    "paired samples. A claim over several budgets is reproduced when every budget is and not "
    "reproduced when any is not (configs/README.md \"Findings\").";

namespace {

constexpr char kReproduced[] = "reproduced";
constexpr char kNotReproduced[] = "not reproduced";
constexpr char kInconclusive[] = "inconclusive";

double num(const QueryValue& v) { return std::strtod(v.text.c_str(), nullptr); }

std::string options_text(const std::map<std::string, std::string>& o) {
  std::string s;
  for (const auto& [k, v] : o) s += (s.empty() ? "" : " ") + k + "=" + v;
  return s;
}

// A unit's sample: task_options, sample_id, question, seed (ordered as configs/README.md says).
struct SampleKey {
  std::string task_options, sample_id, question;
  long long seed = 0;
  bool operator<(const SampleKey& o) const {
    return std::tie(task_options, sample_id, question, seed) <
           std::tie(o.task_options, o.sample_id, o.question, o.seed);
  }
};

struct UnitValue {
  std::string policy, options_json, budget;
  SampleKey sample;
  double value = 0;
  bool higher_is_better = true;
};

// The ok units of (model, task) with a non-NULL value of `metric` (and `question` when given).
std::vector<UnitValue> unit_values(const Store& store, const std::string& model,
                                   const std::string& task, const std::string& metric,
                                   const std::string& question) {
  std::vector<std::string> params = {model, task, metric};
  std::string sql =
      "SELECT u.policy, u.policy_options, u.kv_budget_spec, u.task_options, u.sample_id, "
      "u.question, u.seed, m.value, m.higher_is_better FROM units u JOIN metrics m ON "
      "m.unit_key = u.unit_key AND m.name = ?3 WHERE u.model = ?1 AND u.task = ?2 AND "
      "u.status = 'ok' AND m.value IS NOT NULL";
  if (!question.empty()) {
    sql += " AND u.question = ?4";
    params.push_back(question);
  }
  const QueryResult r = store.query(sql + " ORDER BY u.unit_key", params);
  std::vector<UnitValue> out;
  for (const auto& row : r.rows) {
    UnitValue u;
    u.policy = row[0].text;
    u.options_json = row[1].text;
    u.budget = row[2].text;
    u.sample = {row[3].text, row[4].text, row[5].text, std::atoll(row[6].text.c_str())};
    u.value = num(row[7]);
    u.higher_is_better = row[8].text == "1";
    out.push_back(std::move(u));
  }
  return out;
}

bool holds(const std::map<std::string, std::string>& have,
           const std::map<std::string, std::string>& want) {
  for (const auto& [k, v] : want) {
    const auto it = have.find(k);
    if (it == have.end() || it->second != v) return false;
  }
  return true;
}

std::string figure(double v) {
  std::ostringstream s;
  s.precision(4);
  s << v;
  return s.str();
}

// Whether full clears the task's bars for this model; "" when it does (or there is none), else
// the reason, starting "baseline".
std::string baseline_failure(const Store& store, const Findings& f, const std::string& model,
                             const std::string& task) {
  for (const FindingBaseline& b : f.baselines) {
    if (b.task != task) continue;
    // In sample order, as a contrast's values (the bootstrap's resamples depend on the order).
    std::vector<std::pair<SampleKey, double>> by_sample;
    for (const UnitValue& u : unit_values(store, model, task, b.metric, "")) {
      if (u.policy == "full") by_sample.push_back({u.sample, u.value});
    }
    std::stable_sort(by_sample.begin(), by_sample.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<double> values;
    for (const auto& [key, v] : by_sample) values.push_back(v);
    const std::string bar = b.above ? "its 95% interval above " + figure(b.value)
                                    : "a mean of at least " + figure(b.value);
    if (values.empty()) {
      return "baseline: no full units of " + task + " with " + b.metric +
             " finished ok (the bar: " + bar + ")";
    }
    const MeanCI ci = score_ci(values);
    const bool ok = b.above ? ci.lo > b.value : ci.mean >= b.value;
    if (!ok) {
      return "baseline: full's " + b.metric + " is " + fixed(ci.mean, 3) + " (" + fixed(ci.lo, 3) +
             ", " + fixed(ci.hi, 3) + ") over " + std::to_string(values.size()) +
             " samples; the bar is " + bar;
    }
  }
  return "";
}

// `row`: the claim's row for this model (inconclusive, no figures), filled in here.
FindingRow evaluate_instance(const Claim& c, const FindingInstance& inst,
                             const std::vector<UnitValue>& units, FindingRow row) {
  row.budget = inst.label;
  // Each cell's values by sample.
  std::vector<std::map<SampleKey, double>> cell_values(inst.cells.size());
  std::vector<std::map<SampleKey, double>> cell_raw(inst.cells.size());
  for (size_t ci = 0; ci < inst.cells.size(); ++ci) {
    const FindingCell& cell = inst.cells[ci];
    std::set<std::string> option_sets;
    for (const UnitValue& u : units) {
      if (u.policy != cell.policy || u.budget != cell.budget) continue;
      if (!holds(options_of_json(u.options_json), cell.options)) continue;
      option_sets.insert(u.options_json);
    }
    if (option_sets.empty()) {
      row.why = "no ok units of " + cell.label();
      return row;
    }
    if (option_sets.size() > 1) {
      std::string sets;
      for (const std::string& s : option_sets) sets += (sets.empty() ? "" : " and ") + s;
      row.why = cell.label() + " is ambiguous: it matches the option sets " + sets +
                "; give options that tell them apart";
      return row;
    }
    for (const UnitValue& u : units) {
      if (u.policy != cell.policy || u.budget != cell.budget ||
          u.options_json != *option_sets.begin()) {
        continue;
      }
      if (!cell_values[ci].emplace(u.sample, u.higher_is_better ? u.value : -u.value).second) {
        // Two units of one sample under one model name (the file was replaced between sweeps).
        row.why = cell.label() + " has two units of sample " + u.sample.sample_id +
                  " (two model files under one name, or two settings of the matrix); sweep each "
                  "into its own database";
        return row;
      }
      cell_raw[ci].emplace(u.sample, u.value);
    }
  }
  // Samples present in every cell, in key order.
  std::vector<SampleKey> samples;
  for (const auto& [key, v] : cell_values[0]) {
    bool all = true;
    for (size_t ci = 1; ci < cell_values.size(); ++ci) all = all && cell_values[ci].count(key);
    if (all) samples.push_back(key);
  }
  row.n = static_cast<int>(samples.size());
  std::vector<double> d, against;
  for (const SampleKey& key : samples) {
    double s = 0;
    for (size_t ci = 0; ci < inst.cells.size(); ++ci) {
      s += inst.cells[ci].weight * cell_values[ci].at(key);
    }
    d.push_back(s);
    if (inst.against >= 0) against.push_back(cell_raw[inst.against].at(key));
  }
  if (samples.size() < 2) {
    row.why = std::to_string(samples.size()) +
              " sample(s) have a unit in every cell; a contrast needs at least 2";
    if (!samples.empty()) row.contrast = row.lo = row.hi = d[0];
    return row;
  }
  const PairedComparison pc = paired_bootstrap(d, std::vector<double>(d.size(), 0.0), 10000, 0);
  row.contrast = pc.mean_diff;
  row.lo = pc.lo;
  row.hi = pc.hi;
  double m = c.margin;
  if (c.margin_percent) {
    double sum = 0;
    for (double v : against) sum += v;
    m = c.margin / 100 * std::fabs(sum / against.size());
  }
  row.margin = m;
  // Each expectation's two tests (configs/README.md "Findings"): the end of the interval, how it
  // compares, and the bound (-m or m); reproduced when the first holds, not when the second does.
  struct Test {
    bool high_end;
    const char* relation;  // "below", "not below", "above", "not above"
    bool negated_margin;
  };
  const std::pair<Test, Test> tests =
      c.expect == Expect::kAtLeast ? std::pair<Test, Test>{{false, "not below", true},
                                                           {true, "below", true}}
      : c.expect == Expect::kBetter ? std::pair<Test, Test>{{false, "above", false},
                                                            {true, "not above", false}}
                                    : std::pair<Test, Test>{{true, "below", true},
                                                            {false, "not below", true}};
  auto holds = [&](const Test& t, std::string* why) {
    const double v = t.high_end ? pc.hi : pc.lo;
    const double bound = t.negated_margin ? -m : m;
    const std::string rel = t.relation;
    const bool ok = rel == "below"       ? v < bound
                    : rel == "not below" ? v >= bound
                    : rel == "above"     ? v > bound
                                         : v <= bound;
    *why = std::string("the interval's ") + (t.high_end ? "high" : "low") + " end " + fixed(v, 4) +
           " is " + rel + (t.negated_margin ? " -margin " : " the margin ") + fixed(bound, 4);
    return ok;
  };
  if (holds(tests.first, &row.why)) {
    row.verdict = kReproduced;
  } else if (holds(tests.second, &row.why)) {
    row.verdict = kNotReproduced;
  } else {
    row.why = "the interval (" + fixed(pc.lo, 4) + ", " + fixed(pc.hi, 4) + ") holds " +
              (tests.first.negated_margin ? "-margin " : "the margin ") +
              fixed(tests.first.negated_margin ? -m : m, 4);
  }
  return row;
}

}  // namespace

std::string FindingCell::label() const {
  std::string s = policy;
  if (!options.empty()) s += " " + options_text(options);
  if (!budget.empty()) s += " at " + budget;
  return s;
}

const char* expect_name(Expect e) {
  switch (e) {
    case Expect::kAtLeast:
      return "at_least";
    case Expect::kBetter:
      return "better";
    case Expect::kWorse:
      return "worse";
  }
  return "?";
}

std::vector<FindingRow> evaluate_findings(const Store& store, const Findings& f) {
  std::vector<FindingRow> out;
  for (const Claim& c : f.claims) {
    std::vector<std::string> models;
    if (!c.model.empty()) {
      models.push_back(c.model);
    } else {
      const QueryResult r =
          store.query("SELECT DISTINCT model FROM units WHERE task = ?1 ORDER BY model", {c.task});
      for (const auto& row : r.rows) models.push_back(row[0].text);
    }
    auto base = [&](const std::string& model) {
      FindingRow row;
      row.paper = f.paper;
      row.id = c.id;
      row.claim = c.text;
      row.model = model;
      row.expect = expect_name(c.expect);
      row.contrast = row.lo = row.hi = row.margin = kNaN;
      row.verdict = kInconclusive;
      return row;
    };
    if (models.empty()) {
      FindingRow row = base("-");
      row.budget = "-";
      row.why = "the database holds no units of task " + c.task;
      out.push_back(row);
      continue;
    }
    for (const std::string& model : models) {
      const std::string baseline = baseline_failure(store, f, model, c.task);
      const std::vector<UnitValue> units = unit_values(store, model, c.task, c.metric, c.question);
      int reproduced = 0, refuted = 0;
      for (const FindingInstance& inst : c.instances) {
        FindingRow row = evaluate_instance(c, inst, units, base(model));
        if (!baseline.empty()) {
          row.verdict = kInconclusive;
          row.why = baseline;
        }
        reproduced += row.verdict == kReproduced;
        refuted += row.verdict == kNotReproduced;
        out.push_back(std::move(row));
      }
      if (c.instances.size() > 1) {
        FindingRow all = base(model);
        all.budget = "all";
        const int k = static_cast<int>(c.instances.size());
        if (!baseline.empty()) {
          all.why = baseline;
        } else if (refuted > 0) {
          all.verdict = kNotReproduced;
          all.why =
              std::to_string(refuted) + " of " + std::to_string(k) + " budgets not reproduced";
        } else if (reproduced == k) {
          all.verdict = kReproduced;
          all.why = "every budget reproduced";
        } else {
          all.why = std::to_string(reproduced) + " of " + std::to_string(k) +
                    " budgets reproduced, the rest inconclusive";
        }
        out.push_back(std::move(all));
      }
    }
  }
  return out;
}

Table findings_table(const std::vector<FindingRow>& rows) {
  Table t({"paper", "id", "model", "kv_budget", "n", "contrast", "lo", "hi", "margin", "expect",
           "verdict", "why", "claim"});
  for (const FindingRow& r : rows) {
    t.add({r.paper, r.id, r.model, r.budget, r.n < 0 ? "" : std::to_string(r.n),
           fixed(r.contrast, 4), fixed(r.lo, 4), fixed(r.hi, 4), fixed(r.margin, 4), r.expect,
           r.verdict, r.why, r.claim});
  }
  return t;
}

}  // namespace kvb::results
