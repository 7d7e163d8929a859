// The validated JSON-lines reader: bounded block reads (a hostile file cannot make us buffer an
// unbounded line), one nlohmann parse per line, typed accessors with file/line/key errors.
#include "tasks/jsonl.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "common/error.h"
#include "common/file_io.h"
#include "common/escape.h"

namespace kvb::tasks {

namespace {

const char* type_name(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "a list";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "an integer";
    case nlohmann::json::value_t::number_float:
      return "a number";
    default:
      return "an unsupported value";
  }
}

[[noreturn]] void missing_file(const std::string& path, const std::string& option,
                               const std::string& how_to_obtain) {
  KVB_USAGE_FAIL() << "cannot open data file '" << path << "'"
                   << (option.empty() ? "" : " (task option " + option + ")")
                   << (how_to_obtain.empty() ? "" : "; " + how_to_obtain);
}

// Data files may be pipes (a shell's <(zcat data.gz), read below without waiting for a writer);
// anything else that is not a regular file is refused before the open, naming the path and the
// task option: a device (/dev/zero) would never end, a directory or a socket cannot be read.
void require_file_or_pipe(const std::string& path, const std::string& option) {
  std::error_code ec;
  if (std::filesystem::status(path, ec).type() == std::filesystem::file_type::fifo) return;
  require_regular_file(path, "data file",
                       std::string("give a file") +
                           (option.empty() ? "" : " as task option " + option) +
                           " (or a pipe, e.g. <(zcat data.jsonl.gz))");
}

// open(2) for reading that does not wait for a FIFO's writer: a FIFO with none then reads as
// empty, while a pipe with one (a shell's <(zcat data.gz)) reads as usual once blocking is
// restored. -1 on failure, errno set.
int open_without_waiting(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return -1;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string human_bytes(size_t n) {
  if (n >= (size_t{1} << 20)) return std::to_string(n >> 20) + " MiB";
  return std::to_string(n) + " bytes";
}

// The offset of the first byte that is not well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or npos.
size_t first_invalid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (b < 0x80)
      n = 1;
    else if (b >= 0xC2 && b <= 0xDF)
      n = 2;
    else if (b >= 0xE0 && b <= 0xEF)
      n = 3, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4)
      n = 4, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    else
      return i;
    if (i + n > s.size()) return i;
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (c < lo || c > hi) : (c & 0xC0) != 0x80) return i;
    }
    i += n;
  }
  return std::string::npos;
}

// The top-level key of a JSON object line whose value holds byte `pos` ("" if none): a scan of
// strings and nesting, enough to name the field of a bad byte without a full parse.
std::string key_at(const std::string& s, size_t pos) {
  int depth = 0;
  std::string key, last_string;
  bool expect_key = false;
  for (size_t i = 0; i < s.size() && i < pos; ++i) {
    const char c = s[i];
    if (c == '"') {
      const size_t start = ++i;
      while (i < s.size() && s[i] != '"') i += s[i] == '\\' ? 2 : 1;
      if (i >= pos) break;  // the byte is inside this string
      last_string = s.substr(start, i - start);
    } else if (c == '{' || c == '[') {
      if (++depth == 1) expect_key = true;
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == ':' && depth == 1 && expect_key) {
      key = last_string;
      expect_key = false;
    } else if (c == ',' && depth == 1) {
      expect_key = true;
    }
  }
  return key;
}

}  // namespace

void UniqueSampleIds::add(const std::string& id, const JsonlItem& item) {
  const auto [it, inserted] = line_of_.emplace(id, item.line());
  if (inserted) return;
  // Shown escaped (ids come from the data) and cut: an id may be megabytes long.
  item.fail("sample id \"" + json_escape(cut_chars(id, 200)) + "\" (" + source_ +
            ") repeats the id of line " + std::to_string(it->second) +
            "; sample ids key the results, so each must name one sample: remove the repeated "
            "item or give it an id of its own");
}

bool JsonlItem::has(const std::string& key) const {
  auto it = value_.find(key);
  return it != value_.end() && !it->is_null();
}

