// `kvbench report` (results/report.h): sections of plots and tables, written as HTML, Markdown,
// CSV and SVG from the same data.
#include "results/report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/escape.h"
#include "common/log.h"
#include "results/groups.h"
#include "results/report_dir.h"
#include "results/svg.h"

namespace kvb::results {

namespace {

namespace fs = std::filesystem;

struct Plot {
  std::string id, title, svg;
};
struct NamedTable {
  std::string name, caption;
  Table table;
};
struct Section {
  std::string id, title, intro;
  std::vector<Plot> plots;
  std::vector<NamedTable> tables;
  std::string pre;  // preformatted text (configs), escaped on output
};

// Counts and sums are bookkeeping, not scores: they get no score plot.
bool plotted_metric(const std::string& name) { return is_score_metric(name); }

std::string slug(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c));
    if (ok) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else if (!out.empty() && out.back() != '-') out += '-';
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "x" : out;
}

// A style per policy fixed by its name, the same in every report (issue 34): full is style 7,
// black with a cross (dashed where it is a reference line); every other policy has its index in
// policy_style_index, skipping every style with full's colour, so 49 policies get distinct
// (colour, marker) pairs.
class Styles {
 public:
  static constexpr int kFull = 7;
  int operator()(const std::string& policy) const {
    if (policy == "full") return kFull;
    const int i = policy_style_index(policy);
    return (i / 7) * 8 + i % 7;
  }
};

// How a task is named in plot titles and ids: prefixed by its model when the database holds
// several (single-model reports keep short ids).
// It also keeps plot ids (file names) unique: slugs are lossy (models `smol.lm` and `smol-lm`
// both slug to `smol-lm`), so an id already taken by another key gets a short hash of its key.
struct Scope {
  bool multi = false;
  std::string operator()(const std::string& model, const std::string& task) const {
    return multi ? model + " / " + task : task;
  }
  std::string unique_id(const std::string& id, const std::string& key) const {
    auto [it, added] = owners.emplace(id, key);
    if (added || it->second == key) return id;
    uint64_t h = 1469598103934665603ull;  // FNV-1a 64 of the key
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
    const std::string out = id + "-" + std::string(hex, 8);
    KVB_CHECK(owners.emplace(out, key).second) << "plot id " << out << " is taken twice";
    return out;
  }
  mutable std::map<std::string, std::string> owners;  // plot id -> the unslugged key it names
};

// Score vs budget per (model, task, metric): one series per policy with its CI band; `full` as a dashed
// line with its band across every budget.
std::vector<Plot> score_plots(const std::vector<ScoreCell>& cells, const Styles& styles,
                              const Scope& scope) {
  std::vector<Plot> out;
  std::map<std::pair<std::string, std::string>, std::vector<const ScoreCell*>> groups;
  for (const auto& c : cells) {
    if (plotted_metric(c.metric)) groups[{scope(c.model, c.task), c.metric}].push_back(&c);
  }
  for (const auto& [key, group] : groups) {
    std::vector<std::string> budgets;
    for (const ScoreCell* c : group) {
      if (c->budget != "-" && std::find(budgets.begin(), budgets.end(), c->budget) == budgets.end()) {
        budgets.push_back(c->budget);
      }
    }
    if (budgets.empty()) continue;
    std::sort(budgets.begin(), budgets.end(),
              [](const auto& a, const auto& b) { return budget_order(a) < budget_order(b); });
    const bool hib = group.front()->higher_is_better;
    svg::LinePlot p;
    p.id = scope.unique_id("score-" + slug(key.first) + "-" + slug(key.second),
                           "score\n" + key.first + "\n" + key.second);
    p.title = key.first + ": " + key.second + (hib ? " (higher is better)" : " (lower is better)");
    p.x.label = budget_axis_label(budgets);
    p.x.categories = budgets;
    p.y.label = key.second;
    p.note = "bands: 95% interval of the mean over samples (Wilson for 0/1 scores, else "
             "bootstrap); dashed: full cache";
    std::map<std::string, svg::Series> series;
    for (const ScoreCell* c : group) {
      auto [it, fresh] = series.try_emplace(c->policy);
      svg::Series& s = it->second;
      if (fresh) {
        s.name = c->policy;
        s.style = styles(c->policy);
        s.dashed = c->policy == "full";
      }
      if (c->budget == "-") {  // full and think take no budget: one value across the axis
        for (size_t i = 0; i < budgets.size(); ++i) {
          s.x.push_back(double(i));
          s.y.push_back(c->ci.mean);
          s.lo.push_back(c->ci.lo);
          s.hi.push_back(c->ci.hi);
        }
        continue;
      }
      const size_t i = std::find(budgets.begin(), budgets.end(), c->budget) - budgets.begin();
      s.x.push_back(double(i));
      s.y.push_back(c->ci.mean);
      s.lo.push_back(c->ci.lo);
      s.hi.push_back(c->ci.hi);
    }
    for (auto& [name, s] : series) {
      // Points in budget order so that the line runs left to right.
      std::vector<size_t> order(s.x.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return s.x[a] < s.x[b]; });
      svg::Series sorted = s;
      for (size_t i = 0; i < order.size(); ++i) {
        sorted.x[i] = s.x[order[i]];
        sorted.y[i] = s.y[order[i]];
        sorted.lo[i] = s.lo[order[i]];
        sorted.hi[i] = s.hi[order[i]];
      }
      p.series.push_back(sorted);
    }
    std::stable_sort(p.series.begin(), p.series.end(), [](const auto& a, const auto& b) {
      return policy_before(a.name, b.name);
    });
    const int height = std::max(360, 90 + 18 * static_cast<int>(p.series.size()));
    out.push_back({p.id, p.title, svg::render(p, 640, height)});
  }
  return out;
}

