// `kvbench report`: a small NIAH sweep's report (configs/ci_report.yaml) rendered by headless
// Chromium (Debian's `chromium`, installed by scripts/setup.sh) with every plot present, laid out
// and non-empty; the files (HTML, Markdown, CSV, SVG) of the ci_smoke report; hostile text escaped; filters; and the
// errors (empty database, unknown filter values).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "run_kvbench.h"
#include "results/store.h"

namespace kvb {
namespace {

namespace fs = std::filesystem;
const std::string kConfigs = std::string(KVB_FIXTURES_DIR) + "/../../configs/";
const std::string kBuild = KVB_BINARY_DIR;

using kvb::testing::kvbench;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

std::string fresh_db(const std::string& name) {
  const std::string db = kBuild + "/" + name;
  for (const char* ext : {"", "-wal", "-shm"}) fs::remove(db + ext);
  return db;
}

// What Chromium laid out for one plot: its box, its data marks, how many of them lie inside the
// plot's viewBox, and the extent of the data group.
struct Rendered {
  int width = 0, height = 0, marks = 0, inside = 0, data_w = 0, data_h = 0;
};

// The page with a checking script appended (and its no-script CSP removed: the report itself
// needs no script), dumped by headless Chromium after layout.
std::map<std::string, Rendered> render_in_chromium(const fs::path& report_dir) {
  std::string html = slurp(report_dir / "index.html");
  const size_t csp = html.find("<meta http-equiv=\"Content-Security-Policy\"");
  EXPECT_NE(csp, std::string::npos) << "the report should forbid scripts and network";
  if (csp != std::string::npos) html.erase(csp, html.find('>', csp) + 1 - csp);
  const std::string script = R"js(<script>
const rows = [];
for (const svg of document.querySelectorAll('svg.plot')) {
  const r = svg.getBoundingClientRect();
  const vb = svg.viewBox.baseVal;
  const data = svg.querySelector('g.data');
  const bb = data ? data.getBBox() : {width: 0, height: 0};
  const marks = svg.querySelectorAll('g.data .mark, g.data .cell');
  let inside = 0;
  for (const m of marks) {
    const b = m.getBBox();
    if (b.width > 0 && b.height > 0 && b.x >= -1 && b.y >= -1 &&
        b.x + b.width <= vb.width + 1 && b.y + b.height <= vb.height + 1) inside++;
  }
  rows.push([svg.id, Math.round(r.width), Math.round(r.height), marks.length, inside,
             Math.round(bb.width), Math.round(bb.height)].join(' '));
}
const pre = document.createElement('pre');
pre.id = 'kvb-check';
pre.textContent = rows.join('\n');
document.body.appendChild(pre);
</script>)js";
  html.insert(html.rfind("</body>"), script);
  const fs::path probe = report_dir / "render_check.html";
  std::ofstream(probe) << html;
  const std::string chromium = run_command("command -v chromium");
  EXPECT_FALSE(chromium.empty()) << "chromium is missing: run scripts/setup.sh";
  const std::string flags = "--headless --no-sandbox --disable-gpu --hide-scrollbars ";
  const std::string dom = run_command("chromium " + flags + "--dump-dom 'file://" +
                                      fs::absolute(probe).string() + "' 2>/dev/null");
  // A screenshot for people (the test reads the DOM): the first 4000 pixels of the page.
  run_command("chromium " + flags + "--window-size=1400,4000 --screenshot='" +
              (report_dir / "screenshot.png").string() + "' 'file://" +
              fs::absolute(report_dir / "index.html").string() + "' >/dev/null 2>&1");
  std::map<std::string, Rendered> out;
  const size_t a = dom.find("<pre id=\"kvb-check\">");
  EXPECT_NE(a, std::string::npos) << "chromium did not run the page: " << dom.substr(0, 500);
  if (a == std::string::npos) return out;
  std::istringstream lines(dom.substr(a + 20, dom.find("</pre>", a) - a - 20));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream f(line);
    std::string id;
    Rendered r;
    f >> id >> r.width >> r.height >> r.marks >> r.inside >> r.data_w >> r.data_h;
    out[id] = r;
  }
  return out;
}

