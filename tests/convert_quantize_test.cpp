// tandem quantize: every type on stories260K (F32) and on small synth models,
// the per-tensor types against llama.cpp's rules (the expected tables below
// are worked out by hand from llama_tensor_get_type in llama.cpp's
// src/llama-quant.cpp), the values against the source within each type's
// error, the file layout llama.cpp writes, and the CLI's errors.
// bench/quantize_compare.py checks the same files against llama.cpp itself.
#include "convert/quantize.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gguf/synth.h"
#include "core/error.h"
#include "quant/quant.h"
#include "runtime/thread_pool.h"
#include "eval/perplexity.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "sha256_file.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

const std::string kStories = test::shared_path("models/gguf/stories260K.gguf");

// A fresh directory per test, removed at the end.
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(fs::temp_directory_path() / ("tandem_quantize_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }
  std::vector<std::string> entries() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(path_)) v.push_back(e.path().filename().string());
    return v;
  }

 private:
  fs::path path_;
};

QuantizeType type_of(const std::string& name) {
  auto t = find_quantize_type(name);
  if (!t) throw std::runtime_error("no type " + name);
  return *t;
}

QuantizeReport quantize(const std::string& in, const std::string& out, const std::string& type,
                        QuantizeOptions o = {}) {
  if (o.n_threads == 0) o.n_threads = 2;
  return quantize_model(in, out, type_of(type), o);
}

std::map<std::string, std::string> types_by_name(const GgufFile& f) {
  std::map<std::string, std::string> m;
  for (const auto& t : f.tensors()) m[t.name] = std::string(type_traits(t.type).name);
  return m;
}

std::vector<float> values(const GgufTensor& t) {
  std::vector<float> v(static_cast<size_t>(t.n_elements));
  const int64_t ne0 = t.dims[0];
  const size_t rb = row_bytes(t.type, ne0);
  for (int64_t r = 0; r < t.rows(); ++r) dequantize_row(t.type, t.data + r * rb, v.data() + r * ne0, ne0);
  return v;
}

// RMS of the difference over RMS of the source.
double rel_rms_error(const std::vector<float>& want, const std::vector<float>& got) {
  double e = 0, s = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    e += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    s += double(want[i]) * want[i];
  }
  return s > 0 ? std::sqrt(e / s) : std::sqrt(e);
}

// What each block type may lose on trained or Gaussian weights: a few times
// the step over sqrt(12) of its levels.
double max_rel_error(const std::string& type) {
  static const std::map<std::string, double> k = {
      {"f32", 0.0},   {"f16", 1e-3},  {"bf16", 6e-3}, {"q8_0", 0.012}, {"q6_K", 0.03},  {"q5_0", 0.06},
      {"q5_1", 0.06}, {"q5_K", 0.06}, {"q4_0", 0.13}, {"q4_1", 0.13},  {"q4_K", 0.13}, {"q3_K", 0.26},
      {"q2_K", 0.5}};
  return k.at(type);
}

// ---------------------------------------------------------------- type names

TEST(QuantizeTypes, NamesAsLlamaQuantizeTakesThem) {
  EXPECT_EQ(type_of("q4_k_m").ftype, 15u);
  EXPECT_EQ(type_of("Q4_K_M").ftype, 15u);
  EXPECT_EQ(type_of("Q4_K").ftype, 15u);  // the aliases are the _M mixes
  EXPECT_EQ(type_of("q3_k").ftype, 12u);
  EXPECT_EQ(type_of("Q5_K").ftype, 17u);
  EXPECT_EQ(type_of("bf16").ftype, 32u);
  EXPECT_EQ(type_of("F32").ftype, 0u);
  EXPECT_EQ(type_of("q8_0").ftype, 7u);
  EXPECT_EQ(type_of("15").ftype, 15u);  // llama_ftype numbers
  EXPECT_STREQ(type_of("15").name, "Q4_K_M");
  EXPECT_STREQ(type_of("7").name, "Q8_0");
  EXPECT_FALSE(find_quantize_type("q4_k_x"));
  EXPECT_FALSE(find_quantize_type("iq4_xs"));  // no such format in Tandem
  EXPECT_FALSE(find_quantize_type("q2_k_s"));  // needs an importance matrix
  EXPECT_FALSE(find_quantize_type("5"));       // a removed ftype
  EXPECT_FALSE(find_quantize_type(""));
  const std::string list = quantize_type_list();
  for (const char* n : {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M",
                        "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K"})
    EXPECT_NE(list.find(n), std::string::npos) << n;
}

// ------------------------------------------------------- stories260K, all types

// stories260K: 64 wide (no K-quant block fits: llama.cpp falls back), FFN 172
// wide (not even a 32-block: ffn_down goes to F16), 5 layers, separate output,
// 8 heads / 4 KV heads. Expected types by llama.cpp's rules:
// {output, token_embd, attn_q/k/gate/up, attn_output, attn_v by layer, ffn_down}.
struct StoriesExpect {
  const char* type;
  const char* output;
  const char* embd;
  const char* rest;
  const char* attn_output;
  std::vector<const char*> attn_v;
  const char* ffn_down;
};

