// The coordinator <-> worker wire (harness/sweep_wire.h) and the worker -> store conversion carry
// every measurement field of common/measurement_fields.h (issue 14: the positional wire dropped
// prefill_shared, so every mpirun sweep stored 0 there). Each field gets a value of its own,
// generated from the same table, so a field added later is covered without touching this test.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/error.h"
#include "harness/sweep_wire.h"

namespace kvb::harness {
namespace {

// Field i (0-based, table order) gets a value that no other field has and that is not the default.
template <typename T>
T distinct_value(int i) {
  if constexpr (std::is_same_v<T, std::string>) {
    return std::string(63, 'a') + static_cast<char>('0' + i % 10);  // 64 hex digits (Text)
  } else {
    return static_cast<T>(std::is_same_v<T, double> ? i + 0.25 : i);
  }
}

workers::UnitMeasurements distinct_worker_measurements() {
  workers::UnitMeasurements m;
  int i = 0;
#define KVB_SET(name, ctype, kind) \
  ++i;                             \
  m.name = distinct_value<ctype>(i);
  KVB_MEASUREMENT_FIELDS(KVB_SET)
#undef KVB_SET
  return m;
}

TEST(SweepWire, EveryMeasurementFieldReachesTheStoreStruct) {
  const workers::UnitMeasurements w = distinct_worker_measurements();
  const results::Measurements m = to_store(w);
  // Spot checks against the worker's values, independent of the generated conversion.
  EXPECT_EQ(m.prompt_tokens, w.prompt_tokens);
  EXPECT_EQ(m.ttft_ms, w.ttft_ms);
  EXPECT_EQ(m.host_rss_peak, static_cast<int64_t>(w.host_rss_peak));
  ASSERT_TRUE(m.device_peak_bytes.has_value());
  EXPECT_EQ(*m.device_peak_bytes, static_cast<int64_t>(w.device_peak_bytes));
  EXPECT_TRUE(m.prefill_shared);
  // 0 on the worker is "no device": NULL in the store.
  workers::UnitMeasurements cpu = w;
  cpu.device_peak_bytes = 0;
  EXPECT_FALSE(to_store(cpu).device_peak_bytes.has_value());
}

TEST(SweepWire, ResultsRoundTripEveryMeasurementField) {
  results::UnitResult r;
  r.unit_key = std::string(64, 'a');
  r.kv_budget = 32;
  r.metrics = {{"recall", 0.5, true}, {"nll", NAN, false}};
  r.measurements = to_store(distinct_worker_measurements());
  r.prediction = results::PredictionRow{"text", {"ref"}};
  results::UnitResult cpu = r;
  cpu.unit_key = std::string(64, 'b');
  cpu.measurements->device_peak_bytes.reset();
  cpu.measurements->prefill_shared = false;
  cpu.measurements->decode_ms = NAN;  // NaN travels as null, comes back NaN
  const std::vector<results::UnitResult> back = results_from_json(to_json({r, cpu}));
  ASSERT_EQ(back.size(), 2u);
  ASSERT_TRUE(back[0].measurements && back[1].measurements);
  EXPECT_EQ(*back[0].measurements, *r.measurements);
  EXPECT_TRUE(back[0].measurements->prefill_shared);
  EXPECT_FALSE(back[1].measurements->device_peak_bytes.has_value());
  EXPECT_FALSE(back[1].measurements->prefill_shared);
  EXPECT_TRUE(std::isnan(back[1].measurements->decode_ms));
  EXPECT_EQ(back[0].prediction, r.prediction);
}

TEST(SweepWire, MeasurementsAreKeyedByNameAndComplete) {
  results::UnitResult r;
  r.unit_key = std::string(64, 'a');
  r.measurements = to_store(distinct_worker_measurements());
  std::string text = to_json({r});
  EXPECT_NE(text.find("\"prefill_shared\":true"), std::string::npos) << text;
  EXPECT_NE(text.find("\"prompt_tokens\":1"), std::string::npos) << text;
  // A message that lacks a field (a worker of another version) is refused, naming the field.
  const std::string field = "\"prefill_shared\":true";
  const size_t at = text.find(field);
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(text[at + field.size()], ',');  // keys are sorted: others follow it
  text.erase(at, field.size() + 1);
  try {
    results_from_json(text);
    ADD_FAILURE() << "a measurements object without prefill_shared was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prefill_shared"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvb::harness
