// Comparisons for `kvbench query` and `kvbench report` (results/analysis.h).
#include "results/analysis.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <array>
#include <set>
#include <string>
#include <string_view>
#include <tuple>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace kvb::results {

namespace {

// kv_budget is the budget axis's one name (as in YAML, SQL and --kv-budget); `budget` is read as
// its older spelling.
const char* const kFilterKeys[] = {"model", "task", "policy", "kv_budget", "metric"};

double num(const QueryValue& v) {
  return v.kind == QueryValue::kNull ? kNaN : std::strtod(v.text.c_str(), nullptr);
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// The order of cells: model, task, metric, policy (full first), budget (numeric).
template <class T>
void sort_cells(std::vector<T>& v) {
  std::stable_sort(v.begin(), v.end(), [](const T& a, const T& b) {
    if (a.model != b.model) return a.model < b.model;
    if (a.task != b.task) return a.task < b.task;
    if (a.metric != b.metric) return a.metric < b.metric;
    if (a.policy != b.policy) return policy_before(a.policy, b.policy);
    return budget_order(a.budget) < budget_order(b.budget);
  });
}

}  // namespace

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "";
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string p_value_text(double p, int resamples) {
  if (!std::isfinite(p)) return "";
  const double floor = 1.0 / resamples;
  if (p >= floor) return fixed(p, 4);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0e", floor);  // 1e-04
  std::string s = buf;
  const size_t e = s.find("e-0");
  if (e != std::string::npos) s.erase(e + 2, 1);  // 1e-4
  return "< " + s;
}

Filter Filter::parse(const std::vector<std::string>& specs) {
  Filter f;
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    KVB_USAGE_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < spec.size())
        << "--filter " << spec << ": expected KEY=VALUE[,VALUE...] with KEY one of model, task, "
        << "policy, kv_budget, metric (e.g. --filter policy=snapkv,h2o)";
    std::string key = spec.substr(0, eq);
    if (key == "budget") key = "kv_budget";
    KVB_USAGE_CHECK(std::find(std::begin(kFilterKeys), std::end(kFilterKeys), key) !=
                    std::end(kFilterKeys))
        << "--filter " << spec << ": unknown key '" << key
        << "'; keys: model, task, policy, kv_budget, metric";
    std::string rest = spec.substr(eq + 1);
    size_t start = 0;
    while (start <= rest.size()) {
      const size_t comma = std::min(rest.find(',', start), rest.size());
      const std::string value = rest.substr(start, comma - start);
      KVB_USAGE_CHECK(!value.empty()) << "--filter " << spec << ": empty value";
      f.allow[key].push_back(value);
      start = comma + 1;
    }
  }
  return f;
}

std::string Filter::sql(std::vector<std::string>* params, bool with_metric) const {
  std::string out;
  for (const auto& [key, values] : allow) {
    if (key == "metric" && !with_metric) continue;
    std::string list;
    for (const auto& v : values) {
      params->push_back(v);
      list += (list.empty() ? "?" : ", ?") + std::to_string(params->size());
    }
    if (key == "model") out += " AND u.model IN (" + list + ")";
    if (key == "task") out += " AND u.task IN (" + list + ")";
    if (key == "policy") out += " AND (u.policy = 'full' OR u.policy IN (" + list + "))";
    if (key == "kv_budget") out += " AND (u.kv_budget_spec = '' OR u.kv_budget_spec IN (" + list + "))";
    if (key == "metric") out += " AND m.name IN (" + list + ")";
  }
  return out;
}

void Filter::check_against(const Store& store) const {
  for (const auto& [key, values] : allow) {
    const std::string sql =
        key == "metric" ? "SELECT DISTINCT name FROM metrics ORDER BY 1"
        : key == "kv_budget"
            ? "SELECT DISTINCT kv_budget_spec FROM units WHERE kv_budget_spec <> '' ORDER BY 1"
            : "SELECT DISTINCT " + key + " FROM units ORDER BY 1";
    std::vector<std::string> have;
    for (const auto& row : store.query(sql).rows) have.push_back(row[0].text);
    for (const auto& v : values) {
      KVB_USAGE_CHECK(std::find(have.begin(), have.end(), v) != have.end())
          << "--filter " << key << "=" << v << ": no " << key << " '" << v << "' in "
          << store.path() << "; it holds: " << (have.empty() ? "(none)" : join(have));
    }
  }
}

