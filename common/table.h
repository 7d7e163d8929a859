// One result table, several printers (md, csv, jsonl, html): the same rows in each format (STYLE.md
// "Output"). Cells are strings; md right-aligns cells that parse as numbers. Text cells are
// escaped for the chosen format.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace kvb {

class Table {
 public:
  explicit Table(std::vector<std::string> columns) : columns_(std::move(columns)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // format: "md", "csv", "jsonl", "html" (a <table>; numeric columns get class "num") or "latex"
  // (a booktabs tabular: \toprule, \midrule, \bottomrule; numeric columns right-aligned; TeX's
  // special characters escaped). jsonl writes a cell as a JSON number only when it is one by
  // JSON's grammar ("0x10", "+5", "1e5x" stay strings).
  void print(std::ostream& os, const std::string& format) const;
  size_t size() const { return rows_.size(); }
  bool empty() const { return rows_.empty(); }
  const std::vector<std::string>& columns() const { return columns_; }
  const std::vector<std::vector<std::string>>& rows() const { return rows_; }

 private:
  std::vector<std::string> columns_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace kvb
