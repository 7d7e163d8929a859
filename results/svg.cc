// Static SVG plots (results/svg.h).
#include "results/svg.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "common/error.h"
#include "common/escape.h"

namespace kvb::results::svg {

namespace {

// Okabe & Ito (2008), colour-blind safe; black last so that 8 styles differ in colour too.
const char* const kColours[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                "#E69F00", "#56B4E9", "#F0E442", "#000000"};
const char* const kDashes[] = {"", "6 3", "2 2", "8 3 2 3", "", "4 4", "1 3", "10 4"};
constexpr int kNumColours = 8;
constexpr int kNumMarkers = 8;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

std::string safe_id(const std::string& id) {
  std::string out;
  for (char c : id) out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_';
  return out.empty() ? "plot" : out;
}

// A marker of `style` centred at (x, y).
std::string marker(int style, double x, double y, const std::string& colour,
                   const std::string& tooltip) {
  const double r = 4.5;
  // Styles 0..63 are distinct (colour, shape) pairs: the shape advances by one more each time
  // the colours wrap around.
  const int shape = (style + style / kNumColours) % kNumMarkers;
  const std::string title = "<title>" + html_escape(tooltip) + "</title>";
  auto poly = [&](std::vector<std::pair<double, double>> pts, bool filled) {
    std::string p;
    for (auto& [dx, dy] : pts) p += num(x + dx) + "," + num(y + dy) + " ";
    return "<polygon class=\"mark\" points=\"" + p + "\" fill=\"" + (filled ? colour : "white") +
           "\" stroke=\"" + colour + "\" stroke-width=\"1.5\">" + title + "</polygon>";
  };
  switch (shape) {
    case 0:
      return "<circle class=\"mark\" cx=\"" + num(x) + "\" cy=\"" + num(y) + "\" r=\"" + num(r) +
             "\" fill=\"" + colour + "\">" + title + "</circle>";
    case 1: return poly({{-r, -r}, {r, -r}, {r, r}, {-r, r}}, true);
    case 2: return poly({{0, -r * 1.2}, {r * 1.1, r * 0.8}, {-r * 1.1, r * 0.8}}, true);
    case 3: return poly({{0, -r * 1.3}, {r * 1.1, 0}, {0, r * 1.3}, {-r * 1.1, 0}}, true);
    case 4: return poly({{0, r * 1.2}, {r * 1.1, -r * 0.8}, {-r * 1.1, -r * 0.8}}, true);
    case 5:
      return "<circle class=\"mark\" cx=\"" + num(x) + "\" cy=\"" + num(y) + "\" r=\"" + num(r) +
             "\" fill=\"white\" stroke=\"" + colour + "\" stroke-width=\"1.8\">" + title +
             "</circle>";
    case 6: return poly({{-r, -r}, {r, -r}, {r, r}, {-r, r}}, false);
    default: {
      // A cross (x), drawn as one path.
      const std::string d = "M" + num(x - r) + "," + num(y - r) + "L" + num(x + r) + "," +
                            num(y + r) + "M" + num(x - r) + "," + num(y + r) + "L" + num(x + r) +
                            "," + num(y - r);
      return "<path class=\"mark\" d=\"" + d + "\" stroke=\"" + colour +
             "\" stroke-width=\"2.2\" fill=\"none\">" + title + "</path>";
    }
  }
}

struct Scale {
  double lo = 0, hi = 1, px0 = 0, px1 = 1;
  bool log = false;
  double operator()(double v) const {
    const double a = log ? std::log10(lo) : lo, b = log ? std::log10(hi) : hi;
    const double t = ((log ? std::log10(v) : v) - a) / (b - a);
    return px0 + t * (px1 - px0);
  }
};

// The data range of an axis, padded, over the given values (finite ones).
Scale make_scale(const Axis& axis, const std::vector<double>& values, double px0, double px1) {
  Scale s;
  s.px0 = px0;
  s.px1 = px1;
  if (!axis.categories.empty()) {
    s.lo = -0.5;
    s.hi = static_cast<double>(axis.categories.size()) - 0.5;
    return s;
  }
  s.log = axis.log;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : values) {
    if (!std::isfinite(v) || (axis.log && v <= 0)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (!std::isfinite(lo)) lo = axis.log ? 1 : 0, hi = axis.log ? 10 : 1;
  if (axis.zero_based && !axis.log) lo = std::min(lo, 0.0), hi = std::max(hi, 0.0);
  if (axis.log) {
    if (hi / lo < 1.5) lo /= 1.25, hi *= 1.25;
    const double pad = std::pow(hi / lo, 0.05);
    lo /= pad;
    hi *= pad;
  } else {
    if (hi - lo < 1e-12) {
      const double d = std::max(std::abs(hi) * 0.1, 0.05);
      lo -= d;
      hi += d;
    }
    const double pad = (hi - lo) * 0.06;
    if (!(axis.zero_based && lo == 0)) lo -= pad;
    hi += pad;
  }
  s.lo = lo;
  s.hi = hi;
  return s;
}

std::string text(double x, double y, const std::string& s, const char* anchor, int size = 11,
                 const std::string& extra = "") {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" text-anchor=\"" + anchor +
         "\" font-size=\"" + std::to_string(size) + "\"" + extra + ">" + html_escape(s) +
         "</text>";
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, bool log, int target) {
  std::vector<double> out;
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return out;
  if (log) {
    KVB_ASSERT(lo > 0) << "log axis with a non-positive bound " << lo;
    const int e0 = static_cast<int>(std::floor(std::log10(lo)));
    const int e1 = static_cast<int>(std::ceil(std::log10(hi)));
    const bool dense = e1 - e0 <= 3;
    for (int e = e0; e <= e1; ++e) {
      for (double m : dense ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
        const double v = m * std::pow(10.0, e);
        if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push_back(v);
      }
    }
    return out;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  // k x step, rounded to the step's decimals, so that 3 x 0.2 is 0.6 and not 0.6000000000000001.
  const double scale = std::pow(10.0, std::max(0.0, 1 - std::floor(std::log10(step))));
  const long k0 = std::lround(std::ceil(lo / step - 1e-9));
  const long k1 = std::lround(std::floor(hi / step + 1e-9));
  for (long k = k0; k <= k1; ++k) out.push_back(std::round(k * step * scale) / scale + 0.0);
  return out;
}

std::string tick_label(double v) {
  char buf[32];
  const double a = std::abs(v);
  if (a >= 1e7) {
    std::snprintf(buf, sizeof(buf), "%.4gM", v / 1e6);
  } else if (a >= 1e4) {
    std::snprintf(buf, sizeof(buf), "%.4gk", v / 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.4g", v);
  }
  return buf;
}

std::string render(const LinePlot& p, int width, int height) {
  const double left = 64, right = 190, top = 34, bottom = 52;
  const double x0 = left, x1 = width - right, y0 = height - bottom, y1 = top;
  std::vector<double> xs, ys;
  for (const auto& s : p.series) {
    KVB_ASSERT(s.y.size() == s.x.size()) << "series " << s.name << ": x and y sizes differ";
    xs.insert(xs.end(), s.x.begin(), s.x.end());
    ys.insert(ys.end(), s.y.begin(), s.y.end());
    ys.insert(ys.end(), s.lo.begin(), s.lo.end());
    ys.insert(ys.end(), s.hi.begin(), s.hi.end());
  }
  const Scale sx = make_scale(p.x, xs, x0, x1);
  const Scale sy = make_scale(p.y, ys, y0, y1);
  const std::string id = safe_id(p.id);
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" id=\"" << id << "\" width=\""
    << width << "\" height=\"" << height << "\" viewBox=\"0 0 " << width << " " << height
    << "\" role=\"img\" aria-label=\"" << html_escape(p.title) << "\" font-family=\"sans-serif\">";
  o << "<title>" << html_escape(p.title) << "</title>";
  o << "<rect x=\"0\" y=\"0\" width=\"" << width << "\" height=\"" << height
    << "\" fill=\"white\"/>";
  o << text(width / 2.0 - (right - left) / 2, 18, p.title, "middle", 13, " font-weight=\"bold\"");
  // Grid and ticks.
  o << "<g class=\"axes\" stroke=\"#000\" stroke-width=\"1\">";
  o << "<line x1=\"" << num(x0) << "\" y1=\"" << num(y0) << "\" x2=\"" << num(x1) << "\" y2=\""
    << num(y0) << "\"/><line x1=\"" << num(x0) << "\" y1=\"" << num(y0) << "\" x2=\"" << num(x0)
    << "\" y2=\"" << num(y1) << "\"/></g>";
  std::vector<std::pair<double, std::string>> xt, yt;
  if (!p.x.categories.empty()) {
    for (size_t i = 0; i < p.x.categories.size(); ++i) xt.push_back({double(i), p.x.categories[i]});
  } else if (!p.x.ticks.empty()) {
    for (double v : p.x.ticks) xt.push_back({v, tick_label(v)});
  } else {
    for (double v : nice_ticks(sx.lo, sx.hi, sx.log)) xt.push_back({v, tick_label(v)});
  }
  if (!p.y.categories.empty()) {
    for (size_t i = 0; i < p.y.categories.size(); ++i) yt.push_back({double(i), p.y.categories[i]});
  } else if (!p.y.ticks.empty()) {
    for (double v : p.y.ticks) yt.push_back({v, tick_label(v)});
  } else {
    for (double v : nice_ticks(sy.lo, sy.hi, sy.log)) yt.push_back({v, tick_label(v)});
  }
  o << "<g class=\"ticks\" fill=\"#222\">";
  for (auto& [v, label] : xt) {
    const double px = sx(v);
    o << "<line x1=\"" << num(px) << "\" y1=\"" << num(y0) << "\" x2=\"" << num(px) << "\" y2=\""
      << num(y1) << "\" stroke=\"#ddd\"/>";
    o << text(px, y0 + 16, label, "middle");
  }
  for (auto& [v, label] : yt) {
    const double py = sy(v);
    o << "<line x1=\"" << num(x0) << "\" y1=\"" << num(py) << "\" x2=\"" << num(x1) << "\" y2=\""
      << num(py) << "\" stroke=\"#ddd\"/>";
    o << text(x0 - 6, py + 4, label, "end");
  }
  o << "</g>";
  o << text((x0 + x1) / 2, height - 12, p.x.label, "middle", 12);
  o << "<text x=\"14\" y=\"" << num((y0 + y1) / 2) << "\" text-anchor=\"middle\" font-size=\"12\""
    << " transform=\"rotate(-90 14 " << num((y0 + y1) / 2) << ")\">" << html_escape(p.y.label)
    << "</text>";
  // Bands first (under every line), then lines, then marks.
  auto inside = [&](double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && (!sx.log || x > 0) && (!sy.log || y > 0);
  };
  o << "<g class=\"data\">";
  for (const auto& s : p.series) {
    if (s.lo.size() != s.x.size() || s.hi.size() != s.x.size()) continue;
    std::string up, down;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!inside(s.x[i], s.lo[i]) || !inside(s.x[i], s.hi[i])) continue;
      up += (up.empty() ? "M" : "L") + num(sx(s.x[i])) + "," + num(sy(s.hi[i]));
    }
    for (size_t i = s.x.size(); i-- > 0;) {
      if (!inside(s.x[i], s.lo[i]) || !inside(s.x[i], s.hi[i])) continue;
      down += "L" + num(sx(s.x[i])) + "," + num(sy(s.lo[i]));
    }
    if (up.empty()) continue;
    const std::string colour = s.dashed ? "#555" : kColours[s.style % kNumColours];
    o << "<path class=\"band\" d=\"" << up << down << "Z\" fill=\"" << colour
      << "\" fill-opacity=\"0.15\" stroke=\"none\"/>";
  }
  for (const auto& s : p.series) {
    if (!s.line) continue;
    const std::string colour = s.dashed ? "#333" : kColours[s.style % kNumColours];
    std::string d;
    bool pen = false;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!inside(s.x[i], s.y[i])) {
        pen = false;
        continue;
      }
      d += (pen ? "L" : "M") + num(sx(s.x[i])) + "," + num(sy(s.y[i]));
      pen = true;
    }
    if (d.empty()) continue;
    const char* dash = s.dashed ? "5 4" : kDashes[s.style % kNumColours];
    o << "<path class=\"line\" d=\"" << d << "\" fill=\"none\" stroke=\"" << colour
      << "\" stroke-width=\"1.8\"" << (*dash ? std::string(" stroke-dasharray=\"") + dash + "\"" : "")
      << "/>";
  }
  for (const auto& s : p.series) {
    if (!s.marks) continue;
    const std::string colour = s.dashed ? "#333" : kColours[s.style % kNumColours];
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!inside(s.x[i], s.y[i])) continue;
      const std::string xl = p.x.categories.empty() ? tick_label(s.x[i])
                                                    : p.x.categories[static_cast<size_t>(s.x[i])];
      std::string tip = s.name + ": " + xl + " -> " + tick_label(s.y[i]);
      if (s.lo.size() == s.x.size() && s.hi.size() == s.x.size()) {
        tip += " [" + tick_label(s.lo[i]) + ", " + tick_label(s.hi[i]) + "]";
      }
      o << marker(s.style, sx(s.x[i]), sy(s.y[i]), colour, tip);
    }
  }
  o << "</g>";
  // Legend: marker + line sample + name, one row per series.
  o << "<g class=\"legend\">";
  double ly = top + 6;
  for (const auto& s : p.series) {
    const std::string colour = s.dashed ? "#333" : kColours[s.style % kNumColours];
    const double lx = x1 + 14;
    if (s.line) {
      const char* dash = s.dashed ? "5 4" : kDashes[s.style % kNumColours];
      o << "<line x1=\"" << num(lx) << "\" y1=\"" << num(ly) << "\" x2=\"" << num(lx + 26)
        << "\" y2=\"" << num(ly) << "\" stroke=\"" << colour << "\" stroke-width=\"1.8\""
        << (*dash ? std::string(" stroke-dasharray=\"") + dash + "\"" : "") << "/>";
    }
    if (s.marks) {
      std::string m = marker(s.style, lx + 13, ly, colour, s.name);
      m.replace(m.find("class=\"mark\""), 12, "class=\"key\"");
      o << m;
    }
    std::string name = s.name.size() > 24 ? s.name.substr(0, 23) + "…" : s.name;
    o << text(lx + 32, ly + 4, name, "start");
    ly += 18;
  }
  o << "</g>";
  if (!p.note.empty()) o << text(x0, height - 1.5, p.note, "start", 9, " fill=\"#555\"");
  o << "</svg>";
  return o.str();
}

