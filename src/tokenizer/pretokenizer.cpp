#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace tandem::tok {

namespace {

// The regex lists below are llama.cpp's (src/llama-vocab.cpp, llm_tokenizer_bpe),
// in PCRE syntax. llama.cpp runs the GPT-2, LLaMA-3 and Qwen2 lists through
// hand-written matchers equivalent to these expressions, the rest through
// std::regex over a category-collapsed copy of the text; both agree with a real
// Unicode regex engine on the categories used here. Non-ASCII characters are
// written as \x{...} escapes: several are NFC-unstable, and an editor that
// normalizes them would silently turn a range into an invalid one.
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// o200k (gpt-4o, gpt-oss, llama4), as llama.cpp runs it: a letter run is an
// optional "upper" run then a "lower" run (or the reverse), where upper means
// any letter but a-z and lower any letter but A-Z, so non-ASCII letters count
// as both and combining marks as neither (tiktoken's \p{Lu}/\p{Ll}/\p{M}
// classes differ on non-ASCII text; llama.cpp is the reference here). A
// contraction may follow the run in either case; "/" may follow punctuation.
constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?)"
    R"(|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
constexpr const char* kPoro = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";

std::vector<PreTokenizerSpec> make_specs() {
  std::vector<PreTokenizerSpec> specs;
  auto add = [&](std::vector<std::string> names, std::vector<std::string> regexes) -> PreTokenizerSpec& {
    specs.push_back(PreTokenizerSpec{std::move(names), std::move(regexes)});
    return specs.back();
  };
  add({"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"});
  {
    auto& s = add({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                   "lfm2", "jina-v5-nano"},
                  {kLlama3});
    s.ignore_merges = true;
    s.add_bos = true;
  }
  add({"dbrx", "smaug-bpe"}, {kLlama3});
  add({"chatglm-bpe"}, {kLlama3}).no_bos = true;
  {
    auto& s = add({"glm4", "glm5"}, {kLlama3});
    s.no_bos = true;
    s.ignore_merges = true;
  }
  add({"deepseek-llm"},
      {"[\r\n]",
       R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)",
       R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)", R"(\s+$)", kCjk, R"(\p{N}+)"})
      .clean_spaces = false;
  add({"deepseek-v3"},
      {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
       R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"})
      .clean_spaces = false;
  add({"deepseek-coder"}, {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, R"(\p{N})"}).clean_spaces = false;
  add({"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"});
  add({"starcoder", "refact", "codeshell", "exaone", "minerva-7b"}, {R"(\p{N})", kGpt2});
  add({"command-r", "smollm"}, {R"(\p{N})", kGpt2}).clean_spaces = false;
  add({"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
       "mellum", "modern-bert", "mpt", "olmo", "jais", "exaone4"},
      {kGpt2});
  add({"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"}, {kQwen2}).clean_spaces = false;
  add({"stablelm2"}, {kQwen2});
  add({"gpt-4o", "llama4", "kanana2", "talkie"}, {kGpt4o}).clean_spaces = false;
  add({"poro-chat"}, {kPoro}).clean_spaces = false;
  add({"bloom", "gpt3-finnish"}, {kPoro});
  add({"viking"}, {kPoro, R"(\p{N})"}).clean_spaces = false;
  return specs;
}

std::string pcre_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0) return fmt::format("PCRE2 error {}", code);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

const std::vector<PreTokenizerSpec>& all_pre_tokenizers() {
  static const std::vector<PreTokenizerSpec> s = make_specs();
  return s;
}

const PreTokenizerSpec* find_pre_tokenizer(std::string_view name) {
  for (const auto& s : all_pre_tokenizers()) {
    for (const auto& n : s.names) {
      if (n == name) return &s;
    }
  }
  return nullptr;
}

const PreTokenizerSpec& default_pre_tokenizer() { return all_pre_tokenizers().front(); }

std::string expand_whitespace_classes(std::string_view p) {
  static constexpr std::string_view kWs =
      R"(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[++i];
      if (d == 's') {
        if (in_class) {
          out += kWs;
        } else {
          out += '[';
          out += kWs;
          out += ']';
        }
      } else if (d == 'S') {
        if (in_class) fail(ErrorKind::kUnsupported, "pre-tokenizer regex uses \\S inside a class: {}", p);
        out += "[^";
        out += kWs;
        out += ']';
      } else {
        out += c;
        out += d;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(const PreTokenizerSpec& spec) {
  for (const auto& re : spec.regexes) {
    const std::string pattern = expand_whitespace_classes(re);
    int err = 0;
    PCRE2_SIZE err_off = 0;
    auto c = std::make_unique<Compiled>();
    // DOLLAR_ENDONLY: '$' means end of fragment only, as in ECMAScript.
    c->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                            PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off, nullptr);
    if (!c->code) {
      fail(ErrorKind::kUnsupported, "pre-tokenizer regex does not compile at offset {}: {} ({})", err_off,
           pcre_message(err), re);
    }
    pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
    regexes_.push_back(std::move(c));
  }
}

PreTokenizer::~PreTokenizer() = default;

namespace {

struct MatchResources {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchResources() {
    md = pcre2_match_data_create(1, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (!md || !mctx || !stack) fail(ErrorKind::kResource, "out of memory for the pre-tokenizer regex");
    pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
  ~MatchResources() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(mctx);
    pcre2_match_data_free(md);
  }
};

struct Span {
  size_t off, len;
};

}  // namespace

std::vector<std::string> PreTokenizer::split(std::string_view text, bool byte_encode) const {
  const std::string subject = sanitize_utf8(text);
  std::vector<Span> spans;
  if (!subject.empty()) spans.push_back({0, subject.size()});

  MatchResources res;
  std::vector<Span> next;
  for (const auto& re : regexes_) {
    next.clear();
    for (const Span& f : spans) {
      const auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data() + f.off);
      size_t pos = 0, last = 0;
      uint32_t opts = 0;
      while (pos <= f.len) {
        const int rc = pcre2_match(re->code, subj, f.len, pos, opts | PCRE2_NO_UTF_CHECK, res.md, res.mctx);
        if (rc == PCRE2_ERROR_NOMATCH) {
          if (opts == 0 || pos >= f.len) break;
          // No non-empty match at an empty-match position: step one character.
          opts = 0;
          pos += utf8_len_from_lead(static_cast<uint8_t>(subj[pos]));
          continue;
        }
        if (rc < 0) fail(ErrorKind::kInvalidArgument, "pre-tokenizer regex failed: {}", pcre_message(rc));
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(res.md);
        const size_t ms = ov[0], me = ov[1];
        if (ms > last) next.push_back({f.off + last, ms - last});
        if (me > ms) next.push_back({f.off + ms, me - ms});
        last = me;
        pos = me;
        // After an empty match, insist on a non-empty one at the same place.
        opts = (me == ms) ? (PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED) : 0;
      }
      if (last < f.len) next.push_back({f.off + last, f.len - last});
    }
    spans.swap(next);
  }

  std::vector<std::string> words;
  words.reserve(spans.size());
  for (const Span& s : spans) {
    std::string_view w(subject.data() + s.off, s.len);
    if (!byte_encode) {
      words.emplace_back(w);
      continue;
    }
    std::string enc;
    enc.reserve(w.size() * 2);
    for (char c : w) enc += byte_to_unicode(static_cast<uint8_t>(c));
    words.push_back(std::move(enc));
  }
  return words;
}

}  // namespace tandem::tok