void JsonlItem::fail(const std::string& what) const {
  KVB_USAGE_FAIL() << *file_ << ":" << line_ << ": " << what;
}

const nlohmann::json& JsonlItem::at(const std::string& key, const char* expected) const {
  auto it = value_.find(key);
  if (it == value_.end() || it->is_null()) {
    fail("required key '" + key + "' (" + expected + ") is missing");
  }
  return *it;
}

std::string JsonlItem::str(const std::string& key) const {
  const nlohmann::json& v = at(key, "a string");
  if (!v.is_string()) fail("key '" + key + "' must be a string, not " + type_name(v));
  return v.get<std::string>();
}

std::string JsonlItem::str_or(const std::string& key, const std::string& def) const {
  return has(key) ? str(key) : def;
}

int64_t JsonlItem::integer(const std::string& key) const {
  const nlohmann::json& v = at(key, "an integer");
  // is_number_integer() is true for unsigned numbers too, and get<int64_t>() wraps those above
  // INT64_MAX (18446744073709551615 read as -1): unsigned first.
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(INT64_MAX)) return static_cast<int64_t>(u);
    fail("key '" + key + "' is " + v.dump() + ", above the largest integer allowed (" +
         std::to_string(INT64_MAX) + ")");
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  // 3.0 is an integer for JSON writers that emit floats (pandas); 3.5 is not.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d == static_cast<double>(static_cast<int64_t>(d)) && d > -9.2e18 && d < 9.2e18) {
      return static_cast<int64_t>(d);
    }
  }
  fail("key '" + key + "' must be an integer, not " + (v.is_number() ? v.dump() : type_name(v)));
}

std::optional<int64_t> JsonlItem::integer_opt(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return integer(key);
}

std::vector<std::string> JsonlItem::str_list(const std::string& key) const {
  const nlohmann::json& v = at(key, "a list of strings");
  if (!v.is_array()) fail("key '" + key + "' must be a list of strings, not " + type_name(v));
  std::vector<std::string> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) {
      fail("key '" + key + "' must be a list of strings; element " + std::to_string(i) + " is " +
           type_name(v[i]));
    }
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

std::optional<std::vector<std::string>> JsonlItem::str_list_opt(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return str_list(key);
}