std::string budget_label(const std::string& spec) { return spec.empty() ? "-" : spec; }

double budget_order(const std::string& label) {
  if (label == "-" || label.empty()) return -1;
  char* end = nullptr;
  const double v = std::strtod(label.c_str(), &end);
  if (end == label.c_str()) return 1e15;
  // Ratios ("0.1 ratio") sort after every token count, by the fraction kept: kvpress's
  // compression ratios ("0.25 compression_ratio", the fraction removed) as 1 - c.
  if (*end == '\0') return v;
  return std::string_view(end) == " compression_ratio" ? 1e12 + (1 - v) : 1e12 + v;
}

std::string budget_axis_label(const std::vector<std::string>& labels) {
  bool tokens = false, kept = false, removed = false;
  for (const std::string& l : labels) {
    if (l == "-" || l.empty()) continue;
    if (l.ends_with(" compression_ratio")) {
      removed = true;
    } else if (l.ends_with(" ratio")) {
      kept = true;
    } else {
      tokens = true;
    }
  }
  if (tokens + kept + removed > 1) {
    return "KV budget (tokens per head; ratio: fraction of the prompt kept; compression_ratio: "
           "fraction removed)";
  }
  if (kept) return "KV budget (ratio: fraction of the prompt kept)";
  if (removed) return "kvpress compression_ratio (fraction of the prompt removed)";
  return "KV budget (tokens per head)";
}

std::map<std::string, std::string> options_of_json(const std::string& json) {
  std::map<std::string, std::string> out;
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return out;
  for (const auto& [k, v] : j.items()) out[k] = v.is_string() ? v.get<std::string>() : v.dump();
  return out;
}

PolicyLabels::PolicyLabels(const Store& store) {
  const QueryResult r = store.query(
      "SELECT policy FROM units GROUP BY policy HAVING COUNT(DISTINCT policy_options) > 1");
  for (const auto& row : r.rows) varied_.insert(row[0].text);
}

std::string PolicyLabels::operator()(const std::string& policy,
                                     const std::string& options_json) const {
  // A composition (then:, kvpress's ComposedPress) always names its second policy and ratios:
  // labelled by the first policy's name alone it would read as that policy.
  const std::map<std::string, std::string> options = options_of_json(options_json);
  if (!varied_.count(policy) && !options.count("then")) return policy;
  return label_with_options(policy, options);
}

std::string label_with_options(const std::string& policy,
                               const std::map<std::string, std::string>& options) {
  std::string s = policy;
  for (const auto& [k, v] : options) s += " " + k + "=" + v;
  return s;
}

bool policy_before(const std::string& a, const std::string& b) {
  if (a == b) return false;
  if (a == "full") return true;
  if (b == "full") return false;
  return a < b;
}