// Pareto: mean score vs mean peak KV bytes per (policy, budget); the front as a dashed line.
// Score vs kvpress's compression ratio per (model, task, metric) (issue 34: its leaderboard's
// axis): a series per policy through its budgets, x the mean fraction of each prompt the budget
// removes (ScoreCell::compression_ratio), with the interval bands; `full` at 0. Drawn only where
// some budget removes anything.
std::vector<Plot> compression_plots(const std::vector<ScoreCell>& cells, const Styles& styles,
                                    const Scope& scope) {
  std::vector<Plot> out;
  std::map<std::pair<std::string, std::string>, std::vector<const ScoreCell*>> groups;
  for (const auto& c : cells) {
    if (plotted_metric(c.metric)) groups[{scope(c.model, c.task), c.metric}].push_back(&c);
  }
  for (const auto& [key, group] : groups) {
    const bool any = std::any_of(group.begin(), group.end(),
                                 [](const ScoreCell* c) { return c->compression_ratio > 0; });
    if (!any) continue;
    svg::LinePlot p;
    p.id = scope.unique_id("compression-" + slug(key.first) + "-" + slug(key.second),
                           "compression\n" + key.first + "\n" + key.second);
    p.title = key.first + ": " + key.second + " vs compression ratio";
    p.x.label = "compression ratio: fraction of the prompt removed (kvpress); fraction kept = 1 - x";
    p.y.label = key.second + (group.front()->higher_is_better ? " (higher is better)"
                                                              : " (lower is better)");
    p.note = "x: the mean over the cell's prompts of 1 - kv_budget / prompt tokens; bands: 95% "
             "intervals";
    std::map<std::string, std::vector<const ScoreCell*>> by_policy;
    for (const ScoreCell* c : group) by_policy[c->policy].push_back(c);
    for (auto& [policy, pts] : by_policy) {
      std::sort(pts.begin(), pts.end(), [](const ScoreCell* a, const ScoreCell* b) {
        return a->compression_ratio < b->compression_ratio;
      });
      svg::Series s;
      s.name = policy;
      s.style = styles(policy);
      s.dashed = policy == "full";
      for (const ScoreCell* c : pts) {
        s.x.push_back(c->compression_ratio);
        s.y.push_back(c->ci.mean);
        s.lo.push_back(c->ci.lo);
        s.hi.push_back(c->ci.hi);
      }
      p.series.push_back(s);
    }
    std::stable_sort(p.series.begin(), p.series.end(), [](const auto& a, const auto& b) {
      return policy_before(a.name, b.name);
    });
    const int height = std::max(360, 90 + 18 * static_cast<int>(p.series.size()));
    out.push_back({p.id, p.title, svg::render(p, 640, height)});
  }
  return out;
}

