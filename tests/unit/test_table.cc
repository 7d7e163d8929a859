// The table printers' output formats, pinned (STYLE.md: output formats pinned by tests).
#include <gtest/gtest.h>

#include <sstream>

#include "common/table.h"

namespace kvb {
namespace {

Table sample() {
  Table t({"policy", "score ↑", "note"});
  t.add({"h2o", "0.5000", "a|b"});
  t.add({"snapkv", "12.25", "=1+1, \"x\""});
  return t;
}

TEST(Table, Markdown) {
  std::ostringstream os;
  sample().print(os, "md");
  EXPECT_EQ(os.str(),
            "| policy | score ↑ | note      |\n"
            "| ------ | ------: | --------- |\n"
            "| h2o    |  0.5000 | a\\|b      |\n"
            "| snapkv |   12.25 | =1+1, \"x\" |\n");
}

TEST(Table, Csv) {
  std::ostringstream os;
  sample().print(os, "csv");
  EXPECT_EQ(os.str(),
            "policy,score ↑,note\n"
            "h2o,0.5000,a|b\n"
            "snapkv,12.25,\"'=1+1, \"\"x\"\"\"\n");
}

TEST(Table, Jsonl) {
  std::ostringstream os;
  sample().print(os, "jsonl");
  EXPECT_EQ(os.str(),
            "{\"policy\":\"h2o\",\"score ↑\":0.5000,\"note\":\"a|b\"}\n"
            "{\"policy\":\"snapkv\",\"score ↑\":12.25,\"note\":\"=1+1, \\\"x\\\"\"}\n");
}

// A cell is a JSON number only by JSON's grammar: strtod's other spellings stay strings.
TEST(Table, JsonlNumbersFollowJsonsGrammar) {
  Table t({"v"});
  for (const char* v : {"0", "-1.5", "2e10", "1E-3", "0x10", "+5", " 12", "1.", ".5", "01", "nan",
                        "inf", "1e5x", "-"}) {
    t.add({v});
  }
  std::ostringstream os;
  t.print(os, "jsonl");
  EXPECT_EQ(os.str(),
            "{\"v\":0}\n{\"v\":-1.5}\n{\"v\":2e10}\n{\"v\":1E-3}\n{\"v\":\"0x10\"}\n"
            "{\"v\":\"+5\"}\n{\"v\":\" 12\"}\n{\"v\":\"1.\"}\n{\"v\":\".5\"}\n"
            "{\"v\":\"01\"}\n{\"v\":\"nan\"}\n{\"v\":\"inf\"}\n{\"v\":\"1e5x\"}\n"
            "{\"v\":\"-\"}\n");
}

// Issue 34: a booktabs tabular for papers, with TeX's specials escaped and the arrows in math.
TEST(Table, Latex) {
  std::ostringstream os;
  Table t({"policy", "score ↑", "note"});
  t.add({"ada_snapkv", "0.5000", "50% & $x^2 {y} #1 ~ \\ <b>"});
  t.add({"full", "12.25", ""});
  t.print(os, "latex");
  EXPECT_EQ(os.str(),
            "\\begin{tabular}{lrl}\n"
            "\\toprule\n"
            "policy & score $\\uparrow$ & note \\\\\n"
            "\\midrule\n"
            "ada\\_snapkv & 0.5000 & 50\\% \\& \\$x\\textasciicircum{}2 \\{y\\} \\#1 "
            "\\textasciitilde{} \\textbackslash{} \\textless{}b\\textgreater{} \\\\\n"
            "full & 12.25 &  \\\\\n"
            "\\bottomrule\n"
            "\\end{tabular}\n");
}

}  // namespace
}  // namespace kvb
