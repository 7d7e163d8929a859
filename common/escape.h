// Escaping of untrusted text (dataset content, model outputs) wherever it is rendered.
#pragma once

#include <string>

namespace kvb {
// Markdown table cell: the characters | \ ` * < > [ ] escaped, newlines and tabs as spaces,
// control characters dropped; cut to max_chars code points (with "…") when max_chars > 0.
std::string md_cell(const std::string& s, size_t max_chars = 0);
// RFC 4180 CSV field: quoted when it contains ',', '"', CR or LF (quotes doubled); a leading
// '=', '+', '-', '@', tab or CR gets a ' prefix so spreadsheets do not evaluate it.
std::string csv_field(const std::string& s);
// HTML text and attribute content: & < > " ' escaped.
std::string html_escape(const std::string& s);
// JSON string body (without the quotes): control chars as \uXXXX, invalid UTF-8 replaced.
std::string json_escape(const std::string& s);
// The first max_chars code points of s (valid UTF-8), with "…" appended when cut.
std::string cut_chars(const std::string& s, size_t max_chars);
// Replaces invalid UTF-8 sequences with U+FFFD.
std::string sanitize_utf8(const std::string& s);
}  // namespace kvb
