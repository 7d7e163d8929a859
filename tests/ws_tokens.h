// A whitespace token counter for task tests: tasks ask a tokenizer only for token counts
// (tasks::TaskContext), and words are close enough to tokens for budgets and fitting.
#pragma once

#include <sstream>
#include <string>

namespace kvb::tasks {

inline int ws_count(const std::string& s) {
  std::istringstream in(s);
  std::string w;
  int n = 0;
  while (in >> w) ++n;
  return n;
}

}  // namespace kvb::tasks