std::vector<ScoreCell> score_cells(const Store& store, const Filter& filter) {
  std::vector<std::string> params;
  const std::string where = filter.sql(&params, true);
  const QueryResult r = store.query(
      "SELECT u.task, m.name, m.higher_is_better, u.policy, u.kv_budget_spec, m.value, "
      "x.kv_bytes_peak, u.model, "
      // column 8, below; 9: the options that tell a policy's variants apart (PolicyLabels)
      // kvpress's compression ratio of the unit: the fraction of its prompt's tokens the budget
      // removes per head (0 without a budget, or with one the prompt fits in).
      "CASE WHEN u.kv_budget IS NULL OR x.prompt_tokens IS NULL OR x.prompt_tokens <= 0 THEN 0.0 "
      "ELSE max(0.0, 1.0 - CAST(u.kv_budget AS REAL) / x.prompt_tokens) END, u.policy_options "
      "FROM units u JOIN metrics m ON m.unit_key = u.unit_key "
      "LEFT JOIN measurements x ON x.unit_key = u.unit_key "
      "WHERE u.status = 'ok' AND m.value IS NOT NULL" + where,
      params);
  using Key = std::tuple<std::string, std::string, std::string, std::string, std::string>;
  std::map<Key, std::pair<std::vector<double>, std::vector<double>>> groups;
  std::map<Key, std::pair<double, int>> compression;  // sum, count
  std::map<Key, bool> hib;
  const PolicyLabels label(store);
  for (const auto& row : r.rows) {
    const Key key{row[7].text, row[0].text, row[1].text, label(row[3].text, row[9].text),
                  budget_label(row[4].text)};
    groups[key].first.push_back(num(row[5]));
    if (row[6].kind != QueryValue::kNull) groups[key].second.push_back(num(row[6]));
    compression[key].first += num(row[8]);
    compression[key].second += 1;
    hib[key] = row[2].text == "1";
  }
  // Status counts per (task, policy, budget), filtered the same way (metric aside).
  std::vector<std::string> sp;
  const std::string swhere = filter.sql(&sp, false);
  const QueryResult s = store.query(
      "SELECT u.task, u.policy, u.kv_budget_spec, SUM(u.status = 'ok'), SUM(u.status = 'error'), "
      "SUM(u.status IN ('timeout', 'oom', 'crashed')), SUM(u.status IN ('pending', 'running')), "
      "u.model, u.policy_options FROM units u WHERE 1" + swhere +
          " GROUP BY u.model, u.task, u.policy, u.policy_options, u.kv_budget_spec",
      sp);
  std::map<std::tuple<std::string, std::string, std::string, std::string>, std::array<int, 4>>
      status;
  for (const auto& row : s.rows) {
    std::array<int, 4>& st =
        status[{row[7].text, row[0].text, label(row[1].text, row[8].text), budget_label(row[2].text)}];
    for (int i = 0; i < 4; ++i) st[i] += std::atoi(row[3 + i].text.c_str());
  }
  std::vector<ScoreCell> out;
  for (const auto& [key, values] : groups) {
    ScoreCell c;
    std::tie(c.model, c.task, c.metric, c.policy, c.budget) = key;
    c.higher_is_better = hib[key];
    c.ci = score_ci(values.first);
    c.values = values.first;
    c.compression_ratio = compression[key].first / std::max(1, compression[key].second);
    if (!values.second.empty()) {
      double sum = 0;
      for (double b : values.second) sum += b;
      c.kv_bytes_peak = sum / values.second.size();
    }
    const auto st = status[{c.model, c.task, c.policy, c.budget}];
    c.ok = st[0];
    c.error = st[1];
    c.failed = st[2];
    c.unfinished = st[3];
    out.push_back(std::move(c));
  }
  sort_cells(out);
  return out;
}

std::vector<PairedRow> vs_full(const Store& store, const Filter& filter) {
  std::vector<std::string> params;
  const std::string where = filter.sql(&params, true);
  // Each non-full unit joined with `full`'s unit on the same sample (same model file, task
  // options, question placement), with their values of each metric.
  const QueryResult r = store.query(
      "SELECT u.task, u.policy, u.kv_budget_spec, m.name, m.higher_is_better, m.value, fm.value, "
      "u.model, u.policy_options FROM units u JOIN metrics m ON m.unit_key = u.unit_key "
      "JOIN units f ON f.policy = 'full' AND f.status = 'ok' AND f.task = u.task "
      "AND f.model_sha256 = u.model_sha256 AND f.task_options = u.task_options "
      "AND f.sample_id = u.sample_id AND f.question = u.question "
      "JOIN metrics fm ON fm.unit_key = f.unit_key AND fm.name = m.name "
      "WHERE u.policy <> 'full' AND u.status = 'ok' AND m.value IS NOT NULL "
      "AND fm.value IS NOT NULL" + where + " ORDER BY u.sample_id, u.unit_key",
      params);
  using Key = std::tuple<std::string, std::string, std::string, std::string, std::string>;
  std::map<Key, std::pair<std::vector<double>, std::vector<double>>> groups;
  std::map<Key, bool> hib;
  const PolicyLabels label(store);
  for (const auto& row : r.rows) {
    const Key key{row[7].text, row[0].text, row[3].text, label(row[1].text, row[8].text),
                  budget_label(row[2].text)};
    groups[key].first.push_back(num(row[5]));
    groups[key].second.push_back(num(row[6]));
    hib[key] = row[4].text == "1";
  }
  std::vector<PairedRow> out;
  for (const auto& [key, ab] : groups) {
    PairedRow p;
    std::tie(p.model, p.task, p.metric, p.policy, p.budget) = key;
    p.higher_is_better = hib[key];
    p.mean = mean_ci(ab.first).mean;
    p.full_mean = mean_ci(ab.second).mean;
    p.pc = paired_bootstrap(ab.first, ab.second, 10000, 0);
    out.push_back(std::move(p));
  }
  sort_cells(out);
  return out;
}

