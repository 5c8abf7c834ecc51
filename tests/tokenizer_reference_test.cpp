// llama.cpp's gpt-2 / llama-spm / phi-3 test vocabularies against llama.cpp's
// own output (scripts/gen_tokenizer_refs.py) on strings the .inp vectors lack:
// special tokens with and without parse_special (phi-3's user-defined,
// right-stripping "</s>"), BOS/EOS, unusual whitespace, invalid UTF-8, and the
// detokenizer's space clean-up.
#include "tokenizer_reference.h"

#include "gguf/gguf.h"

namespace tandem {
namespace {

class ReferenceVocab : public ::testing::TestWithParam<const char*> {};

TEST_P(ReferenceVocab, MatchesLlamaCpp) {
  const std::string name = GetParam();
  auto file = GgufFile::open(std::string(TANDEM_SHARED_DIR) + "/models/vocab/" + name + ".gguf");
  auto tok = Tokenizer::from_gguf(*file);
  const auto ref = testing_tok::load_reference(name + ".json");
  testing_tok::expect_metadata(*tok, ref);
  EXPECT_GE(testing_tok::expect_cases(*tok, ref), 100u);
  testing_tok::expect_pieces(*tok, ref);
}

INSTANTIATE_TEST_SUITE_P(TokenizerReference, ReferenceVocab,
                         ::testing::Values("ggml-vocab-gpt-2", "ggml-vocab-llama-spm", "ggml-vocab-phi-3"));

}  // namespace
}  // namespace tandem
