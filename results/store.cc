// The results store (results/store.h): opening and versioning the file, the unit life cycle
// (pending -> running -> ok/error/oom/timeout, crash recovery) and bundle writes. Every value is
// a bound parameter; the only SQL built at run time joins our own column names (measurements).
#include "results/store.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>

#include "common/error.h"
#include "common/escape.h"
#include "common/sha256.h"
#include "results/schema.h"
#include "results/sqlite_util.h"
#include "results/stats.h"

namespace kvb::results {
namespace {

// How long a statement waits for another connection's lock (a reader checkpointing, a second
// process by mistake) before failing with SQLITE_BUSY.
constexpr int kBusyTimeoutMs = 10000;

constexpr const char* kUnitStatusNames[] = {"pending", "running", "ok",      "error",
                                            "oom",     "timeout", "crashed", "superseded"};
constexpr const char* kRunStatusNames[] = {"running", "ok", "error", "interrupted", "crashed"};

// Measurement columns: common/measurement_fields.h, in table order. The INSERT and the SELECT
// are built from that one list, and each field is bound and read by its store type.
std::string measurement_column_list() {
  std::string cols;
  for (const auto& f : measurement::kFields) cols += std::string(cols.empty() ? "" : ", ") + f.name;
  return cols;
}
constexpr int kNumMeasurementColumns = int(std::size(measurement::kFields));

void bind_field(Statement& st, int i, int64_t v) { st.bind_int(i, v); }
void bind_field(Statement& st, int i, double v) { st.bind_real(i, v); }
void bind_field(Statement& st, int i, bool v) { st.bind_int(i, int64_t{v}); }
void bind_field(Statement& st, int i, const std::optional<int64_t>& v) { st.bind_int(i, v); }
void bind_field(Statement& st, int i, const std::string& v) { st.bind_text_or_null(i, v); }
void read_field(const Statement& st, int i, int64_t* v) { *v = st.column_int(i); }
void read_field(const Statement& st, int i, double* v) { *v = st.column_real(i); }
void read_field(const Statement& st, int i, bool* v) { *v = st.column_int(i) != 0; }
void read_field(const Statement& st, int i, std::optional<int64_t>* v) {
  *v = st.column_opt_int(i);
}
void read_field(const Statement& st, int i, std::string* v) {
  *v = st.column_opt_text(i).value_or("");
}

// (Appends rather than `"\"" + ...`: GCC 12 raises a false -Wrestrict on the latter.)
std::string json_string(const std::string& s) {
  std::string out(1, '"');
  out += json_escape(s);
  out += '"';
  return out;
}

std::string json_array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ',';
    out += json_string(items[i]);
  }
  return out + "]";
}

std::optional<int64_t> parse_int(const std::string& s) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::optional<double> parse_real(const std::string& s) {
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty() || !std::isfinite(v)) {
    return std::nullopt;
  }
  return v;
}

std::optional<std::string> field(const std::map<std::string, std::string>& m, const char* key) {
  auto it = m.find(key);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

// The status of a registered unit, or nullopt.
std::optional<std::string> lookup_status(const Db& db, const std::string& key) {
  Statement st(db, "SELECT status FROM units WHERE unit_key = ?1");
  st.bind_text(1, key);
  if (!st.step()) return std::nullopt;
  return st.column_text(0);
}

}  // namespace

const char* to_string(UnitStatus s) { return kUnitStatusNames[int(s)]; }

UnitStatus parse_unit_status(const std::string& s) {
  for (size_t i = 0; i < std::size(kUnitStatusNames); ++i) {
    if (s == kUnitStatusNames[i]) return UnitStatus(i);
  }
  KVB_FAIL() << "unknown unit status '" << s << "'";
}

const char* to_string(RunStatus s) { return kRunStatusNames[int(s)]; }

std::string canonical_json(const std::map<std::string, std::string>& kv) {
  std::string out = "{";
  for (const auto& [k, v] : kv) {
    if (out.size() > 1) out += ',';
    out += json_string(k);
    out += ':';
    out += json_string(v);
  }
  return out + "}";
}