std::set<std::string> plot_files(const fs::path& dir) {
  std::set<std::string> ids;
  for (const auto& e : fs::directory_iterator(dir / "plots")) ids.insert(e.path().stem().string());
  return ids;
}

// A small version of the README's main job (configs/ci_report.yaml: the quickstart's model,
// task and haystack, 12 units instead of 165), then its report in a browser: every plot kind is
// there, has a size, and every data mark lies inside its plot.
TEST(Report, SmallNiahSweepRendersEveryPlotInChromium) {
  const std::string db = fresh_db("report_small.db");
  ASSERT_EQ(kvbench({"sweep", kConfigs + "ci_report.yaml", "--db", db}), 0);
  const fs::path dir = kBuild + "/report_small";
  fs::remove_all(dir);  // a page of an older kvbench, without the marker, would be refused
  std::string out;
  ASSERT_EQ(kvbench({"report", "--db", db, "--out", dir.string()}, &out), 0);
  EXPECT_NE(out.find("from 12 units (12 ok)"), std::string::npos) << out;
  // full and snapkv, 2 budgets, 2 context lengths x 2 depths: 1 score plot, 3 NIAH maps (full +
  // snapkv x 2), memory per budget (2), prefill and decode per budget (4), 1 Pareto plot, 1 score
  // vs compression ratio (issue 34).
  std::set<std::string> expected = {"score-niah-recall", "pareto-niah-recall", "niah-full",
                                    "niah-snapkv-b64", "niah-snapkv-b128",
                                    "compression-niah-recall"};
  for (const char* q : {"kv", "prefill", "decode"}) {
    for (const char* b : {"64", "128"}) expected.insert(std::string(q) + "-niah-b" + b);
  }
  EXPECT_EQ(plot_files(dir), expected);
  const auto rendered = render_in_chromium(dir);
  std::set<std::string> ids;
  for (const auto& [id, r] : rendered) ids.insert(id);
  EXPECT_EQ(ids, expected);
  for (const auto& [id, r] : rendered) {
    EXPECT_GT(r.width, 200) << id;
    EXPECT_GT(r.height, 100) << id;
    EXPECT_GT(r.data_w, 20) << id;
    // Latency plots draw measured times on an axis from zero: on a busy machine the lines of
    // both lengths can lie flat (CI saw 17 px), so only the markers' own height is certain there.
    const bool timed = id.rfind("prefill-", 0) == 0 || id.rfind("decode-", 0) == 0;
    EXPECT_GT(r.data_h, timed ? 4 : 20) << id;
    EXPECT_EQ(r.inside, r.marks) << id << ": marks outside the plot";
  }
  // Marks per plot: the score plot has full at both budgets + snapkv at both; a map 2 x 2 cells;
  // a cost plot 2 policies x 2 lengths; the Pareto plot 3 cells (its front is a line).
  EXPECT_EQ(rendered.at("score-niah-recall").marks, 2 + 2);
  EXPECT_EQ(rendered.at("niah-snapkv-b64").marks, 4);
  EXPECT_EQ(rendered.at("kv-niah-b128").marks, 2 * 2);
  EXPECT_EQ(rendered.at("pareto-niah-recall").marks, 3);
  EXPECT_TRUE(fs::file_size(dir / "screenshot.png") > 10000);
  // The sweep's numbers reach the page: full finds every needle.
  const std::string md = slurp(dir / "report.md");
  EXPECT_NE(md.find("| smollm2-135m | niah | full   | -         | recall ↑ |   4 | 1.0000 |"),
            std::string::npos)
      << md;
}

// Each legend key's policy and colour in one plot's SVG (`<... class="key" ... fill="#..."
// ...><title>policy</title>`; the dashed reference, full, is stroked).
std::map<std::string, std::string> legend_colours(const std::string& svg) {
  std::map<std::string, std::string> out;
  for (size_t at = svg.find("class=\"key\""); at != std::string::npos;
       at = svg.find("class=\"key\"", at + 1)) {
    const size_t end = svg.find('>', at);
    const std::string tag = svg.substr(at, end - at);
    const size_t t = svg.find("<title>", end);
    const std::string name = svg.substr(t + 7, svg.find("</title>", t) - t - 7);
    const size_t f = tag.find("stroke=\"");
    out[name] = tag.substr(f + 8, tag.find('"', f + 8) - f - 8);
  }
  return out;
}

