// `findings:` in a sweep config (harness/findings_config.h; configs/README.md "Findings").
#include "harness/findings_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "common/error.h"
#include "harness/task_file.h"
#include "harness/yaml_tree.h"
#include "kernels/policies/policy.h"
#include "tasks/task.h"

namespace kvb::harness {

namespace {

using namespace yamlcfg;  // NOLINT: the config tree and its checks (harness/yaml_tree.h)

std::map<std::string, std::string> read_options(const Node* n, const std::string& key) {
  std::map<std::string, std::string> out;
  if (!n) return out;
  if (n->kind != Node::Kind::kMap) fail(*n, key, "expected a mapping of policy options");
  for (const Entry& e : n->map) out[e.key] = scalar(e.value, key + "." + e.key);
  return out;
}

// {policy, options, kv_budget} (kv_budget: one value, or a list when `budgets_allowed`), or a
// bare policy name.
struct CellSpec {
  results::FindingCell cell;
  std::vector<std::string> budgets;  // spec texts; empty: none given
};
CellSpec read_cell(const Node& n, const std::string& key, bool list_allowed, bool weighted) {
  CellSpec c;
  if (n.kind == Node::Kind::kScalar) {
    if (weighted) fail(n, key, "expected {weight, policy, options, kv_budget}");
    c.cell.policy = n.scalar;
    return c;
  }
  std::vector<std::string> allowed = {"policy", "options", "kv_budget"};
  if (weighted) allowed.push_back("weight");
  expect_map(n, key, allowed);
  const Entry* p = n.find("policy");
  if (!p) fail(n, key, "needs policy: (a policy of this config)");
  c.cell.policy = scalar(p->value, key + ".policy");
  if (const Entry* o = n.find("options"))
    c.cell.options = read_options(&o->value, key + ".options");
  if (weighted) {
    const Entry* w = n.find("weight");
    if (!w) fail(n, key, "needs weight: (a number; +1 and -1 make a difference)");
    c.cell.weight = to_double(w->value, key + ".weight");
    if (c.cell.weight == 0) fail(w->value, key + ".weight", "a weight of 0 adds nothing");
  }
  if (const Entry* b = n.find("kv_budget")) {
    if (b->value.kind == Node::Kind::kSeq) {
      if (!list_allowed)
        fail(b->value, key + ".kv_budget", "one budget here (a list belongs in compare:)");
      for (const auto& [item, ikey] : items_of(b->value, key + ".kv_budget")) {
        c.budgets.push_back(parse_budget_item(*item, ikey).spec());
      }
    } else {
      c.budgets.push_back(parse_budget_item(b->value, key + ".kv_budget").spec());
    }
    std::set<std::string> seen;
    for (const std::string& s : c.budgets) {
      if (!seen.insert(s).second) fail(b->value, key + ".kv_budget", s + " is listed twice");
    }
    if (!policies::budgeted(c.cell.policy))
      fail(b->value, key + ".kv_budget", c.cell.policy + " takes no budget (it keeps every token)");
  }
  return c;
}

results::Claim read_claim(const Node& n, const std::string& key) {
  expect_map(n, key,
             {"id", "claim", "task", "metric", "model", "question", "compare", "against",
              "contrast", "expect", "margin"});
  results::Claim c;
  auto need = [&](const char* k, const std::string& what) -> const Node& {
    const Entry* e = n.find(k);
    if (!e) fail(n, key, std::string("needs ") + k + ": (" + what + ")");
    return e->value;
  };
  const Node& id = need("id", "a short name: letters, digits, - and _");
  c.id = scalar(id, key + ".id");
  if (c.id.empty() || !std::all_of(c.id.begin(), c.id.end(), [](unsigned char ch) {
        return std::isalnum(ch) || ch == '-' || ch == '_';
      })) {
    fail(id, key + ".id", "'" + c.id + "' is not a short name of letters, digits, - and _");
  }
  c.text = scalar(need("claim", "the claim in one line"), key + ".claim");
  if (c.text.empty() || c.text.find('\n') != std::string::npos)
    fail(n, key + ".claim", "the claim is one non-empty line");
  c.task = scalar(need("task", "a task of this config"), key + ".task");
  c.metric = scalar(need("metric", "one of the task's metrics"), key + ".metric");
  if (const Entry* e = n.find("model")) c.model = scalar(e->value, key + ".model");
  if (const Entry* e = n.find("question")) {
    c.question = scalar(e->value, key + ".question");
    if (c.question != "in_prompt" && c.question != "after_compression")
      fail(e->value, key + ".question",
           "'" + c.question + "' is not in_prompt or after_compression");
  }
  const Node& expect = need("expect", "at_least, better or worse");
  const std::string ex = scalar(expect, key + ".expect");
  if (ex == "at_least") {
    c.expect = results::Expect::kAtLeast;
  } else if (ex == "better") {
    c.expect = results::Expect::kBetter;
  } else if (ex == "worse") {
    c.expect = results::Expect::kWorse;
  } else {
    fail(expect, key + ".expect", "'" + ex + "' is not at_least, better or worse");
  }
  const Entry* compare = n.find("compare");
  const Entry* contrast = n.find("contrast");
  if (compare && contrast) fail(n, key, "give compare: (with against:) or contrast:, not both");
  if (!compare && !contrast) fail(n, key, "needs compare: (with against:) or contrast:");
  if (const Entry* m = n.find("margin")) {
    std::string text = scalar(m->value, key + ".margin");
    if (!text.empty() && text.back() == '%') {
      if (!compare) fail(m->value, key + ".margin", "a percent margin needs compare:/against:");
      c.margin_percent = true;
      text.pop_back();
    }
    Node number = m->value;
    number.scalar = text;
    c.margin = to_double(number, key + ".margin");
    if (!(c.margin >= 0))
      fail(m->value, key + ".margin", "must be >= 0 (the claim's direction is in expect:)");
  }
  if (contrast) {
    if (n.find("against")) fail(n, key, "against: belongs with compare:, not contrast:");
    results::FindingInstance inst;
    inst.label = "-";
    for (const auto& [item, ikey] : items_of(contrast->value, key + ".contrast")) {
      CellSpec cs = read_cell(*item, ikey, false, true);
      if (!cs.budgets.empty()) cs.cell.budget = cs.budgets[0];
      inst.cells.push_back(cs.cell);
    }
    if (inst.cells.size() < 2) fail(contrast->value, key + ".contrast", "needs at least 2 cells");
    c.instances.push_back(inst);
    return c;
  }
  CellSpec cmp = read_cell(compare->value, key + ".compare", true, false);
  CellSpec against;
  against.cell.policy = "full";
  if (const Entry* a = n.find("against"))
    against = read_cell(a->value, key + ".against", false, false);
  against.cell.weight = -1;
  if (cmp.budgets.empty() && cmp.cell.policy != "full")
    fail(compare->value, key + ".compare", "needs kv_budget: (one budget or a list)");
  const std::vector<std::string> budgets =
      cmp.budgets.empty() ? std::vector<std::string>{""} : cmp.budgets;
  for (const std::string& b : budgets) {
    results::FindingInstance inst;
    inst.label = b.empty() ? "-" : b;
    results::FindingCell x = cmp.cell;
    x.budget = b;
    results::FindingCell y = against.cell;
    y.budget = !against.budgets.empty() ? against.budgets[0] : y.policy == "full" ? "" : b;
    inst.cells = {x, y};
    inst.against = 1;
    c.instances.push_back(inst);
  }
  return c;
}

}  // namespace

results::Findings parse_findings(const Node& n) {
  expect_map(n, "findings", {"paper", "baselines", "claims"});
  results::Findings f;
  const Entry* paper = n.find("paper");
  if (!paper) fail(n, "findings", "needs paper: (the paper's name as the verdicts show it)");
  f.paper = scalar(paper->value, "findings.paper");
  if (const Entry* b = n.find("baselines")) {
    for (const auto& [item, key] : items_of(b->value, "findings.baselines")) {
      expect_map(*item, key, {"task", "metric", "at_least", "above"});
      results::FindingBaseline fb;
      const Entry* t = item->find("task");
      const Entry* m = item->find("metric");
      if (!t || !m) fail(*item, key, "needs task: and metric:");
      fb.task = scalar(t->value, key + ".task");
      fb.metric = scalar(m->value, key + ".metric");
      const Entry* al = item->find("at_least");
      const Entry* ab = item->find("above");
      if ((al != nullptr) == (ab != nullptr))
        fail(*item, key,
             "give at_least: (full's mean) or above: (its interval's low end), one of them");
      fb.above = ab != nullptr;
      fb.value = to_double((ab ? ab : al)->value, key + (ab ? ".above" : ".at_least"));
      f.baselines.push_back(fb);
    }
  }
  const Entry* claims = n.find("claims");
  if (!claims) fail(n, "findings", "needs claims: (a list)");
  std::set<std::string> ids;
  for (const auto& [item, key] : items_of(claims->value, "findings.claims")) {
    results::Claim c = read_claim(*item, key);
    if (!ids.insert(c.id).second) fail(*item, key + ".id", "'" + c.id + "' is used twice");
    f.claims.push_back(std::move(c));
  }
  return f;
}

void check_findings(const results::Findings& f, const SweepConfig& cfg, const Node& at) {
  auto task_known = [&](const std::string& t) {
    return std::any_of(cfg.tasks.begin(), cfg.tasks.end(),
                       [&](const TaskEntry& e) { return e.name == t; });
  };
  std::vector<std::string> task_names, budget_specs;
  for (const TaskEntry& t : cfg.tasks) task_names.push_back(t.name);
  for (const BudgetEntry& b : cfg.budgets) budget_specs.push_back(b.spec());
  for (const results::FindingBaseline& b : f.baselines) {
    if (!task_known(b.task))
      fail(at, "findings.baselines",
           "task '" + b.task + "' is not a task of this config (" + join(task_names) + ")");
  }
  for (const results::Claim& c : f.claims) {
    const std::string key = "findings.claims[" + c.id + "]";
    if (!task_known(c.task))
      fail(at, key + ".task",
           "'" + c.task + "' is not a task of this config (" + join(task_names) + ")");
    std::vector<std::string> metrics;
    for (const TaskEntry& te : cfg.tasks) {
      if (te.name != c.task) continue;
      for (const tasks::MetricInfo& m : make_any_task(te.name, task_options(cfg, te))->metrics()) {
        if (std::find(metrics.begin(), metrics.end(), m.name) == metrics.end())
          metrics.push_back(m.name);
      }
    }
    if (std::find(metrics.begin(), metrics.end(), c.metric) == metrics.end()) {
      fail(at, key + ".metric",
           "'" + c.metric + "' is not a metric of task " + c.task + " (" + join(metrics) + ")");
    }
    if (!c.model.empty() && std::none_of(cfg.models.begin(), cfg.models.end(),
                                         [&](const ModelEntry& m) { return m.name == c.model; })) {
      fail(at, key + ".model", "'" + c.model + "' is not a model name of this config");
    }
    for (const results::FindingInstance& inst : c.instances) {
      for (const results::FindingCell& cell : inst.cells) {
        const auto matches =
            std::count_if(cfg.policies.begin(), cfg.policies.end(), [&](const PolicyEntry& p) {
              if (p.name != cell.policy) return false;
              for (const auto& [k, v] : cell.options) {
                const auto it = p.options.find(k);
                if (it == p.options.end() || it->second != v) return false;
              }
              return true;
            });
        if (matches == 0) {
          fail(at, key,
               cell.label() +
                   " matches no entry of policies: (a policy name, and options "
                   "as the entry writes them)");
        }
        if (matches > 1) {
          fail(at, key,
               cell.label() + " matches " + std::to_string(matches) +
                   " entries of policies:; give the options that tell them apart");
        }
        if (policies::budgeted(cell.policy) && std::find(budget_specs.begin(), budget_specs.end(),
                                               cell.budget) == budget_specs.end()) {
          fail(at, key,
               cell.label() + ": budget '" + cell.budget + "' is not in kv_budget: (" +
                   join(budget_specs) + ")");
        }
      }
    }
  }
}

std::vector<results::Findings> findings_of_db(const results::Store& store) {
  const results::QueryResult r =
      store.query("SELECT run_id, config_text FROM runs ORDER BY run_id DESC");
  // A stored config is the top file's text, then each include's after a line "# --- include:
  // PATH" (yaml_tree.h LoadState): the pieces are parsed one by one, the top file first (it wins
  // over its includes, as at load).
  static const std::string kMarker = "\n# --- include: ";
  for (const auto& row : r.rows) {
    const std::string& text = row[1].text;
    if (text.find("findings") == std::string::npos) continue;
    std::vector<std::string> pieces;
    for (size_t start = 0; start <= text.size();) {
      const size_t next = text.find(kMarker, start);
      pieces.push_back(text.substr(start, next == std::string::npos ? next : next - start));
      if (next == std::string::npos) break;
      start = next + 1;
    }
    // The top file, then the includes from the last (a later include overrides an earlier one).
    std::reverse(pieces.begin() + 1, pieces.end());
    for (const std::string& piece : pieces) {
      if (piece.find("findings") == std::string::npos) continue;
      try {
        const Node root = parse_text(piece, "run " + row[0].text + "'s stored config");
        const Entry* e = root.kind == Node::Kind::kMap ? root.find("findings") : nullptr;
        if (e) return {parse_findings(e->value)};
      } catch (const Error&) {
        // an older config that does not parse alone: try the next piece, then earlier runs
      }
    }
  }
  return {};
}

}  // namespace kvb::harness