std::string vs_full_missing(const Store& store, const std::vector<PairedRow>& rows) {
  if (!rows.empty()) return "";
  const QueryResult r = store.query(
      "SELECT COALESCE(SUM(policy = 'full'), 0), COALESCE(SUM(policy <> 'full'), 0) FROM units "
      "WHERE status = 'ok'");
  const std::string full = r.rows.at(0).at(0).text, others = r.rows.at(0).at(1).text;
  if (full == "0") {
    return "no comparison to full: the database has no `full` unit that finished ok (" + others +
           " units of other policies did). Add policy `full` to the sweep's policies (it takes "
           "no budget: one unit per sample) and run the sweep again; the units already done are "
           "kept.";
  }
  if (others == "0") return "no comparison to full: only `full` units finished ok.";
  return "no comparison to full: no policy's finished units share a sample, task and metric with "
         "a finished `full` unit (" + full + " full, " + others + " others).";
}

std::vector<CostRow> cost_rows(const Store& store, const Filter& filter) {
  std::vector<std::string> params;
  const std::string where = filter.sql(&params, false);
  const QueryResult r = store.query(
      "SELECT u.task, u.policy, u.kv_budget_spec, COALESCE(u.context_length, -1), COUNT(*), "
      "AVG(x.prompt_tokens), AVG(x.kv_bytes_final), AVG(x.kv_bytes_peak), "
      "AVG(x.kv_physical_peak), AVG(x.policy_state_bytes), AVG(x.occupancy_mean), "
      "MAX(x.occupancy_peak), "
      // Prefill times of units that prefilled their whole prompt only (prefix reuse: not alike).
      "AVG(CASE WHEN x.prefill_reused = 0 THEN x.prefill_ms END), "
      // Decode times of units that decoded alone only (a batch's steps are shared: not alike).
      "AVG(CASE WHEN x.decode_batch < 1.5 THEN x.decode_ms_p50 END), "
      "MAX(CASE WHEN x.decode_batch < 1.5 THEN x.decode_ms_p99 END), "
      "AVG(CASE WHEN x.decode_batch < 1.5 THEN x.tokens_per_s END), AVG(x.policy_ms), u.model, "
      "AVG(x.prefill_shared), SUM(x.decode_batch >= 1.5), SUM(x.prefill_reused > 0), "
      "u.policy_options "
      "FROM units u JOIN measurements x ON x.unit_key = u.unit_key WHERE u.status = 'ok'" +
          where +
          " GROUP BY u.model, u.task, u.policy, u.policy_options, u.kv_budget_spec, "
          "u.context_length",
      params);
  const PolicyLabels label(store);
  std::vector<CostRow> out;
  for (const auto& row : r.rows) {
    CostRow c;
    c.task = row[0].text;
    c.policy = label(row[1].text, row[21].text);
    c.budget = budget_label(row[2].text);
    c.context_length = std::atoi(row[3].text.c_str());
    c.n = std::atoi(row[4].text.c_str());
    c.prompt_tokens = num(row[5]);
    c.kv_final = num(row[6]);
    c.kv_peak = num(row[7]);
    c.physical_peak = num(row[8]);
    c.policy_state = num(row[9]);
    c.occupancy_mean = num(row[10]);
    c.occupancy_peak = std::atoi(row[11].text.c_str());
    c.prefill_ms = num(row[12]);
    c.decode_p50 = num(row[13]);
    c.decode_p99 = num(row[14]);
    c.tokens_per_s = num(row[15]);
    c.policy_ms = num(row[16]);
    c.model = row[17].text;
    c.prefill_shared = num(row[18]);
    c.batched = std::atoi(row[19].text.c_str());
    c.reused = std::atoi(row[20].text.c_str());
    out.push_back(std::move(c));
  }
  std::stable_sort(out.begin(), out.end(), [](const CostRow& a, const CostRow& b) {
    if (a.model != b.model) return a.model < b.model;
    if (a.task != b.task) return a.task < b.task;
    if (a.policy != b.policy) return policy_before(a.policy, b.policy);
    if (a.budget != b.budget) return budget_order(a.budget) < budget_order(b.budget);
    return a.context_length < b.context_length;
  });
  return out;
}

