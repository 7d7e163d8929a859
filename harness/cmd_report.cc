// `kvbench report --db FILE --out DIR`: the results database as a self-contained HTML page with
// SVG plots, the same as Markdown, and every table as CSV (results/report.h).
#include <boost/program_options.hpp>
#include <iostream>

#include "common/error.h"
#include "common/log.h"
#include "harness/cli.h"
#include "harness/findings_config.h"
#include "results/report.h"
#include "results/store.h"

namespace po = boost::program_options;

namespace kvb::harness {

int cmd_report(const std::vector<std::string>& args) {
  std::string db, out;
  std::vector<std::string> filters;
  results::ReportOptions opt;
  po::options_description desc(
      "usage: kvbench report --db FILE --out DIR [--filter KEY=V1,V2 ...] [--title TEXT]\n\n"
      "Writes DIR/index.html (self-contained: inline SVG, no script, no network), DIR/report.md,\n"
      "DIR/csv/<table>.csv and DIR/plots/<plot>.svg from a results database opened read-only:\n"
      "score vs budget with 95% CI bands, the paired comparison to full (bootstrap CI, p), NIAH\n"
      "heatmaps, task-group means (a task definition's group:, e.g. RULER's summary), memory\n"
      "and latency vs context length, score vs KV memory (Pareto front), failures and\n"
      "provenance (configs, git revision, devices). When the newest run's config has\n"
      "findings: (a paper's claims, configs/README.md), their verdicts come first.\n\n"
      "Filters restrict every table and plot: KEY is model, task, policy, kv_budget (older\n"
      "spelling: budget) or metric;\n"
      "values of one key are alternatives, keys combine. `full` is always kept: it is the\n"
      "reference of every comparison.\n"
      "  kvbench report --db out/quickstart.db --out out/report --filter policy=full,snapkv\n\n"
      "options");
  desc.add_options()("help,h", "print this help")
      ("db", po::value(&db), "the results database (SQLite) written by kvbench sweep")
      ("out", po::value(&out), "output directory (created; the report's own earlier files in it are replaced, others "
       "kept; an index.html or report.md that kvbench did not write is refused)")
      ("filter", po::value(&filters)->composing(), "KEY=V1[,V2...] (repeatable)")
      ("title", po::value(&opt.title)->default_value("kvbench report"), "page title");
  po::variables_map vm;
  if (!parse_command_line(args, desc, nullptr, "report", &vm)) return 0;
  KVB_USAGE_CHECK(!db.empty()) << "--db FILE is required (see kvbench report --help)";
  KVB_USAGE_CHECK(!out.empty()) << "--out DIR is required (see kvbench report --help)";
  opt.out_dir = out;
  opt.filter = results::Filter::parse(filters);
  const results::Store store = results::Store::open(db, results::Mode::kReadOnly);
  opt.findings = findings_of_db(store);
  const results::ReportFiles files = results::write_report(store, opt);
  if (files.ok_units == 0) {
    KVB_LOG_WARN << db << " holds " << files.units
                 << " units but none finished ok: the report shows failures and provenance only";
  }
  std::cout << "kvbench report: wrote " << out << "/index.html, report.md, "
            << files.plots.size() << " plots (plots/*.svg) and " << files.tables.size()
            << " tables (csv/*.csv) from " << files.units << " units (" << files.ok_units
            << " ok)\n";
  return 0;
}

}  // namespace kvb::harness