std::vector<Plot> pareto_plots(const std::vector<ScoreCell>& cells, const Styles& styles,
                               const Scope& scope) {
  std::vector<Plot> out;
  std::map<std::pair<std::string, std::string>, std::vector<ScoreCell>> groups;
  for (const auto& c : cells) {
    if (plotted_metric(c.metric) && std::isfinite(c.kv_bytes_peak) && c.kv_bytes_peak > 0) {
      groups[{scope(c.model, c.task), c.metric}].push_back(c);
    }
  }
  for (const auto& [key, group] : groups) {
    svg::LinePlot p;
    p.id = scope.unique_id("pareto-" + slug(key.first) + "-" + slug(key.second),
                           "pareto\n" + key.first + "\n" + key.second);
    p.title = key.first + ": " + key.second + " vs KV memory";
    p.x.label = "KV cache MiB (peak, logical; log scale)";
    p.x.log = true;
    p.y.label = key.second + (group.front().higher_is_better ? " (higher is better)"
                                                             : " (lower is better)");
    p.note = "one point per policy and budget (hover for the budget); dashed: the Pareto front";
    std::map<std::string, svg::Series> series;
    for (const auto& c : group) {
      svg::Series& s = series[c.policy];
      s.name = c.policy;
      s.style = styles(c.policy);
      s.line = false;
      s.x.push_back(c.kv_bytes_peak / 1048576.0);
      s.y.push_back(c.ci.mean);
    }
    for (auto& [name, s] : series) p.series.push_back(s);
    std::stable_sort(p.series.begin(), p.series.end(), [](const auto& a, const auto& b) {
      return policy_before(a.name, b.name);
    });
    svg::Series front;
    front.name = "Pareto front";
    front.dashed = true;
    front.marks = false;
    for (const auto& c : pareto_front(group)) {
      front.x.push_back(c.kv_bytes_peak / 1048576.0);
      front.y.push_back(c.ci.mean);
    }
    p.series.push_back(front);
    const int height = std::max(360, 90 + 18 * static_cast<int>(p.series.size()));
    out.push_back({p.id, p.title, svg::render(p, 640, height)});
  }
  return out;
}

// Memory and latency vs context length, one plot per (task, budget, quantity), policies as series
// (full in every one of them as the reference).
std::vector<Plot> cost_plots(const std::vector<CostRow>& rows, const Styles& styles,
                             const Scope& scope, bool memory) {
  std::vector<Plot> out;
  std::map<std::string, std::set<int>> lengths;
  for (const auto& r : rows) {
    if (r.context_length > 0) lengths[scope(r.model, r.task)].insert(r.context_length);
  }
  struct Quantity {
    const char* key;
    const char* label;
    double CostRow::*field;
    double scale;
  };
  const std::vector<Quantity> quantities =
      memory ? std::vector<Quantity>{{"kv", "KV cache MiB (peak, logical)", &CostRow::kv_peak,
                                      1.0 / 1048576}}
             : std::vector<Quantity>{{"prefill", "prefill ms", &CostRow::prefill_ms, 1},
                                     {"decode", "decode ms/token (p50)", &CostRow::decode_p50, 1}};
  for (const auto& [task, lens] : lengths) {
    if (lens.size() < 2) continue;  // one length: the table says it all
    std::set<std::string> budget_set;
    for (const auto& r : rows) {
      if (scope(r.model, r.task) == task && r.budget != "-") budget_set.insert(r.budget);
    }
    std::vector<std::string> budgets(budget_set.begin(), budget_set.end());
    std::sort(budgets.begin(), budgets.end(),
              [](const auto& a, const auto& b) { return budget_order(a) < budget_order(b); });
    if (budgets.empty()) budgets.push_back("-");
    const bool log_x = double(*lens.rbegin()) / double(*lens.begin()) >= 4;
    for (const auto& q : quantities) {
      for (const auto& budget : budgets) {
        svg::LinePlot p;
        p.id = scope.unique_id(
            std::string(q.key) + "-" + slug(task) + (budget == "-" ? "" : "-b" + slug(budget)),
            std::string(q.key) + "\n" + task + "\n" + budget);
        p.title = task + ": " + q.label + (budget == "-" ? "" : ", budget " + budget);
        p.x.label = std::string("context length (tokens") + (log_x ? ", log scale)" : ")");
        p.x.log = log_x;
        if (lens.size() <= 8) p.x.ticks.assign(lens.begin(), lens.end());
        p.y.label = q.label;
        p.y.zero_based = true;
        p.note = "means over the samples of each context length";
        if (memory) {
          // A log axis: a linear one flattens every compressed policy onto the floor beside full.
          p.y.log = true;
          p.y.zero_based = false;
          p.y.label = std::string(q.label) + ", log scale";
        }
        std::map<std::string, svg::Series> series;
        for (const auto& r : rows) {
          if (scope(r.model, r.task) != task || r.context_length <= 0) continue;
          if (r.budget != budget && r.budget != "-") continue;  // full, think: no budget
          svg::Series& s = series[r.policy];
          s.name = r.policy;
          s.style = styles(r.policy);
          s.dashed = r.policy == "full";
          s.x.push_back(r.context_length);
          s.y.push_back(r.*(q.field) * q.scale);
        }
        for (auto& [name, s] : series) p.series.push_back(s);
        std::stable_sort(p.series.begin(), p.series.end(), [](const auto& a, const auto& b) {
          return policy_before(a.name, b.name);
        });
        // A plot with measured points at fewer than two lengths is left out, as a task with one
        // length is: the section's words say why (the quickstart decodes in batches, so no unit
        // has a decode time of its own, and reuses prefixes below 4096 tokens).
        std::set<double> measured;
        for (const auto& se : p.series) {
          for (size_t i = 0; i < se.x.size(); ++i) {
            if (std::isfinite(se.y[i])) measured.insert(se.x[i]);
          }
        }
        if (measured.size() < 2) continue;
        const int height = std::max(340, 90 + 18 * static_cast<int>(p.series.size()));
        out.push_back({p.id, p.title, svg::render(p, 640, height)});
      }
    }
  }
  return out;
}

