// Tokenizer behaviour on small synthetic vocabularies (written with
// GgufWriter): merge order, byte fallback, special-token splitting, text-based
// end-of-generation detection, validation errors, and the stream decoder.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <unistd.h>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

enum Type : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kByte = 6 };

struct VocabBuilder {
  std::string model = "llama";
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::function<void(GgufWriter&)> extra;

  int32_t add(std::string text, int32_t type = kNormal, float score = 0.0f) {
    tokens.push_back(std::move(text));
    types.push_back(type);
    scores.push_back(score);
    return static_cast<int32_t>(tokens.size() - 1);
  }

  // <unk> <s> </s> then the 256 <0xNN> byte tokens, as llama's SPM vocab.
  static VocabBuilder spm() {
    VocabBuilder b;
    b.add("<unk>", kUnknown);
    b.add("<s>", kControl);
    b.add("</s>", kControl);
    for (int i = 0; i < 256; ++i) b.add(fmt::format("<0x{:02X}>", i), kByte);
    return b;
  }

  // The 256 characters of the GPT-2 byte alphabet.
  static VocabBuilder bpe() {
    VocabBuilder b;
    b.model = "gpt2";
    for (int i = 0; i < 256; ++i) b.add(tok::byte_to_unicode(static_cast<uint8_t>(i)));
    return b;
  }

  std::unique_ptr<Tokenizer> build() const {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_string("tokenizer.ggml.model", model);
    w.add_string_array("tokenizer.ggml.tokens", tokens);
    w.add_f32_array("tokenizer.ggml.scores", scores);
    w.add_i32_array("tokenizer.ggml.token_type", types);
    if (!merges.empty()) w.add_string_array("tokenizer.ggml.merges", merges);
    if (extra) extra(w);
    static std::atomic<int> counter{0};
    const fs::path path = fs::temp_directory_path() /
                          fmt::format("tandem_tok_{}_{}.gguf", ::getpid(), counter.fetch_add(1));
    // Removed on every exit: the load-error tests throw out of from_gguf.
    struct RemoveOnExit {
      fs::path p;
      ~RemoveOnExit() {
        std::error_code ec;
        fs::remove(p, ec);
      }
    } guard{path};
    w.write(path.string());
    auto file = GgufFile::open(path.string());
    return Tokenizer::from_gguf(*file);
  }
};

