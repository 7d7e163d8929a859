// Table printers: Markdown (aligned, numbers right), CSV (RFC 4180, formula-safe), JSON lines.
#include "common/table.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/escape.h"

namespace kvb {

namespace {
bool is_number(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return *end == '\0' || std::string(end).rfind(" ±", 0) == 0;
}
// A JSON number exactly: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
bool is_json_number(const std::string& s) {
  size_t i = 0;
  auto digits = [&] {
    const size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i > start;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == s.size();
}
// TeX text: its special characters escaped (and no control characters).
std::string tex_escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '\\': out += "\\textbackslash{}"; break;
      case '&': case '%': case '$': case '#': case '_': case '{': case '}':
        out += '\\';
        out += static_cast<char>(c);
        break;
      case '~': out += "\\textasciitilde{}"; break;
      case '^': out += "\\textasciicircum{}"; break;
      case '<': out += "\\textless{}"; break;
      case '>': out += "\\textgreater{}"; break;
      default:
        if (c >= 0x20 && c != 0x7f) out += static_cast<char>(c);
    }
  }
  // The symbols kvbench's tables use, in math mode (pdfLaTeX has no glyphs for them as text).
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\u2191", "$\\uparrow$"}, {"\u2193", "$\\downarrow$"}, {"\u00b1", "$\\pm$"}}) {
    for (size_t at = out.find(from); at != std::string::npos; at = out.find(from, at + to.size())) {
      out.replace(at, from.size(), to);
    }
  }
  return out;
}
// Display width in code points (good enough for alignment of mostly-ASCII tables).
size_t width(const std::string& s) {
  size_t w = 0;
  for (unsigned char c : s) w += (c & 0xC0) != 0x80;
  return w;
}
}  // namespace

void Table::print(std::ostream& os, const std::string& format) const {
  // A column is numeric (right-aligned) when it has a value and every value is a number.
  auto numeric_columns = [&] {
    std::vector<bool> numeric(columns_.size(), true);
    for (size_t c = 0; c < columns_.size(); ++c) {
      bool any = false;
      for (const auto& r : rows_) {
        const std::string v = c < r.size() ? r[c] : "";
        if (v.empty()) continue;
        any = true;
        numeric[c] = numeric[c] && is_number(v);
      }
      numeric[c] = numeric[c] && any;
    }
    return numeric;
  };
  if (format == "csv") {
    for (size_t c = 0; c < columns_.size(); ++c) os << (c ? "," : "") << csv_field(columns_[c]);
    os << "\n";
    for (const auto& r : rows_) {
      for (size_t c = 0; c < columns_.size(); ++c) {
        os << (c ? "," : "") << csv_field(c < r.size() ? r[c] : "");
      }
      os << "\n";
    }
    return;
  }
  if (format == "jsonl") {
    for (const auto& r : rows_) {
      os << "{";
      for (size_t c = 0; c < columns_.size(); ++c) {
        const std::string v = c < r.size() ? r[c] : "";
        os << (c ? "," : "") << "\"" << json_escape(columns_[c]) << "\":";
        if (is_json_number(v)) {
          os << v;
        } else {
          os << "\"" << json_escape(v) << "\"";
        }
      }
      os << "}\n";
    }
    return;
  }
  if (format == "latex") {
    std::string spec;
    for (const bool numeric : numeric_columns()) spec += numeric ? 'r' : 'l';
    os << "\\begin{tabular}{" << spec << "}\n\\toprule\n";
    for (size_t c = 0; c < columns_.size(); ++c) os << (c ? " & " : "") << tex_escape(columns_[c]);
    os << " \\\\\n\\midrule\n";
    for (const auto& r : rows_) {
      for (size_t c = 0; c < columns_.size(); ++c) {
        os << (c ? " & " : "") << tex_escape(c < r.size() ? r[c] : "");
      }
      os << " \\\\\n";
    }
    os << "\\bottomrule\n\\end{tabular}\n";
    return;
  }
  if (format == "html") {
    const std::vector<bool> numeric = numeric_columns();
    os << "<table>\n<thead><tr>";
    for (size_t c = 0; c < columns_.size(); ++c) {
      os << (numeric[c] ? "<th class=\"num\">" : "<th>") << html_escape(columns_[c]) << "</th>";
    }
    os << "</tr></thead>\n<tbody>\n";
    for (const auto& r : rows_) {
      os << "<tr>";
      for (size_t c = 0; c < columns_.size(); ++c) {
        os << (numeric[c] ? "<td class=\"num\">" : "<td>") << html_escape(c < r.size() ? r[c] : "")
           << "</td>";
      }
      os << "</tr>\n";
    }
    os << "</tbody>\n</table>\n";
    return;
  }
  KVB_CHECK(format == "md") << "unknown table format " << format;
  std::vector<std::string> head(columns_.size());
  std::vector<std::vector<std::string>> cells;
  for (size_t c = 0; c < columns_.size(); ++c) head[c] = md_cell(columns_[c]);
  for (const auto& r : rows_) {
    std::vector<std::string> row(columns_.size());
    for (size_t c = 0; c < columns_.size(); ++c) {
      row[c] = md_cell(c < r.size() ? r[c] : "");
    }
    cells.push_back(row);
  }
  std::vector<size_t> w(columns_.size());
  std::vector<bool> numeric(columns_.size(), true);
  for (size_t c = 0; c < columns_.size(); ++c) {
    w[c] = std::max<size_t>(3, width(head[c]));
    bool any = false;
    for (const auto& r : cells) {
      w[c] = std::max(w[c], width(r[c]));
      if (!r[c].empty()) {
        any = true;
        numeric[c] = numeric[c] && is_number(r[c]);
      }
    }
    numeric[c] = numeric[c] && any;
  }
  auto pad = [&](const std::string& s, size_t c) {
    const std::string fill(w[c] - width(s), ' ');
    return numeric[c] ? fill + s : s + fill;
  };
  os << "|";
  for (size_t c = 0; c < columns_.size(); ++c) os << " " << pad(head[c], c) << " |";
  os << "\n|";
  for (size_t c = 0; c < columns_.size(); ++c) {
    os << " " << std::string(w[c] - (numeric[c] ? 1 : 0), '-') << (numeric[c] ? ":" : "") << " |";
  }
  os << "\n";
  for (const auto& r : cells) {
    os << "|";
    for (size_t c = 0; c < columns_.size(); ++c) os << " " << pad(r[c], c) << " |";
    os << "\n";
  }
}

}  // namespace kvb
