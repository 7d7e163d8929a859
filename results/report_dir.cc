// ReportDir (results/report_dir.h): the report's files with a manifest, no deletion of files it
// did not write, and no writing through symbolic links.
#include "results/report_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace kvb::results {
namespace {
namespace fs = std::filesystem;

bool is_link(const fs::path& p) {
  std::error_code ec;
  return fs::is_symlink(fs::symlink_status(p, ec));
}

// A name the report itself writes: "csv/<name>.csv" or "plots/<name>.svg", <name> without '/'
// and not starting with '.'; anything else in a manifest (edited by hand?) is never deleted.
bool own_name(const std::string& rel) {
  for (const auto& [sub, ext] : {std::pair{"csv/", ".csv"}, std::pair{"plots/", ".svg"},
                                 std::pair{"latex/", ".tex"}}) {
    const std::string s = sub, e = ext;
    if (rel.size() > s.size() + e.size() && rel.compare(0, s.size(), s) == 0 &&
        rel.compare(rel.size() - e.size(), e.size(), e) == 0 &&
        rel.find('/', s.size()) == std::string::npos && rel[s.size()] != '.') {
      return true;
    }
  }
  return false;
}

// Whether a regular file carries `marker` in its first 4 KiB (the report writes it in its first
// line).
bool has_marker(const fs::path& p, const std::string& marker) {
  std::ifstream in(p, std::ios::binary);
  std::string head(4096, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  return head.find(marker) != std::string::npos;
}

}  // namespace

ReportDir::ReportDir(const std::string& dir) : dir_(dir) {
  const fs::path d(dir);
  // A page of the user's own (or one an older kvbench wrote without the marker) is theirs: the
  // report never overwrites it. A link is replaced by write(), its target left alone.
  for (const auto& [name, marker] :
       {std::pair{"index.html", kHtmlMarker}, std::pair{"report.md", kMarkdownMarker}}) {
    std::error_code ec;
    const fs::path p = d / name;
    if (!fs::is_regular_file(fs::symlink_status(p, ec))) continue;
    KVB_USAGE_CHECK(has_marker(p, marker))
        << "refusing to write the report: " << p.string()
        << " exists and kvbench report did not write it (it lacks the marker " << marker
        << "); move it away, or choose another --out";
  }
  for (const char* sub : {"csv", "plots", "latex"}) {
    KVB_USAGE_CHECK(!is_link(d / sub))
        << "refusing to write the report: " << (d / sub).string()
        << " is a symbolic link (the report writes and deletes its own files there); remove the "
           "link or choose another --out";
  }
  KVB_USAGE_CHECK(!is_link(d / kManifest))
      << "refusing to write the report: " << (d / kManifest).string() << " is a symbolic link";
  std::error_code ec;
  fs::create_directories(d / "csv", ec);
  fs::create_directories(d / "plots", ec);
  fs::create_directories(d / "latex", ec);
  KVB_USAGE_CHECK(fs::is_directory(d / "csv") && fs::is_directory(d / "plots") &&
                  fs::is_directory(d / "latex"))
      << "cannot create the report directory " << dir << ": " << ec.message();
  std::ifstream in(d / kManifest);
  for (std::string line; std::getline(in, line);) {
    if (own_name(line)) previous_.insert(line);
  }
}

void ReportDir::write(const std::string& rel, const std::string& text) {
  const fs::path target = fs::path(dir_) / rel;
  // A fresh name (O_EXCL | O_NOFOLLOW: never an existing file or link), then rename(2), which
  // replaces whatever entry has the target's name instead of following it.
  const std::string tmp = target.string() + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  KVB_CHECK(fd >= 0) << "cannot write " << tmp << ": " << std::strerror(errno);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      KVB_FAIL() << "error writing " << tmp << ": " << std::strerror(err);
    }
    done += static_cast<size_t>(n);
  }
  KVB_CHECK(::close(fd) == 0) << "error writing " << tmp << ": " << std::strerror(errno);
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    KVB_FAIL() << "cannot replace " << target.string() << ": " << std::strerror(err);
  }
  written_.insert(rel);
}

void ReportDir::finish() {
  for (const std::string& rel : previous_) {
    if (written_.count(rel)) continue;
    const fs::path p = fs::path(dir_) / rel;
    std::error_code ec;
    if (fs::is_regular_file(fs::symlink_status(p, ec))) fs::remove(p, ec);
  }
  std::ostringstream m;
  for (const std::string& rel : written_) {
    if (own_name(rel)) m << rel << "\n";
  }
  write(kManifest, m.str());
}

}  // namespace kvb::results