namespace {
// viridis at 9 stops: luminance rises monotonically, so grey-scale print keeps the order.
const double kViridis[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},
                               {44, 113, 142}, {33, 144, 141}, {39, 173, 129},
                               {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
std::string viridis(double t, bool* dark) {
  t = std::clamp(t, 0.0, 1.0) * 8;
  const int i = std::min(7, static_cast<int>(t));
  const double f = t - i;
  int rgb[3];
  for (int c = 0; c < 3; ++c) {
    rgb[c] = static_cast<int>(std::lround(kViridis[i][c] + f * (kViridis[i + 1][c] - kViridis[i][c])));
  }
  *dark = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 140;
  char buf[16];
  std::snprintf(buf, sizeof(buf), "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
  return buf;
}
}  // namespace

std::string render(const Heatmap& m, int cw, int ch) {
  KVB_ASSERT(m.values.size() == m.rows.size() * m.cols.size())
      << "heatmap " << m.id << ": " << m.values.size() << " values for " << m.rows.size() << "x"
      << m.cols.size();
  const double left = 78, top = 40, legend_w = 70;
  const double gw = cw * m.cols.size(), gh = ch * m.rows.size();
  const int width = static_cast<int>(left + gw + legend_w + 10);
  const int height = static_cast<int>(top + gh + 44);
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot heatmap\" id=\"" << safe_id(m.id)
    << "\" width=\"" << width << "\" height=\"" << height << "\" viewBox=\"0 0 " << width << " "
    << height << "\" role=\"img\" aria-label=\"" << html_escape(m.title)
    << "\" font-family=\"sans-serif\">";
  o << "<title>" << html_escape(m.title) << "</title>";
  o << "<rect x=\"0\" y=\"0\" width=\"" << width << "\" height=\"" << height
    << "\" fill=\"white\"/>";
  o << text(left + gw / 2, 16, m.title, "middle", 12, " font-weight=\"bold\"");
  o << text(left + gw / 2, 32, m.col_label, "middle", 10, " fill=\"#333\"");
  o << "<g class=\"data\">";
  for (size_t r = 0; r < m.rows.size(); ++r) {
    for (size_t c = 0; c < m.cols.size(); ++c) {
      const double v = m.values[r * m.cols.size() + c];
      const double x = left + c * cw, y = top + r * ch;
      if (!std::isfinite(v)) {
        o << "<rect class=\"cell missing\" x=\"" << num(x) << "\" y=\"" << num(y) << "\" width=\""
          << cw << "\" height=\"" << ch
          << "\" fill=\"#fff\" stroke=\"#bbb\" stroke-dasharray=\"2 2\"><title>no data</title></rect>";
        continue;
      }
      bool dark = false;
      const std::string fill = viridis((v - m.vmin) / (m.vmax - m.vmin), &dark);
      o << "<rect class=\"cell\" x=\"" << num(x) << "\" y=\"" << num(y) << "\" width=\"" << cw
        << "\" height=\"" << ch << "\" fill=\"" << fill << "\" stroke=\"white\"><title>"
        << html_escape(m.row_label + " " + m.rows[r] + ", " + m.col_label + " " + m.cols[c] +
                       ": " + tick_label(v))
        << "</title></rect>";
      char buf[16];
      std::snprintf(buf, sizeof(buf), "%.2f", v);
      o << text(x + cw / 2.0, y + ch / 2.0 + 4, buf, "middle", 10,
                dark ? " fill=\"white\"" : " fill=\"black\"");
    }
  }
  o << "</g>";
  for (size_t c = 0; c < m.cols.size(); ++c) {
    o << text(left + c * cw + cw / 2.0, top + gh + 14, m.cols[c], "middle", 10);
  }
  for (size_t r = 0; r < m.rows.size(); ++r) {
    o << text(left - 6, top + r * ch + ch / 2.0 + 4, m.rows[r], "end", 10);
  }
  o << text(left + gw / 2, top + gh + 32, m.row_label + " (rows) x " + m.col_label + " (columns)",
            "middle", 10, " fill=\"#333\"");
  // Colour key: 5 steps from vmin to vmax.
  const double kx = left + gw + 16;
  for (int i = 0; i < 5; ++i) {
    const double v = m.vmax - (m.vmax - m.vmin) * i / 4.0;
    bool dark = false;
    o << "<rect x=\"" << num(kx) << "\" y=\"" << num(top + i * 16) << "\" width=\"14\" height=\"16\""
      << " fill=\"" << viridis((v - m.vmin) / (m.vmax - m.vmin), &dark) << "\"/>";
    o << text(kx + 18, top + i * 16 + 12, tick_label(v), "start", 9);
  }
  o << "</svg>";
  return o.str();
}

}  // namespace kvb::results::svg
