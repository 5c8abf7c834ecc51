#include "runtime/json_parse.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "core/error.h"

namespace tandem {
namespace {

using nlohmann::json;

// RFC 8259 by recursive descent, into nlohmann's tree. Recursion is safe:
// the depth is checked before each container is entered. Each string is
// decoded once into a buffer of its exact size (a general lexer grows one
// buffer by doubling and keeps a second copy for its messages: 4x the text).
class Parser {
 public:
  Parser(std::string_view text, const JsonLimits& lim) : begin_(text.data()), p_(begin_), end_(begin_ + text.size()), lim_(lim) {}

  bool document(json& out) {
    if (!value(out)) return false;
    skip_ws();
    if (p_ != end_) return invalid();
    return true;
  }

  std::string problem;

 private:
  const char* begin_;
  const char* p_;
  const char* end_;
  const JsonLimits& lim_;
  size_t values_ = 0;
  int depth_ = 0;

  bool invalid() {
    problem = "is not valid JSON (at byte " + std::to_string(p_ - begin_) + ")";
    return false;
  }

  void skip_ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }

  bool value(json& out) {
    if (++values_ > lim_.max_values) {
      problem = "holds more than " + std::to_string(lim_.max_values) + " values";
      return false;
    }
    skip_ws();
    if (p_ == end_) return invalid();
    switch (*p_) {
      case '{': return object(out);
      case '[': return array(out);
      case '"': {
        std::string s;
        if (!string(s)) return false;
        out = std::move(s);
        return true;
      }
      case 't': return literal("true", json(true), out);
      case 'f': return literal("false", json(false), out);
      case 'n': return literal("null", json(nullptr), out);
      default: return number(out);
    }
  }

  bool literal(std::string_view word, json v, json& out) {
    if (static_cast<size_t>(end_ - p_) < word.size() || std::string_view(p_, word.size()) != word) return invalid();
    p_ += word.size();
    out = std::move(v);
    return true;
  }

  bool enter() {
    if (++depth_ <= lim_.max_depth) return true;
    problem = "nests deeper than " + std::to_string(lim_.max_depth) + " levels";
    return false;
  }

  bool object(json& out) {
    if (!enter()) return false;
    ++p_;
    out = json::object();
    skip_ws();
    if (p_ < end_ && *p_ == '}') {
      ++p_;
      --depth_;
      return true;
    }
    while (true) {
      skip_ws();
      if (p_ == end_ || *p_ != '"') return invalid();
      std::string key;
      if (!string(key)) return false;
      skip_ws();
      if (p_ == end_ || *p_ != ':') return invalid();
      ++p_;
      if (!value(out[std::move(key)])) return false;  // a repeated key: the last value wins
      skip_ws();
      if (p_ == end_) return invalid();
      if (*p_ == ',') {
        ++p_;
        continue;
      }
      if (*p_ != '}') return invalid();
      ++p_;
      --depth_;
      return true;
    }
  }

  bool array(json& out) {
    if (!enter()) return false;
    ++p_;
    out = json::array();
    skip_ws();
    if (p_ < end_ && *p_ == ']') {
      ++p_;
      --depth_;
      return true;
    }
    while (true) {
      out.emplace_back();
      if (!value(out.back())) return false;
      skip_ws();
      if (p_ == end_) return invalid();
      if (*p_ == ',') {
        ++p_;
        continue;
      }
      if (*p_ != ']') return invalid();
      ++p_;
      --depth_;
      return true;
    }
  }

  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Four hex digits after "\u"; -1 when malformed.
  long u16(const char* q) const {
    if (end_ - q < 4) return -1;
    long v = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = hex(q[i]);
      if (h < 0) return -1;
      v = v * 16 + h;
    }
    return v;
  }

  static void put_utf8(std::string& s, uint32_t cp) {
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      s.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      s.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  // Length of the well-formed UTF-8 sequence at q (RFC 3629: no overlong
  // forms, no surrogates, nothing past U+10FFFF), or 0.
  size_t utf8_len(const char* q) const {
    const auto b = [&](size_t i) { return static_cast<unsigned char>(q[i]); };
    const size_t avail = static_cast<size_t>(end_ - q);
    const unsigned char c = b(0);
    const auto cont = [&](size_t i) { return i < avail && (b(i) & 0xC0) == 0x80; };
    if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
      if (!cont(1) || !cont(2)) return 0;
      if (c == 0xE0 && b(1) < 0xA0) return 0;  // overlong
      if (c == 0xED && b(1) > 0x9F) return 0;  // surrogate
      return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
      if (!cont(1) || !cont(2) || !cont(3)) return 0;
      if (c == 0xF0 && b(1) < 0x90) return 0;  // overlong
      if (c == 0xF4 && b(1) > 0x8F) return 0;  // past U+10FFFF
      return 4;
    }
    return 0;
  }