std::string load_error(const VocabBuilder& b) {
  try {
    b.build();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(TokenizerUnit, SpmMergesHighestScoreFirstThenLeftmost) {
  auto b = VocabBuilder::spm();
  const int32_t a = b.add("a"), bb = b.add("b"), c = b.add("c");
  const int32_t aa = b.add("aa", kNormal, 1.0f), ab = b.add("ab", kNormal, 2.0f), bc = b.add("bc", kNormal, 3.0f);
  b.extra = [](GgufWriter& w) { w.add_bool("tokenizer.ggml.add_space_prefix", false); };
  auto tok = b.build();
  EXPECT_EQ(tok->encode("abc", false, false), (std::vector<int32_t>{a, bc}));  // bc outscores ab
  EXPECT_EQ(tok->encode("aaa", false, false), (std::vector<int32_t>{aa, a}));  // tie: leftmost pair
  EXPECT_EQ(tok->encode("ab", false, false), (std::vector<int32_t>{ab}));
  EXPECT_EQ(tok->encode("cb", false, false), (std::vector<int32_t>{c, bb}));
  // Unknown characters fall back to their UTF-8 bytes.
  EXPECT_EQ(tok->encode("\xC3\xA9", false, false), (std::vector<int32_t>{3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok->decode(tok->encode("a\xC3\xA9" "bc", false, false)), "a\xC3\xA9" "bc");
  // SPM adds BOS by default (no add_bos_token key), never EOS.
  EXPECT_EQ(tok->encode("a", true, false), (std::vector<int32_t>{1, a}));
  EXPECT_TRUE(tok->add_bos());
}

TEST(TokenizerUnit, SpmSpacePrefixAndEscapedSpaces) {
  auto b = VocabBuilder::spm();
  const int32_t w_hi = b.add("\xE2\x96\x81hi", kNormal, 1.0f);
  const int32_t ctl = b.add("<ctl>", kControl);
  b.add("h");
  b.add("i");
  b.add("\xE2\x96\x81");
  b.add("\xE2\x96\x81h", kNormal, 0.5f);
  auto tok = b.build();
  EXPECT_EQ(tok->encode("hi", false, false), (std::vector<int32_t>{w_hi}));
  // Every text fragment right after a special token gets the prefix too.
  EXPECT_EQ(tok->encode("<ctl>hi", false, true), (std::vector<int32_t>{ctl, w_hi}));
  EXPECT_EQ(tok->decode({w_hi, w_hi}), "hi hi");       // first piece loses its space
  EXPECT_EQ(tok->decode({1, w_hi}), " hi");            // ... but only the very first piece
  EXPECT_EQ(tok->decode({ctl, w_hi}, true), "<ctl> hi");
}

TEST(TokenizerUnit, SpecialTokensSplitLongestFirst) {
  auto b = VocabBuilder::spm();
  const int32_t ctl = b.add("<ctl>", kControl);
  const int32_t ud = b.add("<ud>", kUserDefined);
  const int32_t bcd = b.add("bcd", kUserDefined);
  b.add("ab", kUserDefined);
  const int32_t a = b.add("a");
  b.add("b");
  b.extra = [](GgufWriter& w) { w.add_bool("tokenizer.ggml.add_space_prefix", false); };
  auto tok = b.build();
  // Control tokens only with parse_special; user-defined ones always.
  EXPECT_EQ(tok->encode("a<ctl>a", false, true), (std::vector<int32_t>{a, ctl, a}));
  const auto as_text = tok->encode("a<ctl>a", false, false);
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), ctl), 0);
  EXPECT_EQ(tok->encode("a<ud>a", false, false), (std::vector<int32_t>{a, ud, a}));
  // llama.cpp claims the longest special text first, not the leftmost match.
  EXPECT_EQ(tok->encode("abcd", false, false), (std::vector<int32_t>{a, bcd}));
  EXPECT_EQ(tok->token_to_piece(ud), "<ud>");     // user-defined: always shown
  EXPECT_EQ(tok->token_to_piece(ctl), "");        // control: hidden ...
  EXPECT_EQ(tok->token_to_piece(ctl, true), "<ctl>");  // ... unless rendered
  EXPECT_EQ(tok->token_to_piece(0), "");          // unknown behaves like control
  EXPECT_EQ(tok->find_token("<ud>"), ud);
  EXPECT_EQ(tok->find_token("<nope>"), -1);
}

TEST(TokenizerUnit, EndOfGenerationFromTextAndIds) {
  auto b = VocabBuilder::spm();
  const int32_t im_end = b.add("<|im_end|>", kNormal);  // mis-typed as normal in the file
  const int32_t eot = b.add("<end_of_turn>", kControl);
  const int32_t eom = b.add("<|eom_id|>", kControl);
  const int32_t plain = b.add("hello");
  auto tok = b.build();
  EXPECT_TRUE(tok->is_eog(2));  // </s> = default EOS
  EXPECT_TRUE(tok->is_eog(im_end));
  EXPECT_TRUE(tok->is_eog(eot));
  EXPECT_TRUE(tok->is_eog(eom));
  EXPECT_FALSE(tok->is_eog(plain));
  EXPECT_FALSE(tok->is_eog(1));
  EXPECT_FALSE(tok->is_eog(-1));
  EXPECT_EQ(tok->token_to_piece(im_end), "");  // llama.cpp turns it into a control token
}

TEST(TokenizerUnit, BpeMergesByRank) {
  auto b = VocabBuilder::bpe();
  const int32_t ab = b.add("ab"), bc = b.add("bc"), abc = b.add("abc");
  b.merges = {"a b", "b c"};
  auto tok = b.build();
  const int32_t id_a = tok->find_token("a"), id_c = tok->find_token("c");
  EXPECT_EQ(tok->encode("abc", false, false), (std::vector<int32_t>{ab, id_c}));
  b.merges = {"b c", "a b"};
  EXPECT_EQ(b.build()->encode("abc", false, false), (std::vector<int32_t>{id_a, bc}));
  b.merges = {"a b", "ab c"};
  EXPECT_EQ(b.build()->encode("abc abc", false, false),
            (std::vector<int32_t>{abc, tok->find_token("\xC4\xA0"), abc}));
  // No pre key: llama.cpp's default pre-tokenizer; BPE adds no BOS by default.
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->decode(tok->encode("a b\n", false, false)), "a b\n");
}