// The README's main job itself (configs/quickstart.yaml, 165 units), its report rendered in
// headless Chromium: every plot it draws has data marks inside it, the decode plots that batched
// decoding leaves without points are left out and the page says why, and each policy has one
// colour in every plot, the same in a second report of a subset of the policies.
TEST(Report, QuickstartReportInChromium) {
  const std::string db = fresh_db("report_quickstart.db");
  std::string out;
  ASSERT_EQ(kvbench({"sweep", kConfigs + "quickstart.yaml", "--db", db}, &out), 0);
  const fs::path dir = kBuild + "/report_quickstart";
  fs::remove_all(dir);
  ASSERT_EQ(kvbench({"report", "--db", db, "--out", dir.string()}, &out), 0);
  EXPECT_NE(out.find("from 165 units (165 ok)"), std::string::npos) << out;
  const std::vector<std::string> policies = {"window", "streaming_llm", "h2o", "snapkv",
                                             "ada_snapkv"};
  std::set<std::string> expected = {"score-niah-recall", "pareto-niah-recall", "niah-full",
                                    "compression-niah-recall"};
  for (const std::string& p : policies) {
    std::string s = p;
    std::replace(s.begin(), s.end(), '_', '-');
    for (const char* b : {"128", "256"}) expected.insert("niah-" + s + "-b" + b);
  }
  // No latency plot: decode batched everywhere and prefill measured at 4096 tokens alone.
  for (const char* b : {"128", "256"}) expected.insert(std::string("kv-niah-b") + b);
  EXPECT_EQ(plot_files(dir), expected);
  const auto rendered = render_in_chromium(dir);
  std::set<std::string> ids;
  for (const auto& [id, r] : rendered) ids.insert(id);
  EXPECT_EQ(ids, expected);
  for (const auto& [id, r] : rendered) {
    EXPECT_GT(r.width, 200) << id;
    EXPECT_GT(r.marks, 0) << id << ": a plot without data";
    EXPECT_EQ(r.inside, r.marks) << id << ": marks outside the plot";
    EXPECT_GT(r.data_w, 20) << id;
  }
  // A map is 3 lengths x 5 depths; the score plot 6 policies (full at both budgets); the memory
  // plot every policy at every length.
  EXPECT_EQ(rendered.at("niah-h2o-b128").marks, 15);
  EXPECT_EQ(rendered.at("score-niah-recall").marks, 6 * 2);
  EXPECT_EQ(rendered.at("kv-niah-b256").marks, 6 * 3);
  EXPECT_TRUE(fs::file_size(dir / "screenshot.png") > 10000);
  const std::string md = slurp(dir / "report.md");
  EXPECT_NE(md.find("**This database has no decode latency at 1024, 2048, 4096 tokens**: 165 of "
                    "its 165 units decoded in a batch"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("**No prefill latency at 1024, 2048 tokens**: 143 of its 165 units reused"),
            std::string::npos);
  EXPECT_NE(md.find("A latency plot with measured points at fewer than two lengths is left out."),
            std::string::npos);
  // One colour per policy across the report's plots, and a filtered report keeps them.
  std::map<std::string, std::string> colour;
  for (const auto& id : expected) {
    for (auto [name, c] : legend_colours(slurp(dir / "plots" / (id + ".svg")))) {
      if (c == "#333") c = "#000000";  // full: black, drawn #333 where it is the dashed reference
      auto [it, added] = colour.emplace(name, c);
      EXPECT_EQ(it->second, c) << name << " changes colour in " << id;
    }
  }
  EXPECT_EQ(colour.size(), policies.size() + 1);
  EXPECT_EQ(colour["full"], "#000000");
  EXPECT_EQ(colour["snapkv"], "#E69F00");  // pinned as in every earlier report
  const fs::path sub = kBuild + "/report_quickstart_sub";
  fs::remove_all(sub);
  ASSERT_EQ(kvbench({"report", "--db", db, "--out", sub.string(), "--filter",
                     "policy=full,h2o,ada_snapkv"}),
            0);
  for (auto [name, c] : legend_colours(slurp(sub / "plots" / "kv-niah-b128.svg"))) {
    if (c == "#333") c = "#000000";
    EXPECT_EQ(colour[name], c) << name;
  }
  EXPECT_EQ(legend_colours(slurp(sub / "plots" / "kv-niah-b128.svg")).size(), 3u);
  for (const char* ext : {"", "-wal", "-shm"}) fs::remove(db + ext);
}

class SmokeReport : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    for (const char* ext : {"", "-wal", "-shm"}) fs::remove(db_ + ext);
  }
  static void SetUpTestSuite() {
    // One database per test process: ctest runs this suite's tests as separate processes, two
    // at a time, and a shared file would be re-swept under a neighbour's report.
    db_ = fresh_db("report_smoke_" + std::to_string(::getpid()) + ".db");
    ASSERT_EQ(kvbench({"sweep", kConfigs + "ci_smoke.yaml", "--db", db_}), 0);
  }
  static std::string db_;
};
std::string SmokeReport::db_;

