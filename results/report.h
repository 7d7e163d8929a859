// `kvbench report`: one results database turned into a self-contained HTML page (inline SVG, no
// script, no network), the same content as Markdown, every table as CSV and every plot as an SVG
// file (DESIGN.md "Results"; issue "Query and report").
//
//   DIR/index.html  DIR/report.md  DIR/csv/<table>.csv  DIR/plots/<plot>.svg
//   DIR/.kvbench-report (the manifest: the csv/ and plots/ files it wrote)
#pragma once

#include <string>
#include <vector>

#include "results/analysis.h"
#include "results/findings.h"
#include "results/store.h"

namespace kvb::results {

struct ReportOptions {
  std::string out_dir;
  Filter filter;
  std::string title = "kvbench report";
  // The claims of the papers the database's configs reproduce (a config's findings:): their
  // verdicts are the report's first section. Filters do not apply to them.
  std::vector<Findings> findings;
};

struct ReportFiles {
  std::vector<std::string> plots;   // plot ids, in page order
  std::vector<std::string> tables;  // table (CSV) names, in page order
  int units = 0, ok_units = 0;
};

// The style of a policy in every plot, fixed by its name (issue 34: one colour per policy across
// reports): its place in policy_style_order() (kvbench's policies; `full` has a style of its
// own), or for another name a hash of it into the styles after those. 0 <= index < kPolicyStyles.
inline constexpr int kPolicyStyles = 49;
const std::vector<std::string>& policy_style_order();
int policy_style_index(const std::string& policy);

// Writes the report; the directory is created if needed. Files this report wrote before (listed
// in DIR/.kvbench-report) are replaced or, if this one does not write them, deleted; other files
// are left alone (results/report_dir.h). Usage errors: a database without units, a filter value
// the database does not hold, csv/ or plots/ being symbolic links, an index.html or report.md in
// DIR that an earlier report did not write (it lacks the report's marker).
ReportFiles write_report(const Store& store, const ReportOptions& options);

}  // namespace kvb::results
