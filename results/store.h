// The results store (DESIGN.md "Results", "Work unit and its key", "Faults"): one SQLite file in
// WAL mode that rank 0 alone writes. Units are registered once by content key, handed out
// (`running`), and finished in one transaction per bundle; a sweep that died is recovered on
// resume. results/ depends on common/ only: the structs here are plain copies of what the
// harness gets from workers/ and tasks/.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/measurement_fields.h"

namespace kvb::results {

class Db;

// Version of what a unit's results mean; hashed into every unit key, so bumping it makes every
// unit run again. Bump it when a measurement or the prompt assembly changes meaning, not when
// the database layout changes (that is kSchemaVersion in schema.h, handled by migrations).
// 2: keys hold the sample's content (UnitSpec::sample_sha256) and no file path; 1 held the task's
// file options as absolute paths (legacy_unit_key; register_units adopts such rows).
inline constexpr int kResultSchemaVersion = 2;
// A unit in flight during this many dead runs becomes `crashed`, skipped (DESIGN.md "Faults").
inline constexpr int kMaxCrashes = 2;
// A unit handed out this many times without a result becomes `crashed` even when no crash was
// counted against it (its runs' coordinators died alone): a bound on retries whatever the cause.
inline constexpr int kMaxAttempts = 5;

enum class Mode {
  kReadWrite,  // creates the file if missing; WAL; the sweep's single writer
  kReadOnly,   // SQLITE_OPEN_READONLY + query_only: `kvbench query` / `report`
};

// kSuperseded: a unit whose sample's content changed after it was registered (an edited data
// item): a later unit of the same slot (UnitRow::slot_key) with the new content replaced it. Its
// results stay in the database but no query counts them (they read status 'ok'); registering its
// key again (the edit undone) brings it back.
enum class UnitStatus { kPending, kRunning, kOk, kError, kOom, kTimeout, kCrashed, kSuperseded };
const char* to_string(UnitStatus s);  // the SQL spelling: "pending", "running", ...
UnitStatus parse_unit_status(const std::string& s);

enum class RunStatus { kRunning, kOk, kError, kInterrupted, kCrashed };
const char* to_string(RunStatus s);

// Provenance of one sweep invocation (`runs`). config_sha256 is computed from config_text.
struct RunInfo {
  std::string config_text;
  std::string git_rev;
  std::string kvbench_version;
  std::string host;
  int ranks = 1;
  std::string devices_json = "[]";       // per rank: host, device name, memory
  std::string model_hashes_json = "{}";  // model name -> sha256 of its file
  std::string build_info_json = "{}";    // CUDA / NCCL / MPI versions, build type
  // The coordinator of this run records a termination signal (record_signal) before it dies, so
  // that a run left `running` without one died with its coordinator alone (runs.end_signal = 0
  // instead of NULL). Only for multi-rank runs, whose coordinator runs no units.
  bool records_signals = false;
};

// The fields that identify a unit; its key hashes exactly these plus kResultSchemaVersion.
// Option maps are stored and hashed as canonical JSON (sorted keys, string values).
struct UnitSpec {
  std::string model_sha256;
  std::string task;
  int task_version = 0;
  std::map<std::string, std::string> task_options;
  std::string sample_id;
  std::string policy;
  std::map<std::string, std::string> policy_options;
  // As configured: "256", "0.1 ratio" (fraction kept), "0.25 compression_ratio" (kvpress's
  // fraction removed), "" (no budget).
  std::string kv_budget_spec;
  std::string question = "in_prompt";  // question placement: in_prompt | after_compression
  int max_new_tokens = 0;
  uint64_t seed = 0;                              // at most INT64_MAX (SQLite integers are signed)
  std::map<std::string, std::string> generation;  // sampling settings
  // tasks::sample_sha256 of the unit's sample: the files the task read enter the key through the
  // content they gave this sample, never through their paths (task_options holds no path).
  std::string sample_sha256;
};

// The canonical text a unit key hashes: one `name=value` line per field, strings JSON-quoted.
std::string unit_key_text(const UnitSpec& spec);
// Lowercase hex SHA-256 of unit_key_text(spec).
std::string unit_key(const UnitSpec& spec);
// The key result schema 1 gave the unit (kvbench before content keys): `spec` as that version
// filled it (task_options with the file options' absolute paths; sample_sha256 is not read).
std::string legacy_unit_key(const UnitSpec& spec);
// The default slot of a unit (UnitRow::slot_key): its key without the sample's content.
std::string unit_slot_key(const UnitSpec& spec);
// {"a":"1","b":"x"}: keys in byte order, values JSON-escaped strings, no whitespace.
std::string canonical_json(const std::map<std::string, std::string>& kv);

// What register_units stores for a unit beyond its key fields.
struct UnitRow {
  UnitSpec spec;
  std::string model;                 // the model's name in the config (not hashed)
  std::optional<int64_t> kv_budget;  // tokens, when known before running (not a ratio)
  // tasks::Sample::fields. Also fills the typed columns context_length (integer) and depth
  // (number) when those fields are present and parse completely.
  std::map<std::string, std::string> sample_fields;
  // The policy options the units table shows where they differ from the hashed ones
  // (spec.policy_options): a Python policy's script path, whose content the key hashes instead
  // (harness/policy_files.h). Unset: spec.policy_options.
  std::optional<std::map<std::string, std::string>> shown_policy_options;
  // The same for task options: the file options' paths, which the key leaves out. Unset:
  // spec.task_options.
  std::optional<std::map<std::string, std::string>> shown_task_options;
  // What makes a unit the same unit with other content: a unit registered in the same slot under
  // another key supersedes the older one (UnitStatus::kSuperseded). The sweep's slot names the
  // task's files by their paths relative to the config (harness/sweep_plan.cc). Empty:
  // unit_slot_key(spec).
  std::string slot_key;
  // The unit's key under result schema 1 and what that version stored of its sample: a row of an
  // older database registered under that key is adopted (re-keyed, its results kept) when its
  // sample fields and references equal these; otherwise it is superseded and the unit runs.
  std::string legacy_key;
  std::vector<std::string> references;
};

// What register_units did besides inserting new rows.
struct RegisterStats {
  int adopted = 0;     // result-schema-1 rows re-keyed to content keys, their results kept
  int stale = 0;       // result-schema-1 rows whose sample changed: superseded, the unit runs
  int superseded = 0;  // rows whose slot has a unit with other content now
  int restored = 0;    // superseded rows registered again (their content is back)
};

struct UnitState {
  UnitStatus status = UnitStatus::kPending;
  int attempts = 0;
  int crash_count = 0;
  std::string error;
  int64_t run_id = 0;
};

struct Metric {
  std::string name;
  double value = 0;  // NaN is stored as NULL and read back as NaN
  bool higher_is_better = true;
};

// workers::UnitMeasurements as stored: one member per line of common/measurement_fields.h, of
// the store type of its kind (int64_t, double, bool; std::optional<int64_t> for
// device_peak_bytes, unknown on the CPU).
struct Measurements {
#define KVB_STORE_MEASUREMENT_FIELD(name, ctype, kind) \
  measurement::StoreType<measurement::Kind::kind>::type name{};
  KVB_MEASUREMENT_FIELDS(KVB_STORE_MEASUREMENT_FIELD)
#undef KVB_STORE_MEASUREMENT_FIELD
  bool operator==(const Measurements&) const = default;
};

struct PredictionRow {
  std::string text;
  std::vector<std::string> references;
  bool operator==(const PredictionRow&) const = default;
};

// One finished unit as the coordinator received it.
struct UnitResult {
  std::string unit_key;
  UnitStatus status = UnitStatus::kOk;  // kOk, kError, kOom or kTimeout
  std::string error;                    // required unless kOk
  std::optional<int64_t> kv_budget;     // the resolved budget (ratio budgets); kept when unset
  std::vector<Metric> metrics;
  std::optional<Measurements> measurements;
  std::optional<PredictionRow> prediction;
};

// What recover_after_crash did, for the log.
struct Recovery {
  std::vector<std::string> requeued;  // back to pending
  std::vector<std::string> crashed;   // reached kMaxCrashes: skipped from now on
  // In flight when only the coordinator died (runs.end_signal = 0): back to pending, no crash
  // counted, since their workers were healthy.
  std::vector<std::string> released;
  int dead_runs = 0;                  // runs left `running` that were marked `crashed`
};

// What says a file is unchanged since it was hashed (file_digests): its canonical path, size,
// modification time and inode (stat(2)).
struct FileStamp {
  std::string path;  // canonical
  int64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t inode = 0;  // st_ino's bits as a signed integer (SQLite integers are signed)
  bool operator==(const FileStamp&) const = default;
};

// An ad-hoc query's answer; values as SQLite renders them as text, with their storage class.
struct QueryValue {
  enum Kind { kNull, kInteger, kReal, kText, kBlob } kind = kNull;
  std::string text;
};
struct QueryResult {
  std::vector<std::string> columns;
  std::vector<std::vector<QueryValue>> rows;
};

// Thrown by a Store method when another connection held the database's lock for longer than the
// busy timeout (SQLITE_BUSY / SQLITE_LOCKED: a second writer, a long reader checkpoint). Like
// every Store error, nothing of that call was kept; unlike the others, trying again later may
// succeed (the sweep's coordinator does, keeping finished results in memory meanwhile).
class DatabaseBusy : public Error {
 public:
  using Error::Error;
};

// Not thread-safe; one writer process per file (rank 0), any number of read-only readers.
// Every method throws kvb::Error naming the database file; a method that writes does so in one
// transaction, so on error nothing of that call is kept.
class Store {
 public:
  // Opens (kReadWrite: creates) the file, sets WAL, busy_timeout and foreign keys, and brings the
  // schema to kSchemaVersion (schema.h). Usage errors name the file: not a SQLite database,
  // schema newer than this kvbench, an unversioned (draft) database, older and read-only.
  // kReadOnly: ATTACH (and so VACUUM INTO) is denied; a WAL database in a folder the reader
  // cannot write opens as immutable when it has no -wal file, else is a usage error.
  static Store open(const std::string& path, Mode mode);
  Store(Store&&) noexcept;
  Store& operator=(Store&&) noexcept;
  ~Store();

