// The descriptor-level reads the GGUF and safetensors readers share (kernels/formats/file_io.h):
// exact reads at an offset, and usage errors naming the path and the expected format for a
// missing file or a folder, a runtime error naming the offset when the file ends early. Files
// live in a per-process folder (ctest runs tests in parallel).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "kernels/formats/file_io.h"

namespace kvb::formats {
namespace {

namespace fs = std::filesystem;

std::string scratch() {
  const std::string d = std::string(KVB_BINARY_DIR) + "/test_file_io_" +
                        std::to_string(::getpid()) + "_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::create_directories(d);
  return d;
}

std::string write_file(const std::string& bytes) {
  const std::string path = scratch() + "/ten_bytes.bin";
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path;
}

TEST(FileIo, ReadsExactlyTheBytesAtAnOffset) {
  const std::string path = write_file("0123456789");
  Fd fd;
  EXPECT_EQ(open_regular(path, "GGUF", &fd), 10u);
  ASSERT_GE(fd.fd, 0);
  std::string got(4, '\0');
  pread_fully(fd.fd, path, 3, got.data(), got.size());
  EXPECT_EQ(got, "3456");
  pread_fully(fd.fd, path, 6, got.data(), got.size());  // up to the last byte
  EXPECT_EQ(got, "6789");
  fs::remove_all(fs::path(path).parent_path());
}

TEST(FileIo, ReadPastTheEndNamesTheOffset) {
  const std::string path = write_file("0123456789");
  Fd fd;
  open_regular(path, "GGUF", &fd);
  std::string got(4, '\0');
  try {
    pread_fully(fd.fd, path, 8, got.data(), got.size());
    FAIL() << "a 4-byte read at offset 8 of a 10-byte file succeeded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected end of file at offset 10 (2 more bytes expected"),
              std::string::npos)
        << msg;
  }
  fs::remove_all(fs::path(path).parent_path());
}

TEST(FileIo, MissingFileAndFolderAreUsageErrorsNamingTheFormat) {
  const std::string dir = scratch();
  const std::string missing = dir + "/absent.gguf";
  try {
    Fd fd;
    open_regular(missing, "GGUF", &fd);
    FAIL() << "opened a file that does not exist";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << msg;
    EXPECT_NE(msg.find("cannot open GGUF file '" + missing + "'"), std::string::npos) << msg;
  }
  try {
    Fd fd;
    open_regular(dir, "safetensors", &fd);
    FAIL() << "opened a folder as a file";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << msg;
    EXPECT_NE(msg.find(dir + ": not a regular file (expected a safetensors file)"),
              std::string::npos)
        << msg;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvb::formats