std::vector<GridCell> niah_grid(const Store& store, const Filter& filter) {
  std::vector<std::string> params;
  const std::string where = filter.sql(&params, false);
  const QueryResult r = store.query(
      "SELECT u.policy, u.kv_budget_spec, u.context_length, u.depth, COUNT(*), AVG(m.value), "
      "u.model, u.policy_options "
      "FROM units u JOIN metrics m ON m.unit_key = u.unit_key AND m.name = 'recall' "
      "WHERE u.task = 'niah' AND u.status = 'ok' AND m.value IS NOT NULL "
      "AND u.context_length IS NOT NULL AND u.depth IS NOT NULL" + where +
          " GROUP BY u.model, u.policy, u.policy_options, u.kv_budget_spec, u.context_length, "
          "u.depth",
      params);
  const PolicyLabels label(store);
  std::vector<GridCell> out;
  for (const auto& row : r.rows) {
    GridCell g;
    g.policy = label(row[0].text, row[7].text);
    g.budget = budget_label(row[1].text);
    g.context_length = std::atoi(row[2].text.c_str());
    g.depth = num(row[3]);
    g.n = std::atoi(row[4].text.c_str());
    g.recall = num(row[5]);
    g.model = row[6].text;
    out.push_back(std::move(g));
  }
  std::stable_sort(out.begin(), out.end(), [](const GridCell& a, const GridCell& b) {
    if (a.model != b.model) return a.model < b.model;
    if (a.policy != b.policy) return policy_before(a.policy, b.policy);
    if (a.budget != b.budget) return budget_order(a.budget) < budget_order(b.budget);
    if (a.context_length != b.context_length) return a.context_length < b.context_length;
    return a.depth < b.depth;
  });
  return out;
}

std::vector<ScoreCell> pareto_front(const std::vector<ScoreCell>& cells) {
  std::vector<ScoreCell> front;
  for (const auto& c : cells) {
    if (!std::isfinite(c.kv_bytes_peak) || !std::isfinite(c.ci.mean)) continue;
    const auto better = [&](double a, double b) { return c.higher_is_better ? a > b : a < b; };
    bool dominated = false;
    for (const auto& o : cells) {
      if (&o == &c || !std::isfinite(o.kv_bytes_peak) || !std::isfinite(o.ci.mean)) continue;
      const bool no_worse = o.kv_bytes_peak <= c.kv_bytes_peak && !better(c.ci.mean, o.ci.mean);
      const bool strictly = o.kv_bytes_peak < c.kv_bytes_peak || better(o.ci.mean, c.ci.mean);
      if (no_worse && strictly) {
        dominated = true;
        break;
      }
    }
    if (!dominated) front.push_back(c);
  }
  std::stable_sort(front.begin(), front.end(), [](const ScoreCell& a, const ScoreCell& b) {
    return a.kv_bytes_peak < b.kv_bytes_peak;
  });
  return front;
}

bool is_score_metric(const std::string& name) {
  return name.rfind("tokens", 0) != 0 && name.rfind("nll_sum", 0) != 0;
}