const std::vector<StoriesExpect> kStoriesExpect = {
    {"F32", "f32", "f32", "f32", "f32", {"f32", "f32", "f32", "f32", "f32"}, "f32"},
    {"F16", "f16", "f16", "f16", "f16", {"f16", "f16", "f16", "f16", "f16"}, "f16"},
    {"BF16", "bf16", "bf16", "bf16", "bf16", {"bf16", "bf16", "bf16", "bf16", "bf16"}, "bf16"},
    {"Q8_0", "q8_0", "q8_0", "q8_0", "q8_0", {"q8_0", "q8_0", "q8_0", "q8_0", "q8_0"}, "f16"},
    // The output matrix becomes Q6_K, which falls back to Q8_0 on 64-wide rows.
    {"Q4_0", "q8_0", "q4_0", "q4_0", "q4_0", {"q4_0", "q4_0", "q4_0", "q4_0", "q4_0"}, "f16"},
    {"Q4_1", "q8_0", "q4_1", "q4_1", "q4_1", {"q4_1", "q4_1", "q4_1", "q4_1", "q4_1"}, "f16"},
    {"Q5_0", "q8_0", "q5_0", "q5_0", "q5_0", {"q5_0", "q5_0", "q5_0", "q5_0", "q5_0"}, "f16"},
    {"Q5_1", "q8_0", "q5_1", "q5_1", "q5_1", {"q5_1", "q5_1", "q5_1", "q5_1", "q5_1"}, "f16"},
    // K-quants: Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0.
    {"Q2_K", "q8_0", "q4_0", "q4_0", "q4_0", {"q4_0", "q4_0", "q4_0", "q4_0", "q4_0"}, "f16"},
    {"Q3_K_S", "q8_0", "q4_0", "q4_0", "q4_0", {"q4_0", "q4_0", "q4_0", "q4_0", "q4_0"}, "f16"},
    {"Q3_K_M", "q8_0", "q4_0", "q4_0", "q5_0", {"q5_1", "q5_1", "q5_0", "q5_0", "q5_0"}, "f16"},
    {"Q3_K_L", "q8_0", "q4_0", "q4_0", "q5_1", {"q5_1", "q5_1", "q5_1", "q5_1", "q5_1"}, "f16"},
    {"Q4_K_S", "q8_0", "q5_0", "q5_0", "q5_0", {"q5_1", "q5_1", "q5_1", "q5_1", "q5_0"}, "f16"},
    {"Q4_K_M", "q8_0", "q5_0", "q5_0", "q5_0", {"q5_0", "q5_0", "q8_0", "q5_0", "q8_0"}, "f16"},
    {"Q5_K_S", "q8_0", "q5_1", "q5_1", "q5_1", {"q5_1", "q5_1", "q5_1", "q5_1", "q5_1"}, "f16"},
    {"Q5_K_M", "q8_0", "q5_1", "q5_1", "q5_1", {"q5_1", "q5_1", "q8_0", "q5_1", "q8_0"}, "f16"},
    {"Q6_K", "q8_0", "q8_0", "q8_0", "q8_0", {"q8_0", "q8_0", "q8_0", "q8_0", "q8_0"}, "f16"},
};

TEST(Quantize, EveryTypeOnStories260K) {
  TempDir dir("stories");
  auto src = GgufFile::open(kStories);
  for (const StoriesExpect& x : kStoriesExpect) {
    SCOPED_TRACE(x.type);
    const std::string out = dir.file(std::string(x.type) + ".gguf");
    const QuantizeReport rep = quantize(kStories, out, x.type);
    auto f = GgufFile::open(out);
    const auto types = types_by_name(*f);
    ASSERT_EQ(types.size(), src->tensors().size());
    EXPECT_EQ(types.at("output.weight"), x.output);
    EXPECT_EQ(types.at("token_embd.weight"), x.embd);
    EXPECT_EQ(types.at("output_norm.weight"), "f32");
    for (int il = 0; il < 5; ++il) {
      const std::string b = "blk." + std::to_string(il) + ".";
      for (const char* n : {"attn_q.weight", "attn_k.weight", "ffn_gate.weight", "ffn_up.weight"})
        EXPECT_EQ(types.at(b + n), x.rest) << b << n;
      EXPECT_EQ(types.at(b + "attn_output.weight"), x.attn_output) << il;
      EXPECT_EQ(types.at(b + "attn_v.weight"), x.attn_v[static_cast<size_t>(il)]) << il;
      EXPECT_EQ(types.at(b + "ffn_down.weight"), x.ffn_down) << il;
      EXPECT_EQ(types.at(b + "attn_norm.weight"), "f32");
      EXPECT_EQ(types.at(b + "ffn_norm.weight"), "f32");
    }
    // Metadata: general.file_type is the llama_ftype, quantization version 2.
    EXPECT_EQ(f->get_int("general.file_type").value(), type_of(x.type).ftype);
    EXPECT_EQ(f->get_int("general.quantization_version").value(), 2);
    EXPECT_EQ(f->get_int("llama.block_count").value(), 5);
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens")->size(), 512u);
    EXPECT_EQ(f->alignment(), 32u);
    EXPECT_EQ(rep.n_tensors, 48);
    EXPECT_EQ(rep.file_bytes, f->file_size());
    // Values: each tensor within its type's error of the F32 source; vectors unchanged.
    for (const GgufTensor& t : f->tensors()) {
      const GgufTensor* s = src->find_tensor(t.name);
      ASSERT_NE(s, nullptr) << t.name;
      EXPECT_EQ(t.dims, s->dims) << t.name;
      if (t.type == GgmlType::F32) {
        EXPECT_EQ(0, std::memcmp(t.data, s->data, t.n_bytes)) << t.name;
        continue;
      }
      const double err = rel_rms_error(values(*s), values(t));
      EXPECT_LE(err, max_rel_error(std::string(type_traits(t.type).name))) << t.name;
    }
    fs::remove(out);
  }
  EXPECT_TRUE(dir.entries().empty());
}

// Tandem loads the output and it still predicts: the perplexity of a story
// stays near the F32 model's.
double stories_ppl(const std::string& path) {
  auto model = Model::load(path);
  std::string text = test::read_file(test::testdata_path("perplexity/stories.txt"));
  const std::vector<int32_t> tokens = model->tokenizer().encode(text, true, false);
  PerplexityOptions o;
  o.n_ctx = 128;
  o.max_chunks = 4;
  o.kv_cache = {KvType::kF32, KvType::kF32};
  o.threads = 2;
  return perplexity(*model, tokens, o).ppl;
}

TEST(Quantize, Stories260KStillPredicts) {
  TempDir dir("stories_ppl");
  const double base = stories_ppl(kStories);
  for (const auto& [type, tol] : std::vector<std::pair<std::string, double>>{
           {"F16", 0.002}, {"Q8_0", 0.01}, {"Q4_K_M", 0.08}, {"Q2_K", 0.4}}) {
    const std::string out = dir.file(type + ".gguf");
    quantize(kStories, out, type);
    const double ppl = stories_ppl(out);
    EXPECT_NEAR(ppl, base, tol * base) << type;
  }
}

// ------------------------------------------------------ synth: the mix rules

// A gemma3 shape whose widths fit the K-quant blocks (no fallback), 8 layers
// (use_more_bits: layers 0, 3, 6, 7), 4 heads sharing 1 KV head (n_gqa 4),
// tied embeddings (token_embd takes the output matrix's rules).
std::string make_synth(const TempDir& dir, const std::string& type = "f32") {
  SynthSpec s;
  s.arch = "gemma3";
  s.n_layer = 8, s.n_embd = 256, s.n_ff = 256, s.n_head = 4, s.n_head_kv = 1, s.head_dim = 64;
  s.n_ctx = 256, s.sliding_window = 64, s.type = type, s.seed = 11, s.vocab_from = kStories;
  const std::string path = dir.file("synth-" + type + ".gguf");
  synth_model(s, path, 2);
  return path;
}

