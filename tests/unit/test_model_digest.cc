// The model digest cache at sweep start (harness/model_digest.h): an unchanged file's SHA-256
// comes from the database without reading the file; a changed size, modification time or inode
// (a file replaced by rename) hashes it again. "Hashed or not" is the returned flag, and each
// answer is checked against sha256_file of the file as it is.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "common/sha256.h"
#include "harness/model_digest.h"
#include "results/store.h"

namespace kvb::harness {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::path(KVB_BINARY_DIR) / "test_model_digest" / info->name();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(ModelDigest, UnchangedFileIsCachedChangedFileIsHashedAgain) {
  const fs::path dir = fresh_dir();
  const fs::path model = dir / "m.gguf";
  write(model, "weights v1");
  results::Store store = results::Store::open((dir / "r.db").string(), results::Mode::kReadWrite);

  ModelDigest d = model_file_sha256(store, model.string());
  EXPECT_FALSE(d.cached);
  EXPECT_EQ(d.sha256, sha256_file(model.string()));
  EXPECT_EQ(d.sha256, sha256_hex("weights v1"));
  d = model_file_sha256(store, model.string());  // a resume: nothing changed
  EXPECT_TRUE(d.cached);
  EXPECT_EQ(d.sha256, sha256_hex("weights v1"));

  // Same bytes, a new modification time: hashed again (and the same digest).
  fs::last_write_time(model, fs::last_write_time(model) + std::chrono::seconds(5));
  d = model_file_sha256(store, model.string());
  EXPECT_FALSE(d.cached);
  EXPECT_EQ(d.sha256, sha256_hex("weights v1"));
  EXPECT_TRUE(model_file_sha256(store, model.string()).cached);

  // New contents of another size, the old modification time put back: the size gives it away.
  const auto mtime = fs::last_write_time(model);
  write(model, "weights v2, longer");
  fs::last_write_time(model, mtime);
  d = model_file_sha256(store, model.string());
  EXPECT_FALSE(d.cached);
  EXPECT_EQ(d.sha256, sha256_hex("weights v2, longer"));

  // Replaced by rename with a file of the same size and modification time: a new inode.
  const fs::path next = dir / "next.gguf";
  write(next, "weights v3, longer");
  fs::last_write_time(next, mtime);
  EXPECT_TRUE(model_file_sha256(store, model.string()).cached);
  fs::rename(next, model);
  d = model_file_sha256(store, model.string());
  EXPECT_FALSE(d.cached);
  EXPECT_EQ(d.sha256, sha256_hex("weights v3, longer"));

  // A symbolic link to it names the same canonical file: cached.
  fs::create_symlink(model, dir / "link.gguf");
  d = model_file_sha256(store, (dir / "link.gguf").string());
  EXPECT_TRUE(d.cached);
  EXPECT_EQ(d.sha256, sha256_hex("weights v3, longer"));
}

// The cache lives in the database: a second store (another sweep start) reads it.
TEST(ModelDigest, CacheOutlivesTheConnection) {
  const fs::path dir = fresh_dir();
  const fs::path model = dir / "m.bin";
  write(model, std::string(100000, 'x'));
  const std::string db = (dir / "r.db").string();
  {
    results::Store store = results::Store::open(db, results::Mode::kReadWrite);
    EXPECT_FALSE(model_file_sha256(store, model.string()).cached);
  }
  results::Store store = results::Store::open(db, results::Mode::kReadWrite);
  const ModelDigest d = model_file_sha256(store, model.string());
  EXPECT_TRUE(d.cached);
  EXPECT_EQ(d.sha256, sha256_hex(std::string(100000, 'x')));
}

TEST(ModelDigest, MissingFileIsAnErrorNamingIt) {
  const fs::path dir = fresh_dir();
  results::Store store = results::Store::open((dir / "r.db").string(), results::Mode::kReadWrite);
  try {
    (void)model_file_sha256(store, (dir / "gone.gguf").string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gone.gguf"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvb::harness