namespace {
// The key text of result schema `version`; `with_sample`: the sample_sha256 line (version 2's
// keys have it, its slots do not).
std::string key_text(const UnitSpec& u, int version, bool with_sample) {
  std::string t = "kvbench unit key, result schema " + std::to_string(version) + "\n";
  auto line = [&](const char* name, const std::string& value) {
    t += std::string(name) + "=" + value + "\n";
  };
  line("model_sha256", json_string(u.model_sha256));
  line("task", json_string(u.task));
  line("task_version", std::to_string(u.task_version));
  line("task_options", canonical_json(u.task_options));
  line("sample_id", json_string(u.sample_id));
  line("policy", json_string(u.policy));
  line("policy_options", canonical_json(u.policy_options));
  line("kv_budget_spec", json_string(u.kv_budget_spec));
  line("question", json_string(u.question));
  line("max_new_tokens", std::to_string(u.max_new_tokens));
  line("seed", std::to_string(u.seed));
  line("generation", canonical_json(u.generation));
  if (with_sample) line("sample_sha256", json_string(u.sample_sha256));
  return t;
}
}  // namespace

std::string unit_key_text(const UnitSpec& u) { return key_text(u, kResultSchemaVersion, true); }

std::string legacy_unit_key(const UnitSpec& u) { return sha256_hex(key_text(u, 1, false)); }

std::string unit_slot_key(const UnitSpec& u) {
  return sha256_hex("slot\n" + key_text(u, kResultSchemaVersion, false));
}

std::string unit_key(const UnitSpec& spec) { return sha256_hex(unit_key_text(spec)); }

// ---- opening ------------------------------------------------------------------------------------

Store::Store(std::unique_ptr<Db> db, Mode mode) : db_(std::move(db)), mode_(mode) {}
Store::Store(Store&&) noexcept = default;
Store& Store::operator=(Store&&) noexcept = default;
Store::~Store() = default;

const std::string& Store::path() const { return db_->path(); }

namespace {
// t_quantile(p, dof): Student's t quantile (results/stats.h), for ad-hoc SQL (the named queries
// show ci95_lo / ci95_hi below). NULL for dof < 1 or p outside (0, 1).
void sql_t_quantile(sqlite3_context* ctx, int argc, sqlite3_value** argv) {
  if (sqlite3_value_type(argv[0]) == SQLITE_NULL || sqlite3_value_type(argv[1]) == SQLITE_NULL) {
    sqlite3_result_null(ctx);
    return;
  }
  const double p = sqlite3_value_double(argv[0]);
  const double dof = sqlite3_value_double(argv[1]);
  if (!(p > 0 && p < 1) || !(dof >= 1)) {
    sqlite3_result_null(ctx);
    return;
  }
  sqlite3_result_double(ctx, student_t_quantile(p, dof));
}
// ci95_lo(x), ci95_hi(x): aggregates, the bounds of score_ci over the group's non-NULL values
// (results/stats.h: Wilson for 0/1 scores, else the percentile bootstrap), so that the named
// queries show the intervals the report and the sweep show. NULL for a group without values.
void ci_step(sqlite3_context* ctx, int, sqlite3_value** argv) {
  if (sqlite3_value_type(argv[0]) == SQLITE_NULL) return;
  auto** values =
      static_cast<std::vector<double>**>(sqlite3_aggregate_context(ctx, sizeof(void*)));
  if (!values) {
    sqlite3_result_error_nomem(ctx);
    return;
  }
  try {
    if (!*values) *values = new std::vector<double>();
    (*values)->push_back(sqlite3_value_double(argv[0]));
  } catch (const std::exception& e) {
    sqlite3_result_error(ctx, e.what(), -1);
  }
}
template <bool kHi>
void ci_final(sqlite3_context* ctx) {
  auto** values = static_cast<std::vector<double>**>(sqlite3_aggregate_context(ctx, 0));
  if (!values || !*values) {
    sqlite3_result_null(ctx);
    return;
  }
  std::unique_ptr<std::vector<double>> owned(*values);
  *values = nullptr;
  try {
    // ci95_lo and ci95_hi of one group finalize one after the other over the same values: the
    // bootstrap runs once for both (the last group's interval is kept per thread).
    thread_local std::vector<double> last_values;
    thread_local MeanCI last_ci;
    if (*owned != last_values || last_values.empty()) {
      last_ci = score_ci(*owned);
      last_values = *owned;
    }
    const MeanCI& c = last_ci;
    sqlite3_result_double(ctx, kHi ? c.hi : c.lo);
  } catch (const std::exception& e) {
    sqlite3_result_error(ctx, e.what(), -1);
  }
}

void register_sql_functions(Db& db) {
  KVB_SQLITE_CHECK(db, sqlite3_create_function(db.get(), "ci95_lo", 1,
                                                SQLITE_UTF8 | SQLITE_DETERMINISTIC, nullptr,
                                                nullptr, &ci_step, &ci_final<false>),
                   "create_function ci95_lo");
  KVB_SQLITE_CHECK(db, sqlite3_create_function(db.get(), "ci95_hi", 1,
                                                SQLITE_UTF8 | SQLITE_DETERMINISTIC, nullptr,
                                                nullptr, &ci_step, &ci_final<true>),
                   "create_function ci95_hi");
  KVB_SQLITE_CHECK(db, sqlite3_create_function(db.get(), "t_quantile", 2,
                                                SQLITE_UTF8 | SQLITE_DETERMINISTIC, nullptr,
                                                &sql_t_quantile, nullptr, nullptr),
                   "create_function t_quantile");
}
}  // namespace