struct SynthExpect {
  const char* type;
  const char* embd;
  const char* rest;         // attn_q, attn_k, ffn_gate, ffn_up
  const char* attn_output;
  const char* attn_v[8];
  const char* ffn_down[8];
};

const std::vector<SynthExpect> kSynthExpect = {
    {"F16", "f16", "f16", "f16", {"f16", "f16", "f16", "f16", "f16", "f16", "f16", "f16"},
     {"f16", "f16", "f16", "f16", "f16", "f16", "f16", "f16"}},
    {"Q8_0", "q8_0", "q8_0", "q8_0", {"q8_0", "q8_0", "q8_0", "q8_0", "q8_0", "q8_0", "q8_0", "q8_0"},
     {"q8_0", "q8_0", "q8_0", "q8_0", "q8_0", "q8_0", "q8_0", "q8_0"}},
    // A tied embedding is the output matrix: Q6_K, now that 256 divides its rows.
    {"Q4_0", "q6_K", "q4_0", "q4_0", {"q4_0", "q4_0", "q4_0", "q4_0", "q4_0", "q4_0", "q4_0", "q4_0"},
     {"q4_0", "q4_0", "q4_0", "q4_0", "q4_0", "q4_0", "q4_0", "q4_0"}},
    {"Q5_1", "q6_K", "q5_1", "q5_1", {"q5_1", "q5_1", "q5_1", "q5_1", "q5_1", "q5_1", "q5_1", "q5_1"},
     {"q5_1", "q5_1", "q5_1", "q5_1", "q5_1", "q5_1", "q5_1", "q5_1"}},
    // n_gqa >= 4: attn_v in Q4_K.
    {"Q2_K", "q6_K", "q2_K", "q3_K", {"q4_K", "q4_K", "q4_K", "q4_K", "q4_K", "q4_K", "q4_K", "q4_K"},
     {"q3_K", "q3_K", "q3_K", "q3_K", "q3_K", "q3_K", "q3_K", "q3_K"}},
    {"Q3_K_S", "q6_K", "q3_K", "q3_K", {"q3_K", "q3_K", "q3_K", "q3_K", "q3_K", "q3_K", "q3_K", "q3_K"},
     {"q3_K", "q3_K", "q3_K", "q3_K", "q3_K", "q3_K", "q3_K", "q3_K"}},
    // The first two attn_v in Q5_K; ffn_down's first sixteenth (none of 8 layers) in Q5_K.
    {"Q3_K_M", "q6_K", "q3_K", "q4_K", {"q5_K", "q5_K", "q4_K", "q4_K", "q4_K", "q4_K", "q4_K", "q4_K"},
     {"q4_K", "q4_K", "q4_K", "q4_K", "q4_K", "q4_K", "q4_K", "q4_K"}},
    {"Q3_K_L", "q6_K", "q3_K", "q5_K", {"q5_K", "q5_K", "q5_K", "q5_K", "q5_K", "q5_K", "q5_K", "q5_K"},
     {"q5_K", "q5_K", "q5_K", "q5_K", "q5_K", "q5_K", "q5_K", "q5_K"}},
    // The first four attn_v and the first eighth of ffn_down in Q5_K.
    {"Q4_K_S", "q6_K", "q4_K", "q4_K", {"q5_K", "q5_K", "q5_K", "q5_K", "q4_K", "q4_K", "q4_K", "q4_K"},
     {"q5_K", "q4_K", "q4_K", "q4_K", "q4_K", "q4_K", "q4_K", "q4_K"}},
    {"Q4_K_M", "q6_K", "q4_K", "q4_K", {"q6_K", "q4_K", "q4_K", "q6_K", "q4_K", "q4_K", "q6_K", "q6_K"},
     {"q6_K", "q4_K", "q4_K", "q6_K", "q4_K", "q4_K", "q6_K", "q6_K"}},
    {"Q5_K_S", "q6_K", "q5_K", "q5_K", {"q5_K", "q5_K", "q5_K", "q5_K", "q5_K", "q5_K", "q5_K", "q5_K"},
     {"q5_K", "q5_K", "q5_K", "q5_K", "q5_K", "q5_K", "q5_K", "q5_K"}},
    {"Q5_K_M", "q6_K", "q5_K", "q5_K", {"q6_K", "q5_K", "q5_K", "q6_K", "q5_K", "q5_K", "q6_K", "q6_K"},
     {"q6_K", "q5_K", "q5_K", "q6_K", "q5_K", "q5_K", "q6_K", "q6_K"}},
    {"Q6_K", "q6_K", "q6_K", "q6_K", {"q6_K", "q6_K", "q6_K", "q6_K", "q6_K", "q6_K", "q6_K", "q6_K"},
     {"q6_K", "q6_K", "q6_K", "q6_K", "q6_K", "q6_K", "q6_K", "q6_K"}},
};

void expect_synth_types(const SynthExpect& x, const std::map<std::string, std::string>& types) {
  EXPECT_EQ(types.at("token_embd.weight"), x.embd);
  EXPECT_EQ(types.count("output.weight"), 0u);
  for (int il = 0; il < 8; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    for (const char* n : {"attn_q.weight", "attn_k.weight", "ffn_gate.weight", "ffn_up.weight"})
      EXPECT_EQ(types.at(b + n), x.rest) << b << n;
    EXPECT_EQ(types.at(b + "attn_output.weight"), x.attn_output) << il;
    EXPECT_EQ(types.at(b + "attn_v.weight"), x.attn_v[il]) << il;
    EXPECT_EQ(types.at(b + "ffn_down.weight"), x.ffn_down[il]) << il;
    for (const char* n : {"attn_norm.weight", "attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight",
                          "ffn_norm.weight", "post_ffw_norm.weight"})
      EXPECT_EQ(types.at(b + n), "f32") << b << n;
  }
}

