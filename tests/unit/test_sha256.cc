// SHA-256 against the FIPS 180-2 appendix B vectors, streaming across block boundaries, and
// file hashing (common/sha256.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "common/sha256.h"

namespace kvb {
namespace {

TEST(Sha256, Fips180Vectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, StreamingEqualsOneShot) {
  // Lengths around the 55/56/64-byte padding edges, fed in awkward piece sizes.
  std::string msg;
  for (int i = 0; i < 300; ++i) msg.push_back(char('a' + (i * 7) % 26));
  for (size_t len : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 300}) {
    const std::string part = msg.substr(0, len);
    for (size_t piece : {1, 3, 17, 64, 100}) {
      Sha256 h;
      for (size_t off = 0; off < part.size(); off += piece) {
        h.update(part.substr(off, piece));
      }
      EXPECT_EQ(h.hex_digest(), sha256_hex(part)) << "len " << len << " piece " << piece;
    }
  }
  EXPECT_NE(sha256_hex(msg.substr(0, 55)), sha256_hex(msg.substr(0, 56)));
}

TEST(Sha256, DigestTwiceIsAnError) {
  Sha256 h;
  h.update("abc");
  (void)h.digest();
  EXPECT_THROW((void)h.digest(), Error);
  EXPECT_THROW(h.update("x"), Error);
}

TEST(Sha256, HashesFiles) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(KVB_BINARY_DIR) / "test_sha256";
  fs::create_directories(dir);
  const fs::path file = dir / "million_a.bin";
  {
    std::ofstream out(file, std::ios::binary);
    out << std::string(1000000, 'a');
  }
  EXPECT_EQ(sha256_file(file.string()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  const std::string missing = (dir / "no_such_model.gguf").string();
  try {
    (void)sha256_file(missing);
    FAIL() << "hashing a missing file must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvb
