#include "server/http_parse.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include <fmt/format.h>

namespace tandem::server::http {
namespace {

// RFC 9110 tchar: the characters of a method or a header name.
bool is_tchar(unsigned char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-': case '.':
    case '^': case '_': case '`': case '|': case '~':
      return true;
    default:
      return false;
  }
}

// A header value's bytes: visible ASCII, space, tab and obs-text. NUL, the
// other control bytes and DEL are refused: a value is compared and logged as
// text, and a trailing NUL must not make "key\0" equal "key" anywhere.
bool is_value_byte(unsigned char c) { return c == '\t' || c == ' ' || (c >= 0x21 && c != 0x7F); }

bool is_target_byte(unsigned char c) { return c >= 0x21 && c <= 0x7E; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x + 32);
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y + 32);
    if (x != y) return false;
  }
  return true;
}

// A printable form of a byte for error messages.
std::string show_byte(unsigned char c) {
  if (c >= 0x21 && c <= 0x7E) return fmt::format("'{}'", static_cast<char>(c));
  return fmt::format("0x{:02X}", c);
}

Parse error(ParseError& err, int status, std::string message) {
  err.status = status;
  err.message = std::move(message);
  return Parse::kError;
}

// Splits a comma-separated header value into trimmed, non-empty items.
std::vector<std::string_view> list_items(std::string_view v) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= v.size()) {
    size_t comma = v.find(',', start);
    if (comma == std::string_view::npos) comma = v.size();
    const std::string_view item = trim(v.substr(start, comma - start));
    if (!item.empty()) out.push_back(item);
    start = comma + 1;
  }
  return out;
}

Parse parse_request_line(std::string_view line, RequestHead& out, ParseError& err) {
  const size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos || sp1 == 0)
    return error(err, 400, "malformed request line (expected 'METHOD /path HTTP/1.1')");
  const std::string_view method = line.substr(0, sp1);
  for (unsigned char c : method)
    if (!is_tchar(c)) return error(err, 400, fmt::format("the request method has an invalid byte {}", show_byte(c)));
  const size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || sp2 == sp1 + 1)
    return error(err, 400, "malformed request line (expected 'METHOD /path HTTP/1.1')");
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  for (unsigned char c : target)
    if (!is_target_byte(c))
      return error(err, 400, fmt::format("the request target has an invalid byte {}", show_byte(c)));
  if (target[0] != '/' && !(target == "*" && method == "OPTIONS"))
    return error(err, 400, "the request target must be a path starting with '/'");
  const std::string_view version = line.substr(sp2 + 1);
  if (version == "HTTP/1.1") out.minor_version = 1;
  else if (version == "HTTP/1.0") out.minor_version = 0;
  else if (version.size() == 8 && version.substr(0, 5) == "HTTP/" && version[6] == '.')
    return error(err, 505, fmt::format("HTTP version {} is not supported (HTTP/1.0 and HTTP/1.1 are)", version));
  else return error(err, 400, "malformed request line (expected 'METHOD /path HTTP/1.1')");
  out.method = std::string(method);
  out.target = std::string(target);
  out.path = std::string(target.substr(0, target.find('?')));
  return Parse::kDone;
}

Parse parse_header_line(std::string_view line, RequestHead& out, ParseError& err) {
  if (line[0] == ' ' || line[0] == '\t') return error(err, 400, "folded header lines are not accepted");
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return error(err, 400, "a header line has no ':'");
  if (colon == 0) return error(err, 400, "a header line has an empty name");
  const std::string_view name = line.substr(0, colon);
  for (unsigned char c : name)
    if (!is_tchar(c))
      return error(err, 400, c == ' ' || c == '\t' ? std::string("whitespace before ':' in a header line is not accepted")
                                                   : fmt::format("a header name has an invalid byte {}", show_byte(c)));
  const std::string_view value = trim(line.substr(colon + 1));
  for (unsigned char c : value)
    if (!is_value_byte(c))
      return error(err, 400, fmt::format("header '{}' has an invalid byte {} in its value", name, show_byte(c)));
  out.headers.push_back({lower(name), std::string(value)});
  return Parse::kDone;
}