JsonlFile read_jsonl(const std::string& path, const JsonlReadOptions& options) {
  // zlib reads a gzip file through its inflater and any other file as it is.
  gzFile in = nullptr;
  require_file_or_pipe(path, options.option);
  if (!path.empty()) {
    const int fd = open_without_waiting(path);  // a FIFO without a writer reads as empty
    if (fd >= 0 && !(in = gzdopen(fd, "rb"))) ::close(fd);
  }
  if (!in) missing_file(path, options.option, options.how_to_obtain);
  const std::unique_ptr<gzFile_s, int (*)(gzFile)> closer(in, gzclose);
  JsonlFile file;
  file.path = path;
  auto name = std::make_shared<const std::string>(path);

  std::string line;
  size_t line_no = 0, total = 0;
  // Parses one complete line (without its '\n'); returns false once `limit` items are read.
  auto take = [&](std::string& text) {
    ++line_no;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (line_no == 1 && text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);
    if (text.find_first_not_of(" \t\r") == std::string::npos) return true;  // blank line
    KVB_USAGE_CHECK(file.items.size() < options.max_items)
        << path << ":" << line_no << ": more than " << options.max_items
        << " items; the reader's limit (is this the right file?)";
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      const size_t bad = first_invalid_utf8(text);
      if (bad != std::string::npos) {
        const std::string key = key_at(text, bad);
        KVB_USAGE_FAIL() << path << ":" << line_no << ": not valid JSON: invalid UTF-8 at byte "
                         << bad + 1 << " of the line"
                         << (key.empty() ? "" : ", in the value of key '" + key + "'")
                         << " (the file must be UTF-8; re-encode it, e.g. iconv -f latin1 -t "
                            "utf-8)";
      }
      // e.byte is 1-based within the line; the message repeats it, keep only the reason.
      std::string why = e.what();
      const size_t colon = why.rfind(": ");
      if (colon != std::string::npos) why = why.substr(colon + 2);
      KVB_USAGE_FAIL() << path << ":" << line_no << ": not valid JSON (at byte " << e.byte
                       << " of the line: " << why << ")";
    }
    KVB_USAGE_CHECK(value.is_object())
        << path << ":" << line_no << ": each line must be a JSON object, this one is "
        << type_name(value);
    file.items.emplace_back(name, line_no, std::move(value));
    return options.limit == 0 || file.items.size() < options.limit;
  };

  std::vector<char> block(size_t{1} << 20);
  bool more = true;
  while (more) {
    const int read = gzread(in, block.data(), static_cast<unsigned>(block.size()));
    int err = Z_OK;
    const char* why = gzerror(in, &err);
    KVB_USAGE_CHECK(read >= 0 && (err == Z_OK || err == Z_STREAM_END))
        << path << ": read error after " << total << " bytes: " << why
        << " (a damaged or truncated gzip file?)";
    const size_t got = static_cast<size_t>(read);
    if (got == 0) break;
    total += got;
    KVB_USAGE_CHECK(total <= options.max_total_bytes)
        << path << ": larger than the reader's limit of " << human_bytes(options.max_total_bytes);
    const char* p = block.data();
    const char* end = p + got;
    while (more && p < end) {
      const char* nl = static_cast<const char*>(std::memchr(p, '\n', end - p));
      const size_t n = static_cast<size_t>((nl ? nl : end) - p);
      KVB_USAGE_CHECK(line.size() + n <= options.max_line_bytes)
          << path << ":" << line_no + 1 << ": line longer than the reader's limit of "
          << human_bytes(options.max_line_bytes) << (options.limit_hint.empty() ? "" : "; ")
          << options.limit_hint;
      line.append(p, n);
      if (!nl) break;
      more = take(line);
      line.clear();
      p = nl + 1;
    }
  }
  if (more && !line.empty()) take(line);  // last line without '\n'
  // No items would be a task of no samples: zero units that look like a finished run.
  KVB_USAGE_CHECK(!file.items.empty())
      << path << ": no items (" << (total == 0 ? "the file is empty" : "only blank lines")
      << "); a data file holds one JSON object per line"
      << (options.option.empty() ? "" : " (task option " + options.option + ")");
  return file;
}

std::string read_text_file(const std::string& path, const std::string& option,
                           const std::string& how_to_obtain, size_t max_bytes) {
  require_file_or_pipe(path, option);
  // A FIFO without a writer reads as empty.
  const int fd = path.empty() ? -1 : open_without_waiting(path);
  if (fd < 0) missing_file(path, option, how_to_obtain);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  std::string text;
  std::vector<char> block(size_t{1} << 20);
  for (;;) {
    const ssize_t got = ::read(fd, block.data(), block.size());
    if (got < 0 && errno == EINTR) continue;
    KVB_USAGE_CHECK(got >= 0) << path << ": read error: " << std::strerror(errno);
    if (got == 0) break;
    KVB_USAGE_CHECK(text.size() + static_cast<size_t>(got) <= max_bytes)
        << path << ": larger than the limit of " << human_bytes(max_bytes);
    text.append(block.data(), static_cast<size_t>(got));
  }
  return text;
}

namespace {
bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}
// The code point starting at s[i] and its byte length; invalid UTF-8 reads as one non-space byte.
std::pair<uint32_t, size_t> decode_at(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return {0xFFFFFFFF, 1};
  uint32_t c = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
  for (size_t k = 1; k < n; ++k) {
    const auto cb = static_cast<unsigned char>(s[i + k]);
    if ((cb & 0xC0) != 0x80) return {0xFFFFFFFF, 1};
    c = (c << 6) | (cb & 0x3F);
  }
  return {c, n};
}
}  // namespace

std::string py_strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    const auto [c, n] = decode_at(s, begin);
    if (!py_space(c)) break;
    begin += n;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;  // back to the lead byte of the last code point (at most 3 steps)
    while (start > begin && end - start < 4 &&
           (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
      --start;
    }
    const auto [c, n] = decode_at(s, start);
    if (start + n != end || !py_space(c)) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

}  // namespace kvb::tasks