Store Store::open(const std::string& path, Mode mode) {
  const bool read_only = mode == Mode::kReadOnly;
  if (std::error_code ec; read_only && !std::filesystem::exists(path, ec)) {
    KVB_USAGE_FAIL() << "results database " << path << " does not exist";
  }
  auto db = std::make_unique<Db>(
      path, read_only ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE));
  sqlite3_busy_timeout(db->get(), kBusyTimeoutMs);
  // SQLite reads lazily: a file that is not a database shows itself on the first read.
  const char* probe = "SELECT count(*) FROM sqlite_master";
  int rc = sqlite3_exec(db->get(), probe, nullptr, nullptr, nullptr);
  if (read_only && ((rc & 0xff) == SQLITE_READONLY || (rc & 0xff) == SQLITE_CANTOPEN)) {
    // A WAL database whose folder this reader cannot write (no -shm can be made). Without a
    // -wal file no writer is active and every commit is in the main file, so it reads as
    // immutable; with one, immutable would silently miss committed rows.
    std::error_code ec;
    KVB_USAGE_CHECK(std::filesystem::file_size(path + "-wal", ec) == 0 || ec)
        << path << " cannot be read: it is in WAL mode with a " << path
        << "-wal file, and this user cannot create its -shm file in that folder; read it where "
           "you can write the folder, or copy the database with its -wal file";
    db = std::make_unique<Db>(path, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI,
                              sqlite_file_uri(path, "immutable=1"));
    rc = sqlite3_exec(db->get(), probe, nullptr, nullptr, nullptr);
  }
  if ((rc & 0xff) == SQLITE_NOTADB) {
    KVB_USAGE_FAIL() << path << " is not a SQLite database (" << sqlite3_errmsg(db->get())
                     << "); pass another --db";
  }
  KVB_SQLITE_CHECK(*db, rc, probe);
  if (read_only) {
    db->exec("PRAGMA query_only = 1");  // second fence besides SQLITE_OPEN_READONLY
    // Third: no ATTACH, which VACUUM INTO also does, so no statement can create a file.
    sqlite3_set_authorizer(
        db->get(),
        [](void*, int action, const char*, const char*, const char*, const char*) {
          return action == SQLITE_ATTACH || action == SQLITE_DETACH ? SQLITE_DENY : SQLITE_OK;
        },
        nullptr);
  } else {
    Statement wal(*db, "PRAGMA journal_mode = WAL");
    KVB_CHECK(wal.step()) << "PRAGMA journal_mode returned no row [db " << path << "]";
    const std::string journal = wal.column_text(0);
    KVB_CHECK(journal == "wal") << path << ": cannot switch to WAL (journal_mode stays '" << journal
                                << "'); is it on a network file system?";
    // In WAL, NORMAL loses no committed transaction on a process crash (only on power loss).
    db->exec("PRAGMA synchronous = NORMAL");
  }
  upgrade_schema(*db, read_only);
  db->exec("PRAGMA foreign_keys = ON");
  register_sql_functions(*db);
  return Store(std::move(db), mode);
}

