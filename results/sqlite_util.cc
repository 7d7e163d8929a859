// RAII wrappers over sqlite3 / sqlite3_stmt and the KVB_SQLITE_CHECK error path.
#include "results/sqlite_util.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "results/store.h"

namespace kvb::results {
namespace detail {

void throw_sqlite_error(const char* file, int line, const char* call, const Db& db, int rc,
                        std::string_view sql) {
  // sqlite3_errmsg describes the connection's latest failure; fall back to the code's text when
  // the handle is missing (open failed before allocating one).
  const char* msg = db.get() ? sqlite3_errmsg(db.get()) : sqlite3_errstr(rc);
  const int ext = db.get() ? sqlite3_extended_errcode(db.get()) : rc;
  try {
    ::kvb::detail::ErrorBuilder err(file, line, call, ErrorKind::kRuntime);
    err << msg << " (sqlite code " << ext << ")";
    if (!sql.empty()) err << " in `" << sql << "`";
    err << " [db " << db.path() << "]";
    // ~ErrorBuilder throws at the end of this scope.
  } catch (const Error& e) {
    // Another connection's lock outlasted the busy timeout: a failure worth retrying later.
    if ((ext & 0xff) == SQLITE_BUSY || (ext & 0xff) == SQLITE_LOCKED) throw DatabaseBusy(e.what());
    throw SqliteError(e, msg, std::string(sql), ext);
  }
  std::abort();  // unreachable
}

}  // namespace detail

std::string sqlite_file_uri(const std::string& path, const std::string& query) {
  std::string out = "file:";
  for (unsigned char c : path) {
    if (c == '%' || c == '?' || c == '#' || c < 0x20 || c >= 0x7f) {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return query.empty() ? out : out + "?" + query;
}

Db::Db(std::string path, int flags, const std::string& uri) : path_(std::move(path)) {
  const int rc = sqlite3_open_v2(uri.empty() ? path_.c_str() : uri.c_str(), &db_, flags, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close(db_);
    db_ = nullptr;
    KVB_FAIL() << "cannot open results database " << path_ << ": " << msg;
  }
  sqlite3_extended_result_codes(db_, 1);
}

Db::~Db() {
  // Statements are finalized by their owners first (they never outlive the Store that owns this).
  if (db_) sqlite3_close(db_);
}

void Db::set_time_limit(double seconds) {
  using Clock = std::chrono::steady_clock;
  auto now = [] { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); };
  time_limit_hit_ = false;
  deadline_s_ = seconds > 0 ? now() + seconds : 0;
  if (deadline_s_ == 0) {
    sqlite3_progress_handler(db_, 0, nullptr, nullptr);
    return;
  }
  // Called every 10000 virtual-machine steps (well under a millisecond): nonzero interrupts.
  sqlite3_progress_handler(
      db_, 10000,
      [](void* self) -> int {
        auto* db = static_cast<Db*>(self);
        const double t =
            std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
        if (t < db->deadline_s_) return 0;
        db->time_limit_hit_ = true;
        return 1;
      },
      this);
}

void Db::exec(std::string_view sql) {
  const std::string text(sql);
  KVB_SQLITE_CHECK(*this, sqlite3_exec(db_, text.c_str(), nullptr, nullptr, nullptr), sql);
}

Statement::Statement(const Db& db, std::string_view sql) : db_(&db), sql_(sql) {
  const char* tail = nullptr;
  KVB_SQLITE_CHECK(db, sqlite3_prepare_v2(db.get(), sql_.data(), int(sql_.size()), &stmt_, &tail),
                   sql_);
  std::string_view rest(tail ? tail : "");
  if (rest.find_first_not_of(" \t\r\n;") != std::string_view::npos) {
    sqlite3_finalize(stmt_);
    stmt_ = nullptr;
    KVB_USAGE_FAIL() << "one SQL statement at a time, but `" << sql_ << "` holds more [db "
                     << db.path() << "]";
  }
  KVB_CHECK(stmt_ != nullptr) << "no SQL statement in `" << sql_ << "` [db " << db.path() << "]";
}

Statement::~Statement() {
  if (stmt_) sqlite3_finalize(stmt_);
}

Statement::Statement(Statement&& other) noexcept
    : db_(other.db_), stmt_(other.stmt_), sql_(std::move(other.sql_)) {
  other.stmt_ = nullptr;
}

Statement& Statement::bind_int(int index, int64_t value) {
  KVB_SQLITE_CHECK(*db_, sqlite3_bind_int64(stmt_, index, value), sql_);
  return *this;
}

Statement& Statement::bind_real(int index, double value) {
  if (std::isnan(value)) return bind_null(index);
  KVB_SQLITE_CHECK(*db_, sqlite3_bind_double(stmt_, index, value), sql_);
  return *this;
}

Statement& Statement::bind_text(int index, std::string_view value) {
  // SQLITE_TRANSIENT: SQLite copies the bytes, so temporaries are safe to pass.
  KVB_SQLITE_CHECK(*db_,
                   sqlite3_bind_text64(stmt_, index, value.data() ? value.data() : "", value.size(),
                                       SQLITE_TRANSIENT, SQLITE_UTF8),
                   sql_);
  return *this;
}

Statement& Statement::bind_null(int index) {
  KVB_SQLITE_CHECK(*db_, sqlite3_bind_null(stmt_, index), sql_);
  return *this;
}

Statement& Statement::bind_int(int index, const std::optional<int64_t>& value) {
  return value ? bind_int(index, *value) : bind_null(index);
}

Statement& Statement::bind_real(int index, const std::optional<double>& value) {
  return value ? bind_real(index, *value) : bind_null(index);
}

Statement& Statement::bind_text_or_null(int index, std::string_view value) {
  return value.empty() ? bind_null(index) : bind_text(index, value);
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  // Reported before any reset, while sqlite3_errmsg still describes this failure; the SQL text
  // names the call site.
  detail::throw_sqlite_error(__FILE__, __LINE__, "sqlite3_step", *db_, rc, sql_);
}

void Statement::run() {
  const bool row = step();
  reset();
  KVB_CHECK(!row) << "statement returned a row where none was expected: `" << sql_ << "`";
}

void Statement::reset() {
  sqlite3_reset(stmt_);  // returns the last step's error, already reported by step()
  sqlite3_clear_bindings(stmt_);
}

int Statement::column_count() const { return sqlite3_column_count(stmt_); }

std::string Statement::column_name(int col) const {
  const char* name = sqlite3_column_name(stmt_, col);
  return name ? name : "";
}

int Statement::column_type(int col) const { return sqlite3_column_type(stmt_, col); }

int64_t Statement::column_int(int col) const { return sqlite3_column_int64(stmt_, col); }

double Statement::column_real(int col) const {
  return is_null(col) ? std::nan("") : sqlite3_column_double(stmt_, col);
}

std::string Statement::column_text(int col) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
  return p ? std::string(p, size_t(sqlite3_column_bytes(stmt_, col))) : std::string();
}

std::optional<int64_t> Statement::column_opt_int(int col) const {
  if (is_null(col)) return std::nullopt;
  return column_int(col);
}

std::optional<std::string> Statement::column_opt_text(int col) const {
  if (is_null(col)) return std::nullopt;
  return column_text(col);
}

Transaction::Transaction(Db& db) : db_(db) { db_.exec("BEGIN IMMEDIATE"); }

Transaction::~Transaction() {
  if (!done_) sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);  // best effort
}

void Transaction::commit() {
  db_.exec("COMMIT");
  done_ = true;
}

}  // namespace kvb::results