  const std::string& path() const;
  Mode mode() const { return mode_; }

  int64_t begin_run(const RunInfo& info);
  // The coordinator received `signal` and is about to die (one UPDATE, quick: mpirun's SIGKILL
  // follows its SIGTERM closely).
  void record_signal(int64_t run_id, int signal);
  void finish_run(int64_t run_id, RunStatus status);

  // Inserts the units whose key is new as `pending` under run_id; existing units (whatever their
  // status) are left alone, so registering a matrix twice never duplicates. In the same
  // transaction, per row: a result-schema-1 row under its legacy_key is adopted or superseded
  // (UnitRow::legacy_key), a superseded row under its key is restored (`ok` when its results are
  // there, else `pending`), and every other row of its slot is superseded. Returns the keys in
  // row order; `stats` (optional) counts what happened.
  std::vector<std::string> register_units(int64_t run_id, const std::vector<UnitRow>& rows,
                                          RegisterStats* stats = nullptr);
  // The keys (in the given order) still to run: status `pending`. Throws on an unregistered key.
  std::vector<std::string> unfinished_units(const std::vector<std::string>& keys) const;
  // States of the registered keys among `keys` (unregistered ones are absent).
  std::map<std::string, UnitState> unit_status(const std::vector<std::string>& keys) const;

