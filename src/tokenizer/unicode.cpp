#include "tokenizer/unicode.h"

#include <array>

namespace tandem::tok {

size_t utf8_len_from_lead(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

namespace {

bool is_cont(uint8_t c) { return (c & 0xC0) == 0x80; }

// One lenient step; returns false (and leaves `i`) for an invalid sequence.
bool decode_one(std::string_view s, size_t& i, uint32_t& cpt) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c0 = b(0);
  if (!(c0 & 0x80)) {
    cpt = c0;
    i += 1;
    return true;
  }
  if (!(c0 & 0x40)) return false;
  if (!(c0 & 0x20)) {
    if (i + 1 >= s.size() || !is_cont(b(1))) return false;
    cpt = ((c0 & 0x1Fu) << 6) | (b(1) & 0x3Fu);
    i += 2;
    return true;
  }
  if (!(c0 & 0x10)) {
    if (i + 2 >= s.size() || !is_cont(b(1)) || !is_cont(b(2))) return false;
    cpt = ((c0 & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu);
    i += 3;
    return true;
  }
  if (!(c0 & 0x08)) {
    if (i + 3 >= s.size() || !is_cont(b(1)) || !is_cont(b(2)) || !is_cont(b(3))) return false;
    cpt = ((c0 & 0x07u) << 18) | ((b(1) & 0x3Fu) << 12) | ((b(2) & 0x3Fu) << 6) | (b(3) & 0x3Fu);
    i += 4;
    return true;
  }
  return false;
}

struct ByteAlphabet {
  std::array<std::string, 256> to_utf8;
  std::array<int16_t, 256 + 68> from_cpt;  // codepoints used are < 256 + 68

  ByteAlphabet() {
    from_cpt.fill(-1);
    const auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cpt = printable(b) ? static_cast<uint32_t>(b) : 256u + extra++;
      append_utf8(to_utf8[b], cpt);
      from_cpt[cpt] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

}  // namespace

std::vector<uint32_t> decode_utf8_lenient(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cpt = 0;
    if (decode_one(s, i, cpt)) {
      out.push_back(cpt);
    } else {
      out.push_back(0xFFFD);
      ++i;
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cpt) {
  if ((cpt >= 0xD800 && cpt <= 0xDFFF) || cpt > 0x10FFFF) cpt = 0xFFFD;
  if (cpt <= 0x7F) {
    out.push_back(static_cast<char>(cpt));
  } else if (cpt <= 0x7FF) {
    out.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt <= 0xFFFF) {
    out.push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    uint32_t cpt = 0;
    if (!decode_one(s, i, cpt)) {
      out.append(kReplacementChar);
      i = start + 1;
    } else if (cpt < 0x80) {
      out.push_back(static_cast<char>(cpt));
    } else {
      append_utf8(out, cpt);
    }
  }
  return out;
}

const std::string& byte_to_unicode(uint8_t byte) { return alphabet().to_utf8[byte]; }

int unicode_to_byte(uint32_t cpt) {
  if (cpt >= alphabet().from_cpt.size()) return -1;
  return alphabet().from_cpt[cpt];
}

int utf8_sequence_status(std::string_view s, size_t i) {
  const auto c0 = static_cast<uint8_t>(s[i]);
  if (c0 < 0x80) return 1;
  int len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    len = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    len = 3;
    if (c0 == 0xE0) lo = 0xA0;  // overlong
    if (c0 == 0xED) hi = 0x9F;  // surrogates
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    len = 4;
    if (c0 == 0xF0) lo = 0x90;  // overlong
    if (c0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) return 0;
    const auto c = static_cast<uint8_t>(s[i + k]);
    if (k == 1 ? (c < lo || c > hi) : !is_cont(c)) return -1;
  }
  return len;
}

}  // namespace tandem::tok
