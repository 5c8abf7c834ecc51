// The o200k pre-tokenizer (tokenizer.ggml.pre = "gpt-4o": gpt-oss, llama4)
// against llama.cpp. No gpt-4o vocabulary GGUF is available here, so the GPT-2
// byte-level BPE vocabulary is copied with only tokenizer.ggml.pre changed,
// exactly as scripts/gen_gpt4o_tokenizer_refs.py did when llama.cpp wrote
// tests/data/tokenizer/ggml-vocab-gpt-4o.json: the ids then depend on the
// o200k splits, which decide which merges can apply.
#include "tokenizer_reference.h"

#include <unistd.h>

#include <filesystem>

#include "chat/model_chat.h"
#include "gguf/gguf.h"
#include "gguf/synth.h"
#include "model/model.h"
#include "test_support.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

namespace tandem {
namespace {

std::vector<uint8_t> gpt2_vocab_with_pre(const std::string& pre) {
  auto src = GgufFile::open(std::string(TANDEM_SHARED_DIR) + "/models/vocab/ggml-vocab-gpt-2.gguf");
  GgufWriter w;
  bool replaced = false;
  for (const auto& kv : src->metadata()) {
    if (kv.key == "general.alignment") continue;
    if (kv.key == "tokenizer.ggml.pre") {
      w.add_string(kv.key, pre);
      replaced = true;
    } else {
      w.add(kv.key, kv.value);
    }
  }
  if (!replaced) w.add_string("tokenizer.ggml.pre", pre);
  return w.to_bytes();
}

TEST(TokenizerGpt4o, MatchesLlamaCpp) {
  const auto bytes = gpt2_vocab_with_pre("gpt-4o");
  auto file = GgufFile::from_memory(bytes.data(), bytes.size(), "gpt-2 vocab as gpt-4o");
  auto tok = Tokenizer::from_gguf(*file);
  const auto ref = testing_tok::load_reference("ggml-vocab-gpt-4o.json");
  testing_tok::expect_metadata(*tok, ref);
  EXPECT_GE(testing_tok::expect_cases(*tok, ref), 400u);
  testing_tok::expect_pieces(*tok, ref);
}

TEST(TokenizerGpt4o, DecodeRestoresValidText) {
  const auto bytes = gpt2_vocab_with_pre("gpt-4o");
  auto file = GgufFile::from_memory(bytes.data(), bytes.size());
  auto tok = Tokenizer::from_gguf(*file);
  const auto ref = testing_tok::load_reference("ggml-vocab-gpt-4o.json");
  size_t n = 0;
  for (const auto& c : ref["cases"]) {
    const std::string text = testing_tok::unhex(c["hex"].get<std::string>());
    if (tok::sanitize_utf8(text) != text) continue;  // invalid UTF-8 cannot come back byte for byte
    // The byte-level vocabulary and clean_spaces = false make decoding exact.
    EXPECT_EQ(tok->decode(tok->encode(text, false, false)), text);
    ++n;
  }
  EXPECT_GE(n, 90u);
}

TEST(TokenizerGpt4o, SplitsByCaseRunsDigitTriplesAndPunctuationTails) {
  const auto* spec = tok::find_pre_tokenizer("gpt-4o");
  ASSERT_NE(spec, nullptr);
  EXPECT_FALSE(spec->clean_spaces);
  for (const char* alias : {"llama4", "kanana2", "talkie"}) EXPECT_EQ(tok::find_pre_tokenizer(alias), spec) << alias;
  tok::PreTokenizer pre(*spec);
  using V = std::vector<std::string>;
  EXPECT_EQ(pre.split("HelloWorld", false), (V{"Hello", "World"}));
  EXPECT_EQ(pre.split("HTTPServer abcDEFghi", false), (V{"HTTPServer", " abc", "DEFghi"}));
  EXPECT_EQ(pre.split(" 12345678", false), (V{" ", "123", "456", "78"}));
  EXPECT_EQ(pre.split("DON'T stop's", false), (V{"DON'T", " stop's"}));
  EXPECT_EQ(pre.split("end.\n/x", false), (V{"end", ".\n/", "x"}));
  // Non-ASCII letters count as upper and lower case alike (llama.cpp's rule).
  EXPECT_EQ(pre.split("\xC3\xA9" "cole\xC3\x89" "cole", false), (V{"\xC3\xA9" "cole\xC3\x89" "cole"}));
}

// gpt-oss with an o200k-pretokenized vocabulary, as real gpt-oss files carry:
// it loads, its tokenizer is the gpt-4o one, it generates, and its chat
// format (the architecture's default, the vocabulary having no template) is harmony.
TEST(TokenizerGpt4o, GptOssModelWithItLoadsAndRuns) {
  namespace fs = std::filesystem;
  const std::string tag = std::to_string(::getpid());
  const fs::path vocab = fs::temp_directory_path() / ("tandem_gpt4o_vocab_" + tag + ".gguf");
  const fs::path path = fs::temp_directory_path() / ("tandem_gpt4o_gptoss_" + tag + ".gguf");
  {
    const auto bytes = gpt2_vocab_with_pre("gpt-4o");
    std::ofstream(vocab, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  SynthSpec s;
  s.arch = "gpt-oss";
  s.n_layer = 2;
  s.n_embd = 64;
  s.n_ff = 96;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.head_dim = 32;
  s.n_expert = 8;
  s.n_expert_used = 2;
  s.n_ff_exp = 32;
  s.sliding_window = 8;
  s.vocab_from = vocab.string();
  synth_model(s, path.string(), 1);
  fs::remove(vocab);

  auto model = Model::load(path.string());
  const Tokenizer& tok = model->tokenizer();
  // Same ids as llama.cpp gave for the relabelled vocabulary.
  const auto ref = testing_tok::load_reference("ggml-vocab-gpt-4o.json");
  for (size_t i = 0; i < 20; ++i) {
    const auto& c = ref["cases"][i];
    const auto& e = c["encodings"][1];  // add_special = parse_special = false
    ASSERT_FALSE(e["add_special"].get<bool>());
    EXPECT_EQ(tok.encode(testing_tok::unhex(c["hex"].get<std::string>()), false, false),
              e["ids"].get<std::vector<int32_t>>());
  }
  auto file = GgufFile::open(path.string());
  const ChatTemplate chat = chat_template_for(*file);
  EXPECT_EQ(chat.family(), ChatFamily::kGptOss);
  const auto prompt = tok.encode(chat.apply({{"user", "What is 12345 + 678?"}}, true), true, true);
  const Completion out = test::greedy(*model, prompt, 8, /*stop_at_eog=*/false, 128);
  EXPECT_TRUE(out.error.empty()) << out.error;
  EXPECT_EQ(out.tokens.size(), 8u);
  model.reset();
  file.reset();
  fs::remove(path);
}

}  // namespace
}  // namespace tandem