std::vector<Plot> niah_plots(const std::vector<GridCell>& grid, const Scope& scope) {
  std::vector<Plot> out;
  std::map<std::pair<std::string, std::string>, std::vector<const GridCell*>> groups;
  std::vector<std::pair<std::string, std::string>> order;
  for (const auto& g : grid) {
    // A single-model report names maps by policy alone ("niah-snapkv-b128").
    const std::string who = scope.multi ? g.model + " / " + g.policy : g.policy;
    auto key = std::make_pair(who, g.budget);
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(&g);
  }
  for (const auto& key : order) {
    const auto& cells = groups[key];
    std::set<int> lens;
    std::set<double> depths;
    for (const GridCell* g : cells) lens.insert(g->context_length), depths.insert(g->depth);
    svg::Heatmap m;
    m.id = scope.unique_id(
        "niah-" + slug(key.first) + (key.second == "-" ? "" : "-b" + slug(key.second)),
        "niah\n" + key.first + "\n" + key.second);
    m.title = key.first + (key.second == "-" ? "" : " @ " + key.second);
    m.row_label = "context length";
    m.col_label = "depth %";
    for (int l : lens) m.rows.push_back(std::to_string(l));
    for (double d : depths) m.cols.push_back(svg::tick_label(d));
    m.values.assign(m.rows.size() * m.cols.size(), kNaN);
    for (const GridCell* g : cells) {
      const size_t r = std::distance(lens.begin(), lens.find(g->context_length));
      const size_t c = std::distance(depths.begin(), depths.find(g->depth));
      m.values[r * m.cols.size() + c] = g->recall;
    }
    out.push_back({m.id, "NIAH recall: " + m.title, svg::render(m)});
  }
  return out;
}

// A Markdown code fence longer than any run of backticks in the text.
std::string fence_for(const std::string& text) {
  size_t longest = 0, run = 0;
  for (char c : text) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  return std::string(std::max<size_t>(3, longest + 1), '`');
}

// Escaped text with `code` spans as <code> (the intros are written for Markdown).
std::string html_with_code(const std::string& text) {
  std::string out;
  bool open = false;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == '`') {
      out += html_escape(text.substr(start, i - start));
      if (i < text.size()) out += (open = !open) ? "<code>" : "</code>";
      start = i + 1;
    }
  }
  if (open) out += "</code>";
  return out;
}

const char* kCss = R"css(
body{font-family:sans-serif;margin:24px auto;max-width:1400px;color:#111;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:32px}
h3{font-size:14px}nav a{margin-right:12px}
.plots{display:flex;flex-wrap:wrap;gap:12px}.plots figure{margin:0}
table{border-collapse:collapse;font-size:12px;margin:8px 0 16px}
th,td{border:1px solid #ccc;padding:2px 6px}th{background:#f2f2f2}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}
.meta{color:#444;font-size:13px}
@media print{.plots figure{break-inside:avoid}nav{display:none}}
)css";

}  // namespace

const std::vector<std::string>& policy_style_order() {
  // kvbench's policies in their registry's order when each got its style; new ones are appended,
  // never inserted, so that no policy's colour ever changes.
  static const std::vector<std::string> order = {
      "window",        "h2o",       "subgen", "subgen_kcenter", "snapkv",   "pyramidkv",
      "ada_snapkv",    "ada_pyramidkv", "streaming_llm", "scissorhands", "tova", "knorm",
      "random",        "keydiff",   "observed_attention", "cur", "lagkv", "python",
      "expected_attention", "simlayerkv", "duo_attention", "noncausal_attn", "leverage",
      "compactor",     "think",     "qfilter", "finch", "kvzip"};
  return order;
}

int policy_style_index(const std::string& policy) {
  const std::vector<std::string>& order = policy_style_order();
  const auto it = std::find(order.begin(), order.end(), policy);
  if (it != order.end()) return static_cast<int>(it - order.begin());
  uint32_t h = 2166136261u;  // FNV-1a 32 of the name: a policy of the user's own keeps its style
  for (unsigned char c : policy) h = (h ^ c) * 16777619u;
  const int known = static_cast<int>(order.size());
  return known + static_cast<int>(h % static_cast<uint32_t>(kPolicyStyles - known));
}

ReportFiles write_report(const Store& store, const ReportOptions& opt) {
  const QueryResult counts = store.query("SELECT COUNT(*), COALESCE(SUM(status = 'ok'), 0) FROM units");
  ReportFiles files;
  files.units = std::stoi(counts.rows[0][0].text);
  files.ok_units = std::stoi(counts.rows[0][1].text);
  KVB_USAGE_CHECK(files.units > 0) << store.path()
                                   << " holds no units: nothing to report (run kvbench sweep "
                                      "CONFIG --db " << store.path() << " first)";
  opt.filter.check_against(store);

  const std::vector<ScoreCell> cells = score_cells(store, opt.filter);
  const std::vector<PairedRow> pairs = vs_full(store, opt.filter);
  const std::vector<CostRow> cost = cost_rows(store, opt.filter);
  const std::vector<GridCell> grid = niah_grid(store, opt.filter);
  const std::vector<GroupRow> groups = group_rows(store, opt.filter);
  const Styles styles;
  Scope scope;
  scope.multi = store.query("SELECT COUNT(DISTINCT model) FROM units").rows[0][0].text != "1";

  std::vector<Section> sections;
  if (!opt.findings.empty()) {
    Section s{"findings", "Findings: the paper's claims", "", {}, {}, ""};
    std::vector<FindingRow> rows;
    std::string papers;
    for (const Findings& f : opt.findings) {
      papers += (papers.empty() ? "" : ", ") + f.paper;
      for (FindingRow& r : evaluate_findings(store, f)) rows.push_back(std::move(r));
    }
    int counts[3] = {0, 0, 0};
    for (const FindingRow& r : rows) {
      if (r.budget == "all" || std::none_of(rows.begin(), rows.end(), [&](const FindingRow& o) {
            return o.id == r.id && o.model == r.model && o.budget == "all";
          })) {
        counts[r.verdict == "reproduced" ? 0 : r.verdict == "not reproduced" ? 1 : 2] += 1;
      }
    }
    s.intro = "The claims of " + papers + " as its config states them (findings:), each with a "
              "verdict from this database: " + std::to_string(counts[0]) + " reproduced, " +
              std::to_string(counts[1]) + " not reproduced, " + std::to_string(counts[2]) +
              " inconclusive. " + kFindingsRule + " Filters do not apply here.";
    s.tables.push_back({"findings", "Claims and verdicts", findings_table(rows)});
    sections.push_back(std::move(s));
  }
  {
    Section s{"scores", "Score vs KV budget", "", {}, {}, ""};
    s.intro = std::string("Mean score per model, task, metric, policy and budget over the samples "
                          "that finished. ") +
              kScoreCiMethod + " (identical non-binary scores, or n = 1 of them: no interval).";
    s.plots = score_plots(cells, styles, scope);
    for (Plot& pl : compression_plots(cells, styles, scope)) s.plots.push_back(std::move(pl));
    s.tables.push_back({"summary", "Summary: task x policy x budget x metric", summary_table(cells)});
    sections.push_back(std::move(s));
  }
  {
    Section s{"paper", "Methods x tasks", "", {}, {}, ""};
    s.intro = std::string("The form of a KV-cache paper's main table: a row per policy and budget, "
                          "a column per task (its higher-is-better metrics), each cell the mean "
                          "(95% interval), and the average of the row's task means, whose interval "
                          "resamples each task's samples (a stratified percentile bootstrap, "
                          "10,000 resamples). ") +
              kScoreCiMethod + ". The LaTeX file is a booktabs tabular.";
    s.tables.push_back({"paper", "Methods x tasks", paper_table(cells)});
    sections.push_back(std::move(s));
  }
  {
    Section s{"paired", "Paired comparison to full", "", {}, {}, ""};
    s.intro = "Each policy against `full` on the same samples: mean difference (policy - full) "
              "with a paired-bootstrap 95% CI (10,000 resamples, seed 0) and a two-sided p-value "
              "(`< 1e-4`: no resample reached 0, below what 10,000 resamples resolve). An "
              "interval that excludes 0 is a difference the samples support.";
    const std::string missing = vs_full_missing(store, pairs);
    if (!missing.empty()) s.intro = missing;
    s.tables.push_back({"vs_full", "Paired difference to full", vs_full_table(pairs)});
    sections.push_back(std::move(s));
  }
  if (!groups.empty()) {
    Section s{"groups", "Task groups", "", {}, {}, ""};
    s.intro =
        "Per task group (a task definition's `group:`, e.g. `ruler`): the mean over the "
        "group's tasks of each task's mean score, as RULER's summary figure averages its 13 "
        "tasks, per data folder (`data_dir`: one context length for RULER's files), policy "
        "and budget. The 95% CI is the stratified percentile bootstrap of that "
        "mean (each task's scores resampled on their own, 10,000 resamples, seed 0), as the "
        "paper table's average; `tasks` counts the tasks with a score, so a partial group shows.";
    s.tables.push_back({"groups", "Task-group mean per policy and budget", groups_table(groups)});
    sections.push_back(std::move(s));
  }
  if (!grid.empty()) {
    Section s{"niah", "Needle in a haystack", "", {}, {}, ""};
    s.intro = "Recall per context length (rows) and needle depth (columns), per policy and budget; "
              "each cell prints its value, so the maps read in grey-scale too.";
    s.plots = niah_plots(grid, scope);
    s.tables.push_back({"niah_grid", "NIAH recall grid", niah_table(grid)});
    sections.push_back(std::move(s));
  }
  {
    Section s{"memory", "Memory vs context length", "", {}, {}, ""};
    s.intro = "Logical KV bytes (retained slots x slot bytes) at their peak, physical bytes "
              "allocated, policy state and cache occupancy in tokens per (layer, head).";
    s.plots = cost_plots(cost, styles, scope, true);
    s.tables.push_back({"memory", "Memory by policy, budget and context length", memory_table(cost)});
    sections.push_back(std::move(s));
  }
  {
    Section s{"latency", "Latency vs context length", "", {}, {}, ""};
    s.intro =
        "Prefill (prompt forward with compression), decode per token (p50 mean over units, "
        "p99 max over units), throughput and time inside the policy's hooks. Where "
        "\"prefill shared\" is above 0, a sample's prompt forward pass ran once for all "
        "its oneshot policies, so their prefill times are that one pass. Decode times "
        "compare like with like: they average only units that decoded alone; units that "
        "decoded in a batch with other units (kvbench sweep --decode-batch; \"batched "
        "units\") shared each step's time and are left out of them (run with "
        "--decode-batch 1 to measure latency). Prefill times likewise average only units that "
        "prefilled their whole prompt: a unit whose shared prefill started from an earlier "
        "prompt's identical first tokens (prefix reuse; \"prefix-reuse units\") is left "
        "out of them (run with --prefix-cache-mib 0 to measure every prefill).";
    // Say in words where the plots have no points, and why (issue 34: the quickstart's sweep
    // decodes in batches and reuses prefixes, so its latency plots were empty without a word).
    int units = 0, batched = 0, reused = 0;
    std::set<int> lengths, decode_lengths, prefill_lengths;
    for (const CostRow& r : cost) {
      units += r.n;
      batched += r.batched;
      reused += r.reused;
      if (r.context_length <= 0) continue;
      lengths.insert(r.context_length);
      if (std::isfinite(r.decode_p50)) decode_lengths.insert(r.context_length);
      if (std::isfinite(r.prefill_ms)) prefill_lengths.insert(r.context_length);
    }
    auto missing = [&](const std::set<int>& have) {
      std::string out;
      for (int l : lengths) {
        if (!have.count(l)) out += (out.empty() ? "" : ", ") + std::to_string(l);
      }
      return out;
    };
    const std::string no_decode = missing(decode_lengths), no_prefill = missing(prefill_lengths);
    if (!no_decode.empty()) {
      s.intro += " **This database has no decode latency at " + no_decode + " tokens**: " +
                 std::to_string(batched) + " of its " + std::to_string(units) +
                 " units decoded in a batch, so those lengths have no decode time (sweep "
                 "with --decode-batch 1 to measure them).";
    }
    if (!no_prefill.empty()) {
      s.intro += " **No prefill latency at " + no_prefill + " tokens**: " +
                 std::to_string(reused) + " of its " + std::to_string(units) +
                 " units reused an earlier prompt's prefix (sweep with --prefix-cache-mib 0 to "
                 "measure every prefill).";
    }
    if (!no_decode.empty() || !no_prefill.empty()) {
      s.intro += " A latency plot with measured points at fewer than two lengths is left out.";
    }
    s.plots = cost_plots(cost, styles, scope, false);
    s.tables.push_back({"latency", "Latency by policy, budget and context length", latency_table(cost)});
    sections.push_back(std::move(s));
  }
  {
    Section s{"pareto", "Score vs KV memory (Pareto)", "", {}, {}, ""};
    s.intro = "Each policy and budget as a point: mean score against mean peak KV bytes. Points on "
              "the front are not beaten on both at once by any other point.";
    s.plots = pareto_plots(cells, styles, scope);
    s.tables.push_back({"pareto", "Score and KV memory per policy and budget", pareto_table(cells)});
    sections.push_back(std::move(s));
  }
  {
    Section s{"failures", "Failures", "", {}, {}, ""};
    Table t = failures_table(store, opt.filter);
    s.intro = t.empty() ? "Every unit finished ok." : std::to_string(t.size()) +
                                                           " unit(s) did not finish ok.";
    s.tables.push_back({"failures", "Units that did not finish ok", std::move(t)});
    sections.push_back(std::move(s));
  }
  {
    Section s{"provenance", "Provenance", "", {}, {}, ""};
    const QueryResult runs = store.query(
        "SELECT run_id, started_at, COALESCE(finished_at, ''), status, git_rev, kvbench_version, "
        "host, ranks, devices, build_info, model_hashes, config_sha256, config_text FROM runs "
        "ORDER BY run_id");
    Table t({"run", "started", "finished", "status", "git rev", "kvbench", "host", "ranks",
             "devices", "build", "models", "config sha256"});
    std::map<std::string, std::string> configs;
    for (const auto& r : runs.rows) {
      std::vector<std::string> row;
      for (size_t c = 0; c + 1 < r.size(); ++c) row.push_back(r[c].text);
      t.add(row);
      configs[r[11].text] = r[12].text;
    }
    s.intro = "Database " + store.path() + ": " + std::to_string(files.units) + " units, " +
              std::to_string(files.ok_units) + " ok, from " + std::to_string(runs.rows.size()) +
              " run(s).";
    s.tables.push_back({"runs", "Runs (sweep invocations)", std::move(t)});
    for (const auto& [sha, text] : configs) {
      s.pre += "# config " + sha + "\n" + text + (text.empty() || text.back() == '\n' ? "" : "\n");
    }
    sections.push_back(std::move(s));
  }

  ReportDir out(opt.out_dir);  // refuses symbolic links; deletes only its own earlier files
  std::string filter_text;
  for (const auto& [key, values] : opt.filter.allow) {
    std::string v;
    for (const auto& x : values) v += (v.empty() ? "" : ",") + x;
    filter_text += (filter_text.empty() ? "" : "; ") + key + " = " + v;
  }
  std::ostringstream html, md;
  html << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
       << ReportDir::kHtmlMarker
       << "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
          "style-src 'unsafe-inline'\">"
       << "<title>" << html_escape(opt.title) << "</title><style>" << kCss << "</style></head>\n"
       << "<body>\n<h1>" << html_escape(opt.title) << "</h1>\n<p class=\"meta\">"
       << html_escape(store.path()) << " &middot; " << files.units << " units, " << files.ok_units
       << " ok" << (filter_text.empty() ? "" : " &middot; filter: " + html_escape(filter_text))
       << "</p>\n<nav>";
  md << ReportDir::kMarkdownMarker << "\n"
     << "# " << md_cell(opt.title) << "\n\n"
     << md_cell(store.path()) << ": " << files.units << " units, " << files.ok_units << " ok"
     << (filter_text.empty() ? "" : "; filter: " + md_cell(filter_text)) << "\n";
  for (const auto& s : sections) html << "<a href=\"#" << s.id << "\">" << s.title << "</a>";
  html << "</nav>\n";
  for (const auto& s : sections) {
    html << "<section id=\"" << s.id << "\">\n<h2>" << html_escape(s.title) << "</h2>\n<p>"
         << html_with_code(s.intro) << "</p>\n";
    md << "\n## " << s.title << "\n\n" << s.intro << "\n";
    if (!s.plots.empty()) {
      html << "<div class=\"plots\">\n";
      md << "\n";
      for (const auto& p : s.plots) {
        html << "<figure>" << p.svg << "</figure>\n";
        out.write("plots/" + p.id + ".svg", p.svg);
        md << "![" << md_cell(p.title) << "](plots/" << p.id << ".svg)\n";
        files.plots.push_back(p.id);
      }
      html << "</div>\n";
    }
    for (const auto& t : s.tables) {
      html << "<h3>" << html_escape(t.caption) << " <a href=\"csv/" << t.name
           << ".csv\">(CSV)</a> <a href=\"latex/" << t.name << ".tex\">(LaTeX)</a></h3>\n";
      md << "\n### " << t.caption << " ([CSV](csv/" << t.name << ".csv), [LaTeX](latex/" << t.name
         << ".tex))\n\n";
      if (t.table.empty()) {
        html << "<p>(no rows)</p>\n";
        md << "(no rows)\n";
      } else {
        // Long tables fold (a <details> element: no script needed to open it).
        const bool fold = t.table.size() > 40;
        if (fold) html << "<details><summary>" << t.table.size() << " rows</summary>\n";
        t.table.print(html, "html");
        if (fold) html << "</details>\n";
        t.table.print(md, "md");
      }
      std::ostringstream csv;
      t.table.print(csv, "csv");
      out.write("csv/" + t.name + ".csv", csv.str());
      std::ostringstream tex;  // booktabs: \usepackage{booktabs} in the paper
      t.table.print(tex, "latex");
      out.write("latex/" + t.name + ".tex", tex.str());
      files.tables.push_back(t.name);
    }
    if (!s.pre.empty()) {
      html << "<h3>Configurations</h3>\n<pre>" << html_escape(s.pre) << "</pre>\n";
      const std::string fence = fence_for(s.pre);
      md << "\n### Configurations\n\n" << fence << "yaml\n" << s.pre << fence << "\n";
    }
    html << "</section>\n";
  }
  html << "</body></html>\n";
  out.write("index.html", html.str());
  out.write("report.md", md.str());
  out.finish();
  return files;
}

}  // namespace kvb::results
