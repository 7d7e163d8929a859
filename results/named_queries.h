// The named queries of `kvbench query` (results/queries/<name>.sql, compiled in by CMake). Each
// file starts with "-- <name>: <description>".
#pragma once

#include <string>
#include <vector>

namespace kvb::results {

struct NamedQuery {
  std::string name;
  std::string sql;  // the file's text; its first line is the description comment
  std::string description() const {
    const size_t colon = sql.find(':');
    const size_t eol = sql.find('\n');
    if (sql.rfind("--", 0) != 0 || colon == std::string::npos || colon > eol) return "";
    return sql.substr(colon + 2, eol - colon - 2);
  }
};

const std::vector<NamedQuery>& named_queries();

}  // namespace kvb::results
