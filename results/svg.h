// Static SVG plots for `kvbench report`: line/scatter plots with confidence bands and heatmaps.
// The output is plain SVG 1.1 text (no script, no external reference) meant to be inlined in
// HTML or saved as a file. Series differ by colour (Okabe-Ito, colour-blind safe), marker shape
// and dash pattern, so they stay distinguishable in grey-scale print. Every text is escaped.
//
// Structure the report test relies on: the root <svg> has class "plot" and an id; each drawn
// data point is an element of class "mark", each series line a <path class="line">, each CI
// band a <path class="band">, each heatmap cell a <rect class="cell">.
#pragma once

#include <string>
#include <vector>

namespace kvb::results::svg {

// An axis: numeric (linear or log10) or categorical (positions 0..n-1 with labels).
struct Axis {
  std::string label;
  bool log = false;                      // numeric log10 scale (all values must be > 0)
  std::vector<std::string> categories;   // non-empty: categorical, x values are indices
  bool zero_based = false;               // linear: include 0 in the range
  std::vector<double> ticks;             // numeric: ticks at these values instead of nice ones
};

struct Series {
  std::string name;
  int style = 0;                // colour (style % 8), marker and dash; 0..63 are all distinct
  std::vector<double> x, y;     // NaN y: a gap (no mark, the line breaks)
  std::vector<double> lo, hi;   // optional CI band (same size as x), drawn translucent
  bool line = true;             // join the marks with a line
  bool marks = true;            // draw a marker per point
  bool dashed = false;          // a reference series (e.g. `full`), dashed whatever the style
};

struct LinePlot {
  std::string id;     // unique within the page; [A-Za-z0-9_-] (sanitised otherwise)
  std::string title;
  Axis x, y;
  std::vector<Series> series;
  std::string note;   // a line under the plot (e.g. what the bands are)
};

struct Heatmap {
  std::string id, title;
  std::string row_label, col_label;
  std::vector<std::string> rows, cols;
  std::vector<double> values;  // rows.size() x cols.size(), row-major; NaN: no data
  double vmin = 0, vmax = 1;
};

std::string render(const LinePlot& plot, int width = 640, int height = 360);
std::string render(const Heatmap& map, int cell_w = 56, int cell_h = 28);

// Tick positions of a numeric axis over [lo, hi]: about `target` "nice" values (1, 2, 5 x 10^k)
// for linear axes; for log axes 1, 2, 5 x 10^k (or only powers of ten over wide ranges).
std::vector<double> nice_ticks(double lo, double hi, bool log, int target = 5);
// A short tick label: up to 4 significant digits, no trailing zeros, k/M suffixes above 10^4.
std::string tick_label(double v);

}  // namespace kvb::results::svg