  bool string(std::string& s) {
    ++p_;  // the opening quote
    // Find the end first, to decode into a buffer of the right size.
    const char* q = p_;
    while (q < end_ && *q != '"') q += *q == '\\' ? 2 : 1;
    if (q >= end_) {
      p_ = end_;
      return invalid();
    }
    s.reserve(static_cast<size_t>(q - p_));
    while (p_ < end_) {
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        ++p_;
        return true;
      }
      if (c < 0x20) return invalid();  // control characters must be escaped
      if (c < 0x80) {
        // A run of plain ASCII at once.
        const char* run = p_;
        while (p_ < end_ && static_cast<unsigned char>(*p_) >= 0x20 && static_cast<unsigned char>(*p_) < 0x80 &&
               *p_ != '"' && *p_ != '\\')
          ++p_;
        if (p_ > run) {
          s.append(run, static_cast<size_t>(p_ - run));
          continue;
        }
        // A backslash.
        if (end_ - p_ < 2) return invalid();
        const char e = p_[1];
        p_ += 2;
        switch (e) {
          case '"': s.push_back('"'); break;
          case '\\': s.push_back('\\'); break;
          case '/': s.push_back('/'); break;
          case 'b': s.push_back('\b'); break;
          case 'f': s.push_back('\f'); break;
          case 'n': s.push_back('\n'); break;
          case 'r': s.push_back('\r'); break;
          case 't': s.push_back('\t'); break;
          case 'u': {
            long cp = u16(p_);
            if (cp < 0) return invalid();
            p_ += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return invalid();  // a low surrogate alone
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              if (end_ - p_ < 6 || p_[0] != '\\' || p_[1] != 'u') return invalid();
              const long lo = u16(p_ + 2);
              if (lo < 0xDC00 || lo > 0xDFFF) return invalid();
              p_ += 6;
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            put_utf8(s, static_cast<uint32_t>(cp));
            break;
          }
          default: return invalid();
        }
        continue;
      }
      const size_t n = utf8_len(p_);
      if (n == 0) return invalid();
      s.append(p_, n);
      p_ += n;
    }
    return invalid();
  }

  bool number(json& out) {
    const char* start = p_;
    const auto digits = [&] {
      const char* d = p_;
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      return p_ > d;
    };
    if (p_ < end_ && *p_ == '-') ++p_;
    if (p_ == end_) return invalid();
    if (*p_ == '0') {
      ++p_;
    } else if (!digits()) {
      return invalid();
    }
    bool integral = true;
    if (p_ < end_ && *p_ == '.') {
      ++p_;
      if (!digits()) return invalid();
      integral = false;
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (!digits()) return invalid();
      integral = false;
    }
    if (integral) {
      if (*start == '-') {
        int64_t v = 0;
        if (std::from_chars(start, p_, v).ec == std::errc()) {
          out = v;
          return true;
        }
      } else {
        uint64_t v = 0;
        if (std::from_chars(start, p_, v).ec == std::errc()) {
          out = v;
          return true;
        }
      }
      // Too large for 64 bits: a float, as nlohmann's own parser makes it.
    }
    // strtod, as nlohmann's lexer reads numbers: the same double, and an
    // underflow is a zero or a subnormal rather than an error.
    const std::string text(start, p_);
    const double d = std::strtod(text.c_str(), nullptr);
    if (!std::isfinite(d)) {
      p_ = start;
      problem = "has a number out of range (at byte " + std::to_string(start - begin_) + ")";
      return false;
    }
    out = d;
    return true;
  }
};

}  // namespace

json parse_json(std::string_view text, const JsonLimits& limits, std::string_view what) {
  Parser parser(text, limits);
  json root;
  if (!parser.document(root)) fail(ErrorKind::kInvalidArgument, "{} {}", what, parser.problem);
  return root;
}

}  // namespace tandem