Table paper_table(const std::vector<ScoreCell>& cells, int digits) {
  // Columns: (task, metric) of higher-is-better metrics, in task order; a task with one such
  // metric is headed by its name alone.
  std::map<std::string, std::set<std::string>> metrics_of;  // task -> its hib metrics
  bool multi_model = false;
  for (const ScoreCell& c : cells) {
    if (c.higher_is_better && is_score_metric(c.metric)) metrics_of[c.task].insert(c.metric);
    multi_model = multi_model || c.model != cells.front().model;
  }
  std::vector<std::pair<std::string, std::string>> columns;
  for (const auto& [task, ms] : metrics_of) {
    for (const std::string& m : ms) columns.push_back({task, m});
  }
  std::vector<std::string> head;
  if (multi_model) head.push_back("model");
  head.push_back("policy");
  head.push_back("kv_budget");
  for (const auto& [task, m] : columns) {
    head.push_back(metrics_of[task].size() == 1 ? task : task + " " + m);
  }
  head.push_back("average");
  Table t(head);
  // Rows in the summary's order (policy, then budget), full first.
  using RowKey = std::tuple<std::string, std::string, std::string>;  // model, policy, budget
  std::vector<RowKey> rows;
  std::map<RowKey, std::map<std::pair<std::string, std::string>, const ScoreCell*>> at;
  for (const ScoreCell& c : cells) {
    if (!c.higher_is_better || !is_score_metric(c.metric) || c.values.empty()) continue;
    const RowKey k{c.model, c.policy, c.budget};
    if (!at.count(k)) rows.push_back(k);
    at[k][{c.task, c.metric}] = &c;
  }
  std::stable_sort(rows.begin(), rows.end(), [](const RowKey& a, const RowKey& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
    if (std::get<1>(a) != std::get<1>(b)) return policy_before(std::get<1>(a), std::get<1>(b));
    return budget_order(std::get<2>(a)) < budget_order(std::get<2>(b));
  });
  auto cell_text = [&](const MeanCI& ci) {
    return fixed(ci.mean, digits) + " (" + fixed(ci.lo, digits) + ", " + fixed(ci.hi, digits) + ")";
  };
  for (const RowKey& k : rows) {
    std::vector<std::string> r;
    if (multi_model) r.push_back(std::get<0>(k));
    r.push_back(std::get<1>(k));
    r.push_back(std::get<2>(k));
    std::vector<std::vector<double>> groups;
    for (const auto& col : columns) {
      const auto it = at[k].find(col);
      if (it == at[k].end()) {
        r.push_back("");
        continue;
      }
      r.push_back(cell_text(it->second->ci));
      groups.push_back(it->second->values);
    }
    // One task: its own cell (the same interval); several: the stratified bootstrap.
    r.push_back(groups.size() != columns.size() ? ""
                : groups.size() == 1            ? r.back()
                                                : cell_text(mean_of_means_ci(groups)));
    t.add(r);
  }
  return t;
}

Table summary_table(const std::vector<ScoreCell>& cells) {
  Table t({"model", "task", "policy", "kv_budget", "metric", "n", "mean", "ci95 lo", "ci95 hi",
           "ok", "error", "failed", "unfinished"});
  for (const auto& c : cells) {
    t.add({c.model, c.task, c.policy, c.budget, c.metric + (c.higher_is_better ? " ↑" : " ↓"),
           std::to_string(c.ci.n), fixed(c.ci.mean), fixed(c.ci.lo), fixed(c.ci.hi),
           std::to_string(c.ok), std::to_string(c.error), std::to_string(c.failed),
           std::to_string(c.unfinished)});
  }
  return t;
}

Table vs_full_table(const std::vector<PairedRow>& rows) {
  Table t({"model", "task", "policy", "kv_budget", "metric", "n", "mean", "full mean", "diff",
           "diff ci95 lo", "diff ci95 hi", "p", "verdict"});
  for (const auto& p : rows) {
    // The verdict reads the interval: excluding 0 means the samples support a difference.
    std::string verdict = "no evidence";
    if (p.pc.n >= 2 && (p.pc.lo > 0 || p.pc.hi < 0)) {
      verdict = (p.pc.mean_diff > 0) == p.higher_is_better ? "better" : "worse";
    }
    t.add({p.model, p.task, p.policy, p.budget, p.metric + (p.higher_is_better ? " ↑" : " ↓"),
           std::to_string(p.pc.n), fixed(p.mean), fixed(p.full_mean), fixed(p.pc.mean_diff),
           fixed(p.pc.lo), fixed(p.pc.hi), p_value_text(p.pc.p_value), verdict});
  }
  return t;
}

