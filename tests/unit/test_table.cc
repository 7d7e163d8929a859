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

}  // namespace
}  // namespace kvb
