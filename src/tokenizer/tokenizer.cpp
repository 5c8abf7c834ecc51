#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/algorithms.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace tandem {

namespace {

using tok::Vocab;

// llama.cpp's llama_decode_text: map each codepoint of a byte-level token back
// to its byte; a codepoint outside the alphabet is spelled out as llama.cpp does.
std::string decode_byte_level(std::string_view text) {
  std::string out;
  for (uint32_t cpt : tok::decode_utf8_lenient(text)) {
    const int b = tok::unicode_to_byte(cpt);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
      continue;
    }
    std::string utf8;
    tok::append_utf8(utf8, cpt);
    out += "[UNK_BYTE_0x";
    for (char c : utf8) out += fmt::format("{:02x}", static_cast<uint8_t>(c));
    out.append(text);
    out += "]";
  }
  return out;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t m; (m = s.find(from, pos)) != std::string::npos; pos = m + from.size()) {
    out.append(s, pos, m - pos);
    out += to;
  }
  out.append(s, pos, std::string::npos);
  s.swap(out);
}

// llama.cpp's detokenize clean-up (HF clean_up_tokenization_spaces), three
// passes over bytes; each reads the previous pass's output.
std::string clean_spaces(std::string in) {
  if (in.empty()) return in;
  std::string out;
  // " ?", " !", " .", " ," lose the space.
  out.push_back(in[0]);
  for (size_t i = 1; i < in.size(); ++i) {
    const char x = in[i];
    if (in[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) out.pop_back();
    out.push_back(x);
  }
  // " ' " becomes "'".
  in.swap(out);
  out.clear();
  out.push_back(in[0]);
  for (size_t i = 1; i < in.size(); ++i) {
    const char x = in[i];
    if (x == '\'' && i + 1 < in.size() && in[i - 1] == ' ' && in[i + 1] == ' ') {
      out.pop_back();
      in[++i] = '\0';  // the skipped space no longer counts as a space
    }
    out.push_back(x);
  }
  // " 's", " 'm", " 're", " 've" lose the space.
  in.swap(out);
  out.clear();
  out.push_back(in[0]);
  for (size_t i = 1; i < in.size(); ++i) {
    const char x = in[i];
    if (in[i - 1] == ' ' && x == '\'' && i + 1 < in.size()) {
      const char x1 = in[i + 1];
      if (x1 == 's' || x1 == 'm') {
        out.pop_back();
      } else if (x1 != 't' && x1 != 'd' && i + 2 < in.size()) {
        const char x2 = in[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) out.pop_back();
      }
    }
    out.push_back(x);
  }
  return out;
}

class GgufTokenizer final : public Tokenizer {
 public:
  explicit GgufTokenizer(Vocab v) : v_(std::move(v)) {
    if (v_.kind == Vocab::Kind::kBpe) {
      const tok::PreTokenizerSpec* spec =
          v_.pre.empty() ? &tok::default_pre_tokenizer() : tok::find_pre_tokenizer(v_.pre);
      pre_ = std::make_unique<tok::PreTokenizer>(*spec);
    }
    // A piece is never shorter than the input it covers (SPM writes a space
    // as 3 bytes, byte-level BPE a byte as 1-2).
    for (int32_t id = 0; id < v_.n(); ++id) max_token_bytes_ = std::max(max_token_bytes_, v_.text[id].size());
    max_token_bytes_ = std::max<size_t>(max_token_bytes_, 1);
  }

  size_t max_token_bytes() const override { return max_token_bytes_; }

  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special,
                              std::span<const std::pair<size_t, size_t>> literal) const override {
    std::vector<int32_t> out;
    const bool bos = add_special && v_.add_bos && v_.bos >= 0;
    const bool eos = add_special && v_.add_eos && v_.eos >= 0;
    if (bos) out.push_back(v_.bos);
    bool prev_special = true;  // SPM: the first text fragment gets the space prefix
    std::string buf;
    for (const tok::Fragment& f : tok::split_special(v_, text, parse_special, literal)) {
      if (f.token >= 0) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      const std::string_view raw = text.substr(f.offset, f.length);
      if (v_.kind == Vocab::Kind::kSpm) {
        buf.clear();
        if (v_.add_space_prefix && prev_special) buf.push_back(' ');
        buf += raw;
        replace_all(buf, " ", "\xE2\x96\x81");
        tok::spm_encode(v_, buf, out);
      } else {
        tok::bpe_encode(v_, *pre_, raw, out);
      }
      prev_special = false;
    }
    if (eos) out.push_back(v_.eos);
    return out;
  }

  std::string token_to_piece(int32_t id, bool render_special) const override {
    check_id(id);
    const uint32_t attr = v_.attr[id];
    const std::string_view text = v_.text[id];
    if (attr & (tok::kAttrControl | tok::kAttrUnknown)) return render_special ? std::string(text) : std::string();
    if (attr & tok::kAttrUserDefined) return std::string(text);
    if (attr & tok::kAttrNormal) {
      if (v_.kind == Vocab::Kind::kBpe) return decode_byte_level(text);
      std::string s(text);
      replace_all(s, "\xE2\x96\x81", " ");
      return s;
    }
    if (attr & tok::kAttrByte) return std::string(1, static_cast<char>(byte_value(text)));
    return {};  // unused / undefined
  }

  int32_t n_vocab() const override { return v_.n(); }
  int32_t bos_id() const override { return v_.bos; }
  int32_t eos_id() const override { return v_.eos; }
  bool add_bos() const override { return v_.add_bos && v_.bos >= 0; }
  bool is_eog(int32_t id) const override { return v_.eog.count(id) > 0; }
  int32_t find_token(std::string_view piece) const override { return v_.find(piece); }

 protected:
  std::string spell(const std::vector<int32_t>& ids, std::vector<size_t>* offsets) const override {
    std::string out;
    if (offsets) offsets->resize(ids.size());
    bool strip_space = v_.add_space_prefix;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (offsets) (*offsets)[i] = out.size();
      std::string piece = token_to_piece(ids[i], false);
      if (piece.empty()) continue;  // BOS and other control tokens
      out.append(piece, strip_space && piece[0] == ' ' ? 1 : 0);
      strip_space = false;
    }
    return out;
  }

  std::string detokenize(const std::vector<int32_t>& ids, bool render_special) const override {
    std::string out;
    bool strip_space = v_.add_space_prefix;  // only ever the very first token
    for (int32_t id : ids) {
      std::string piece = token_to_piece(id, render_special);
      if (strip_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
      strip_space = false;
      out += piece;
    }
    return v_.clean_spaces ? clean_spaces(std::move(out)) : out;
  }

 private:
  void check_id(int32_t id) const {
    if (id < 0 || id >= v_.n()) {
      fail(ErrorKind::kInvalidArgument, "token id {} is out of range (vocab has {} tokens)", id, v_.n());
    }
  }

  // "<0xNN>" -> NN, read like llama.cpp's strtol on the two hex digits.
  static uint8_t byte_value(std::string_view text) {
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    if (text.size() < 5) return 0;
    const int hi = hex(text[3]), lo = hex(text[4]);
    if (hi < 0) return 0;
    return static_cast<uint8_t>(lo < 0 ? hi : hi * 16 + lo);
  }

  Vocab v_;
  std::unique_ptr<tok::PreTokenizer> pre_;
  size_t max_token_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  return std::make_unique<GgufTokenizer>(Vocab::load(f));
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
  return detokenize(ids, render_special);
}


std::string Tokenizer::detokenize(const std::vector<int32_t>& ids, bool render_special) const {
  std::string out;
  for (int32_t id : ids) out += token_to_piece(id, render_special);
  return out;
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_.token_to_piece(id);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const int st = tok::utf8_sequence_status(pending_, i);
    if (st == 0) break;  // an unfinished character: wait for more bytes
    if (st < 0) {
      out += tok::kReplacementChar;
      i += 1;
    } else {
      out.append(pending_, i, st);
      i += st;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  if (!pending_.empty()) out = std::string(tok::kReplacementChar);
  pending_.clear();
  return out;
}

}  // namespace tandem