namespace {
std::string ctx(int c) { return c < 0 ? "-" : std::to_string(c); }
}  // namespace

Table memory_table(const std::vector<CostRow>& rows) {
  Table t({"model", "task", "policy", "kv_budget", "context_length", "n", "prompt tokens",
           "KV MiB final",
           "KV MiB peak", "physical MiB peak", "policy state KiB", "occupancy mean",
           "occupancy peak"});
  for (const auto& c : rows) {
    t.add({c.model, c.task, c.policy, c.budget, ctx(c.context_length), std::to_string(c.n),
           fixed(c.prompt_tokens, 1), fixed(c.kv_final / 1048576.0, 3),
           fixed(c.kv_peak / 1048576.0, 3), fixed(c.physical_peak / 1048576.0, 3),
           fixed(c.policy_state / 1024.0, 1), fixed(c.occupancy_mean, 1),
           std::to_string(c.occupancy_peak)});
  }
  return t;
}

Table latency_table(const std::vector<CostRow>& rows) {
  Table t({"model", "task", "policy", "kv_budget", "context_length", "n", "prefill ms",
           "decode ms/tok p50", "decode ms/tok p99", "tok/s", "policy ms", "prefill shared",
           "batched units", "prefix-reuse units"});
  for (const auto& c : rows) {
    t.add({c.model, c.task, c.policy, c.budget, ctx(c.context_length), std::to_string(c.n),
           fixed(c.prefill_ms, 1), fixed(c.decode_p50, 2), fixed(c.decode_p99, 2),
           fixed(c.tokens_per_s, 1), fixed(c.policy_ms, 2), fixed(c.prefill_shared, 2),
           std::to_string(c.batched), std::to_string(c.reused)});
  }
  return t;
}

Table niah_table(const std::vector<GridCell>& cells) {
  Table t({"model", "policy", "kv_budget", "context_length", "depth", "n", "recall"});
  for (const auto& g : cells) {
    char depth[32];
    std::snprintf(depth, sizeof(depth), "%g", g.depth);
    t.add({g.model, g.policy, g.budget, std::to_string(g.context_length), depth, std::to_string(g.n),
           fixed(g.recall)});
  }
  return t;
}

Table failures_table(const Store& store, const Filter& filter) {
  std::vector<std::string> params;
  const std::string where = filter.sql(&params, false);
  const QueryResult r = store.query(
      "SELECT u.task, u.sample_id, u.policy, u.kv_budget_spec, u.status, u.attempts, "
      "u.crash_count, COALESCE(u.error, ''), u.model FROM units u WHERE u.status NOT IN ('ok', 'superseded')" +
          where + " ORDER BY u.status, u.model, u.task, u.sample_id, u.policy",
      params);
  Table t({"model", "task", "sample_id", "policy", "kv_budget", "status", "attempts",
           "crash_count", "error"});
  for (const auto& row : r.rows) {
    t.add({row[8].text, row[0].text, row[1].text, row[2].text, budget_label(row[3].text), row[4].text,
           row[5].text, row[6].text, row[7].text});
  }
  return t;
}

Table pareto_table(const std::vector<ScoreCell>& cells) {
  Table t({"model", "task", "metric", "policy", "kv_budget", "KV MiB peak", "mean", "pareto"});
  std::map<std::tuple<std::string, std::string, std::string>, std::vector<ScoreCell>> by_metric;
  for (const auto& c : cells) by_metric[{c.model, c.task, c.metric}].push_back(c);
  for (const auto& [key, group] : by_metric) {
    std::set<std::pair<std::string, std::string>> front;
    for (const auto& f : pareto_front(group)) front.insert({f.policy, f.budget});
    for (const auto& c : group) {
      t.add({c.model, c.task, c.metric + (c.higher_is_better ? " ↑" : " ↓"), c.policy, c.budget,
             fixed(c.kv_bytes_peak / 1048576.0, 3), fixed(c.ci.mean),
             front.count({c.policy, c.budget}) ? "yes" : ""});
    }
  }
  return t;
}

}  // namespace kvb::results
