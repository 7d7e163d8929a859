// The one list of a unit's measurement fields (TASKS.md "Measurements every unit records").
// Every place that names them is generated from KVB_MEASUREMENT_FIELDS: the worker's struct
// (workers::UnitMeasurements), the store's struct and its column binding (results::Measurements,
// results/store.cc), the worker -> store conversion and the MPI wire format, keyed by field name
// (harness/sweep_wire.cc). Adding a field is one line here plus its column in results/schema.sql
// and a migration in results/schema.cc (test_store checks that the table's columns are exactly
// this list, in this order). Depends on the standard library only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

// X(name, worker C++ type, store kind). Kinds: Int (SQL INTEGER), Real (SQL REAL; NaN as NULL),
// Bool (0/1), NullableInt (0 on the worker means "unknown": SQL NULL), Text (SQL TEXT; "" on the
// worker means "unknown": SQL NULL). Comments must be /* */:
// a // comment would swallow the line continuation.
#define KVB_MEASUREMENT_FIELDS(X)                                                              \
  X(prompt_tokens, int, Int) /* tokens of the prompt, after truncation */                      \
  X(generated_tokens, int, Int)                                                                \
  X(truncated_tokens, int, Int)  /* removed by middle truncation */                            \
  X(prefill_ms, double, Real)    /* prompt forward, compression included */                    \
  X(ttft_ms, double, Real)       /* prefill + choosing the first token */                      \
  X(decode_ms, double, Real)     /* all decode steps */                                        \
  X(decode_ms_p50, double, Real) /* per decode step */                                         \
  X(decode_ms_p99, double, Real)                                                               \
  X(tokens_per_s, double, Real)  /* generated tokens / decode time */                          \
  X(policy_ms, double, Real)     /* inside policy hooks (eviction/scoring overhead) */         \
  X(kv_bytes_final, size_t, Int) /* logical: retained slots x slot bytes */                    \
  X(kv_bytes_peak, size_t, Int)                                                                \
  X(kv_physical_peak, size_t, Int)   /* allocated */                                           \
  X(policy_state_bytes, size_t, Int) /* at the end */                                          \
  X(occupancy_mean, double, Real)    /* retained tokens per (layer, head), mean over steps */  \
  X(occupancy_final, double, Real)   /* the same after the last step */                        \
  X(occupancy_peak, int, Int)        /* the longest head at any step */                        \
  X(occupancy_min_final, int, Int)                                                             \
  X(occupancy_max_final, int, Int)                                                             \
  X(host_rss_peak, size_t, Int)             /* bytes (VmHWM of the worker process) */          \
  X(device_peak_bytes, size_t, NullableInt) /* GPU allocator high-water mark; 0/NULL on CPU */ \
  X(prefill_shared, bool, Bool)             /* prompt forward shared with other policies */    \
  X(decode_batch, double, Real)       /* sequences per decode step, mean over its steps (1) */ \
  X(prompt_sha256, std::string, Text) /* SHA-256 hex of the prompt's token ids (int32 LE) */   \
  X(prefill_reused, int, Int)         /* prompt tokens an earlier prompt's prefill computed */ \
  X(channel_bytes_pruned, size_t, Int) /* key channels zeroed (think) at the end: not stored */

namespace kvb::measurement {

enum class Kind { Int, Real, Bool, NullableInt, Text };

// How the store (and the wire) holds a field of each kind.
template <Kind K>
struct StoreType;
template <>
struct StoreType<Kind::Int> {
  using type = int64_t;
};
template <>
struct StoreType<Kind::Real> {
  using type = double;
};
template <>
struct StoreType<Kind::Bool> {
  using type = bool;
};
template <>
struct StoreType<Kind::NullableInt> {
  using type = std::optional<int64_t>;
};
template <>
struct StoreType<Kind::Text> {
  using type = std::string;
};

// The worker's value as the store holds it.
template <Kind K, typename T>
typename StoreType<K>::type to_store(T v) {
  if constexpr (K == Kind::NullableInt) {
    return v > 0 ? std::optional<int64_t>(static_cast<int64_t>(v)) : std::nullopt;
  } else if constexpr (K == Kind::Text) {
    return v;
  } else {
    return static_cast<typename StoreType<K>::type>(v);
  }
}

struct Field {
  const char* name;
  Kind kind;
};

// The fields in table order.
inline constexpr Field kFields[] = {
#define KVB_MEASUREMENT_FIELD_INFO(name, ctype, kind) {#name, Kind::kind},
    KVB_MEASUREMENT_FIELDS(KVB_MEASUREMENT_FIELD_INFO)
#undef KVB_MEASUREMENT_FIELD_INFO
};

}  // namespace kvb::measurement
