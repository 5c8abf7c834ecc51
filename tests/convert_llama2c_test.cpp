#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "convert/llama2c.h"
#include "core/error.h"
#include "gguf/gguf.h"

namespace fs = std::filesystem;
using namespace tandem;

namespace {

const std::string kModels = TANDEM_SHARED_DIR "/models";

std::vector<uint8_t> slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void spit(const fs::path& p, const std::vector<uint8_t>& d) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(d.data()), static_cast<std::streamsize>(d.size()));
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("tandem_convert_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
             "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path operator/(const std::string& n) const { return path_ / n; }

 private:
  fs::path path_;
};

std::string convert_error(const std::string& bin, const std::string& tok, const std::string& out) {
  try {
    convert_llama2c(bin, tok, out);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "conversion of " << bin << " succeeded";
  return "";
}

template <typename T>
void put(std::vector<uint8_t>& b, T v) {
  const size_t at = b.size();
  b.resize(at + sizeof(T));
  std::memcpy(b.data() + at, &v, sizeof(T));
}

}  // namespace

TEST(ConvertLlama2c, Stories260KMatchesShippedGguf) {
  TempDir dir;
  const std::string out = (dir / "stories260K.gguf").string();
  convert_llama2c(kModels + "/llama2c/stories260K.bin", kModels + "/llama2c/tok512.bin", out);
  auto mine = GgufFile::open(out);
  auto ref = GgufFile::open(kModels + "/gguf/stories260K.gguf");

  ASSERT_EQ(mine->tensors().size(), ref->tensors().size());
  for (size_t i = 0; i < ref->tensors().size(); ++i) {
    const GgufTensor& a = mine->tensors()[i];
    const GgufTensor& b = ref->tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.type, b.type) << b.name;
    EXPECT_EQ(a.dims, b.dims) << b.name;
    EXPECT_EQ(a.offset, b.offset) << b.name;
    ASSERT_EQ(a.n_bytes, b.n_bytes) << b.name;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.n_bytes), 0) << b.name << " differs";
  }

  EXPECT_EQ(mine->get_string_array("tokenizer.ggml.tokens"), ref->get_string_array("tokenizer.ggml.tokens"));
  EXPECT_EQ(mine->get_float_array("tokenizer.ggml.scores"), ref->get_float_array("tokenizer.ggml.scores"));
  EXPECT_EQ(mine->get_int_array("tokenizer.ggml.token_type"), ref->get_int_array("tokenizer.ggml.token_type"));
  for (const char* k : {"general.architecture", "tokenizer.ggml.model"})
    EXPECT_EQ(mine->get_string(k), ref->get_string(k)) << k;
  for (const char* k : {"llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count",
                        "llama.attention.head_count_kv", "llama.block_count", "llama.rope.dimension_count",
                        "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.bos_token_id",
                        "tokenizer.ggml.eos_token_id"})
    EXPECT_EQ(mine->get_int(k), ref->get_int(k)) << k;
  EXPECT_EQ(mine->get_float("llama.attention.layer_norm_rms_epsilon"),
            ref->get_float("llama.attention.layer_norm_rms_epsilon"));
  // The checkpoint's own seq_len (the shipped file carries llama.cpp's default 2048).
  EXPECT_EQ(mine->get_int("llama.context_length"), 512);
}

