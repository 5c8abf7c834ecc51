// A MessagePack writer (https://github.com/msgpack/msgpack/blob/master/spec.md):
// the few types the KV events need, each in its smallest encoding.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tandem {

class MsgpackWriter {
 public:
  void nil() { out_.push_back(char(0xc0)); }
  void boolean(bool v) { out_.push_back(char(v ? 0xc3 : 0xc2)); }
  void uint(uint64_t v) {
    if (v < 0x80) {
      out_.push_back(char(v));
    } else if (v <= 0xff) {
      out_.push_back(char(0xcc));
      be(v, 1);
    } else if (v <= 0xffff) {
      out_.push_back(char(0xcd));
      be(v, 2);
    } else if (v <= 0xffffffffULL) {
      out_.push_back(char(0xce));
      be(v, 4);
    } else {
      out_.push_back(char(0xcf));
      be(v, 8);
    }
  }
  void integer(int64_t v) {
    if (v >= 0) return uint(uint64_t(v));
    if (v >= -32) {
      out_.push_back(char(v));  // negative fixint
    } else if (v >= INT8_MIN) {
      out_.push_back(char(0xd0));
      be(uint64_t(v), 1);
    } else if (v >= INT16_MIN) {
      out_.push_back(char(0xd1));
      be(uint64_t(v), 2);
    } else if (v >= INT32_MIN) {
      out_.push_back(char(0xd2));
      be(uint64_t(v), 4);
    } else {
      out_.push_back(char(0xd3));
      be(uint64_t(v), 8);
    }
  }
  void float64(double v) {
    out_.push_back(char(0xcb));
    be(std::bit_cast<uint64_t>(v), 8);
  }
  void str(std::string_view s) {
    const uint64_t n = s.size();
    if (n < 32) {
      out_.push_back(char(0xa0 | n));
    } else if (n <= 0xff) {
      out_.push_back(char(0xd9));
      be(n, 1);
    } else if (n <= 0xffff) {
      out_.push_back(char(0xda));
      be(n, 2);
    } else {
      out_.push_back(char(0xdb));
      be(n, 4);
    }
    out_.append(s);
  }
  void array(uint32_t n) { header(n, 0x90, 0xdc, 0xdd); }
  void map(uint32_t n) { header(n, 0x80, 0xde, 0xdf); }

  const std::string& bytes() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void header(uint32_t n, int fix, int c16, int c32) {
    if (n < 16) {
      out_.push_back(char(fix | n));
    } else if (n <= 0xffff) {
      out_.push_back(char(c16));
      be(n, 2);
    } else {
      out_.push_back(char(c32));
      be(n, 4);
    }
  }
  void be(uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; --i) out_.push_back(char((v >> (8 * i)) & 0xff));
  }
  std::string out_;
};

}  // namespace tandem
