// Thin RAII over the SQLite C API for results/ only: a connection (Db), a prepared statement
// (Statement), a transaction (Transaction) and the one check macro, KVB_SQLITE_CHECK, whose
// errors name the call, SQLite's message, the SQL and the database file (STYLE.md "Errors").
// Values reach SQL only through bound parameters; SQL text is always a constant of our own
// (or, for `kvbench query`, the user's own statement).
// A file name as a SQLite URI ("file:/a%3Fb.db?immutable=1" for "/a?b.db"): '%', '?' and '#' in
// the path are percent-encoded (sqlite.org/uri.html).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"

// The current time in the schema's convention (ISO-8601 UTC, milliseconds), as SQL.
#define KVB_SQL_NOW "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"

namespace kvb::results {

class Db;

std::string sqlite_file_uri(const std::string& path, const std::string& query);

// A failed SQLite call: what() as below, plus SQLite's own message and the statement, so that a
// command can show a user exactly those (`kvbench query`).
class SqliteError : public Error {
 public:
  SqliteError(const Error& e, std::string sqlite_message, std::string sql, int code)
      : Error(e.what(), e.kind(), e.origin()),
        sqlite_message_(std::move(sqlite_message)),
        sql_(std::move(sql)),
        code_(code) {}
  const std::string& sqlite_message() const { return sqlite_message_; }  // "no such table: x"
  const std::string& sql() const { return sql_; }                        // may be empty
  int code() const { return code_; }                                     // extended result code

 private:
  std::string sqlite_message_, sql_;
  int code_;
};

namespace detail {
// Throws SqliteError (DatabaseBusy when the database stayed locked): "<file>:<line> <call>: <sqlite message> (<code name>) in `<sql>` [db <path>]".
[[noreturn]] void throw_sqlite_error(const char* file, int line, const char* call, const Db& db,
                                     int rc, std::string_view sql);
inline bool sqlite_ok(int rc) { return rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE; }
}  // namespace detail

// KVB_SQLITE_CHECK(db, sqlite3_xxx(...), sql): throws unless the call returned OK, ROW or DONE.
#define KVB_SQLITE_CHECK(db, call, sql)                                                           \
  do {                                                                                            \
    const int kvb_sqlite_rc_ = (call);                                                            \
    if (!::kvb::results::detail::sqlite_ok(kvb_sqlite_rc_))                                       \
      ::kvb::results::detail::throw_sqlite_error(__FILE__, __LINE__, #call, (db), kvb_sqlite_rc_, \
                                                 (sql));                                          \
  } while (0)

// One connection. Not thread-safe: one thread uses a Db at a time (rank 0's writer thread, or
// a `kvbench query` process).
class Db {
 public:
  // flags: SQLITE_OPEN_* (sqlite3_open_v2). Throws naming the path when the file cannot be opened.
  // `uri` (with SQLITE_OPEN_URI in flags), when given, is what is opened instead ("file:...?
  // immutable=1"); messages still name `path`.
  Db(std::string path, int flags, const std::string& uri = "");
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  sqlite3* get() const { return db_; }
  const std::string& path() const { return path_; }
  // Runs constant SQL of our own that may hold several statements (DDL, PRAGMAs). Never pass
  // text that contains values: bind them through Statement instead.
  void exec(std::string_view sql);
  int changes() const { return sqlite3_changes(db_); }
  // Interrupts any statement still running `seconds` from now (0: no limit): it fails with
  // SQLITE_INTERRUPT and time_limit_hit() turns true (`kvbench query --timeout-s`).
  void set_time_limit(double seconds);
  bool time_limit_hit() const { return time_limit_hit_; }

 private:
  std::string path_;
  sqlite3* db_ = nullptr;
  double deadline_s_ = 0;  // steady-clock seconds; 0: none
  bool time_limit_hit_ = false;
};

// One prepared statement; parameters are 1-based as in SQLite. step() returns true while there is
// a row; reset() makes it reusable (bindings cleared) for the next row of a batch.
class Statement {
 public:
  // Throws when the SQL does not compile or holds more than one statement.
  Statement(const Db& db, std::string_view sql);
  ~Statement();
  Statement(Statement&& other) noexcept;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  Statement& operator=(Statement&&) = delete;

  Statement& bind_int(int index, int64_t value);
  Statement& bind_real(int index, double value);  // NaN is stored as NULL (SQLite has no NaN)
  Statement& bind_text(int index, std::string_view value);
  Statement& bind_null(int index);
  Statement& bind_int(int index, const std::optional<int64_t>& value);
  Statement& bind_real(int index, const std::optional<double>& value);
  Statement& bind_text_or_null(int index, std::string_view value);  // "" -> NULL

  bool step();
  void run();    // step() expecting no row, then reset()
  void reset();  // sqlite3_reset + sqlite3_clear_bindings

  int column_count() const;
  std::string column_name(int col) const;
  int column_type(
      int col) const;  // SQLITE_INTEGER, SQLITE_FLOAT, SQLITE_TEXT, SQLITE_BLOB, SQLITE_NULL
  bool is_null(int col) const { return column_type(col) == SQLITE_NULL; }
  int64_t column_int(int col) const;
  double column_real(int col) const;  // NULL reads as NaN
  std::string column_text(int col) const;
  std::optional<int64_t> column_opt_int(int col) const;
  std::optional<std::string> column_opt_text(int col) const;

  const std::string& sql() const { return sql_; }

 private:
  const Db* db_;
  sqlite3_stmt* stmt_ = nullptr;
  std::string sql_;
};

// BEGIN IMMEDIATE on construction (takes the write lock up front, so a busy database waits in
// busy_timeout here rather than failing mid-transaction); ROLLBACK in the destructor unless
// commit() ran. Not nestable.
class Transaction {
 public:
  explicit Transaction(Db& db);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit();

 private:
  Db& db_;
  bool done_ = false;
};

}  // namespace kvb::results
