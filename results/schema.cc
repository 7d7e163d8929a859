// The results schema embedded in the binary, and the migrations to it (results/schema.h).
// kSchemaSql is results/schema.sql, compiled in by CMakeLists.txt (build/generated/
// named_queries.cc), so the file is the only copy.
#include "results/schema.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "results/sqlite_util.h"

namespace kvb::results {

namespace {

std::vector<std::string> user_tables(const Db& db) {
  Statement st(db,
               "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' "
               "ESCAPE '\\' ORDER BY name");
  std::vector<std::string> names;
  while (st.step()) names.push_back(st.column_text(0));
  return names;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// Version 0 is both "empty file" (build the schema) and "tables but no version": an earlier
// draft of this schema (it has `units`) or some other program's database. Neither can be
// migrated safely, since nothing says what their columns mean.
// Throws the usage error for a version-0 file that holds tables.
[[noreturn]] void refuse_unversioned(const Db& db, const std::vector<std::string>& tables) {
  if (std::find(tables.begin(), tables.end(), "units") != tables.end()) {
    KVB_USAGE_FAIL() << "results database " << db.path()
                     << " has schema version 0 but already holds a `units` table (tables: "
                     << join(tables) << "): it was written by a pre-release draft of kvbench "
                     << "whose schema cannot be migrated. Move it aside or pass another --db, "
                     << "and run the sweep again; the old file still opens with the sqlite3 shell";
  }
  KVB_USAGE_FAIL() << db.path() << " is not a kvbench results database: it holds tables ("
                   << join(tables) << ") but no schema version. Pass another --db";
  std::abort();  // unreachable: the builder above throws
}

void from_version_0(Db& db) {
  const std::vector<std::string> tables = user_tables(db);
  if (tables.empty()) {
    db.exec(kSchemaSql);
    return;
  }
  refuse_unversioned(db, tables);
}

// 1 -> 2: measurements.prefill_shared (existing rows: 0, since nothing recorded it).
void from_version_1(Db& db) {
  db.exec("ALTER TABLE measurements ADD COLUMN prefill_shared INTEGER NOT NULL DEFAULT 0 "
          "CHECK (prefill_shared IN (0, 1))");
}

// 2 -> 3: runs.end_signal (existing runs: NULL, not recorded).
void from_version_2(Db& db) {
  db.exec("ALTER TABLE runs ADD COLUMN end_signal INTEGER "
          "CHECK (end_signal IS NULL OR end_signal >= 0)");
}

// 3 -> 4: the model digest cache, file_digests (empty: the next sweep hashes once and fills it).
void from_version_3(Db& db) {
  db.exec("CREATE TABLE file_digests ("
          "path TEXT NOT NULL PRIMARY KEY, "
          "size INTEGER NOT NULL CHECK (size >= 0), "
          "mtime_ns INTEGER NOT NULL, "
          "inode INTEGER NOT NULL, "
          "sha256 TEXT NOT NULL CHECK (length(sha256) = 64 AND sha256 NOT GLOB '*[^0-9a-f]*'), "
          "hashed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))"
          ") WITHOUT ROWID");
}

// 4 -> 5: measurements.decode_batch (existing units decoded alone: 1).
void from_version_4(Db& db) {
  db.exec("ALTER TABLE measurements ADD COLUMN decode_batch REAL NOT NULL DEFAULT 1 "
          "CHECK (decode_batch >= 0)");
}

// 5 -> 6: measurements.prompt_sha256 (NULL for the units measured before).
void from_version_5(Db& db) {
  db.exec(
      "ALTER TABLE measurements ADD COLUMN prompt_sha256 TEXT CHECK (prompt_sha256 IS NULL OR "
      "(length(prompt_sha256) = 64 AND prompt_sha256 NOT GLOB '*[^0-9a-f]*'))");
}

// 6 -> 7: measurements.prefill_reused (existing units prefilled their own prompts: 0).
void from_version_6(Db& db) {
  db.exec(
      "ALTER TABLE measurements ADD COLUMN prefill_reused INTEGER NOT NULL DEFAULT 0 "
      "CHECK (prefill_reused >= 0)");
}

// The statement of kSchemaSql that begins with `head`, through its closing ");" line (tables)
// or its ';' (indexes).
std::string schema_statement(const std::string& head) {
  const std::string sql = kSchemaSql;
  const size_t at = sql.find(head);
  KVB_ASSERT(at != std::string::npos) << "schema.sql has no `" << head << "`";
  const bool table = head.rfind("CREATE TABLE", 0) == 0;
  const size_t end = table ? sql.find("\n);", at) : sql.find(';', at);
  KVB_ASSERT(end != std::string::npos) << "schema.sql: `" << head << "` does not end";
  return sql.substr(at, end + (table ? 3 : 1) - at);
}

// 7 -> 8: units.sample_sha256 and units.slot_key (NULL: keyed by result schema 1, adopted or
// superseded by the next sweep of their matrix), and status 'superseded'. A CHECK cannot be
// altered, so the table is rebuilt from schema.sql's own statement (SQLite's documented
// procedure: create, copy, drop, rename; foreign keys are off while migrating).
void from_version_7(Db& db) {
  std::string create = schema_statement("CREATE TABLE units (");
  create.replace(0, std::string("CREATE TABLE units (").size(), "CREATE TABLE units_v8 (");
  db.exec(create);
  std::string cols;
  {
    Statement st(db, "SELECT name FROM pragma_table_info('units') ORDER BY cid");
    while (st.step()) cols += (cols.empty() ? "" : ", ") + st.column_text(0);
  }
  db.exec("INSERT INTO units_v8 (" + cols + ") SELECT " + cols + " FROM units");
  db.exec("DROP TABLE units");
  db.exec("ALTER TABLE units_v8 RENAME TO units");
  for (const char* index : {"CREATE INDEX units_by_task_policy_budget", "CREATE INDEX units_by_status",
                            "CREATE INDEX units_by_run", "CREATE INDEX units_by_slot"}) {
    db.exec(schema_statement(index));
  }
}

// 8 -> 9: measurements.channel_bytes_pruned (no earlier unit pruned key channels: 0).
void from_version_8(Db& db) {
  db.exec(
      "ALTER TABLE measurements ADD COLUMN channel_bytes_pruned INTEGER NOT NULL DEFAULT 0 "
      "CHECK (channel_bytes_pruned >= 0)");
}

void set_schema_version(Db& db, int version) {
  // PRAGMA arguments cannot be bound parameters; `version` is our own integer, not input.
  db.exec("PRAGMA user_version = " + std::to_string(version));
}

}  // namespace

const std::vector<Migration>& migrations() {
  static const std::vector<Migration> steps = {
      {0, "create the schema in an empty file; refuse unversioned databases", &from_version_0},
      {1, "add measurements.prefill_shared", &from_version_1},
      {2, "add runs.end_signal", &from_version_2},
      {3, "add the file_digests table (model digest cache)", &from_version_3},
      {4, "add measurements.decode_batch", &from_version_4},
      {5, "add measurements.prompt_sha256", &from_version_5},
      {6, "add measurements.prefill_reused", &from_version_6},
      {7, "add units.sample_sha256, units.slot_key and status superseded (content keys)",
       &from_version_7},
      {8, "add measurements.channel_bytes_pruned", &from_version_8},
  };
  return steps;
}

int schema_version(const Db& db) {
  Statement st(db, "PRAGMA user_version");
  KVB_CHECK(st.step()) << "PRAGMA user_version returned no row [db " << db.path() << "]";
  return int(st.column_int(0));
}

int upgrade_schema(Db& db, bool read_only, const std::vector<Migration>& steps, int target) {
  const int found = schema_version(db);
  if (found == target) return found;
  if (found > target) {
    KVB_USAGE_FAIL() << db.path() << ": database schema version " << found
                     << " is newer than this kvbench (" << target << "); upgrade kvbench";
  }
  if (read_only) {
    if (found == 0) {
      const std::vector<std::string> tables = user_tables(db);
      if (tables.empty()) KVB_USAGE_FAIL() << db.path() << " is empty: not a kvbench results database";
      refuse_unversioned(db, tables);
    }
    KVB_USAGE_FAIL() << db.path() << ": database schema version " << found
                     << " is older than this kvbench (" << target
                     << "); migrate it with `kvbench query --db " << db.path()
                     << " --migrate` (or any read-write open, e.g. `kvbench sweep --resume`)";
  }
  // Table rebuilds must not cascade deletes: foreign keys are off while migrating (they cannot be
  // switched inside a transaction) and each step is checked with foreign_key_check instead.
  db.exec("PRAGMA foreign_keys = OFF");
  int version = found;
  while (version < target) {
    auto step = std::find_if(steps.begin(), steps.end(),
                             [&](const Migration& m) { return m.from_version == version; });
    KVB_ASSERT(step != steps.end()) << "no migration from schema version " << version << " to "
                                    << target << " [db " << db.path() << "]";
    Transaction tx(db);
    step->apply(db);
    Statement fk(db, "PRAGMA foreign_key_check");
    KVB_CHECK(!fk.step()) << "migration from schema version " << version << " ("
                          << step->description << ") left rows that violate foreign keys in "
                          << fk.column_text(0) << " [db " << db.path() << "]";
    const int reached = std::max(schema_version(db), version + 1);
    set_schema_version(db, reached);
    tx.commit();
    version = reached;
  }
  return found;
}

}  // namespace kvb::results