TEST(TokenizerUnit, BpeIgnoreMergesForLlama3) {
  auto b = VocabBuilder::bpe();
  const int32_t ab = b.add("ab");
  const int32_t abc = b.add("abc");
  const int32_t bos = b.add("<|begin_of_text|>", kControl);
  b.merges = {"a b"};
  b.extra = [&](GgufWriter& w) {
    w.add_string("tokenizer.ggml.pre", "gpt-2");
    w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos));
  };
  EXPECT_EQ(b.build()->encode("abc", false, false), (std::vector<int32_t>{ab, b.build()->find_token("c")}));
  b.extra = [&](GgufWriter& w) {
    w.add_string("tokenizer.ggml.pre", "llama-bpe");
    w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos));
  };
  auto tok = b.build();
  EXPECT_EQ(tok->encode("abc", false, false), (std::vector<int32_t>{abc}));  // whole word is a token
  EXPECT_TRUE(tok->add_bos());  // llama3 pre-tokenizers add BOS
  EXPECT_EQ(tok->encode("abc", true, false), (std::vector<int32_t>{bos, abc}));
}

TEST(TokenizerUnit, ValidationErrorsNameTheKey) {
  auto spm = VocabBuilder::spm();
  spm.add("a");

  auto b = spm;
  b.model = "bert";
  EXPECT_NE(load_error(b).find("'bert'"), std::string::npos) << load_error(b);

  b = VocabBuilder::bpe();
  b.merges = {"a b"};
  b.extra = [](GgufWriter& w) { w.add_string("tokenizer.ggml.pre", "no-such-pre"); };
  EXPECT_NE(load_error(b).find("no-such-pre"), std::string::npos) << load_error(b);

  b = VocabBuilder::bpe();  // no merges
  EXPECT_NE(load_error(b).find("tokenizer.ggml.merges"), std::string::npos) << load_error(b);

  b = spm;
  b.scores.pop_back();
  EXPECT_NE(load_error(b).find("tokenizer.ggml.scores"), std::string::npos) << load_error(b);

  b = spm;
  b.types.resize(3);
  EXPECT_NE(load_error(b).find("tokenizer.ggml.token_type"), std::string::npos) << load_error(b);

  b = spm;
  const auto n = static_cast<uint32_t>(spm.tokens.size());
  b.extra = [n](GgufWriter& w) { w.add_u32("tokenizer.ggml.bos_token_id", n); };
  EXPECT_NE(load_error(b).find("tokenizer.ggml.bos_token_id"), std::string::npos) << load_error(b);

  b = spm;
  b.extra = [](GgufWriter& w) { w.add_string("tokenizer.ggml.eos_token_id", "two"); };
  EXPECT_NE(load_error(b).find("tokenizer.ggml.eos_token_id"), std::string::npos) << load_error(b);

  b = spm;
  b.tokens.clear();
  b.scores.clear();
  b.types.clear();
  EXPECT_NE(load_error(b).find("tokenizer.ggml.tokens"), std::string::npos) << load_error(b);

  // 0xFFFFFFFF is the converters' "none": keep llama.cpp's default.
  b = spm;
  b.extra = [](GgufWriter& w) { w.add_u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFFu); };
  EXPECT_EQ(load_error(b), "<no error>");

  // A file without the model key.
  GgufWriter w;
  w.add_string_array("tokenizer.ggml.tokens", {"a"});
  const fs::path path = fs::temp_directory_path() / fmt::format("tandem_tok_nomodel_{}.gguf", ::getpid());
  w.write(path.string());
  auto file = GgufFile::open(path.string());
  fs::remove(path);
  try {
    Tokenizer::from_gguf(*file);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.model"), std::string::npos) << e.what();
  }

  auto tok = spm.build();
  EXPECT_THROW(tok->token_to_piece(-1), Error);
  EXPECT_THROW(tok->token_to_piece(tok->n_vocab()), Error);
  EXPECT_THROW(tok->decode({0, 1, tok->n_vocab() + 5}), Error);
}