void Store::require_writable(const char* what) const {
  if (mode_ == Mode::kReadOnly) {
    KVB_FAIL() << what << ": results database " << path() << " is open read-only";
  }
}

// ---- runs ---------------------------------------------------------------------------------------

int64_t Store::begin_run(const RunInfo& info) {
  require_writable("begin_run");
  KVB_CHECK(info.ranks >= 1) << "a run has at least one rank";
  Statement st(
      *db_,
      "INSERT INTO runs (config_text, config_sha256, git_rev, kvbench_version, host, "
      "ranks, devices, model_hashes, build_info, end_signal) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)");
  st.bind_text(1, info.config_text)
      .bind_text(2, sha256_hex(info.config_text))
      .bind_text(3, info.git_rev)
      .bind_text(4, info.kvbench_version)
      .bind_text(5, info.host)
      .bind_int(6, info.ranks)
      .bind_text(7, info.devices_json)
      .bind_text(8, info.model_hashes_json)
      .bind_text(9, info.build_info_json)
      .bind_int(10, info.records_signals ? std::optional<int64_t>(0) : std::nullopt);
  st.run();
  return sqlite3_last_insert_rowid(db_->get());
}

void Store::record_signal(int64_t run_id, int signal) {
  require_writable("record_signal");
  KVB_CHECK(signal > 0) << "record_signal needs a signal number, got " << signal;
  Statement st(*db_, "UPDATE runs SET end_signal = ?2 WHERE run_id = ?1");
  st.bind_int(1, run_id).bind_int(2, signal);
  st.run();
}

void Store::finish_run(int64_t run_id, RunStatus status) {
  require_writable("finish_run");
  KVB_CHECK(status != RunStatus::kRunning) << "finish_run needs a final status";
  Statement st(*db_,
               "UPDATE runs SET status = ?2, finished_at = " KVB_SQL_NOW " WHERE run_id = ?1");
  st.bind_int(1, run_id).bind_text(2, to_string(status));
  st.run();
  if (db_->changes() != 1) KVB_FAIL() << "no run " << run_id << " in " << path();
}

// ---- units --------------------------------------------------------------------------------------