// Framing and connection handling from the parsed headers.
Parse derive_framing(RequestHead& h, ParseError& err) {
  int hosts = 0;
  const std::string* cl = nullptr;
  std::string te;
  int te_headers = 0;
  for (const Header& x : h.headers) {
    if (x.name == "host") {
      ++hosts;
    } else if (x.name == "content-length") {
      if (cl) return error(err, 400, "more than one Content-Length header");
      cl = &x.value;
    } else if (x.name == "transfer-encoding") {
      te += (te_headers++ ? "," : "") + x.value;
    } else if (x.name == "connection") {
      for (std::string_view item : list_items(x.value)) {
        if (iequals(item, "close")) h.keep_alive = false;
        else if (iequals(item, "keep-alive") && h.minor_version == 0) h.keep_alive = true;
      }
    } else if (x.name == "expect") {
      if (!iequals(x.value, "100-continue"))
        return error(err, 417, fmt::format("Expect: {} is not supported (only 100-continue)", x.value));
      h.expect_continue = true;
    }
  }
  if (h.minor_version == 1 && hosts != 1)
    return error(err, 400, hosts == 0 ? "an HTTP/1.1 request needs a Host header" : "more than one Host header");
  if (te_headers) {
    if (h.minor_version == 0) return error(err, 400, "Transfer-Encoding is not allowed in an HTTP/1.0 request");
    if (cl) return error(err, 400, "a request may not carry both Transfer-Encoding and Content-Length");
    const std::vector<std::string_view> codings = list_items(te);
    if (codings.size() != 1 || !iequals(codings[0], "chunked"))
      return error(err, 501, fmt::format("Transfer-Encoding '{}' is not supported (only 'chunked')", te));
    h.chunked = true;
  }
  if (cl) {
    const std::string& v = *cl;
    if (v.empty() || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return error(err, 400, fmt::format("Content-Length '{}' is not a number", v.substr(0, 32)));
    uint64_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || n > static_cast<uint64_t>(INT64_MAX))
      return error(err, 413, "the request body is too large (Content-Length overflows)");
    h.content_length = static_cast<int64_t>(n);
  }
  if (h.minor_version == 0) {
    // HTTP/1.0 keeps the connection only when asked to.
    bool asked = false;
    for (const Header& x : h.headers)
      if (x.name == "connection")
        for (std::string_view item : list_items(x.value)) asked |= iequals(item, "keep-alive");
    h.keep_alive = asked;
  }
  return Parse::kDone;
}

}  // namespace

const std::string* RequestHead::find(std::string_view name) const {
  for (const Header& h : headers)
    if (h.name == name) return &h.value;
  return nullptr;
}

Parse parse_head(std::string_view buf, const HeadLimits& lim, RequestHead& out, size_t& consumed, ParseError& err) {
  // RFC 9112 2.2: empty lines before a request line are ignored.
  size_t start = 0;
  while (start + 1 < buf.size() && buf[start] == '\r' && buf[start + 1] == '\n' && start < 8) start += 2;
  const std::string_view window = buf.substr(0, std::min(buf.size(), lim.max_head_bytes + start));
  const size_t end = window.find("\r\n\r\n", start);
  if (end == std::string_view::npos) {
    // A bare LF or CR already seen is an error now, not after 16 KiB.
    for (size_t i = start; i < window.size(); ++i) {
      const char c = window[i];
      if (c == '\n' && (i == start || window[i - 1] != '\r'))
        return error(err, 400, "a line of the request head ends in a bare LF (CRLF is required)");
      if (c == '\r' && i + 1 < window.size() && window[i + 1] != '\n')
        return error(err, 400, "a bare CR in the request head");
    }
    if (buf.size() - start >= lim.max_head_bytes)
      return error(err, 431, fmt::format("the request head is larger than {} KiB", lim.max_head_bytes >> 10));
    return Parse::kIncomplete;
  }
  out = RequestHead{};
  std::string_view head = buf.substr(start, end - start + 2);  // lines, each ending in CRLF
  bool first = true;
  while (!head.empty()) {
    const size_t eol = head.find("\r\n");
    const std::string_view line = head.substr(0, eol);
    head.remove_prefix(eol + 2);
    if (line.find('\r') != std::string_view::npos) return error(err, 400, "a bare CR in the request head");
    if (line.find('\n') != std::string_view::npos)
      return error(err, 400, "a line of the request head ends in a bare LF (CRLF is required)");
    if (first) {
      if (parse_request_line(line, out, err) == Parse::kError) return Parse::kError;
      first = false;
      continue;
    }
    if (out.headers.size() >= lim.max_headers)
      return error(err, 431, fmt::format("the request has more than {} header fields", lim.max_headers));
    if (parse_header_line(line, out, err) == Parse::kError) return Parse::kError;
  }
  if (derive_framing(out, err) == Parse::kError) return Parse::kError;
  consumed = end + 4;
  return Parse::kDone;
}

