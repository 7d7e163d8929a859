// The results database layout: its version (PRAGMA user_version), its DDL (results/schema.sql,
// embedded verbatim in results/schema.cc) and the ordered migrations that bring an older database
// up to it (DESIGN.md "Results": schema versioned with user_version and migrations).
#pragma once

#include <vector>

namespace kvb::results {

class Db;

// Layout version of the database file. Distinct from kResultSchemaVersion (store.h), which unit
// keys hash: a layout change migrates the rows that are there; it does not make units run again.
inline constexpr int kSchemaVersion = 9;

// The full DDL of version kSchemaVersion, ending with `PRAGMA user_version = <version>`.
extern const char* const kSchemaSql;

// One step of the upgrade path. apply() brings a database at `from_version` to a later version
// (normally from_version + 1; the step from 0 builds the current schema directly) or throws a
// usage error saying why it cannot. It runs inside one transaction, with foreign keys off (so
// that table rebuilds do not cascade) and a foreign_key_check before commit.
struct Migration {
  int from_version;
  const char* description;
  void (*apply)(Db& db);
};

// The real path, in order. [0]: an empty file gets the schema; a version-0 file that already has
// tables (a pre-release draft, or not ours) is refused with what to do.
const std::vector<Migration>& migrations();

// Reads user_version and, when it is older than `target`, applies `steps` in order (one
// transaction each; a failed step leaves the file at the last completed version). Throws a usage
// error naming the file when the version is newer than `target`, or older on a read-only
// connection. Returns the version the file had. `steps` and `target` are parameters so tests can
// drive the machinery with steps of their own.
int upgrade_schema(Db& db, bool read_only, const std::vector<Migration>& steps = migrations(),
                   int target = kSchemaVersion);

// PRAGMA user_version of the open database.
int schema_version(const Db& db);

}  // namespace kvb::results