std::vector<std::string> Store::register_units(int64_t run_id, const std::vector<UnitRow>& rows,
                                              RegisterStats* stats) {
  require_writable("register_units");
  RegisterStats counts;
  Transaction tx(*db_);
  // Re-keying an adopted row moves its results' rows after it: checked at commit.
  db_->exec("PRAGMA defer_foreign_keys = ON");
  // ON CONFLICT (unit_key) DO NOTHING, not INSERT OR IGNORE: the latter would also skip rows
  // that break a CHECK (bad JSON), silently.
  Statement st(*db_,
               "INSERT INTO units (unit_key, run_id, model, model_sha256, task, task_version, "
               "task_options, sample_id, policy, policy_options, kv_budget_spec, kv_budget, "
               "question, max_new_tokens, seed, generation, sample_fields, context_length, depth, "
               "sample_sha256, slot_key) "
               "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, "
               "?17, ?18, ?19, ?20, ?21) ON CONFLICT (unit_key) DO NOTHING");
  // A result-schema-1 row (no sample_sha256) under the legacy key, with what it stored of its
  // sample.
  Statement legacy(*db_,
                   "SELECT u.sample_fields, p.references_json FROM units u LEFT JOIN predictions p "
                   "ON p.unit_key = u.unit_key WHERE u.unit_key = ?1 AND u.sample_sha256 IS NULL");
  Statement adopt(*db_,
                  "UPDATE units SET unit_key = ?2, sample_sha256 = ?3, slot_key = ?4, "
                  "task_options = ?5 WHERE unit_key = ?1");
  std::vector<Statement> move_results;
  for (const char* table : {"metrics", "measurements", "predictions"}) {
    move_results.emplace_back(*db_, std::string("UPDATE ") + table +
                                        " SET unit_key = ?2 WHERE unit_key = ?1");
  }
  Statement retire(*db_, "UPDATE units SET status = 'superseded' WHERE unit_key = ?1");
  Statement restore(*db_,
                    "UPDATE units SET status = CASE WHEN EXISTS (SELECT 1 FROM measurements m "
                    "WHERE m.unit_key = ?1) THEN 'ok' ELSE 'pending' END "
                    "WHERE unit_key = ?1 AND status = 'superseded'");
  Statement supersede(*db_,
                      "UPDATE units SET status = 'superseded' WHERE slot_key = ?1 AND "
                      "unit_key <> ?2 AND status <> 'superseded'");
  // Legacy rows exist only in a database from before content keys: without one, no row pays for
  // the legacy lookups.
  const bool any_legacy = [&] {
    Statement q(*db_, "SELECT 1 FROM units WHERE sample_sha256 IS NULL LIMIT 1");
    return q.step();
  }();
  std::vector<std::string> keys;
  keys.reserve(rows.size());
  for (const UnitRow& row : rows) {
    const UnitSpec& u = row.spec;
    KVB_CHECK(u.seed <= uint64_t(std::numeric_limits<int64_t>::max()))
        << "seed " << u.seed << " does not fit a SQLite integer";
    keys.push_back(unit_key(u));
    const std::string& key = keys.back();
    const std::string slot = row.slot_key.empty() ? unit_slot_key(u) : row.slot_key;
    const std::string shown_task_options =
        canonical_json(row.shown_task_options.value_or(u.task_options));
    if (any_legacy && !row.legacy_key.empty() && row.legacy_key != key &&
        !lookup_status(*db_, key)) {
      legacy.bind_text(1, row.legacy_key);
      if (legacy.step()) {
        const bool same = legacy.column_text(0) == canonical_json(row.sample_fields) &&
                          (legacy.is_null(1) || legacy.column_text(1) == json_array(row.references));
        legacy.reset();
        if (same) {
          adopt.bind_text(1, row.legacy_key)
              .bind_text(2, key)
              .bind_text(3, u.sample_sha256)
              .bind_text(4, slot)
              .bind_text(5, shown_task_options);
          adopt.run();
          for (Statement& m : move_results) m.bind_text(1, row.legacy_key).bind_text(2, key).run();
          ++counts.adopted;
        } else {
          retire.bind_text(1, row.legacy_key).run();
          ++counts.stale;
        }
      } else {
        legacy.reset();
      }
    }
    std::optional<int64_t> context_length;
    if (auto v = field(row.sample_fields, "context_length")) context_length = parse_int(*v);
    std::optional<double> depth;
    if (auto v = field(row.sample_fields, "depth")) depth = parse_real(*v);
    st.bind_text(1, key)
        .bind_int(2, run_id)
        .bind_text(3, row.model)
        .bind_text(4, u.model_sha256)
        .bind_text(5, u.task)
        .bind_int(6, u.task_version)
        .bind_text(7, shown_task_options)
        .bind_text(8, u.sample_id)
        .bind_text(9, u.policy)
        .bind_text(10, canonical_json(row.shown_policy_options.value_or(u.policy_options)))
        .bind_text(11, u.kv_budget_spec)
        .bind_int(12, row.kv_budget)
        .bind_text(13, u.question)
        .bind_int(14, u.max_new_tokens)
        .bind_int(15, int64_t(u.seed))
        .bind_text(16, canonical_json(u.generation))
        .bind_text(17, canonical_json(row.sample_fields))
        .bind_int(18, context_length)
        .bind_real(19, depth)
        .bind_text_or_null(20, u.sample_sha256)
        .bind_text(21, slot);
    st.run();
    restore.bind_text(1, key).run();
    counts.restored += db_->changes();
    supersede.bind_text(1, slot).bind_text(2, key).run();
    counts.superseded += db_->changes();
  }
  tx.commit();
  if (stats) *stats = counts;
  return keys;
}

