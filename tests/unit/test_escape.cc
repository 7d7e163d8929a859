// Escaping of hostile text for Markdown, CSV, HTML and JSON.
#include <gtest/gtest.h>

#include "common/escape.h"

namespace kvb {
namespace {

TEST(Escape, MarkdownCell) {
  EXPECT_EQ(md_cell("a|b\nc"), "a\\|b c");
  EXPECT_EQ(md_cell("<script>"), "\\<script\\>");
  EXPECT_EQ(md_cell("x\x01y"), "xy");
  EXPECT_EQ(md_cell("héllo wörld", 5), "héllo\xE2\x80\xA6");
  EXPECT_EQ(md_cell("\xFF"), "\xEF\xBF\xBD");
}

TEST(Escape, CsvField) {
  EXPECT_EQ(csv_field("plain"), "plain");
  EXPECT_EQ(csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_field("line\nbreak"), "\"line\nbreak\"");
  EXPECT_EQ(csv_field("=cmd()"), "'=cmd()");
  EXPECT_EQ(csv_field("@SUM(A1)"), "'@SUM(A1)");
  EXPECT_EQ(csv_field("-1.5"), "-1.5");
  EXPECT_EQ(csv_field("-x"), "'-x");
}

TEST(Escape, HtmlAndJson) {
  EXPECT_EQ(html_escape("<a href=\"x\">&'</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
  EXPECT_EQ(json_escape("a\"b\\c\n\x01"), "a\\\"b\\\\c\\n\\u0001");
  EXPECT_EQ(json_escape("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(json_escape("bad \xC3"), "bad \xEF\xBF\xBD");
}

}  // namespace
}  // namespace kvb
namespace kvb {
namespace {
TEST(Escape, CutChars) {
  EXPECT_EQ(cut_chars("héllo", 2), "hé\xE2\x80\xA6");
  EXPECT_EQ(cut_chars("abc", 3), "abc");
  EXPECT_EQ(cut_chars("", 0), "");
}
}  // namespace
}  // namespace kvb
