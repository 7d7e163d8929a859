// Escapers for Markdown, CSV, HTML and JSON output of untrusted text.
#include "common/escape.h"

#include <cstdio>

namespace kvb {

namespace {
// Length of the valid UTF-8 sequence starting at s[i], or 0 if invalid.
size_t utf8_len(const std::string& s, size_t i) {
  const unsigned char c = s[i];
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  }
  if (n == 2 && c < 0xC2) return 0;  // overlong
  return n;
}
}  // namespace

std::string sanitize_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_len(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s, i, n);
      i += n;
    }
  }
  return out;
}

std::string cut_chars(const std::string& raw, size_t max_chars) {
  const std::string s = sanitize_utf8(raw);
  size_t chars = 0;
  for (size_t i = 0; i < s.size();) {
    if (chars == max_chars) return s.substr(0, i) + "\xE2\x80\xA6";
    i += utf8_len(s, i);
    ++chars;
  }
  return s;
}

std::string md_cell(const std::string& raw, size_t max_chars) {
  const std::string s = sanitize_utf8(raw);
  std::string out;
  size_t chars = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_len(s, i);
    if (max_chars > 0 && chars == max_chars) {
      out += "\xE2\x80\xA6";
      break;
    }
    const char c = s[i];
    if (n == 1) {
      if (c == '|' || c == '\\' || c == '`' || c == '*' || c == '<' || c == '>' ||
          c == '[' || c == ']') {
        out += '\\';
        out += c;
      } else if (c == '\n' || c == '\t' || c == '\r') {
        out += ' ';
      } else if (static_cast<unsigned char>(c) >= 0x20 && c != 0x7F) {
        out += c;
      }
    } else {
      out.append(s, i, n);
    }
    i += n;
    ++chars;
  }
  return out;
}

std::string csv_field(const std::string& raw) {
  std::string s = sanitize_utf8(raw);
  if (!s.empty() && (s[0] == '=' || s[0] == '+' || s[0] == '-' || s[0] == '@' || s[0] == '\t' ||
                     s[0] == '\r')) {
    // Numbers like -1.5 stay numbers; only text that a spreadsheet would evaluate is prefixed.
    // A lone "-" (our "no value") is text to a spreadsheet, not a formula.
    bool numeric = s == "-" || (s.size() > 1 && (s[0] == '-' || s[0] == '+'));
    for (size_t i = 1; numeric && i < s.size(); ++i) {
      numeric = (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == 'e' || s[i] == 'E' ||
                s[i] == '-' || s[i] == '+';
    }
    if (!numeric) s = "'" + s;
  }
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string html_escape(const std::string& raw) {
  const std::string s = sanitize_utf8(raw);
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string json_escape(const std::string& raw) {
  const std::string s = sanitize_utf8(raw);
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

}  // namespace kvb