TEST_F(SmokeReport, WritesHtmlMarkdownCsvAndSvg) {
  const fs::path dir = kBuild + "/report_smoke";
  fs::remove_all(dir);
  fs::create_directories(dir / "plots");
  std::ofstream(dir / "plots" / "stale.svg") << "<svg/>";  // from an earlier report,
  std::ofstream(dir / ".kvbench-report", std::ios::app) << "plots/stale.svg\n";  // which listed it
  std::ofstream(dir / "notes.txt") << "mine";              // not ours: left alone
  std::string out;
  ASSERT_EQ(kvbench({"report", "--db", db_, "--out", dir.string()}, &out), 0);
  EXPECT_NE(out.find("from 49 units (49 ok)"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "plots" / "stale.svg"));
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
  for (const char* t : {"summary", "paper", "vs_full", "niah_grid", "memory", "latency", "pareto",
                        "failures", "runs"}) {
    EXPECT_TRUE(fs::exists(dir / "csv" / (std::string(t) + ".csv"))) << t;
    EXPECT_TRUE(fs::exists(dir / "latex" / (std::string(t) + ".tex"))) << t;
  }
  // Score vs kvpress's compression ratio, both conventions named on the axis (issue 34).
  ASSERT_TRUE(fs::exists(dir / "plots" / "compression-niah-recall.svg"));
  const std::string comp = slurp(dir / "plots" / "compression-niah-recall.svg");
  EXPECT_NE(comp.find("compression ratio: fraction of the prompt removed (kvpress); fraction kept = 1 - x"),
            std::string::npos);
  // The methods x tasks table (issue 34): niah's recall per policy and budget with its interval;
  // perplexity's higher-is-better metrics are token counts (bookkeeping, not scores), so niah is
  // the one task column and the average repeats it. full: 3 x 1/7 and 3 x 0, the bootstrap's 1/42 and 5/42 (as the summary below).
  const std::string paper = slurp(dir / "csv" / "paper.csv");
  EXPECT_EQ(paper.substr(0, paper.find('\n')), "policy,kv_budget,niah,average");
  EXPECT_NE(paper.find("full,-,\"0.071 (0.024, 0.119)\",\"0.071 (0.024, 0.119)\""),
            std::string::npos)
      << paper;
  EXPECT_NE(slurp(dir / "latex" / "paper.tex").find("\\toprule\npolicy & kv\\_budget & niah & average"),
            std::string::npos);
  const std::string html = slurp(dir / "index.html");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);  // nothing loaded from anywhere
  const std::string md = slurp(dir / "report.md");
  // Every plot is inlined in the page and linked from the Markdown.
  for (const auto& id : plot_files(dir)) {
    EXPECT_NE(html.find("id=\"" + id + "\""), std::string::npos) << id;
    EXPECT_NE(md.find("(plots/" + id + ".svg)"), std::string::npos) << id;
  }
  // The summary CSV: one row per (task, policy, budget, metric) cell: 7 cells x 10 metrics, with
  // the intervals of results/stats.h score_ci (issue 34: inside the metric's range; the Student-t
  // interval this row had, -0.0107 to 0.1535, was not). niah full: 6 samples, 3 x 1/7 and 3 x 0,
  // so the percentile bootstrap: resampled means k/42, k ~ Binomial(6, 1/2), whose 2.5% and
  // 97.5% points are k = 1 and 5.
  const std::string csv = slurp(dir / "csv" / "summary.csv");
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "model,task,policy,kv_budget,metric,n,mean,ci95 lo,ci95 hi,ok,error,failed,unfinished");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 7 * 10);
  EXPECT_NE(csv.find("stories260K,niah,full,-,recall ↑,6,0.0714,0.0238,0.1190,6,0,0,0"),
            std::string::npos)
      << csv;
  // The provenance: the config text and this build's revision.
  EXPECT_NE(html.find("<h3>Configurations</h3>\n<pre># config "), std::string::npos);
  EXPECT_NE(html.find("stories260K.bin"), std::string::npos);
}