// Every mix's types (the plan alone: the K-quant searches take a while), then
// three mixes that between them write every K-quant block type, read back and
// checked against the source.
TEST(Quantize, MixRulesOnASynthModel) {
  TempDir dir("synth");
  const std::string in = make_synth(dir);
  auto src = GgufFile::open(in);
  for (const SynthExpect& x : kSynthExpect) {
    SCOPED_TRACE(x.type);
    std::map<std::string, std::string> types;
    for (const auto& e : plan_quantization(*src, type_of(x.type), {})) {
      EXPECT_FALSE(e.fallback) << e.name;
      types[e.name] = std::string(type_traits(e.dst_type).name);
    }
    expect_synth_types(x, types);
  }
  for (const char* type : {"Q2_K", "Q3_K_L", "Q4_K_M"}) {
    SCOPED_TRACE(type);
    const std::string out = dir.file(std::string(type) + ".gguf");
    const QuantizeReport rep = quantize(in, out, type);
    EXPECT_EQ(rep.n_fallback, 0);
    auto f = GgufFile::open(out);
    for (const SynthExpect& x : kSynthExpect)
      if (std::string(x.type) == type) expect_synth_types(x, types_by_name(*f));
    for (const GgufTensor& t : f->tensors()) {
      if (t.type == GgmlType::F32) continue;
      const double err = rel_rms_error(values(*src->find_tensor(t.name)), values(t));
      EXPECT_LE(err, max_rel_error(std::string(type_traits(t.type).name))) << t.name;
    }
    fs::remove(out);
  }
}

// The file as llama.cpp writes it: tensors ordered by layer then name (the
// non-layer ones first), data offsets 32-aligned, the input's keys in order
// with general.quantization_version and general.file_type moved to the end.
TEST(Quantize, FileLayoutAsLlamaCppWritesIt) {
  TempDir dir("layout");
  const std::string out = dir.file("q4km.gguf");
  quantize(kStories, out, "q4_k_m");
  auto in = GgufFile::open(kStories);
  auto f = GgufFile::open(out);
  std::vector<std::string> names;
  for (const auto& t : f->tensors()) names.push_back(t.name);
  std::vector<std::string> want = {"output.weight", "output_norm.weight", "token_embd.weight"};
  for (int il = 0; il < 5; ++il)
    for (const char* n : {"attn_k.weight", "attn_norm.weight", "attn_output.weight", "attn_q.weight", "attn_v.weight",
                          "ffn_down.weight", "ffn_gate.weight", "ffn_norm.weight", "ffn_up.weight"})
      want.push_back("blk." + std::to_string(il) + "." + n);
  EXPECT_EQ(names, want);
  uint64_t expect_off = 0;
  for (const auto& t : f->tensors()) {
    EXPECT_EQ(t.offset, expect_off) << t.name;
    expect_off = (t.offset + t.n_bytes + 31) / 32 * 32;
  }
  EXPECT_EQ(f->data_offset() + expect_off, f->file_size());
  std::vector<std::string> keys_in, keys_out;
  for (const auto& kv : in->metadata()) keys_in.push_back(kv.key);
  for (const auto& kv : f->metadata()) keys_out.push_back(kv.key);
  keys_in.push_back("general.quantization_version");
  keys_in.push_back("general.file_type");
  EXPECT_EQ(keys_out, keys_in);
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), in->get_string("tokenizer.ggml.model"));
  EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores"), in->get_float_array("tokenizer.ggml.scores"));
}

TEST(Quantize, OutputDoesNotDependOnThreads) {
  TempDir dir("threads");
  const std::string in = make_synth(dir);
  QuantizeOptions one, two;
  one.n_threads = 1;
  two.n_threads = 2;
  quantize(in, dir.file("a.gguf"), "q3_k_m", one);
  quantize(in, dir.file("b.gguf"), "q3_k_m", two);
  EXPECT_EQ(test::sha256_file(dir.file("a.gguf")), test::sha256_file(dir.file("b.gguf")));
}

// Blocks as quant/quant.h's reference quantizers make them (which follow
// ggml's quantize_row_*_ref byte for byte): synth's file in a pure type, made
// from the same random values, is what --pure makes of synth's F32 file.
TEST(Quantize, BlocksEqualTheReferenceQuantizers) {
  TempDir dir("blocks");
  const std::string in = make_synth(dir);
  QuantizeOptions pure;
  pure.pure = true;
  for (const char* type : {"q5_1", "q4_k"}) {
    SCOPED_TRACE(type);
    const std::string want_path = make_synth(dir, type);  // synth's pure types
    // synth's q3_k etc. are pure; tandem quantize's Q3_K is the _M mix, so
    // name the type through its _S form (with --pure all the same).
    std::string qt = type;
    if (qt == "q3_k") qt = "q3_k_s";
    if (qt == "q4_k") qt = "q4_k_s";
    if (qt == "q5_k") qt = "q5_k_s";
    quantize(in, dir.file("out.gguf"), qt, pure);
    auto got = GgufFile::open(dir.file("out.gguf"));
    auto want = GgufFile::open(want_path);
    for (const GgufTensor& t : got->tensors()) {
      const GgufTensor* w = want->find_tensor(t.name);
      ASSERT_NE(w, nullptr);
      ASSERT_EQ(t.type, w->type) << t.name;
      EXPECT_EQ(0, std::memcmp(t.data, w->data, t.n_bytes)) << t.name;
    }
  }
}

// ------------------------------------------- byte for byte as llama.cpp

