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
// Measurements as an object keyed by field name (common/measurement_fields.h), so that a field
// cannot be dropped or shifted by position: the decoder requires every field of the table.
json field_json(int64_t v) { return v; }
json field_json(double v) { return number(v); }
json field_json(bool v) { return v; }
json field_json(const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); }
json field_json(const std::string& v) { return v; }
void field_from(const json& j, int64_t* v) { *v = j.get<int64_t>(); }
void field_from(const json& j, double* v) { *v = number_from(j); }
void field_from(const json& j, bool* v) { *v = j.get<bool>(); }
void field_from(const json& j, std::string* v) { *v = j.get<std::string>(); }
void field_from(const json& j, std::optional<int64_t>* v) {
  if (j.is_null()) {
    v->reset();
  } else {
    *v = j.get<int64_t>();
  }
}

json measurements_json(const results::Measurements& m) {
  json j = json::object();
#define KVB_WIRE_MEASUREMENT(name, ctype, kind) j[#name] = field_json(m.name);
  KVB_MEASUREMENT_FIELDS(KVB_WIRE_MEASUREMENT)
#undef KVB_WIRE_MEASUREMENT
  return j;
}

results::Measurements measurements_from(const json& j) {
  KVB_CHECK(j.is_object()) << "measurements are a JSON object keyed by field name, got "
                           << j.type_name() << " (a worker of another kvbench version?)";
  results::Measurements m;
#define KVB_WIRE_MEASUREMENT(name, ctype, kind) field_from(j.at(#name), &m.name);
  KVB_MEASUREMENT_FIELDS(KVB_WIRE_MEASUREMENT)
#undef KVB_WIRE_MEASUREMENT
  KVB_CHECK(j.size() == std::size(measurement::kFields))
      << "measurements message has " << j.size() << " fields, this kvbench knows "
      << std::size(measurement::kFields) << " (a worker of another kvbench version?)";
  return m;
}
}  // namespace

results::Measurements to_store(const workers::UnitMeasurements& w) {
  results::Measurements m;
#define KVB_STORE_FROM_WORKER(name, ctype, kind) \
  m.name = measurement::to_store<measurement::Kind::kind>(w.name);
  KVB_MEASUREMENT_FIELDS(KVB_STORE_FROM_WORKER)
#undef KVB_STORE_FROM_WORKER
  return m;
}

std::string to_json(const WireBundle& b) {
  json units = json::array();
  for (const auto& u : b.units) {
    json unit = {{"key", u.key},
                 {"policy", u.policy},
                 {"policy_options", u.policy_options},
                 {"kv_budget", u.kv_budget},
                 {"question", u.question},
                 {"seed", u.seed}};
    if (u.budget_fraction > 0) unit["budget_fraction"] = u.budget_fraction;
    units.push_back(unit);
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
                         u.at("seed").get<uint64_t>(), u.value("budget_fraction", 0.0)});
      const double f = b.units.back().budget_fraction;
      KVB_CHECK(f >= 0 && f <= 1) << "malformed bundle message: budget_fraction " << f;
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
    if (r.measurements) j["m"] = measurements_json(*r.measurements);
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
      if (j.contains("m")) r.measurements = measurements_from(j.at("m"));
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