TEST_F(SmokeReport, HostileTextIsEscaped) {
  // A database is input: names and errors from it are text, never markup.
  const std::string db = fresh_db("report_hostile.db");
  fs::copy_file(db_, db);
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h,
                         "UPDATE units SET policy = '<script>alert(1)</script>|x' WHERE policy = 'h2o';"
                         "UPDATE units SET status = 'error', error = '<img src=x onerror=alert(2)>' "
                         "WHERE unit_key = (SELECT MIN(unit_key) FROM units WHERE policy = 'window');",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(h);
  const fs::path dir = kBuild + "/report_hostile";
  fs::remove_all(dir);
  ASSERT_EQ(kvbench({"report", "--db", db, "--out", dir.string()}), 0);
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".html" && e.path().extension() != ".svg") continue;
    const std::string text = slurp(e.path());
    EXPECT_EQ(text.find("<script>"), std::string::npos) << e.path();
    EXPECT_EQ(text.find("<img"), std::string::npos) << e.path();
  }
  const std::string html = slurp(dir / "index.html");
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;|x"), std::string::npos);
  EXPECT_NE(html.find("&lt;img src=x onerror=alert(2)&gt;"), std::string::npos);
  // In Markdown, a pipe inside a cell would split it.
  const std::string md = slurp(dir / "report.md");
  EXPECT_EQ(md.find("</script>|x"), std::string::npos);
  EXPECT_NE(md.find("1 unit(s) did not finish ok."), std::string::npos);
}