// SHA-256 of the files llama.cpp 0.3.36 (llama-cpp-python's llama_model_quantize,
// no importance matrix) wrote from the same inputs: stories260K.gguf, and
// make_synth's F32 file (which synth writes identically on any x86-64
// build). bench/quantize_compare.py makes the same comparison on Gemma 3.
const std::map<std::string, std::string> kLlamaCppStories = {
    {"F32", "f18837d06914bcc627d8b93c818b453823493a057041a85a8484819de8938664"},
    {"F16", "4cd29bbe9cb3b735750837816a43c3dd4b473dbd658e8612816f7c4d3926ac21"},
    {"BF16", "633551c4cd934c2090c88fd56a8e7b1263b1bc6e91b22e41f398a16f4245ebb0"},
    {"Q8_0", "ff8701a45da28293b7af11a695ab33575b692e9b109a2eae6238c906c31415da"},
    {"Q4_0", "fd93abd9957992763c863e7e3f30934baf1e7a2e31b6c911a720cd109daed40d"},
    {"Q4_1", "2ddb634a1e71dffd234b5fa3ecb0608b43e9a913b19012e4fbc616c29d9a3c66"},
    {"Q5_0", "749e10e0a33dbef8df92045c6add0d807dc5d1105667c96ad3f81ae3deb64ac7"},
    {"Q5_1", "c36497248a0a883836c36c96bf707bd176b94911d34af9bf7681df98cd22025d"},
    {"Q2_K", "94967a2bf35ea5fc57aedcc8fe06e2b94454323b4899a260927830860274267b"},
    {"Q3_K_S", "c9d3191472266bf63362214aa05e48a6ab226dd38cc39faa843d78bb3c171768"},
    {"Q3_K_M", "1b8cf84b50f0676d7580c30d76ab0f80f337f782824b7f312de674c521bcf79d"},
    {"Q3_K_L", "0b715a6c2598aac375ef30f200ac19d157a1431eb40a57041c5243c994fdfb42"},
    {"Q4_K_S", "ec7a769903d8b4cb18e5ed29b288c60f9d8a15437321c67ac319ddb6191125b6"},
    {"Q4_K_M", "7f61512f1889080c73b2afd3ac7fdfe55a368e83570b20e5019829adfa734a2a"},
    {"Q5_K_S", "66ed769a4df768d67b88ea4395e9dab273b717de9f64980b9cd5cfe832108b6f"},
    {"Q5_K_M", "017253a152346d29609472739647c6c1136557abaad67c24e6966fccd07eafda"},
    {"Q6_K", "137d1fbe834a43bc20cc1e04a9459af61953a7579baeedba17590faacfb13104"},
    {"MXFP4_MOE", "d3b8fc31c5848a4788e8f74656add7222a16d804d32c4f2490c375ca1e665013"},
};
const std::map<std::string, std::string> kLlamaCppSynth = {
    {"Q2_K", "b8ea719459a71caf22f41cb71e3463d37439e8f50dd7701cc1f0884b70c9e560"},
    {"Q3_K_S", "7a1ac416b433cd348daa746f6581c3587ccc26dc6735eddbff354d735a2b9bae"},
    {"Q3_K_M", "e70a221609124a0bd7a5b7d3b46f8a8997fcfa5e7a7e429a49ae975ad0b1730b"},
    {"Q3_K_L", "394816c0c002ac89d51f87698d656a1b6b3ad798d244e3d041e41251b9b8f6a9"},
    {"Q4_K_S", "2e1f2c749be4aaae0a73a047390244815497ffe8b02690cad859be2d6a8f3d15"},
    {"Q4_K_M", "a32b7eb97df74b695ea33d2da6e6a9c956ce1a46435baa3668ca2fbf4727129d"},
    {"Q5_K_S", "8fa46e2f75b3cd39846a5eeac28ad7bdb28b1eeb48d0623519ab90deabae6da0"},
    {"Q5_K_M", "41c87476ca7d65a0d7956470bd204e41e5eb73ee801d8ed6211a04020bc82dfd"},
    {"Q6_K", "7f98f1c62c7452444520e22e13ef3dcee2007f20848912902283d55e56ee4939"},
    {"Q4_0", "d0065785e538a35f3ddc8b7953741b66653f794749fb973f6d5dfbf9358fcdd5"},
    {"Q8_0", "db25a06a1aa0ec999ce44fc7be0e872f7ea091cfc4069b2703eeda5aead53819"},
    {"BF16", "54b3e6d8a9b892131ecc43cbbe4548355e748929bf49365991c97ee884707fc8"},
    {"MXFP4_MOE", "d38ce2a6503120d1300b35ad6dfc982dc4a9f13074f2770e3d6d96d9bd8403b6"},
};

TEST(Quantize, FilesEqualLlamaCppsByteForByte) {
  TempDir dir("llamacpp");
  ASSERT_EQ(test::sha256_file(kStories), "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d");
  for (const auto& [type, sha] : kLlamaCppStories) {
    quantize(kStories, dir.file("s.gguf"), type);
    EXPECT_EQ(test::sha256_file(dir.file("s.gguf")), sha) << "stories260K " << type;
  }
  const std::string in = make_synth(dir);
  ASSERT_EQ(test::sha256_file(in), "8207423e7e5091b1341f9e7ec494fa898c363ca3a8c9d19bea033bb7633f17cb");
  // Under the sanitizers (TANDEM_TEST_QUICK=1) three mixes that write all five
  // K-quant block types between them.
  const bool quick = std::getenv("TANDEM_TEST_QUICK") != nullptr;
  for (const auto& [type, sha] : kLlamaCppSynth) {
    if (quick && type != "Q3_K_L" && type != "Q2_K" && type != "Q4_K_M") continue;
    quantize(in, dir.file("g.gguf"), type);
    EXPECT_EQ(test::sha256_file(dir.file("g.gguf")), sha) << "synth " << type;
  }
  // These files have no experts, so MXFP4_MOE writes Q8_0; --pure writes
  // every matrix in MXFP4 (llama_model_quantize with pure = true).
  QuantizeOptions pure;
  pure.pure = true;
  quantize(kStories, dir.file("s.gguf"), "MXFP4_MOE", pure);
  EXPECT_EQ(test::sha256_file(dir.file("s.gguf")), "0e73aaaf6bf1b9c0d49d13b70e806776e5f12430e407833158c199b7567a93f0");
  quantize(in, dir.file("g.gguf"), "MXFP4_MOE", pure);
  EXPECT_EQ(test::sha256_file(dir.file("g.gguf")), "ba0edd99781a808c30094502e8565820fdccb88658a5551d141d148f04a6ed31");
}

// ----------------------------------------------------------- requantizing