Parse ChunkedDecoder::feed(std::string_view in, size_t& consumed, std::string& out, ParseError& err) {
  constexpr size_t kMaxLine = 4096;  // a size line with its extensions, or a trailer field
  constexpr int kMaxTrailers = 64;
  size_t i = 0;
  // Takes one CRLF-terminated line into line_; true when complete.
  const auto take_line = [&](Parse& status) {
    while (i < in.size()) {
      const char c = in[i++];
      if (c == '\n') {
        if (line_.empty() || line_.back() != '\r') {
          status = error(err, 400, "a chunked body line ends in a bare LF (CRLF is required)");
          return false;
        }
        line_.pop_back();
        return true;
      }
      if (!line_.empty() && line_.back() == '\r') {
        status = error(err, 400, "a bare CR in a chunked body");
        return false;
      }
      line_.push_back(c);
      if (line_.size() > kMaxLine) {
        status = error(err, 400, "a chunk-size or trailer line is too long");
        return false;
      }
    }
    return false;
  };
  Parse status = Parse::kIncomplete;
  while (state_ != State::kDone) {
    if (state_ == State::kSize || state_ == State::kTrailer) {
      if (!take_line(status)) {
        consumed = i;
        return status;
      }
      const std::string line = std::move(line_);
      line_.clear();
      if (state_ == State::kTrailer) {
        if (line.empty()) {
          state_ = State::kDone;
          break;
        }
        if (++trailers_ > kMaxTrailers) {
          consumed = i;
          return error(err, 431, "a chunked body has too many trailer fields");
        }
        for (unsigned char c : line)
          if (!is_value_byte(c)) {
            consumed = i;
            return error(err, 400, fmt::format("a trailer field has an invalid byte {}", show_byte(c)));
          }
        continue;  // trailers are read and dropped
      }
      size_t digits = 0;
      uint64_t size = 0;
      while (digits < line.size() && std::isxdigit(static_cast<unsigned char>(line[digits]))) {
        if (digits == 15) {
          consumed = i;
          return error(err, 413, "a chunk size is too large");
        }
        const char c = line[digits++];
        size = size * 16 + static_cast<uint64_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
      }
      if (digits == 0) {
        consumed = i;
        return error(err, 400, "a chunk does not start with its size in hex");
      }
      std::string_view rest = trim(std::string_view(line).substr(digits));
      if (!rest.empty() && rest[0] != ';') {
        consumed = i;
        return error(err, 400, "a chunk size is followed by something other than an extension");
      }
      for (unsigned char c : rest)
        if (!is_value_byte(c)) {
          consumed = i;
          return error(err, 400, fmt::format("a chunk extension has an invalid byte {}", show_byte(c)));
        }
      if (size == 0) {
        state_ = State::kTrailer;
        continue;
      }
      if (size > max_body_ - std::min(decoded_, max_body_)) {
        consumed = i;
        return error(err, 413, "the request body is too large");
      }
      remaining_ = size;
      state_ = State::kData;
    } else if (state_ == State::kData) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, in.size() - i));
      if (n == 0) break;
      out.append(in.data() + i, n);
      i += n;
      decoded_ += n;
      remaining_ -= n;
      if (remaining_ == 0) state_ = State::kDataEnd;
    } else if (state_ == State::kDataEnd) {
      while (line_.size() < 2 && i < in.size()) line_.push_back(in[i++]);
      if (line_.size() < 2) break;
      if (line_ != "\r\n") {
        consumed = i;
        return error(err, 400, "a chunk's data is not followed by CRLF");
      }
      line_.clear();
      state_ = State::kSize;
    }
  }
  consumed = i;
  return state_ == State::kDone ? Parse::kDone : Parse::kIncomplete;
}

std::string_view reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

}  // namespace tandem::server::http