TEST(TokenizerUnit, StreamDecoderHoldsBackPartialCharacters) {
  auto file = GgufFile::open(std::string(TANDEM_SHARED_DIR) + "/models/vocab/ggml-vocab-llama-spm.gguf");
  auto tok = Tokenizer::from_gguf(*file);
  const std::string llama = "\xF0\x9F\xA6\x99";  // U+1F999, not in the vocab: 4 byte tokens
  const auto ids = tok->encode(llama, false, false);
  ASSERT_EQ(ids.size(), 5u);  // "▁" then <0xF0> <0x9F> <0xA6> <0x99>
  StreamDecoder sd(*tok);
  EXPECT_EQ(sd.push(ids[0]), " ");
  EXPECT_EQ(sd.push(ids[1]), "");
  EXPECT_EQ(sd.push(ids[2]), "");
  EXPECT_EQ(sd.push(ids[3]), "");
  EXPECT_EQ(sd.push(ids[4]), llama);
  EXPECT_EQ(sd.flush(), "");

  // Cut short: flush shows one replacement character.
  EXPECT_EQ(sd.push(ids[1]), "");
  EXPECT_EQ(sd.push(ids[2]), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");

  // A byte that can never start a character is replaced at once; a lead byte
  // followed by a non-continuation is replaced and the rest goes through.
  const int32_t ff = tok->find_token("<0xFF>");
  const int32_t f0 = tok->find_token("<0xF0>");
  const int32_t a = tok->find_token("a");
  ASSERT_GE(ff, 0);
  EXPECT_EQ(sd.push(ff), "\xEF\xBF\xBD");
  EXPECT_EQ(sd.push(f0), "");
  EXPECT_EQ(sd.push(a), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(sd.flush(), "");

  // Control tokens stream as nothing.
  EXPECT_EQ(sd.push(tok->bos_id()), "");
}

TEST(TokenizerUnit, Utf8SequenceStatus) {
  using tok::utf8_sequence_status;
  EXPECT_EQ(utf8_sequence_status("a", 0), 1);
  EXPECT_EQ(utf8_sequence_status("\xC3\xA9", 0), 2);
  EXPECT_EQ(utf8_sequence_status("\xC3", 0), 0);
  EXPECT_EQ(utf8_sequence_status("\xE2\x82", 0), 0);
  EXPECT_EQ(utf8_sequence_status("\xE2\x82\xAC", 0), 3);
  EXPECT_EQ(utf8_sequence_status("\xF0\x9F\xA6\x99", 0), 4);
  EXPECT_EQ(utf8_sequence_status("\x80", 0), -1);
  EXPECT_EQ(utf8_sequence_status("\xC0\x80", 0), -1);      // overlong
  EXPECT_EQ(utf8_sequence_status("\xED\xA0\x80", 0), -1);  // surrogate
  EXPECT_EQ(utf8_sequence_status("\xF4\x90\x80\x80", 0), -1);  // > U+10FFFF
  EXPECT_EQ(utf8_sequence_status("\xE2" "a", 0), -1);
}

}  // namespace
}  // namespace tandem
