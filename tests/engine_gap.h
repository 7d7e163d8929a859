// Shared by the engine tests that hold one engine against another on the transformers golden's
// prompts (test_engine_bf16, test_engine_native): the largest logit difference over every
// position, relative to the row's largest |logit|, and the top-1 agreement; and the device a
// sweep's only run recorded.
#pragma once

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "workers/engine/engine.h"

namespace kvb::testing {

struct LogitsGap {
  double max_diff = 0, max_rel = 0;  // max |a - b|; and that over the row's max |b|
  int rows = 0, top1 = 0;            // positions compared; positions with the same argmax
};

// Every position of the first `max_tokens` ids of each case of `cases` (a golden's "cases"
// array), a against b, each prompt prefilled once with all logits.
inline LogitsGap logits_gap(engine::Engine& a, engine::Engine& b, const nlohmann::json& cases,
                            size_t max_tokens, int vocab) {
  LogitsGap g;
  for (const auto& cs : cases) {
    std::vector<int32_t> ids = cs["ids"].get<std::vector<int32_t>>();
    ids.resize(std::min(ids.size(), max_tokens));
    kernels::KvCache ca = a.new_cache(static_cast<int>(ids.size()));
    kernels::KvCache cb = b.new_cache(static_cast<int>(ids.size()));
    std::vector<float> la, lb;
    a.forward(ids, ca, engine::LogitsMode::kAll, &la);
    b.forward(ids, cb, engine::LogitsMode::kAll, &lb);
    if (la.size() != lb.size() || la.size() != ids.size() * vocab) return LogitsGap{-1, -1, 0, 0};
    for (size_t p = 0; p < ids.size(); ++p) {
      const float* x = &la[p * vocab];
      const float* y = &lb[p * vocab];
      double spread = 0, diff = 0;
      for (int v = 0; v < vocab; ++v) {
        diff = std::max(diff, double{std::fabs(x[v] - y[v])});
        spread = std::max(spread, double{std::fabs(y[v])});
      }
      g.max_diff = std::max(g.max_diff, diff);
      g.max_rel = std::max(g.max_rel, diff / spread);
      g.top1 += std::max_element(x, x + vocab) - x == std::max_element(y, y + vocab) - y;
      ++g.rows;
    }
  }
  return g;
}

// The runs table's devices JSON of the only run in `db` ("" when there is none).
inline std::string run_devices(const std::string& db) {
  sqlite3* h = nullptr;
  std::string out;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(h);
    return out;
  }
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(h, "SELECT devices FROM runs", -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW) {
    out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  }
  sqlite3_finalize(st);
  sqlite3_close(h);
  return out;
}

}  // namespace kvb::testing