std::map<std::string, UnitState> Store::unit_status(const std::vector<std::string>& keys) const {
  Statement st(
      *db_, "SELECT status, attempts, crash_count, error, run_id FROM units WHERE unit_key = ?1");
  std::map<std::string, UnitState> out;
  for (const std::string& key : keys) {
    st.bind_text(1, key);
    if (st.step()) {
      UnitState s;
      s.status = parse_unit_status(st.column_text(0));
      s.attempts = int(st.column_int(1));
      s.crash_count = int(st.column_int(2));
      s.error = st.column_text(3);
      s.run_id = st.column_int(4);
      out.emplace(key, std::move(s));
    }
    st.reset();
  }
  return out;
}

std::vector<std::string> Store::unfinished_units(const std::vector<std::string>& keys) const {
  const auto states = unit_status(keys);
  std::vector<std::string> out;
  for (const std::string& key : keys) {
    auto it = states.find(key);
    if (it == states.end()) KVB_FAIL() << "unit " << key << " is not registered in " << path();
    if (it->second.status == UnitStatus::kPending) out.push_back(key);
  }
  return out;
}

void Store::mark_running(int64_t run_id, const std::vector<std::string>& keys, int rank,
                         const std::string& host) {
  require_writable("mark_running");
  Transaction tx(*db_);
  Statement st(*db_,
               "UPDATE units SET status = 'running', attempts = attempts + 1, run_id = ?2, "
               "rank = ?3, host = ?4, started_at = " KVB_SQL_NOW
               ", finished_at = NULL, "
               "error = NULL WHERE unit_key = ?1 AND status = 'pending'");
  for (const std::string& key : keys) {
    st.bind_text(1, key).bind_int(2, run_id).bind_int(3, rank).bind_text(4, host);
    st.run();
    if (db_->changes() != 1) {
      const auto status = lookup_status(*db_, key);
      KVB_FAIL() << "cannot hand unit " << key << " to a worker: "
                 << (status ? "it is " + *status + ", only pending units run" : "not registered")
                 << " [db " << path() << "]";
    }
  }
  tx.commit();
}

Recovery Store::recover_after_crash(int64_t current_run_id) {
  require_writable("recover_after_crash");
  Transaction tx(*db_);
  struct InFlight {
    std::string key;
    int crash_count;
    int64_t run_id;
    bool coordinator_alone;  // the run recorded signals and saw none (end_signal = 0)
    int attempts;
  };
  std::vector<InFlight> in_flight;
  {
    Statement st(*db_,
                 "SELECT u.unit_key, u.crash_count, u.run_id, "
                 "coalesce(r.end_signal = 0 AND r.ranks > 1, 0), u.attempts "
                 "FROM units u LEFT JOIN runs r ON r.run_id = u.run_id "
                 "WHERE u.status = 'running' AND u.run_id <> ?1 ORDER BY u.unit_key");
    st.bind_int(1, current_run_id);
    while (st.step()) {
      in_flight.push_back({st.column_text(0), int(st.column_int(1)), st.column_int(2),
                           st.column_int(3) != 0, int(st.column_int(4))});
    }
  }
  Statement requeue(*db_,
                    "UPDATE units SET status = 'pending', crash_count = ?2 "
                    "WHERE unit_key = ?1");
  Statement give_up(*db_,
                    "UPDATE units SET status = 'crashed', crash_count = ?2, error = ?3, "
                    "finished_at = " KVB_SQL_NOW " WHERE unit_key = ?1");
  Recovery rec;
  for (const InFlight& u : in_flight) {
    if (u.coordinator_alone && u.attempts < kMaxAttempts) {
      requeue.bind_text(1, u.key).bind_int(2, u.crash_count);
      requeue.run();
      rec.released.push_back(u.key);
      continue;
    }
    const int crashes = u.coordinator_alone ? kMaxCrashes : u.crash_count + 1;
    if (crashes >= kMaxCrashes) {
      const std::string why =
          u.coordinator_alone
              ? "handed out " + std::to_string(u.attempts) +
                    " times without a result (the last in run " + std::to_string(u.run_id) +
                    "); skipped from now on (--rerun-status crashed runs it again)"
              : "in flight when " + std::to_string(crashes) + " runs died (the last: run " +
                    std::to_string(u.run_id) +
                    "); skipped from now on (--rerun-status crashed runs it again)";
      give_up.bind_text(1, u.key).bind_int(2, crashes).bind_text(3, why);
      give_up.run();
      rec.crashed.push_back(u.key);
    } else {
      requeue.bind_text(1, u.key).bind_int(2, crashes);
      requeue.run();
      rec.requeued.push_back(u.key);
    }
  }
  Statement runs(*db_,
                 "UPDATE runs SET status = 'crashed' WHERE status = 'running' AND run_id <> ?1");
  runs.bind_int(1, current_run_id);
  runs.run();
  rec.dead_runs = db_->changes();
  tx.commit();
  return rec;
}

