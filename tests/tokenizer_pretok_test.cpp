// BPE pre-tokenizer splits against an independent implementation (Python's
// `regex` module, scripts/gen_pretok_refs.py). For llama-bpe, qwen2 and the
// deepseek/falcon/starcoder/bloom/viking lists no vocab GGUF is available
// here, so they are verified at this split level only.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/pretokenizer.h"

namespace tandem::tok {
namespace {

TEST(TokenizerPretok, MatchesPythonRegexSplits) {
  std::ifstream f(std::string(TANDEM_TESTDATA_DIR) + "/tokenizer/pretok_splits.json");
  ASSERT_TRUE(f) << "missing tests/data/tokenizer/pretok_splits.json";
  const auto ref = nlohmann::json::parse(f);
  const auto texts = ref["texts"].get<std::vector<std::string>>();
  ASSERT_GE(texts.size(), 50u);
  size_t n_pre = 0;
  for (const auto& [name, splits] : ref["splits"].items()) {
    const PreTokenizerSpec* spec = find_pre_tokenizer(name);
    ASSERT_NE(spec, nullptr) << name;
    PreTokenizer pre(*spec);
    ASSERT_EQ(splits.size(), texts.size()) << name;
    for (size_t i = 0; i < texts.size(); ++i) {
      EXPECT_EQ(pre.split(texts[i], /*byte_encode=*/false), splits[i].get<std::vector<std::string>>())
          << "pre-tokenizer " << name << ", text #" << i << " '" << texts[i] << "'";
    }
    ++n_pre;
  }
  EXPECT_GE(n_pre, 10u);
}

TEST(TokenizerPretok, EverySupportedListCompiles) {
  for (const auto& spec : all_pre_tokenizers()) {
    ASSERT_FALSE(spec.names.empty());
    EXPECT_NO_THROW({
      PreTokenizer pre(spec);
      (void)pre.split("Hello, World! 123 \xE4\xB8\xAD\xE6\x96\x87\n", true);
    }) << spec.names[0];
    for (const auto& n : spec.names) EXPECT_EQ(find_pre_tokenizer(n), &spec) << n;
  }
  EXPECT_EQ(find_pre_tokenizer("no-such-pre"), nullptr);
  EXPECT_EQ(find_pre_tokenizer("default"), &default_pre_tokenizer());
}

TEST(TokenizerPretok, WhitespaceClassesAreLlamaCppWhitespace) {
  const std::string ws = expand_whitespace_classes(R"(\s)");
  EXPECT_EQ(ws.front(), '[');
  EXPECT_NE(ws.find(R"(\x{3000})"), std::string::npos);
  EXPECT_EQ(expand_whitespace_classes(R"([^\s\p{L}])").find(R"(\s)"), std::string::npos);
  EXPECT_EQ(expand_whitespace_classes(R"(\S)").substr(0, 2), "[^");
  EXPECT_EQ(expand_whitespace_classes(R"(a\\s)"), R"(a\\s)");  // an escaped backslash, then 's'
  EXPECT_THROW(expand_whitespace_classes(R"([\S])"), Error);

  // U+180E (Mongolian vowel separator) is whitespace to PCRE2 but not to
  // llama.cpp; U+0085 is whitespace to both. 0x1C is to neither.
  PreTokenizer gpt2(*find_pre_tokenizer("gpt-2"));
  EXPECT_EQ(gpt2.split("a\xE1\xA0\x8E" "b", false), (std::vector<std::string>{"a", "\xE1\xA0\x8E", "b"}));
  EXPECT_EQ(gpt2.split("a\xC2\x85\xC2\x85" "b", false),
            (std::vector<std::string>{"a", "\xC2\x85", "\xC2\x85", "b"}));
  EXPECT_EQ(gpt2.split("a\x1C" "b", false), (std::vector<std::string>{"a", "\x1C", "b"}));
}

TEST(TokenizerPretok, InvalidUtf8BecomesReplacementCharacters) {
  PreTokenizer gpt2(*find_pre_tokenizer("gpt-2"));
  // llama.cpp decodes each bad byte as U+FFFD before splitting.
  EXPECT_EQ(gpt2.split("ab\xFF\xFE" "cd", false),
            (std::vector<std::string>{"ab", "\xEF\xBF\xBD\xEF\xBF\xBD", "cd"}));
  EXPECT_EQ(gpt2.split("x \xE2\x82", false),
            (std::vector<std::string>{"x", " \xEF\xBF\xBD\xEF\xBF\xBD"}));
  // Byte-level encoding maps every byte into the printable GPT-2 alphabet.
  EXPECT_EQ(gpt2.split(" a\n", true), (std::vector<std::string>{"\xC4\xA0" "a", "\xC4\x8A"}));
}

}  // namespace
}  // namespace tandem::tok