TEST(Quantize, RequantizingNeedsTheFlagDequantizingDoesNot) {
  TempDir dir("requant");
  const std::string q = make_synth(dir, "q4_k_m");
  try {
    quantize(q, dir.file("x.gguf"), "q4_0");
    FAIL() << "requantized without allow_requantize";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("--allow-requantize"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(!fs::exists(dir.file("x.gguf")));
  // Into a float type: a plain dequantization, and exact in F32.
  quantize(q, dir.file("f32.gguf"), "f32");
  {
    auto a = GgufFile::open(q);
    auto b = GgufFile::open(dir.file("f32.gguf"));
    for (const GgufTensor& t : b->tensors()) {
      ASSERT_EQ(t.type, GgmlType::F32);
      EXPECT_EQ(values(t), values(*a->find_tensor(t.name))) << t.name;
    }
  }
  // The same mix again: every tensor is already in its type and is copied.
  QuantizeOptions allow;
  allow.allow_requantize = true;
  const QuantizeReport same = quantize(q, dir.file("same.gguf"), "q4_k_m", allow);
  EXPECT_EQ(same.n_converted, 0);
  {
    auto a = GgufFile::open(q);
    auto b = GgufFile::open(dir.file("same.gguf"));
    for (const GgufTensor& t : b->tensors()) {
      const GgufTensor* s = a->find_tensor(t.name);
      ASSERT_EQ(t.type, s->type);
      EXPECT_EQ(0, std::memcmp(t.data, s->data, t.n_bytes)) << t.name;
    }
  }
  // With the flag, another quantized type.
  const QuantizeReport r = quantize(q, dir.file("q8.gguf"), "q8_0", allow);
  EXPECT_GT(r.n_converted, 0);
  EXPECT_EQ(types_by_name(*GgufFile::open(dir.file("q8.gguf"))).at("blk.0.attn_q.weight"), "q8_0");
}

// --------------------------------------------------- rules on other models

// An in-memory GGUF of zeros with the given names and shapes (F32), for the
// rules that need a model Tandem cannot run: 70B, Falcon, 8 experts.
struct FakeTensor {
  std::string name;
  std::vector<int64_t> dims;
};

std::vector<uint8_t> fake_model(const std::string& arch, int n_layer, int n_head, int n_head_kv, int n_expert,
                                const std::vector<FakeTensor>& tensors) {
  GgufWriter w;
  w.add_string("general.architecture", arch);
  w.add_u32(arch + ".block_count", static_cast<uint32_t>(n_layer));
  w.add_u32(arch + ".attention.head_count", static_cast<uint32_t>(n_head));
  w.add_u32(arch + ".attention.head_count_kv", static_cast<uint32_t>(n_head_kv));
  if (n_expert > 0) w.add_u32(arch + ".expert_count", static_cast<uint32_t>(n_expert));
  for (const auto& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.dims) n *= d;
    w.add_tensor(t.name, GgmlType::F32, t.dims, std::vector<uint8_t>(static_cast<size_t>(n) * 4));
  }
  return w.to_bytes();
}

std::map<std::string, std::string> planned(const std::vector<uint8_t>& img, const std::string& type,
                                           QuantizeOptions o = {}) {
  auto f = GgufFile::from_memory(img.data(), img.size());
  std::map<std::string, std::string> m;
  for (const auto& e : plan_quantization(*f, type_of(type), o)) m[e.name] = std::string(type_traits(e.dst_type).name);
  return m;
}

TEST(QuantizePlan, SeventyBLlamaGivesAttnVMoreBits) {
  std::vector<FakeTensor> ts = {{"token_embd.weight", {256, 4}}, {"output.weight", {256, 4}}};
  for (int il = 0; il < 80; ++il) ts.push_back({"blk." + std::to_string(il) + ".attn_v.weight", {256, 2}});
  // 80 layers with GQA is llama.cpp's LLM_TYPE_70B: Q3_K/Q4_K attn_v become Q5_K.
  auto m = planned(fake_model("llama", 80, 64, 8, 0, ts), "q4_k_s");
  EXPECT_EQ(m.at("blk.0.attn_v.weight"), "q5_K");
  EXPECT_EQ(m.at("blk.50.attn_v.weight"), "q5_K");
  EXPECT_EQ(m.at("output.weight"), "q6_K");
  EXPECT_EQ(m.at("token_embd.weight"), "q4_K");  // untied: the default type
  // Without GQA it is the 65B, which has no such rule.
  m = planned(fake_model("llama", 80, 64, 64, 0, ts), "q4_k_s");
  EXPECT_EQ(m.at("blk.50.attn_v.weight"), "q4_K");
}

TEST(QuantizePlan, FalconAndEightExperts) {
  std::vector<FakeTensor> ts = {{"token_embd.weight", {256, 4}}, {"output.weight", {256, 4}}};
  for (int il = 0; il < 16; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    ts.push_back({b + "ffn_down.weight", {256, 2}});
    ts.push_back({b + "attn_output.weight", {256, 2}});
    ts.push_back({b + "ffn_gate_inp.weight", {256, 8}});  // expert router: never quantized
  }
  // Falcon: the output matrix in Q8_0; Q4_K_M's ffn_down Q6_K / Q5_K / Q4_K by layer.
  auto m = planned(fake_model("falcon", 16, 8, 8, 0, ts), "q4_k_m");
  EXPECT_EQ(m.at("output.weight"), "q8_0");
  EXPECT_EQ(m.at("blk.0.ffn_down.weight"), "q6_K");   // i < n/16
  EXPECT_EQ(m.at("blk.1.ffn_down.weight"), "q5_K");   // use_more_bits (i < n/8)
  EXPECT_EQ(m.at("blk.2.ffn_down.weight"), "q4_K");
  EXPECT_EQ(m.at("blk.4.ffn_down.weight"), "q5_K");   // (4 - 2) % 3 == 2
  EXPECT_EQ(m.at("blk.0.ffn_gate_inp.weight"), "f32");
  m = planned(fake_model("falcon", 16, 8, 8, 0, ts), "q3_k_l");
  EXPECT_EQ(m.at("blk.3.attn_output.weight"), "q4_K");
  EXPECT_EQ(m.at("blk.3.ffn_down.weight"), "q4_K");
  // Eight experts: attn_output Q5_K for the low mixes.
  m = planned(fake_model("llama", 16, 8, 8, 8, ts), "q3_k_m");
  EXPECT_EQ(m.at("blk.3.attn_output.weight"), "q5_K");
}

TEST(QuantizePlan, OptionsPureAndLeaveOutput) {
  std::vector<FakeTensor> ts = {{"token_embd.weight", {256, 4}}, {"output.weight", {256, 4}},
                                {"blk.0.attn_v.weight", {256, 2}}, {"blk.0.ffn_down.weight", {256, 2}},
                                {"blk.0.attn_norm.weight", {256}}, {"blk.0.odd.weight", {100, 2}},
                                {"blk.0.column.weight", {256, 1}}};
  const auto img = fake_model("llama", 1, 8, 8, 0, ts);
  auto m = planned(img, "q4_k_m");
  EXPECT_EQ(m.at("output.weight"), "q6_K");
  EXPECT_EQ(m.at("blk.0.attn_v.weight"), "q6_K");
  EXPECT_EQ(m.at("blk.0.attn_norm.weight"), "f32");
  EXPECT_EQ(m.at("blk.0.odd.weight"), "f16");      // 100 wide: neither Q4_K nor Q5_0 fits
  EXPECT_EQ(m.at("blk.0.column.weight"), "f32");   // [256, 1] is 1-d to ggml
  QuantizeOptions pure;
  pure.pure = true;
  m = planned(img, "q4_k_m", pure);
  EXPECT_EQ(m.at("output.weight"), "q4_K");
  EXPECT_EQ(m.at("blk.0.attn_v.weight"), "q4_K");
  QuantizeOptions leave;
  leave.leave_output_tensor = true;
  m = planned(img, "q4_k_m", leave);
  EXPECT_EQ(m.at("output.weight"), "f32");
  EXPECT_EQ(m.at("token_embd.weight"), "q4_K");
}

// MXFP4_MOE: llama.cpp puts the expert tensors (3-D, one matrix per expert)
// in MXFP4 and every other quantizable tensor, the output matrix included,
// in Q8_0; --pure makes everything MXFP4.
TEST(QuantizePlan, Mxfp4MoeExpertsInMxfp4TheRestInQ8_0) {
  const std::vector<FakeTensor> ts = {
      {"token_embd.weight", {256, 4}},           {"output.weight", {256, 4}},
      {"blk.0.attn_q.weight", {256, 2}},         {"blk.0.attn_norm.weight", {256}},
      {"blk.0.ffn_gate_inp.weight", {256, 4}},   {"blk.0.ffn_gate_exps.weight", {256, 64, 4}},
      {"blk.0.ffn_up_exps.weight", {256, 64, 4}}, {"blk.0.ffn_down_exps.weight", {64, 256, 4}},
      {"blk.0.odd_exps.weight", {100, 2, 4}},    {"blk.0.one_exp.weight", {256, 2, 1}}};
  const auto img = fake_model("llama", 1, 8, 8, 4, ts);
  auto m = planned(img, "MXFP4_MOE");
  for (const char* n : {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"})
    EXPECT_EQ(m.at(n), "mxfp4") << n;
  for (const char* n : {"token_embd.weight", "output.weight", "blk.0.attn_q.weight", "blk.0.one_exp.weight"})
    EXPECT_EQ(m.at(n), "q8_0") << n;
  EXPECT_EQ(m.at("blk.0.ffn_gate_inp.weight"), "f32");  // the router is never quantized
  EXPECT_EQ(m.at("blk.0.attn_norm.weight"), "f32");
  EXPECT_EQ(m.at("blk.0.odd_exps.weight"), "f16");  // 100 wide: no 32-element block fits
  EXPECT_EQ(type_of("mxfp4_moe").ftype, 38u);
  QuantizeOptions pure;
  pure.pure = true;
  m = planned(img, "MXFP4_MOE", pure);
  EXPECT_EQ(m.at("output.weight"), "mxfp4");
  EXPECT_EQ(m.at("blk.0.attn_q.weight"), "mxfp4");
}

// The written experts are the reference quantizer's blocks of each row of
// each expert, and read back within MXFP4's error.
TEST(Quantize, Mxfp4MoeWritesTheExpertsRowByRow) {
  TempDir dir("mxfp4");
  std::mt19937 rng(38);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.block_count", 1);
  w.add_u32("llama.expert_count", 3);
  const std::vector<int64_t> dims = {96, 5, 3};  // 3 experts of 5 rows of 96
  std::vector<float> src(96 * 5 * 3);
  for (float& v : src) v = normal(rng);
  std::vector<uint8_t> bytes(src.size() * 4);
  std::memcpy(bytes.data(), src.data(), bytes.size());
  w.add_tensor("blk.0.ffn_up_exps.weight", GgmlType::F32, dims, bytes);
  w.add_tensor("blk.0.attn_q.weight", GgmlType::F32, {96, 2}, std::vector<uint8_t>(96 * 2 * 4));
  const std::vector<uint8_t> img = w.to_bytes();
  const std::string in = dir.file("moe_f32.gguf"), out = dir.file("moe_mxfp4.gguf");
  {
    std::FILE* f = std::fopen(in.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(img.data(), 1, img.size(), f), img.size());
    std::fclose(f);
  }
  quantize(in, out, "MXFP4_MOE");
  auto q = GgufFile::open(out);
  const GgufTensor* t = q->find_tensor("blk.0.ffn_up_exps.weight");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->type, GgmlType::MXFP4);
  EXPECT_EQ(t->dims, dims);
  const size_t rb = row_bytes(GgmlType::MXFP4, 96);
  ASSERT_EQ(t->n_bytes, rb * 15);
  std::vector<uint8_t> want(rb);
  for (int64_t r = 0; r < 15; ++r) {
    quantize_row(GgmlType::MXFP4, src.data() + r * 96, want.data(), 96);
    EXPECT_EQ(0, std::memcmp(t->data + r * rb, want.data(), rb)) << "row " << r;
  }
  // Gaussian rows: a few times the step (a quarter of the block maximum's
  // power of two at the top, finer below) over sqrt(12).
  EXPECT_LT(rel_rms_error(src, values(*t)), 0.2);
  EXPECT_EQ(q->find_tensor("blk.0.attn_q.weight")->type, GgmlType::Q8_0);
  EXPECT_EQ(q->get_int("general.file_type").value(), 38);
}

// `synth --type mxfp4_moe` writes what `quantize --type MXFP4_MOE` makes of
// the same gpt-oss model in f32 (so the gptoss_mxfp4_moe reference speaks for
// both): every tensor of the same type and bytes, the biases and sinks f32.
TEST(Quantize, Mxfp4MoeOfAGptOssModelEqualsSynthsMix) {
  TempDir dir("gptoss");
  SynthSpec s;
  s.arch = "gpt-oss";
  s.n_layer = 2, s.n_embd = 64, s.n_ff = 64, s.n_head = 4, s.n_head_kv = 2, s.head_dim = 32;
  s.n_expert = 4, s.n_ff_exp = 32;
  s.vocab_from = test::shared_path("models/gguf/stories260K.gguf");
  const std::string f32 = dir.file("f32.gguf"), mix = dir.file("mix.gguf"), q = dir.file("q.gguf");
  synth_model(s, f32, 1);
  s.type = "mxfp4_moe";
  synth_model(s, mix, 1);
  quantize(f32, q, "MXFP4_MOE");
  auto a = GgufFile::open(mix), b = GgufFile::open(q);
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  for (const GgufTensor& t : a->tensors()) {
    const GgufTensor* u = b->find_tensor(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(u->type, t.type) << t.name;
    ASSERT_EQ(u->n_bytes, t.n_bytes) << t.name;
    EXPECT_EQ(0, std::memcmp(u->data, t.data, t.n_bytes)) << t.name;
  }
  EXPECT_EQ(a->find_tensor("blk.1.ffn_down_exps.weight")->type, GgmlType::MXFP4);
  EXPECT_EQ(a->find_tensor("blk.1.attn_sinks.weight")->type, GgmlType::F32);
  EXPECT_EQ(a->find_tensor("blk.1.ffn_up_exps.bias")->type, GgmlType::F32);
}

// ------------------------------------------------- GgufWriter, streamed data

// header() followed by each tensor's bytes, padded, is what to_bytes() makes.
TEST(GgufWriterStream, HeaderThenDataEqualsToBytes) {
  GgufWriter held, streamed;
  const std::vector<uint8_t> a(4 * 3 * 5, 7), b(row_bytes(GgmlType::Q8_0, 64) * 2, 9);
  for (GgufWriter* w : {&held, &streamed}) w->add_string("general.architecture", "llama");
  held.add_tensor("a", GgmlType::F32, {3, 5}, a);
  held.add_tensor("b", GgmlType::Q8_0, {64, 2}, b);
  streamed.add_tensor_info("a", GgmlType::F32, {3, 5});
  streamed.add_tensor_info("b", GgmlType::Q8_0, {64, 2});
  std::vector<uint8_t> img = streamed.header();
  for (const auto* d : {&a, &b}) {
    img.insert(img.end(), d->begin(), d->end());
    img.resize((img.size() + 31) / 32 * 32, 0);
  }
  EXPECT_EQ(img, held.to_bytes());
  EXPECT_THROW(streamed.to_bytes(), Error);  // declared-only tensors have no bytes to write
  EXPECT_THROW(streamed.add_tensor_info("c", GgmlType::Q4_K, {100, 2}), Error);  // 100 % 256
}

// ----------------------------------------------------------------- the CLI

test::CliResult cli(const std::string& args) { return test::run_cli("quantize " + args); }

TEST(QuantizeCli, WritesAndReports) {
  TempDir dir("cli");
  const std::string out = dir.file("q8.gguf");
  auto r = cli(kStories + " " + out + " --type Q8_0 -t 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("converting to q8_0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model size"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("BPW"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bits per weight"), std::string::npos) << r.err;
  EXPECT_EQ(GgufFile::open(out)->get_int("general.file_type").value(), 7);
  // llama-quantize's positional form, and a dry run that writes nothing.
  r = cli(kStories + " " + dir.file("q4.gguf") + " q4_0");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(GgufFile::open(dir.file("q4.gguf"))->get_int("general.file_type").value(), 2);
  r = cli(kStories + " " + dir.file("dry.gguf") + " --type q4_k_m --dry-run");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("-> falling back to"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("dry.gguf")));
}

TEST(QuantizeCli, Errors) {
  TempDir dir("cli_err");
  // Unknown type: the valid ones are listed.
  auto r = cli(kStories + " " + dir.file("o.gguf") + " --type q4_k_x");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("unknown type 'q4_k_x'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Q4_K_M"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("BF16"), std::string::npos) << r.err;
  // No type.
  r = cli(kStories + " " + dir.file("o.gguf"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no type"), std::string::npos) << r.err;
  // A type where the output belongs (llama-quantize would make up a name).
  r = cli(kStories + " q4_k_m");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("give OUT.gguf"), std::string::npos) << r.err;
  // Missing input.
  r = cli(dir.file("missing.gguf") + " " + dir.file("o.gguf") + " --type q8_0");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("missing.gguf"), std::string::npos) << r.err;
  // Not a GGUF.
  {
    std::FILE* f = std::fopen(dir.file("text.gguf").c_str(), "w");
    std::fputs("hello, not a model\n", f);
    std::fclose(f);
  }
  r = cli(dir.file("text.gguf") + " " + dir.file("o.gguf") + " --type q8_0");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("text.gguf"), std::string::npos) << r.err;
  // The output is the input, however spelled.
  fs::copy_file(kStories, dir.file("in.gguf"));
  const std::string before = test::sha256_file(dir.file("in.gguf"));
  r = cli(dir.file("in.gguf") + " " + (dir.path() / "." / "in.gguf").string() + " --type q8_0");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("is the input"), std::string::npos) << r.err;
  EXPECT_EQ(test::sha256_file(dir.file("in.gguf")), before);
  // An output directory that does not exist.
  r = cli(kStories + " " + dir.file("no/such/dir/o.gguf") + " --type q8_0");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("cannot create"), std::string::npos) << r.err;
  // A write that fails half-way (file size limit): an error, and neither
  // the output nor the temporary file is left.
  const std::string cmd = "bash -c \"trap '' XFSZ; ulimit -f 64; " + std::string(TANDEM_CLI_PATH) + " quantize " +
                          kStories + " " + dir.file("big.gguf") + " --type f32 2>" + dir.file("err.txt") + "\"";
  const int st = std::system(cmd.c_str());
  EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 1);
  const std::string err = test::read_file(dir.file("err.txt"));
  EXPECT_NE(err.find("write failed"), std::string::npos) << err;
  fs::remove(dir.file("err.txt"));
  auto left = dir.entries();
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"in.gguf", "text.gguf"}));
  // Requantizing without the flag names it.
  r = cli(dir.file("in.gguf") + " " + dir.file("a.gguf") + " --type q4_0");
  ASSERT_EQ(r.status, 0) << r.err;
  r = cli(dir.file("a.gguf") + " " + dir.file("b.gguf") + " --type q8_0");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--allow-requantize"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("b.gguf")));
  r = cli(dir.file("a.gguf") + " " + dir.file("b.gguf") + " --type q8_0 --allow-requantize");
  EXPECT_EQ(r.status, 0) << r.err;
}

}  // namespace
}  // namespace tandem