  // pending -> running for a unit handed to a worker: attempts += 1, records run, rank, host and
  // started_at. Throws (and changes nothing) when any key is not `pending`.
  void mark_running(int64_t run_id, const std::vector<std::string>& keys, int rank,
                    const std::string& host);
  // On resume, before scheduling: every unit still `running` under a run other than
  // current_run_id was in flight when that run died. crash_count += 1, and it goes back to
  // `pending`, or to `crashed` once crash_count reaches kMaxCrashes — except where that run's
  // coordinator died alone (runs.end_signal = 0: it recorded signals and saw none): its units go
  // back to `pending` uncounted (Recovery::released), unless handed out kMaxAttempts times.
  // Those runs become `crashed`.
  Recovery recover_after_crash(int64_t current_run_id);
  // `--rerun`: finished or crashed units go back to `pending`, their results deleted and
  // crash_count cleared. Throws on a unit that is `running` or not registered.
  void rerun_units(const std::vector<std::string>& keys);

  // runs.model_hashes of run_id: model name -> SHA-256 of its file, as canonical JSON (known only
  // after the plan is expanded, so after begin_run).
  void record_model_hashes(int64_t run_id, const std::map<std::string, std::string>& hashes);
  // The model digest cache (file_digests, results/file_digests.cc): the SHA-256 stored for
  // stamp.path when its size, mtime_ns and inode all equal the stamp's, else nothing.
  std::optional<std::string> cached_digest(const FileStamp& stamp) const;
  // Stores (replaces) stamp.path's digest; sha256 must be 64 lowercase hex digits.
  void remember_digest(const FileStamp& stamp, const std::string& sha256);

  // One transaction for the whole bundle: each unit's status, error, resolved budget, metrics,
  // measurements and prediction (replacing any earlier ones). All or nothing.
  void write_bundle(const std::vector<UnitResult>& results);

  // Readers (tests, report).
  std::vector<Metric> metrics(const std::string& key) const;  // by name
  std::optional<Measurements> measurements(const std::string& key) const;
  std::optional<PredictionRow> prediction(const std::string& key) const;
  // One SQL statement with text parameters bound to ?1, ?2, ... (`kvbench query`). On a
  // read-only store, any statement that writes fails.
  QueryResult query(const std::string& sql, const std::vector<std::string>& params = {}) const;
  // Interrupts statements still running `seconds` from now (0: no limit) with an error, after
  // which time_limit_hit() is true (`kvbench query --timeout-s`).
  void set_time_limit(double seconds);
  bool time_limit_hit() const;

 private:
  Store(std::unique_ptr<Db> db, Mode mode);
  void require_writable(const char* what) const;

  std::unique_ptr<Db> db_;
  Mode mode_;
};

}  // namespace kvb::results
