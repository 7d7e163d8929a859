// Static SVG plots (results/svg.h): tick placement and labels against hand-computed values, text
// escaping, gaps at NaN, bands and heatmap cells.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "results/svg.h"

namespace kvb::results::svg {
namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(Svg, NiceTicks) {
  EXPECT_EQ(nice_ticks(0, 1, false), (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1.0}));
  EXPECT_EQ(nice_ticks(-0.05, 1.05, false), (std::vector<double>{0, 0.25, 0.5, 0.75, 1.0}));
  EXPECT_EQ(nice_ticks(900, 4200, false), (std::vector<double>{1000, 2000, 3000, 4000}));
  // Log axes: 1-2-5 within three decades, powers of ten beyond.
  EXPECT_EQ(nice_ticks(5, 110, true), (std::vector<double>{5, 10, 20, 50, 100}));
  EXPECT_EQ(nice_ticks(0.5, 2e5, true), (std::vector<double>{1, 10, 100, 1000, 1e4, 1e5}));
  EXPECT_TRUE(nice_ticks(1, 1, false).empty());
  EXPECT_TRUE(nice_ticks(0, std::numeric_limits<double>::infinity(), false).empty());
}

TEST(Svg, TickLabels) {
  EXPECT_EQ(tick_label(0.25), "0.25");
  EXPECT_EQ(tick_label(1024), "1024");
  EXPECT_EQ(tick_label(12345), "12.35k");
  EXPECT_EQ(tick_label(2e7), "20M");
  EXPECT_EQ(tick_label(-3.5), "-3.5");
}

TEST(Svg, LinePlotEscapesTextBreaksAtNaNAndDrawsBands) {
  LinePlot p;
  p.id = "a b<c";  // sanitised to an id
  p.title = "<script>x</script> & co";
  p.x.categories = {"128", "256", "<512>"};
  p.y.label = "recall";
  Series s;
  s.name = "pol\"icy";
  s.x = {0, 1, 2};
  s.y = {0.5, std::nan(""), 0.7};
  s.lo = {0.4, 0.5, 0.6};
  s.hi = {0.6, 0.7, 0.8};
  p.series.push_back(s);
  const std::string svg = render(p);
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_NE(svg.find("id=\"a_b_c\""), std::string::npos);
  EXPECT_EQ(svg.find("<script>"), std::string::npos);
  EXPECT_NE(svg.find("&lt;script&gt;x&lt;/script&gt; &amp; co"), std::string::npos);
  EXPECT_NE(svg.find("&lt;512&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("pol\"icy"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"mark\""), 2u);  // the NaN point has no mark
  EXPECT_EQ(count(svg, "class=\"band\""), 1u);
  // The line breaks at the NaN: two "M" moves in its path, no "L".
  const size_t line = svg.find("class=\"line\" d=\"");
  ASSERT_NE(line, std::string::npos);
  const std::string d = svg.substr(line + 16, svg.find('"', line + 16) - line - 16);
  EXPECT_EQ(count(d, "M"), 2u) << d;
  EXPECT_EQ(count(d, "L"), 0u) << d;
}

TEST(Svg, HeatmapCellsAndMissingValues) {
  Heatmap m;
  m.id = "h";
  m.title = "t";
  m.rows = {"1024", "2048"};
  m.cols = {"0", "50", "100"};
  m.values = {1, 0.5, 0, std::nan(""), 0.25, 1};
  const std::string svg = render(m);
  EXPECT_EQ(count(svg, "<rect class=\"cell\""), 5u);
  EXPECT_EQ(count(svg, "<rect class=\"cell missing\""), 1u);
  // Values are printed in the cells (grey-scale print keeps them readable).
  EXPECT_NE(svg.find(">0.25</text>"), std::string::npos);
  EXPECT_NE(svg.find(">1.00</text>"), std::string::npos);
  // viridis ends: 0 -> #440154, 1 -> #fde725.
  EXPECT_NE(svg.find("fill=\"#440154\""), std::string::npos);
  EXPECT_NE(svg.find("fill=\"#fde725\""), std::string::npos);
}

}  // namespace
}  // namespace kvb::results::svg
