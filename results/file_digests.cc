// The model digest cache of the results store (results/store.h, schema.sql `file_digests`):
// a model file's SHA-256 kept by (canonical path, size, mtime_ns, inode), so that a resumed sweep
// does not read a multi-gigabyte file again.
#include "results/sqlite_util.h"
#include "results/store.h"

namespace kvb::results {

void Store::record_model_hashes(int64_t run_id,
                                const std::map<std::string, std::string>& hashes) {
  require_writable("record_model_hashes");
  Statement st(*db_, "UPDATE runs SET model_hashes = ?2 WHERE run_id = ?1");
  st.bind_int(1, run_id).bind_text(2, canonical_json(hashes));
  st.run();
  if (db_->changes() != 1) KVB_FAIL() << "no run " << run_id << " in " << path();
}

std::optional<std::string> Store::cached_digest(const FileStamp& stamp) const {
  Statement st(*db_,
               "SELECT sha256 FROM file_digests WHERE path = ?1 AND size = ?2 AND mtime_ns = ?3 "
               "AND inode = ?4");
  st.bind_text(1, stamp.path).bind_int(2, stamp.size).bind_int(3, stamp.mtime_ns);
  st.bind_int(4, stamp.inode);
  if (!st.step()) return std::nullopt;
  return st.column_text(0);
}

void Store::remember_digest(const FileStamp& stamp, const std::string& sha256) {
  require_writable("remember_digest");
  // The table's CHECK refuses anything but 64 lowercase hex digits (and a negative size).
  Statement st(*db_,
               "INSERT INTO file_digests (path, size, mtime_ns, inode, sha256) "
               "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (path) DO UPDATE SET size = ?2, "
               "mtime_ns = ?3, inode = ?4, sha256 = ?5, hashed_at = " KVB_SQL_NOW);
  st.bind_text(1, stamp.path).bind_int(2, stamp.size).bind_int(3, stamp.mtime_ns);
  st.bind_int(4, stamp.inode).bind_text(5, sha256);
  st.run();
}

}  // namespace kvb::results