void Store::rerun_units(const std::vector<std::string>& keys) {
  require_writable("rerun_units");
  Transaction tx(*db_);
  const char* kDeletes[] = {"DELETE FROM metrics WHERE unit_key = ?1",
                            "DELETE FROM measurements WHERE unit_key = ?1",
                            "DELETE FROM predictions WHERE unit_key = ?1"};
  Statement reset(*db_,
                  "UPDATE units SET status = 'pending', crash_count = 0, error = NULL, "
                  "started_at = NULL, finished_at = NULL, rank = NULL, host = NULL "
                  "WHERE unit_key = ?1");
  for (const std::string& key : keys) {
    const auto status = lookup_status(*db_, key);
    if (!status || *status == "running") {
      KVB_FAIL() << "cannot rerun unit " << key << ": "
                 << (status ? "it is running" : "not registered") << " [db " << path() << "]";
    }
    for (const char* sql : kDeletes) Statement(*db_, sql).bind_text(1, key).run();
    reset.bind_text(1, key);
    reset.run();
  }
  tx.commit();
}

// ---- results ------------------------------------------------------------------------------------

void Store::write_bundle(const std::vector<UnitResult>& results) {
  require_writable("write_bundle");
  Transaction tx(*db_);
  Statement unit(*db_,
                 "UPDATE units SET status = ?2, error = ?3, kv_budget = coalesce(?4, "
                 "kv_budget), finished_at = " KVB_SQL_NOW " WHERE unit_key = ?1");
  Statement del_metrics(*db_, "DELETE FROM metrics WHERE unit_key = ?1");
  Statement add_metric(*db_,
                       "INSERT INTO metrics (unit_key, name, value, higher_is_better) "
                       "VALUES (?1, ?2, ?3, ?4)");
  Statement del_measurements(*db_, "DELETE FROM measurements WHERE unit_key = ?1");
  std::string placeholders = "?1";
  for (int i = 2; i <= kNumMeasurementColumns + 1; ++i) placeholders += ", ?" + std::to_string(i);
  Statement add_measurements(*db_, "INSERT INTO measurements (unit_key, " +
                                       measurement_column_list() + ") VALUES (" + placeholders +
                                       ")");
  Statement del_prediction(*db_, "DELETE FROM predictions WHERE unit_key = ?1");
  Statement add_prediction(*db_,
                           "INSERT INTO predictions (unit_key, prediction, references_json) "
                           "VALUES (?1, ?2, ?3)");
  for (const UnitResult& r : results) {
    if (r.status != UnitStatus::kOk && r.status != UnitStatus::kError &&
        r.status != UnitStatus::kOom && r.status != UnitStatus::kTimeout) {
      KVB_FAIL() << "unit " << r.unit_key << ": a finished unit is ok, error, oom or timeout, not "
                 << to_string(r.status) << "; bundle not written";
    }
    if (r.status != UnitStatus::kOk && r.error.empty()) {
      KVB_FAIL() << "unit " << r.unit_key << " is " << to_string(r.status)
                 << " without an error message; bundle not written";
    }
    unit.bind_text(1, r.unit_key)
        .bind_text(2, to_string(r.status))
        .bind_text_or_null(3, r.error)
        .bind_int(4, r.kv_budget);
    unit.run();
    if (db_->changes() != 1) {
      KVB_FAIL() << "unit " << r.unit_key << " is not registered in " << path()
                 << "; bundle not written";
    }

    del_metrics.bind_text(1, r.unit_key);
    del_metrics.run();
    for (const Metric& m : r.metrics) {
      add_metric.bind_text(1, r.unit_key)
          .bind_text(2, m.name)
          .bind_real(3, m.value)
          .bind_int(4, m.higher_is_better ? 1 : 0);
      add_metric.run();
    }
    del_measurements.bind_text(1, r.unit_key);
    del_measurements.run();
    if (r.measurements) {
      const Measurements& m = *r.measurements;
      int i = 1;
      add_measurements.bind_text(i++, r.unit_key);
#define KVB_BIND_MEASUREMENT(name, ctype, kind) bind_field(add_measurements, i++, m.name);
      KVB_MEASUREMENT_FIELDS(KVB_BIND_MEASUREMENT)
#undef KVB_BIND_MEASUREMENT
      add_measurements.run();
    }
    del_prediction.bind_text(1, r.unit_key);
    del_prediction.run();
    if (r.prediction) {
      add_prediction.bind_text(1, r.unit_key)
          .bind_text(2, r.prediction->text)
          .bind_text(3, json_array(r.prediction->references));
      add_prediction.run();
    }
  }
  tx.commit();
}