TEST_F(SmokeReport, SeveralModelsAreKeptApart) {
  // Two models in one database: cells, plots and maps never pool them.
  const std::string db = fresh_db("report_two_models.db");
  fs::copy_file(db_, db);
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h, "UPDATE units SET model = 'other' WHERE sample_id LIKE '%depth100%'",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(h);
  const fs::path dir = kBuild + "/report_two_models";
  fs::remove_all(dir);
  ASSERT_EQ(kvbench({"report", "--db", db, "--out", dir.string()}), 0);
  const std::string csv = slurp(dir / "csv" / "summary.csv");
  EXPECT_NE(csv.find("\nother,niah,full,-,recall ↑,2,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("\nstories260K,niah,full,-,recall ↑,4,"), std::string::npos) << csv;
  const auto ids = plot_files(dir);
  EXPECT_TRUE(ids.count("score-other-niah-recall") && ids.count("score-stories260k-niah-recall"));
  EXPECT_TRUE(ids.count("niah-other-snapkv-b32") && ids.count("niah-stories260k-snapkv-b32"));
}

// --out is the user's folder (issue 14): the report deletes only what it wrote itself, never
// writes or deletes through symbolic links, and gives colliding slugs distinct file names.
TEST_F(SmokeReport, OutDirKeepsTheUsersFilesAndFollowsNoLinks) {
  // Not HostileTextIsEscaped's folder: ctest may run the two at once.
  const fs::path dir = kBuild + "/report_outdir";
  fs::remove_all(dir);
  fs::create_directories(dir / "csv");
  fs::create_directories(dir / "plots");
  std::ofstream(dir / "csv" / "mine.csv") << "a,b\n";
  std::ofstream(dir / "plots" / "mine.svg") << "<svg/>";
  ASSERT_EQ(kvbench({"report", "--db", db_, "--out", dir.string()}), 0);
  EXPECT_EQ(slurp(dir / "csv" / "mine.csv"), "a,b\n");
  EXPECT_EQ(slurp(dir / "plots" / "mine.svg"), "<svg/>");
  // A narrower report removes the plots of the wider one, and still not the user's files.
  const std::set<std::string> wide = plot_files(dir);
  ASSERT_EQ(kvbench({"report", "--db", db_, "--out", dir.string(), "--filter", "policy=snapkv"}),
            0);
  std::set<std::string> narrow = plot_files(dir);
  EXPECT_LT(narrow.size(), wide.size());
  EXPECT_TRUE(narrow.count("mine"));
  EXPECT_FALSE(narrow.count("niah-h2o-b32"));
  EXPECT_TRUE(wide.count("niah-h2o-b32"));

  // Symbolic links: csv/ or plots/ pointing elsewhere are refused (nothing deleted there), and
  // a link at index.html is replaced, not written through.
  const fs::path elsewhere = kBuild + "/report_hostile_elsewhere";
  fs::remove_all(elsewhere);
  fs::create_directories(elsewhere);
  std::ofstream(elsewhere / "precious.csv") << "keep\n";
  std::ofstream(elsewhere / "precious.svg") << "<svg/>";
  std::ofstream(elsewhere / "victim.html") << "victim\n";
  for (const char* sub : {"csv", "plots"}) {
    const fs::path linked = kBuild + "/report_hostile_link_" + sub;
    fs::remove_all(linked);
    fs::create_directories(linked);
    fs::create_directory_symlink(elsewhere, linked / sub);
    std::string err;
    EXPECT_EQ(kvbench({"report", "--db", db_, "--out", linked.string()}, nullptr, &err), 2) << sub;
    EXPECT_NE(err.find((linked / sub).string() + " is a symbolic link"), std::string::npos) << err;
  }
  EXPECT_EQ(slurp(elsewhere / "precious.csv"), "keep\n");
  EXPECT_EQ(slurp(elsewhere / "precious.svg"), "<svg/>");
  fs::remove(dir / "index.html");
  fs::create_symlink(elsewhere / "victim.html", dir / "index.html");
  ASSERT_EQ(kvbench({"report", "--db", db_, "--out", dir.string()}), 0);
  EXPECT_TRUE(slurp(elsewhere / "victim.html") == "victim\n") << "written through the link";
  EXPECT_FALSE(fs::is_symlink(dir / "index.html"));
  EXPECT_NE(slurp(dir / "index.html").find("<html"), std::string::npos);

  // Models `smol.lm` and `smol-lm` slug alike: each still gets its own plot files.
  const std::string db = fresh_db("report_slugs.db");
  fs::copy_file(db_, db);
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h,
                         "UPDATE units SET model = CASE WHEN sample_id LIKE '%depth100%' THEN "
                         "'smol.lm' ELSE 'smol-lm' END",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(h);
  const fs::path sdir = kBuild + "/report_slugs";
  fs::remove_all(sdir);
  ASSERT_EQ(kvbench({"report", "--db", db, "--out", sdir.string()}), 0);
  const std::string html = slurp(sdir / "index.html");
  size_t figures = 0;
  for (size_t at = html.find("<figure>"); at != std::string::npos;
       at = html.find("<figure>", at + 1))
    ++figures;
  const std::set<std::string> ids = plot_files(sdir);
  EXPECT_EQ(ids.size(), figures);  // one file per plot: none overwrote another
  EXPECT_TRUE(ids.count("score-smol-lm-niah-recall"));
  size_t hashed = 0;
  for (const std::string& id : ids) hashed += id.rfind("score-smol-lm-niah-recall-", 0) == 0;
  EXPECT_EQ(hashed, 1u);
}

// --out may be a folder with the user's own web page (issue 31): index.html and report.md are
// replaced only when an earlier report wrote them (its marker), never the user's.
TEST_F(SmokeReport, OutDirRefusesToOverwriteTheUsersPages) {
  for (const char* page : {"index.html", "report.md"}) {
    SCOPED_TRACE(page);
    const fs::path dir = kBuild + "/report_users_page";
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir / page) << "my own page\n";
    std::string out, err;
    EXPECT_EQ(kvbench({"report", "--db", db_, "--out", dir.string()}, &out, &err), 2);
    EXPECT_NE(err.find("refusing to write the report: " + (dir / page).string() +
                       " exists and kvbench report did not write it"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("move it away, or choose another --out"), std::string::npos) << err;
    EXPECT_EQ(slurp(dir / page), "my own page\n");
    EXPECT_FALSE(fs::exists(dir / "csv" / "summary.csv"));  // refused before writing anything
    // Moved away, the report is written; run again, it replaces its own pages.
    fs::remove(dir / page);
    ASSERT_EQ(kvbench({"report", "--db", db_, "--out", dir.string()}, &out, &err), 0) << err;
    ASSERT_EQ(kvbench({"report", "--db", db_, "--out", dir.string()}, &out, &err), 0) << err;
    EXPECT_NE(
        slurp(dir / "index.html").find("<meta name=\"generator\" content=\"kvbench report\">"),
        std::string::npos);
    EXPECT_EQ(slurp(dir / "report.md").rfind("<!-- generator: kvbench report -->\n# ", 0), 0u);
  }
}

TEST_F(SmokeReport, FilterRestrictsAndKeepsFull) {
  const fs::path dir = kBuild + "/report_filtered";
  fs::remove_all(dir);
  ASSERT_EQ(kvbench({"report", "--db", db_, "--out", dir.string(), "--filter", "policy=snapkv",
                     "--filter", "budget=32", "--filter", "task=niah"}),
            0);
  const std::string csv = slurp(dir / "csv" / "summary.csv");
  std::set<std::string> cells;
  std::istringstream lines(csv);
  std::string line;
  std::getline(lines, line);
  while (std::getline(lines, line)) cells.insert(line.substr(0, line.find(",recall")));
  EXPECT_EQ(cells, (std::set<std::string>{"stories260K,niah,full,-", "stories260K,niah,snapkv,32"}));
  EXPECT_EQ(plot_files(dir), (std::set<std::string>{"score-niah-recall", "pareto-niah-recall",
                                                    "compression-niah-recall",
                                                    "niah-full", "niah-snapkv-b32", "kv-niah-b32",
                                                    "prefill-niah-b32", "decode-niah-b32"}));
  // Issue 34: a policy keeps its colour and marker from one report to the next. The whole
  // database's report has h2o, snapkv and window; this one snapkv alone (styles by a report's own
  // sorted policies gave snapkv another colour here). Each legend key: its fill, then its title.
  auto legend_key = [](const std::string& svg, const std::string& policy) {
    const size_t t = svg.find("<title>" + policy + "</title>");
    if (t == std::string::npos) return std::string("(no legend entry)");
    const size_t open = svg.rfind('<', t - 1);  // the key's marker element
    return svg.substr(open, t - open);
  };
  const fs::path whole = kBuild + "/report_styles_whole";
  fs::remove_all(whole);
  ASSERT_EQ(kvbench({"report", "--db", db_, "--out", whole.string()}), 0);
  const std::string a = slurp(whole / "plots" / "score-niah-recall.svg");
  const std::string b = slurp(dir / "plots" / "score-niah-recall.svg");
  EXPECT_NE(legend_key(a, "snapkv"), "(no legend entry)");
  EXPECT_EQ(legend_key(b, "snapkv").substr(legend_key(b, "snapkv").find("fill=")),
            legend_key(a, "snapkv").substr(legend_key(a, "snapkv").find("fill=")));
  EXPECT_EQ(legend_key(a, "full").substr(legend_key(a, "full").find("stroke=")),
            legend_key(b, "full").substr(legend_key(b, "full").find("stroke=")));
  std::string err;
  EXPECT_EQ(kvbench({"report", "--db", db_, "--out", dir.string(), "--filter", "policy=snapk"},
                    nullptr, &err),
            2);
  EXPECT_NE(err.find("no policy 'snapk' in"), std::string::npos) << err;
  EXPECT_NE(err.find("it holds: full, h2o, snapkv, window"), std::string::npos) << err;
  EXPECT_EQ(kvbench({"report", "--db", db_, "--out", dir.string(), "--filter", "colour=red"},
                    nullptr, &err),
            2);
  EXPECT_NE(err.find("unknown key 'colour'"), std::string::npos) << err;
  // kv_budget= is the axis's one name; budget= (above) its older spelling: the same report.
  const fs::path named = kBuild + "/report_filtered_kv_budget";
  fs::remove_all(named);
  ASSERT_EQ(kvbench({"report", "--db", db_, "--out", named.string(), "--filter",
                     "policy=snapkv", "--filter", "kv_budget=32", "--filter", "task=niah"}),
            0);
  EXPECT_EQ(slurp(named / "csv" / "summary.csv"), csv);
  EXPECT_EQ(plot_files(named), plot_files(dir));
  EXPECT_EQ(kvbench({"report", "--db", db_, "--out", named.string(), "--filter", "kv_budget=31"},
                    nullptr, &err),
            2);
  EXPECT_NE(err.find("--filter kv_budget=31: no kv_budget '31' in"), std::string::npos) << err;
}

TEST(ReportErrors, EmptyMissingAndForeignDatabases) {
  const std::string empty = fresh_db("report_empty.db");
  { results::Store::open(empty, results::Mode::kReadWrite); }  // the schema, no units
  std::string out, err;
  EXPECT_EQ(kvbench({"report", "--db", empty, "--out", kBuild + "/report_empty"}, &out, &err), 2);
  EXPECT_NE(err.find("holds no units: nothing to report"), std::string::npos) << err;
  // The named queries on it: headers only, and a line that says why.
  EXPECT_EQ(kvbench({"query", "--db", empty, "summary"}, &out, &err), 0);
  EXPECT_NE(err.find("no rows (the database holds 0 units, 0 of them ok)"), std::string::npos) << err;
  EXPECT_EQ(kvbench({"report", "--db", kBuild + "/no_such.db", "--out", kBuild + "/x"}, &out, &err),
            2);
  EXPECT_NE(err.find("does not exist"), std::string::npos) << err;
  // A SQLite file that is not ours (no schema version, other tables) is refused by name.
  const std::string foreign = fresh_db("report_foreign.db");
  sqlite3* h = nullptr;
  ASSERT_EQ(sqlite3_open(foreign.c_str(), &h), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(h, "CREATE TABLE notes (x TEXT)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(h);
  EXPECT_EQ(kvbench({"report", "--db", foreign, "--out", kBuild + "/x"}, &out, &err), 2);
  EXPECT_NE(err.find("no schema version"), std::string::npos) << err;
  // A database of schema version 1 (as released): refused read-only with the command that
  // migrates it; after `query --migrate` it opens (and is empty).
  const std::string v1 = fresh_db("report_v1.db");
  {
    std::ifstream f(std::string(KVB_FIXTURES_DIR) + "/results/schema_v1.sql");
    std::stringstream ddl;
    ddl << f.rdbuf();
    sqlite3* h1 = nullptr;
    ASSERT_EQ(sqlite3_open(v1.c_str(), &h1), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(h1, ddl.str().c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(h1);
  }
  EXPECT_EQ(kvbench({"report", "--db", v1, "--out", kBuild + "/x"}, &out, &err), 2);
  EXPECT_NE(err.find("schema version 1 is older than this kvbench"), std::string::npos) << err;
  EXPECT_NE(err.find("kvbench query --db " + v1 + " --migrate"), std::string::npos) << err;
  EXPECT_EQ(kvbench({"query", "--db", v1, "--migrate"}, &out, &err), 0);
  EXPECT_NE(out.find(": schema version 1 -> "), std::string::npos) << out;
  EXPECT_EQ(kvbench({"report", "--db", v1, "--out", kBuild + "/x"}, &out, &err), 2);
  EXPECT_NE(err.find("holds no units"), std::string::npos) << err;
  EXPECT_EQ(kvbench({"report", "--out", kBuild + "/x"}, &out, &err), 2);
  EXPECT_NE(err.find("--db FILE is required"), std::string::npos) << err;
}

}  // namespace
}  // namespace kvb
