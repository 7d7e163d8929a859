// The matrix side of a sweep config (harness/sweep_config.h): integer range lists ("64-512*2"),
// exclusion rules, and the cartesian product of cells, model outermost (as llama-bench expands
// its list flags).
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <sstream>

#include "common/error.h"
#include "harness/sweep_config.h"
#include "kernels/policies/policy.h"

namespace kvb::harness {

std::vector<int64_t> expand_int_range(const std::string& text, const std::string& what) {
  std::vector<int64_t> out;
  auto number = [&](std::string s, const std::string& item) -> int64_t {
    int64_t mult = 1;
    if (!s.empty() && (s.back() == 'k' || s.back() == 'K')) {
      mult = 1024;
      s.pop_back();
    } else if (!s.empty() && (s.back() == 'm' || s.back() == 'M')) {
      mult = 1024 * 1024;
      s.pop_back();
    }
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    KVB_USAGE_CHECK(!s.empty() && std::isdigit(static_cast<unsigned char>(s[0])) && *end == '\0' &&
                    errno != ERANGE && v <= (INT64_MAX / mult))
        << what << " '" << item << "' is not a number or a range (a-b, a-b*factor, a-b+step)";
    return v * mult;
  };
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    const size_t dash = item.find('-', 1);
    if (dash == std::string::npos) {
      out.push_back(number(item, item));
      continue;
    }
    const size_t op = item.find_first_of("*+", dash);
    const int64_t a = number(item.substr(0, dash), item);
    const int64_t b = number(
        item.substr(dash + 1, op == std::string::npos ? std::string::npos : op - dash - 1), item);
    const int64_t step = op == std::string::npos ? 1 : number(item.substr(op + 1), item);
    const bool mul = op != std::string::npos && item[op] == '*';
    KVB_USAGE_CHECK(a <= b) << what << " range '" << item << "' runs backwards (" << a << " > " << b
                            << ")";
    KVB_USAGE_CHECK(mul ? step >= 2 && a >= 1 : step >= 1)
        << what << " range '" << item
        << "': " << (mul ? "the factor must be >= 2 and the start >= 1" : "the step must be >= 1");
    for (int64_t v = a; v <= b; v = mul ? v * step : v + step) {
      KVB_USAGE_CHECK(out.size() < 100000)
          << what << " range '" << item << "' expands to over 100000 values";
      out.push_back(v);
      if (v > INT64_MAX / step) break;
    }
  }
  KVB_USAGE_CHECK(!out.empty()) << what << " '" << text << "' is empty";
  return out;
}

bool excluded(const SweepConfig& config, const std::map<std::string, std::string>& axes) {
  for (const ExcludeRule& rule : config.exclude) {
    bool all = !rule.match.empty();
    for (const auto& [k, v] : rule.match) {
      auto it = axes.find(k);
      all = all && it != axes.end() && it->second == v;
    }
    if (all) return true;
  }
  return false;
}

std::map<std::string, std::string> cell_axes(const SweepConfig& config, const ConfigCell& cell) {
  std::map<std::string, std::string> axes = {
      {"model", config.models[cell.model].name},
      {"task", config.tasks[cell.task].name},
      {"policy", config.policies[cell.policy].name},
      {"question", config.questions[cell.question]},
      {"seed", std::to_string(config.seeds[cell.seed])},
  };
  if (cell.budget >= 0) axes["kv_budget"] = config.budgets[cell.budget].spec();
  return axes;
}

std::vector<ConfigCell> expand_config_cells(const SweepConfig& config) {
  std::vector<ConfigCell> out;
  const int nb = static_cast<int>(config.budgets.size());
  for (int m = 0; m < static_cast<int>(config.models.size()); ++m) {
    for (int t = 0; t < static_cast<int>(config.tasks.size()); ++t) {
      for (int p = 0; p < static_cast<int>(config.policies.size()); ++p) {
        const bool full = !policies::budgeted(config.policies[p].name);  // no budget axis
        for (int b = full ? -1 : 0; b < (full ? 0 : nb); ++b) {
          for (int q = 0; q < static_cast<int>(config.questions.size()); ++q) {
            for (int s = 0; s < static_cast<int>(config.seeds.size()); ++s) {
              const ConfigCell cell{m, t, p, b, q, s};
              if (!excluded(config, cell_axes(config, cell))) out.push_back(cell);
            }
          }
        }
      }
    }
  }
  return out;
}

}  // namespace kvb::harness
