// `kvbench query --db FILE NAME|SQL`: a named query (results/queries/*.sql) or ad-hoc SQL against
// a results database opened read-only; the rows printed as md, csv or jsonl on stdout.
#include <sqlite3.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "common/error.h"
#include "common/table.h"
#include "harness/cli.h"
#include "harness/findings_config.h"
#include "harness/sweep_config.h"
#include "results/analysis.h"
#include "results/findings.h"
#include "results/groups.h"
#include "results/named_queries.h"
#include "results/schema.h"
#include "results/sqlite_util.h"
#include "results/stats.h"
#include "results/store.h"

namespace po = boost::program_options;

namespace kvb::harness {

namespace {
const char* kVsFullDescription =
    "paired difference to full on the same samples per task x policy x budget x metric: means, "
    "difference with a paired-bootstrap 95% CI (10,000 resamples, seed 0), two-sided p and a "
    "verdict (better/worse when the CI excludes 0)";

const char* kGroupsDescription =
    "task-group score (a definition's group:, e.g. ruler) per model x group x data_dir x policy x "
    "budget: the mean over the group's tasks of each task's mean, as RULER's summary, with a 95% "
    "CI (stratified percentile bootstrap: each task's scores resampled on their own) and the "
    "number of tasks";

const char* kPaperDescription =
    "the methods x tasks table of KV-cache papers: a row per model x policy x budget, a column "
    "per task (higher-is-better metrics), mean (95% interval), and the average of the task means "
    "with a stratified bootstrap interval; -o latex gives a booktabs tabular";

const char* kFindingsDescription =
    "a paper's claims (its config's findings:) with verdicts: per claim, model and budget the "
    "contrast with its paired-bootstrap 95% interval, the margin and reproduced / not "
    "reproduced / inconclusive with the reason (configs/README.md \"Findings\"); the claims "
    "come from the newest run's stored config that has them, or from --config FILE";

}  // namespace

int cmd_query(const std::vector<std::string>& args) {
  std::string db, what, output = "md", config;
  std::vector<std::string> params;
  double timeout_s = 60;
  po::options_description desc(
      "usage: kvbench query --db FILE NAME|SQL [-o md|csv|jsonl|latex] [--param VALUE ...]\n"
      "       kvbench query --db FILE findings [--config SWEEP.yaml]\n"
      "       kvbench query --list\n"
      "       kvbench query --db FILE --migrate\n\n"
      "Runs a named query (kvbench query --list) or one SQL statement against a results\n"
      "database, opened read-only. Values given with --param bind to ?1, ?2, ... in the SQL.\n\n"
      "options");
  desc.add_options()("help,h", "print this help")
      ("db", po::value(&db), "the results database (SQLite) written by kvbench sweep")
      ("list", po::bool_switch(), "list the named queries with a line of description each")
      ("migrate", po::bool_switch(),
       "bring a database written by an older kvbench to this schema version (opens it "
       "read-write once; every other use of query opens read-only)")
      ("output,o", po::value(&output)->default_value("md"),
       "md | csv | jsonl | latex (a booktabs tabular)")
      ("param", po::value(&params)->composing(), "a value bound to the next ?N parameter")
      ("config", po::value(&config),
       "findings only: the sweep config whose findings: to check (default: the newest run's "
       "stored config that has findings:)")
      ("timeout-s", po::value(&timeout_s)->default_value(60),
       "stop a query still running after this many seconds (0: no limit)")
      ("query", po::value(&what), "a named query or SQL (positional)");
  po::positional_options_description pos;
  pos.add("query", 1);
  po::variables_map vm;
  if (!parse_command_line(args, desc, &pos, "query", &vm)) return 0;
  if (vm["list"].as<bool>()) {
    Table t({"name", "description"});
    for (const auto& q : results::named_queries()) t.add({q.name, q.description()});
    t.add({"vs-full", kVsFullDescription});
    t.add({"groups", kGroupsDescription});
    t.add({"paper", kPaperDescription});
    t.add({"findings", kFindingsDescription});
    t.print(std::cout, output);
    return 0;
  }
  KVB_USAGE_CHECK(!db.empty()) << "--db FILE is required (see kvbench query --help)";
  if (vm["migrate"].as<bool>()) {
    KVB_USAGE_CHECK(what.empty()) << "--migrate takes no query";
    KVB_USAGE_CHECK(std::filesystem::exists(db)) << "results database " << db << " does not exist";
    // The version as found, read before the read-write open migrates it.
    const int before = results::schema_version(results::Db(db, SQLITE_OPEN_READONLY));
    const results::Store store = results::Store::open(db, results::Mode::kReadWrite);
    const std::string after = store.query("PRAGMA user_version").rows[0][0].text;
    std::cout << db << ": schema version " << before << " -> " << after
              << (std::to_string(before) == after ? " (already current)" : "") << "\n";
    return 0;
  }
  KVB_USAGE_CHECK(!what.empty()) << "give a query name or SQL (kvbench query --list names them)";
  KVB_USAGE_CHECK(std::isfinite(timeout_s) && timeout_s >= 0)
      << "--timeout-s must be >= 0 seconds (0: no limit), got " << timeout_s;
  KVB_USAGE_CHECK(output == "md" || output == "csv" || output == "jsonl" || output == "latex")
      << "--output must be md, csv, jsonl or latex, got " << output;
  KVB_USAGE_CHECK(config.empty() || what == "findings")
      << "--config is for the findings query (kvbench query --db DB findings --config FILE)";
  if (what == "findings") {
    results::Store store = results::Store::open(db, results::Mode::kReadOnly);
    std::vector<results::Findings> all;
    if (!config.empty()) {
      const SweepConfig cfg = load_sweep_config(config);
      KVB_USAGE_CHECK(cfg.findings.has_value())
          << config << " has no findings: section (configs/README.md \"Findings\" writes one)";
      all.push_back(*cfg.findings);
    } else {
      all = findings_of_db(store);
      KVB_USAGE_CHECK(!all.empty())
          << "no run in " << db
          << " was swept from a config with findings:; give the config with --config FILE "
             "(configs/paper_*.yaml have them)";
    }
    std::vector<results::FindingRow> rows;
    for (const results::Findings& f : all) {
      for (results::FindingRow& r : results::evaluate_findings(store, f)) rows.push_back(r);
    }
    results::findings_table(rows).print(std::cout, output);
    return 0;
  }
  if (what == "paper") {
    results::Store store = results::Store::open(db, results::Mode::kReadOnly);
    results::paper_table(results::score_cells(store, {})).print(std::cout, output);
    return 0;
  }
  if (what == "vs-full") {
    results::Store store = results::Store::open(db, results::Mode::kReadOnly);
    const std::vector<results::PairedRow> rows = results::vs_full(store, {});
    results::vs_full_table(rows).print(std::cout, output);
    const std::string missing = results::vs_full_missing(store, rows);
    if (!missing.empty()) std::cerr << "kvbench query vs-full: " << missing << "\n";
    return 0;
  }
  if (what == "groups") {
    results::Store store = results::Store::open(db, results::Mode::kReadOnly);
    results::groups_table(results::group_rows(store, {})).print(std::cout, output);
    return 0;
  }
  std::string sql = what;
  for (const auto& q : results::named_queries()) {
    if (q.name == what) sql = q.sql;
  }
  const bool named = sql != what;
  if (!named && what.find(' ') == std::string::npos) {
    std::string names;
    for (const auto& q : results::named_queries()) names += (names.empty() ? "" : ", ") + q.name;
    names += ", vs-full, groups, paper, findings";
    KVB_USAGE_FAIL() << "no named query '" << what << "'; named queries: " << names
                     << " (or give a SQL statement)";
  }
  results::Store store = results::Store::open(db, results::Mode::kReadOnly);
  results::QueryResult r;
  try {
    store.set_time_limit(timeout_s);
    r = store.query(sql, params);
    store.set_time_limit(0);
  } catch (const Error& e) {
    KVB_USAGE_CHECK(!store.time_limit_hit())
        << (named ? "query " + what : std::string("SQL")) << " on " << db
        << " was stopped after --timeout-s " << timeout_s
        << " s (a recursive CTE without an end?); add a LIMIT or a larger --timeout-s";
    // SQLite's own words and the statement; not our call site (that is -v's origin line).
    const auto* sq = dynamic_cast<const results::SqliteError*>(&e);
    KVB_USAGE_FAIL() << (named ? "query " + what : std::string("SQL")) << " failed on " << db
                     << ": " << (sq ? sq->sqlite_message() : std::string(e.what()))
                     << (sq && (sq->code() & 0xff) == SQLITE_READONLY
                             ? " (kvbench query opens the database readonly: it reads, never "
                               "writes)"
                             : "")
                     << "\n  statement: " << sql;
  }
  Table t(r.columns);
  for (const auto& row : r.rows) {
    std::vector<std::string> cells;
    for (const auto& v : row) cells.push_back(v.kind == results::QueryValue::kNull ? "" : v.text);
    t.add(cells);
  }
  t.print(std::cout, output);
  if (r.rows.empty()) {
    const results::QueryResult n = store.query("SELECT COUNT(*), SUM(status = 'ok') FROM units");
    std::cerr << "kvbench query: no rows (the database holds " << n.rows[0][0].text
              << " units, " << (n.rows[0][1].text.empty() ? "0" : n.rows[0][1].text)
              << " of them ok)\n";
  }
  return 0;
}

}  // namespace kvb::harness
