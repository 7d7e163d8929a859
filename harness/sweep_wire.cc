// JSON (nlohmann) encoding of bundles and results. Both ends are our own ranks, but the decoder
// still validates types, so a version mismatch fails with a message rather than a crash.
#include "harness/sweep_wire.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace kvb::harness {

using nlohmann::json;

namespace {
json sample_json(const tasks::Sample& s) {
  return {{"id", s.id},
          {"kind", static_cast<int>(s.kind)},
          {"context", s.context},
          {"question", s.question},
          {"chat", s.chat},
          {"answer_prefix", s.answer_prefix},
          {"max_new_tokens", s.max_new_tokens},
          {"max_prompt_tokens", s.max_prompt_tokens},
          {"stop_strings", s.stop_strings},
          {"references", s.references},
          {"choices", s.choices},
          {"gold", s.gold},
          {"text", s.text},
          {"max_tokens", s.max_tokens},
          {"fields", s.fields}};
}

tasks::Sample sample_from(const json& j) {
  tasks::Sample s;
  s.id = j.at("id").get<std::string>();
  s.kind = static_cast<tasks::SampleKind>(j.at("kind").get<int>());
  s.context = j.at("context").get<std::string>();
  s.question = j.at("question").get<std::string>();
  s.chat = j.at("chat").get<bool>();
  s.answer_prefix = j.at("answer_prefix").get<std::string>();
  s.max_new_tokens = j.at("max_new_tokens").get<int>();
  s.max_prompt_tokens = j.at("max_prompt_tokens").get<int>();
  s.stop_strings = j.at("stop_strings").get<std::vector<std::string>>();
  s.references = j.at("references").get<std::vector<std::string>>();
  s.choices = j.at("choices").get<std::vector<std::string>>();
  s.gold = j.at("gold").get<int>();
  s.text = j.at("text").get<std::string>();
  s.max_tokens = j.at("max_tokens").get<int>();
  s.fields = j.at("fields").get<std::map<std::string, std::string>>();
  return s;
}

// NaN is not JSON: send it as null.
json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
double number_from(const json& j) { return j.is_null() ? NAN : j.get<double>(); }
}  // namespace

std::string to_json(const WireBundle& b) {
  json units = json::array();
  for (const auto& u : b.units) {
    units.push_back({{"key", u.key},
                     {"policy", u.policy},
                     {"policy_options", u.policy_options},
                     {"kv_budget", u.kv_budget},
                     {"question", u.question},
                     {"seed", u.seed}});
  }
  return json{{"model", b.model}, {"task", b.task}, {"sample", sample_json(b.sample)}, {"units", units}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

WireBundle bundle_from_json(const std::string& text) {
  try {
    const json j = json::parse(text);
    WireBundle b;
    b.model = j.at("model").get<int>();
    b.task = j.at("task").get<int>();
    b.sample = sample_from(j.at("sample"));
    for (const auto& u : j.at("units")) {
      b.units.push_back({u.at("key").get<std::string>(), u.at("policy").get<std::string>(),
                         u.at("policy_options").get<std::map<std::string, std::string>>(),
                         u.at("kv_budget").get<int>(), u.at("question").get<std::string>(),
                         u.at("seed").get<uint64_t>()});
    }
    return b;
  } catch (const json::exception& e) {
    KVB_FAIL() << "malformed bundle message: " << e.what();
  }
}

std::string to_json(const std::vector<results::UnitResult>& rs) {
  json out = json::array();
  for (const auto& r : rs) {
    json metrics = json::array();
    for (const auto& m : r.metrics) {
      metrics.push_back({{"name", m.name}, {"value", number(m.value)}, {"hib", m.higher_is_better}});
    }
    json j = {{"key", r.unit_key},
              {"status", results::to_string(r.status)},
              {"error", r.error},
              {"metrics", metrics}};
    if (r.kv_budget) j["kv_budget"] = *r.kv_budget;
    if (r.measurements) {
      const auto& m = *r.measurements;
      j["m"] = {m.prompt_tokens, m.generated_tokens, m.truncated_tokens, number(m.prefill_ms),
                number(m.ttft_ms), number(m.decode_ms), number(m.decode_ms_p50),
                number(m.decode_ms_p99), number(m.tokens_per_s), number(m.policy_ms),
                m.kv_bytes_final, m.kv_bytes_peak, m.kv_physical_peak, m.policy_state_bytes,
                number(m.occupancy_mean), number(m.occupancy_final), m.occupancy_peak,
                m.occupancy_min_final, m.occupancy_max_final, m.host_rss_peak};
      if (m.device_peak_bytes) j["device_peak"] = *m.device_peak_bytes;  // GPU workers only
    }
    if (r.prediction) j["prediction"] = {{"text", r.prediction->text}, {"refs", r.prediction->references}};
    out.push_back(j);
  }
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::vector<results::UnitResult> results_from_json(const std::string& text) {
  try {
    std::vector<results::UnitResult> out;
    for (const auto& j : json::parse(text)) {
      results::UnitResult r;
      r.unit_key = j.at("key").get<std::string>();
      r.status = results::parse_unit_status(j.at("status").get<std::string>());
      r.error = j.at("error").get<std::string>();
      for (const auto& m : j.at("metrics")) {
        r.metrics.push_back({m.at("name").get<std::string>(), number_from(m.at("value")),
                             m.at("hib").get<bool>()});
      }
      if (j.contains("kv_budget")) r.kv_budget = j.at("kv_budget").get<int64_t>();
      if (j.contains("m")) {
        const json& a = j.at("m");
        results::Measurements m;
        m.prompt_tokens = a.at(0).get<int64_t>();
        m.generated_tokens = a.at(1).get<int64_t>();
        m.truncated_tokens = a.at(2).get<int64_t>();
        m.prefill_ms = number_from(a.at(3));
        m.ttft_ms = number_from(a.at(4));
        m.decode_ms = number_from(a.at(5));
        m.decode_ms_p50 = number_from(a.at(6));
        m.decode_ms_p99 = number_from(a.at(7));
        m.tokens_per_s = number_from(a.at(8));
        m.policy_ms = number_from(a.at(9));
        m.kv_bytes_final = a.at(10).get<int64_t>();
        m.kv_bytes_peak = a.at(11).get<int64_t>();
        m.kv_physical_peak = a.at(12).get<int64_t>();
        m.policy_state_bytes = a.at(13).get<int64_t>();
        m.occupancy_mean = number_from(a.at(14));
        m.occupancy_final = number_from(a.at(15));
        m.occupancy_peak = a.at(16).get<int64_t>();
        m.occupancy_min_final = a.at(17).get<int64_t>();
        m.occupancy_max_final = a.at(18).get<int64_t>();
        m.host_rss_peak = a.at(19).get<int64_t>();
        if (j.contains("device_peak")) m.device_peak_bytes = j.at("device_peak").get<int64_t>();
        r.measurements = m;
      }
      if (j.contains("prediction")) {
        r.prediction = results::PredictionRow{j.at("prediction").at("text").get<std::string>(),
                                              j.at("prediction").at("refs").get<std::vector<std::string>>()};
      }
      out.push_back(std::move(r));
    }
    return out;
  } catch (const json::exception& e) {
    KVB_FAIL() << "malformed results message: " << e.what();
  }
}

}  // namespace kvb::harness
