// llama.cpp's tokenizer test vectors (test-tokenizer-0): every .inp string,
// tokenized without BOS/EOS and without parsing special tokens, must give
// exactly the ids on the matching .out line.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

const std::string kVocabDir = std::string(TANDEM_SHARED_DIR) + "/models/vocab/";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// Same splitting as llama.cpp's tests/test-tokenizer-0.cpp.
std::vector<Case> read_cases(const std::string& gguf_path) {
  const std::string raw = read_file(gguf_path + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      inputs.push_back(raw.substr(pos));
      break;
    }
    inputs.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::istringstream out(read_file(gguf_path + ".out"));
  std::vector<Case> cases;
  std::string line;
  for (size_t i = 0; std::getline(out, line); ++i) {
    if (i >= inputs.size()) throw std::runtime_error("more .out lines than .inp tests in " + gguf_path);
    Case c{inputs[i], {}};
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  if (cases.size() != inputs.size()) throw std::runtime_error("test count mismatch in " + gguf_path);
  return cases;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

class VocabVectors : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabVectors, MatchesLlamaCpp) {
  const std::string path = kVocabDir + GetParam();
  auto file = GgufFile::open(path);
  auto tok = Tokenizer::from_gguf(*file);
  const auto cases = read_cases(path);
  ASSERT_GE(cases.size(), 40u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto got = tok->encode(cases[i].text, /*add_special=*/false, /*parse_special=*/false);
    EXPECT_EQ(got, cases[i].ids) << "test #" << i << " text '" << cases[i].text << "'\n got:  " << show(got)
                                 << "\n want: " << show(cases[i].ids);
  }
}

INSTANTIATE_TEST_SUITE_P(TokenizerVectors, VocabVectors,
                         ::testing::Values("ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf",
                                           "ggml-vocab-phi-3.gguf"));

// SPM vocabularies with byte fallback lose nothing: decode(encode(x)) == x for
// every test string (llama.cpp strips the space the prefix rule adds).
TEST(TokenizerVectors, SpmRoundTrip) {
  for (const char* name : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf"}) {
    const std::string path = kVocabDir + name;
    auto file = GgufFile::open(path);
    auto tok = Tokenizer::from_gguf(*file);
    for (const Case& c : read_cases(path)) {
      EXPECT_EQ(tok->decode(tok->encode(c.text, false, false)), c.text) << name;
      // With BOS first the prefix space stays (llama.cpp only strips it from
      // the very first piece, and BOS renders as nothing).
      const auto with_bos = tok->encode(c.text, true, false);
      ASSERT_FALSE(with_bos.empty());
      EXPECT_EQ(with_bos[0], tok->bos_id());
    }
  }
}

// GPT-2's byte-level alphabet is lossless too, up to llama.cpp's
// clean_up_tokenization_spaces, which only touches ASCII spaces before
// punctuation and apostrophes.
TEST(TokenizerVectors, Gpt2DecodeMatchesExpectedIds) {
  const std::string path = kVocabDir + "ggml-vocab-gpt-2.gguf";
  auto file = GgufFile::open(path);
  auto tok = Tokenizer::from_gguf(*file);
  EXPECT_EQ(tok->decode(tok->encode("Hello world", false, false)), "Hello world");
  EXPECT_EQ(tok->decode(tok->encode(" this is 🦙.cpp", false, false)), " this is 🦙.cpp");
  EXPECT_EQ(tok->decode(tok->encode("Hello , world !", false, false)), "Hello, world!");  // cleaned
  EXPECT_EQ(tok->decode(tok->encode("I 'm sure it 's", false, false)), "I'm sure it's");
  EXPECT_EQ(tok->decode(tok->encode("don 't", false, false)), "don 't");  // " 't" is kept
  EXPECT_EQ(tok->decode(tok->encode("a ' b", false, false)), "a'b");
  const int32_t eot = tok->find_token("<|endoftext|>");
  ASSERT_GE(eot, 0);
  EXPECT_TRUE(tok->is_eog(eot));
  EXPECT_EQ(tok->token_to_piece(eot), "");
  EXPECT_EQ(tok->token_to_piece(eot, true), "<|endoftext|>");
  EXPECT_FALSE(tok->add_bos());  // gpt-2 pre-tokenizer, no add_bos key
  // Control tokens are text unless parse_special.
  EXPECT_EQ(tok->encode("<|endoftext|>", false, true), std::vector<int32_t>{eot});
  EXPECT_NE(tok->encode("<|endoftext|>", false, false), std::vector<int32_t>{eot});
}

TEST(TokenizerVectors, Stories260K) {
  auto file = GgufFile::open(std::string(TANDEM_SHARED_DIR) + "/models/gguf/stories260K.gguf");
  auto tok = Tokenizer::from_gguf(*file);
  EXPECT_EQ(tok->n_vocab(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->encode("Once upon a time", true, false), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_TRUE(tok->is_eog(2));
  EXPECT_FALSE(tok->is_eog(1));

  // The reference greedy run's ids decode to its reference text.
  // The file holds '#' comments, the prompt ids, then the full sequence.
  std::istringstream ids_txt(
      read_file(std::string(TANDEM_SHARED_DIR) +
                "/models/reference/stories260K.greedy.n64.once_upon_a_time.token_ids.txt"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(ids_txt, line);) {
    if (!line.empty() && line[0] != '#') lines.push_back(line);
  }
  ASSERT_EQ(lines.size(), 2u);
  std::vector<int32_t> ids;
  std::istringstream full(lines[1]);
  for (int32_t id; full >> id;) ids.push_back(id);
  ASSERT_EQ(ids.size(), 65u);
  const std::string want = read_file(std::string(TANDEM_SHARED_DIR) +
                                     "/models/reference/stories260K.greedy.n64.once_upon_a_time.stdout.txt");
  ids.erase(ids.begin());  // BOS: llama2.c prints from the first prompt token
  std::string got = tok->decode(ids);
  // run.c prints a trailing newline after generation.
  EXPECT_EQ(got + "\n", want);
}

}  // namespace
}  // namespace tandem