// A tiny synthetic checkpoint whose every float is its own index in the weight
// area, with an unshared classifier, checks the llama2.c layout tensor by tensor.
TEST(ConvertLlama2c, SyntheticLayoutAndUnsharedClassifier) {
  TempDir dir;
  const int32_t dim = 4, hidden = 6, layers = 2, heads = 2, kv_heads = 1, vocab = 5, seq = 3;
  const int64_t hs = dim / heads, kv = kv_heads * hs;
  std::vector<uint8_t> bin;
  for (int32_t v : {dim, hidden, layers, heads, kv_heads, -vocab, seq}) put(bin, v);
  const int64_t n_floats = vocab * dim + layers * (dim + dim * dim + 2 * dim * kv + dim * dim + dim +
                                                   3 * dim * hidden) +
                           dim + seq * hs + vocab * dim;
  for (int64_t i = 0; i < n_floats; ++i) put(bin, static_cast<float>(i));
  spit(dir / "m.bin", bin);

  std::vector<uint8_t> tok;
  put<int32_t>(tok, 6);
  for (std::string t : {"<unk>", "\n<s>\n", "\n</s>\n", "<0x41>", " the"}) {
    put<float>(tok, -1.5f);
    put<int32_t>(tok, static_cast<int32_t>(t.size()));
    tok.insert(tok.end(), t.begin(), t.end());
  }
  spit(dir / "t.bin", tok);
  convert_llama2c((dir / "m.bin").string(), (dir / "t.bin").string(), (dir / "o.gguf").string());
  auto f = GgufFile::open((dir / "o.gguf").string());

  // Index of each array's first float, in llama2.c's order.
  int64_t at = 0;
  std::map<std::string, int64_t> first;
  auto next = [&](const std::string& n, int64_t count) { first[n] = at; at += count; };
  next("token_embd.weight", vocab * dim);
  for (auto [n, c] : std::vector<std::pair<std::string, int64_t>>{
           {"attn_norm", dim}, {"attn_q", dim * dim}, {"attn_k", dim * kv}, {"attn_v", dim * kv},
           {"attn_output", dim * dim}, {"ffn_norm", dim}, {"ffn_gate", dim * hidden},
           {"ffn_down", hidden * dim}, {"ffn_up", dim * hidden}})
    for (int l = 0; l < layers; ++l) next("blk." + std::to_string(l) + "." + n + ".weight", c);
  next("output_norm.weight", dim);
  at += seq * hs;  // freq_cis_real + freq_cis_imag
  next("output.weight", vocab * dim);
  ASSERT_EQ(at, n_floats);

  ASSERT_EQ(f->tensors().size(), 3u + 9u * layers);
  for (const auto& t : f->tensors()) {
    ASSERT_TRUE(first.count(t.name)) << t.name;
    EXPECT_EQ(t.type, GgmlType::F32);
    std::vector<float> v(static_cast<size_t>(t.n_elements));
    std::memcpy(v.data(), t.data, t.n_bytes);
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(v[i], static_cast<float>(first[t.name] + static_cast<int64_t>(i))) << t.name;
  }
  EXPECT_EQ(f->find_tensor("blk.1.attn_k.weight")->dims, (std::vector<int64_t>{dim, kv}));
  EXPECT_EQ(f->find_tensor("blk.0.ffn_down.weight")->dims, (std::vector<int64_t>{hidden, dim}));
  EXPECT_EQ(f->find_tensor("output.weight")->dims, (std::vector<int64_t>{dim, vocab}));
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), kv_heads);
  EXPECT_EQ(f->get_int("llama.rope.dimension_count"), hs);
  EXPECT_EQ(f->get_int("llama.context_length"), seq);

  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens"),
            (std::vector<std::string>{"<unk>", "<s>", "</s>", "<0x41>", "\xe2\x96\x81the"}));
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type"), (std::vector<int64_t>{2, 3, 3, 6, 1}));
  EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores"), std::vector<float>(5, -1.5f));
}

TEST(ConvertLlama2c, BadCheckpointsAreRejected) {
  TempDir dir;
  const auto bin = slurp(kModels + "/llama2c/stories260K.bin");
  const std::string tok = kModels + "/llama2c/tok512.bin";
  const std::string out = (dir / "o.gguf").string();
  auto with = [&](std::vector<uint8_t> b) {
    spit(dir / "m.bin", b);
    return (dir / "m.bin").string();
  };
  auto expect_msg = [](const std::string& m, const char* word) {
    EXPECT_NE(m.find(word), std::string::npos) << "missing '" << word << "' in: " << m;
  };

  expect_msg(convert_error(with({bin.begin(), bin.end() - 4}), tok, out), "truncated");
  expect_msg(convert_error(with({bin.begin(), bin.begin() + 20}), tok, out), "truncated");
  auto extra = bin;
  extra.push_back(0);
  expect_msg(convert_error(with(extra), tok, out), "inconsistent header");
  auto set = [&](int field, int32_t v) {
    auto b = bin;
    std::memcpy(b.data() + 4 * field, &v, 4);
    return with(b);
  };
  expect_msg(convert_error(set(0, 0), tok, out), "dim = 0");
  expect_msg(convert_error(set(3, 7), tok, out), "multiple of n_heads");
  expect_msg(convert_error(set(4, 3), tok, out), "n_kv_heads");
  expect_msg(convert_error(set(2, 0x7fffffff), tok, out), "implies");  // no huge allocation
  expect_msg(convert_error(set(0, 0x616b3432), tok, out), "ak42");
  expect_msg(convert_error((dir / "missing.bin").string(), tok, out), "missing.bin");
  EXPECT_FALSE(fs::exists(out));
}

TEST(ConvertLlama2c, BadTokenizersAreRejected) {
  TempDir dir;
  const std::string bin = kModels + "/llama2c/stories260K.bin";
  const std::string out = (dir / "o.gguf").string();
  const auto tok = slurp(kModels + "/llama2c/tok512.bin");
  spit(dir / "t.bin", {tok.begin(), tok.end() - 1});
  EXPECT_NE(convert_error(bin, (dir / "t.bin").string(), out).find("truncated"), std::string::npos);
  // The 32000-token Llama 2 tokenizer does not fit a 512-token model.
  EXPECT_NE(convert_error(bin, kModels + "/llama2c/tokenizer.bin", out).find("vocab_size"),
            std::string::npos);
  auto bad_len = tok;
  const int32_t huge = 1 << 30;
  std::memcpy(bad_len.data() + 8, &huge, 4);  // length of token 0
  spit(dir / "t.bin", bad_len);
  EXPECT_NE(convert_error(bin, (dir / "t.bin").string(), out).find("token 0 has length"), std::string::npos);
}