std::vector<Metric> Store::metrics(const std::string& key) const {
  Statement st(*db_,
               "SELECT name, value, higher_is_better FROM metrics WHERE unit_key = ?1 "
               "ORDER BY name");
  st.bind_text(1, key);
  std::vector<Metric> out;
  while (st.step()) out.push_back({st.column_text(0), st.column_real(1), st.column_int(2) != 0});
  return out;
}

std::optional<Measurements> Store::measurements(const std::string& key) const {
  Statement st(*db_,
               "SELECT " + measurement_column_list() + " FROM measurements WHERE unit_key = ?1");
  st.bind_text(1, key);
  if (!st.step()) return std::nullopt;
  Measurements m;
  int i = 0;
#define KVB_READ_MEASUREMENT(name, ctype, kind) read_field(st, i++, &m.name);
  KVB_MEASUREMENT_FIELDS(KVB_READ_MEASUREMENT)
#undef KVB_READ_MEASUREMENT
  return m;
}

std::optional<PredictionRow> Store::prediction(const std::string& key) const {
  Statement st(*db_, "SELECT prediction, references_json FROM predictions WHERE unit_key = ?1");
  st.bind_text(1, key);
  if (!st.step()) return std::nullopt;
  PredictionRow p;
  p.text = st.column_text(0);
  // The references come back through SQLite's own JSON reader: no parser of ours to trust.
  Statement refs(*db_, "SELECT value FROM json_each(?1) ORDER BY key");
  refs.bind_text(1, st.column_text(1));
  while (refs.step()) p.references.push_back(refs.column_text(0));
  return p;
}

void Store::set_time_limit(double seconds) { db_->set_time_limit(seconds); }
bool Store::time_limit_hit() const { return db_->time_limit_hit(); }

QueryResult Store::query(const std::string& sql, const std::vector<std::string>& params) const {
  Statement st(*db_, sql);
  for (size_t i = 0; i < params.size(); ++i) st.bind_text(int(i) + 1, params[i]);
  QueryResult out;
  for (int c = 0; c < st.column_count(); ++c) out.columns.push_back(st.column_name(c));
  while (st.step()) {
    std::vector<QueryValue> row;
    for (int c = 0; c < st.column_count(); ++c) {
      QueryValue v;
      switch (st.column_type(c)) {
        case SQLITE_INTEGER:
          v.kind = QueryValue::kInteger;
          break;
        case SQLITE_FLOAT:
          v.kind = QueryValue::kReal;
          break;
        case SQLITE_TEXT:
          v.kind = QueryValue::kText;
          break;
        case SQLITE_BLOB:
          v.kind = QueryValue::kBlob;
          break;
        default:
          v.kind = QueryValue::kNull;
          break;
      }
      if (v.kind != QueryValue::kNull) v.text = st.column_text(c);
      row.push_back(std::move(v));
    }
    out.rows.push_back(std::move(row));
  }
  return out;
}

}  // namespace kvb::results
