// tandem synth as a library: determinism, every weight type and architecture
// loads back with the shapes and types llama.cpp's rules give, bad specs fail
// with errors that name the problem.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include <gtest/gtest.h>

#include "gguf/synth.h"
#include "core/error.h"
#include "quant/quant.h"
#include "runtime/thread_pool.h"
#include "kernels/vec_dot_impl.h"
#include "kv/kv_cache.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "sha256_file.h"
#include "test_support.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

const std::string kVocab512 = test::shared_path("models/gguf/stories260K.gguf");

fs::path tmp(const std::string& name) { return fs::temp_directory_path() / ("tandem_synth_" + name + ".gguf"); }

SynthSpec small(const std::string& arch = "llama") {
  SynthSpec s;
  s.arch = arch;
  s.n_layer = 2;
  s.n_embd = 64;
  s.n_ff = 96;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.vocab_from = kVocab512;
  if (arch == "gemma3") s.sliding_window = 8;
  return s;
}

std::string synth_hash(const SynthSpec& s, const std::string& name, int threads = 1) {
  const fs::path p = tmp(name);
  synth_model(s, p.string(), threads);
  std::string h = test::sha256_file(p.string());
  fs::remove(p);
  return h;
}

// Throws and the message contains `what`.
void expect_error(const SynthSpec& s, const std::string& what) {
  try {
    synth_model(s, tmp("bad").string(), 1);
    ADD_FAILURE() << "no error; expected one mentioning '" << what << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp("bad")));
}

TEST(SynthModel, SameSpecSameBytesAnyThreadCount) {
  SynthSpec s = small("qwen2");
  s.type = "q4_k_m";
  s.n_embd = 256;
  s.n_ff = 256;
  const std::string a = synth_hash(s, "det_a", 1);
  ASSERT_EQ(a.size(), 64u);
  EXPECT_EQ(a, synth_hash(s, "det_b", 2));
  EXPECT_EQ(a, synth_hash(s, "det_c", 3));
  s.seed = 1;
  EXPECT_NE(a, synth_hash(s, "det_d", 1));
}

TEST(SynthModel, DifferentSeedsGiveDifferentWeights) {
  SynthSpec s = small();
  const fs::path p0 = tmp("seed0"), p1 = tmp("seed1");
  synth_model(s, p0.string(), 1);
  s.seed = 12345;
  synth_model(s, p1.string(), 1);
  auto f0 = GgufFile::open(p0.string()), f1 = GgufFile::open(p1.string());
  ASSERT_EQ(f0->tensors().size(), f1->tensors().size());
  for (size_t i = 0; i < f0->tensors().size(); ++i) {
    const GgufTensor& a = f0->tensors()[i];
    const GgufTensor& b = f1->tensors()[i];
    ASSERT_EQ(a.name, b.name);
    ASSERT_EQ(a.n_bytes, b.n_bytes);
    EXPECT_NE(std::memcmp(a.data, b.data, a.n_bytes), 0) << a.name;
  }
  // Within one file, no two tensors of the same shape share their values.
  const GgufTensor* q0 = f0->find_tensor("blk.0.attn_q.weight");
  const GgufTensor* q1 = f0->find_tensor("blk.1.attn_q.weight");
  ASSERT_TRUE(q0 && q1);
  EXPECT_NE(std::memcmp(q0->data, q1->data, q0->n_bytes), 0);
  fs::remove(p0);
  fs::remove(p1);
}

TEST(SynthModel, WeightStatistics) {
  SynthSpec s = small();
  s.n_embd = 256;
  s.n_ff = 512;
  const fs::path p = tmp("stats");
  synth_model(s, p.string(), 2);
  auto f = GgufFile::open(p.string());
  auto moments = [&](const char* name, double& mean, double& sd) {
    const GgufTensor* t = f->find_tensor(name);
    ASSERT_TRUE(t) << name;
    ASSERT_EQ(t->type, GgmlType::F32);
    const float* v = reinterpret_cast<const float*>(t->data);
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < t->n_elements; ++i) s1 += v[i], s2 += double{v[i]} * v[i];
    mean = s1 / t->n_elements;
    sd = std::sqrt(s2 / t->n_elements - mean * mean);
  };
  double mean, sd;
  moments("blk.0.ffn_up.weight", mean, sd);  // 131072 values, fan-in 256
  EXPECT_NEAR(mean, 0.0, 0.01 / 16);
  EXPECT_NEAR(sd, 1.0 / 16, 0.01 / 16);
  moments("blk.1.ffn_down.weight", mean, sd);  // fan-in 512
  EXPECT_NEAR(sd, 1.0 / std::sqrt(512.0), 0.01 / std::sqrt(512.0));
  moments("blk.0.attn_norm.weight", mean, sd);
  EXPECT_NEAR(mean, 1.0, 0.03);
  EXPECT_NEAR(sd, 0.1, 0.03);
  fs::remove(p);
}

// The type llama.cpp's llama_tensor_get_type picks for a matrix under the
// _M mixes (use_more_bits: the first and last eighth, every third between).
GgmlType expected_m_type(const std::string& name, int n_layer, GgmlType base) {
  if (name == "output.weight") return GgmlType::Q6_K;
  int il = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &il) == 1 &&
      (name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight"))) {
    const bool more = il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
    return more ? GgmlType::Q6_K : base;
  }
  return base;
}

TEST(SynthModel, EveryTypeLoadsBackWithItsTensorTypes) {
  for (const std::string& type : synth_type_names()) {
    SCOPED_TRACE(type);
    const bool mix = type.ends_with("_m");
    SynthSpec s = small();
    s.n_layer = mix ? 8 : 1;  // 8: enough for the _M pattern to show (layers 0, 3, 6, 7 get q6_K)
    s.n_embd = 256;
    s.n_ff = 256;
    s.n_head = 2;
    s.n_head_kv = 1;
    s.type = type;
    const fs::path p = tmp("type_" + type);
    const SynthReport rep = synth_model(s, p.string(), 2);
    EXPECT_EQ(rep.n_vocab, 512);
    auto f = GgufFile::open(p.string());
    EXPECT_EQ(rep.file_bytes, f->file_size());
    EXPECT_EQ(rep.n_tensors, static_cast<int64_t>(f->tensors().size()));
    const std::map<std::string, GgmlType> bases = {
        {"f32", GgmlType::F32},   {"f16", GgmlType::F16},   {"bf16", GgmlType::BF16},   {"q8_0", GgmlType::Q8_0},
        {"q4_0", GgmlType::Q4_0}, {"q4_1", GgmlType::Q4_1}, {"q5_0", GgmlType::Q5_0},   {"q5_1", GgmlType::Q5_1},
        {"q2_k", GgmlType::Q2_K}, {"q3_k", GgmlType::Q3_K}, {"q4_k", GgmlType::Q4_K},   {"q5_k", GgmlType::Q5_K},
        {"q6_k", GgmlType::Q6_K}, {"q4_k_m", GgmlType::Q4_K}, {"q5_k_m", GgmlType::Q5_K}, {"mxfp4", GgmlType::MXFP4},
        {"mxfp4_moe", GgmlType::Q8_0}};  // a dense model: no expert tensors, so every matrix q8_0
    ASSERT_TRUE(bases.count(type));
    const GgmlType base = bases.at(type);
    int64_t params = 0;
    for (const GgufTensor& t : f->tensors()) {
      params += t.n_elements;
      const GgmlType want = t.dims.size() == 1 ? GgmlType::F32 : mix ? expected_m_type(t.name, s.n_layer, base) : base;
      EXPECT_EQ(type_traits(t.type).name, type_traits(want).name) << t.name;
      // Every quantized tensor decodes to finite values.
      std::vector<float> row(static_cast<size_t>(t.dims[0]));
      dequantize_row(t.type, t.data, row.data(), t.dims[0]);
      for (float v : row) ASSERT_TRUE(std::isfinite(v)) << t.name;
    }
    EXPECT_EQ(params, rep.n_params);
    auto m = Model::load(p.string());
    EXPECT_EQ(m->config().n_vocab, 512);
    EXPECT_EQ(m->config().n_layer, s.n_layer);
    fs::remove(p);
  }
}

// Weights rearranged at load (q8_0 panels, q4_0, q5_0 and q4_K tiles; kernels/layouts.h)
// give the logits of the file's layout bit for bit, in prefill and decode,
// with a separate output matrix (llama) and a tied one (qwen2: the embedding
// lookup reads the new layout too).
TEST(SynthModel, RepackedWeightsGiveTheFileLayoutsLogits) {
  for (const char* arch : {"llama", "qwen2"})
    for (const char* type : {"q8_0", "q4_0", "q5_0", "q4_k_m"}) {
      SCOPED_TRACE(std::string(arch) + " " + type);
      SynthSpec s = small(arch);
      s.type = type;
      if (s.type == "q4_k_m") {
        s.n_embd = 256;  // K-quant rows are multiples of 256
        s.n_ff = 512;
      }
      const fs::path p = tmp(std::string("repack_") + arch + type);
      synth_model(s, p.string(), 1);
      auto logits = [&](PrepackMode mode, size_t* packed) {
        auto m = Model::load(p.string(), {.prepack = mode});
        *packed = m->packed_bytes();
        ThreadPool pool(2);
        const ModelConfig& c = m->config();
        KvCache kv(m->kv_shape(), 8, 16);
        SeqKv seq;
        EXPECT_TRUE(seq.reserve(kv, 16));
        const std::vector<int32_t> prompt = {1, 72, 300, 17, 45, 9, 400, 3};
        Logits out;
        m->prefill(seq, prompt, kv, pool, out);
        for (int32_t t : {5, 77, 311}) {
          SeqKv* seqs[] = {&seq};
          const int32_t one[] = {t};
          m->decode(seqs, one, kv, pool, out);
        }
        // forward() into a caller's buffer (the serving engine's): the same
        // logits; one float short is an error, before any K/V is written.
        Batch b = {{2, 11, 0, true}};
        std::vector<float> buf(c.n_vocab);
        SeqKv* seqs[] = {&seq};
        EXPECT_THROW(m->forward(b, seqs, kv, pool, std::span<float>(buf).first(c.n_vocab - 1)), Error);
        EXPECT_EQ(seq.n_tokens, 11);
        m->forward(b, seqs, kv, pool, std::span<float>(buf));
        out.insert(out.end(), buf.begin(), buf.end());
        return out;
      };
      size_t packed = 0, all = 0, unpacked = 0;
      const Logits a = logits(PrepackMode::kAuto, &packed), b = logits(PrepackMode::kOff, &unpacked),
                   c = logits(PrepackMode::kAll, &all);
      EXPECT_EQ(unpacked, 0u);
      if (cpu_supports_level(KernelLevel::kAvx512Vnni)) {
        EXPECT_GT(all, 0u);
        if (s.type == "q8_0" || s.type == "q4_0" || s.type == "q5_0" || s.type == "q4_k_m") {
          EXPECT_GT(packed, 0u);
        }
      }
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(a, b);
      EXPECT_EQ(c, b);
      fs::remove(p);
    }
}

TEST(SynthModel, ArchitecturesHaveTheirKeysAndTensors) {
  struct Case {
    const char* arch;
    std::vector<const char*> tensors, absent;
  };
  const Case cases[] = {
      {"llama", {"output.weight", "blk.1.ffn_down.weight"}, {"blk.0.attn_q.bias", "blk.0.attn_q_norm.weight"}},
      {"qwen2", {"blk.0.attn_q.bias", "blk.1.attn_k.bias", "blk.1.attn_v.bias"}, {"output.weight"}},
      {"qwen3", {"blk.0.attn_q_norm.weight", "blk.1.attn_k_norm.weight"}, {"output.weight", "blk.0.attn_q.bias"}},
      {"gemma3",
       {"blk.0.attn_q_norm.weight", "blk.1.post_attention_norm.weight", "blk.1.post_ffw_norm.weight"},
       {"output.weight"}},
      {"gpt-oss",
       {"output.weight", "blk.1.attn_sinks.weight", "blk.1.attn_output.bias", "blk.0.attn_k.bias",
        "blk.0.post_attention_norm.weight", "blk.0.ffn_gate_inp.bias", "blk.1.ffn_down_exps.bias"},
       {"blk.0.ffn_norm.weight", "blk.0.ffn_down.weight", "blk.0.attn_q_norm.weight"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.arch);
    SynthSpec s = small(c.arch);
    s.head_dim = 32;  // != n_embd / n_head = 16: the key_length key must say so
    const fs::path p = tmp(std::string("arch_") + c.arch);
    synth_model(s, p.string(), 1);
    auto f = GgufFile::open(p.string());
    const std::string a = c.arch;
    EXPECT_EQ(f->get_string("general.architecture"), a);
    EXPECT_EQ(f->get_int(a + ".attention.key_length"), 32);
    EXPECT_EQ(f->get_int(a + ".attention.head_count_kv"), 2);
    EXPECT_TRUE(f->get_float(a + ".attention.layer_norm_rms_epsilon"));
    EXPECT_TRUE(f->get_float(a + ".rope.freq_base"));
    EXPECT_EQ(f->get_int(a + ".attention.sliding_window").has_value(), a == "gemma3" || a == "gpt-oss");
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens")->size(), 512u);
    EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
    for (const char* t : c.tensors) EXPECT_TRUE(f->find_tensor(t)) << t;
    for (const char* t : c.absent) EXPECT_FALSE(f->find_tensor(t)) << t;
    EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->dims, (std::vector<int64_t>{64, 4 * 32}));
    EXPECT_EQ(f->find_tensor("blk.0.attn_k.weight")->dims, (std::vector<int64_t>{64, 2 * 32}));
    EXPECT_EQ(f->find_tensor("blk.0.attn_output.weight")->dims, (std::vector<int64_t>{4 * 32, 64}));
    auto m = Model::load(p.string());
    EXPECT_EQ(m->config().head_dim, 32);
    EXPECT_EQ(m->config().n_head_kv, 2);
    if (a == "gemma3") {
      EXPECT_EQ(m->config().sliding_window, 8);
    }
    if (a == "gpt-oss") {
      EXPECT_EQ(m->config().sliding_window, 128);  // synth's default, gpt-oss-20b's
      EXPECT_EQ(f->find_tensor("blk.1.ffn_down_exps.bias")->dims, (std::vector<int64_t>{64, 8}));
      EXPECT_EQ(f->find_tensor("blk.1.attn_sinks.weight")->dims, (std::vector<int64_t>{4}));
    }
    fs::remove(p);
  }
}

TEST(SynthModel, RopeFreqsAndTying) {
  SynthSpec s = small();
  s.rope_freqs = true;
  s.tied = true;
  const fs::path p = tmp("ropefreqs");
  synth_model(s, p.string(), 1);
  auto f = GgufFile::open(p.string());
  const GgufTensor* rf = f->find_tensor("rope_freqs.weight");
  ASSERT_TRUE(rf);
  ASSERT_EQ(rf->dims, std::vector<int64_t>{8});  // head_dim 16 / 2
  const float* v = reinterpret_cast<const float*>(rf->data);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[7], 8.0f);
  for (int i = 1; i < 8; ++i) EXPECT_GE(v[i], v[i - 1]);
  EXPECT_FALSE(f->find_tensor("output.weight"));
  fs::remove(p);
}

TEST(SynthModel, KQuantRowsFallBackLikeLlamaCpp) {
  // 64-wide rows do not fill a 256-element K-quant block.
  const std::pair<const char*, GgmlType> cases[] = {
      {"q4_k", GgmlType::Q5_0}, {"q5_k", GgmlType::Q5_1}, {"q6_k", GgmlType::Q8_0}, {"q4_k_m", GgmlType::Q5_0}};
  for (const auto& [type, want] : cases) {
    SCOPED_TRACE(type);
    SynthSpec s = small();
    s.type = type;
    const fs::path p = tmp(std::string("fallback_") + type);
    synth_model(s, p.string(), 1);
    auto f = GgufFile::open(p.string());
    EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->type, want);
    if (std::string(type) == "q4_k_m") {
      EXPECT_EQ(f->find_tensor("output.weight")->type, GgmlType::Q8_0);
      EXPECT_EQ(f->find_tensor("blk.1.attn_v.weight")->type, GgmlType::Q8_0);  // q6_K -> q8_0
    }
    fs::remove(p);
  }
}

TEST(SynthModel, Presets) {
  const SynthSpec t = synth_preset("tinyllama-1.1b");
  EXPECT_EQ(t.arch, "llama");
  EXPECT_EQ(t.n_layer, 22);
  EXPECT_EQ(t.n_embd, 2048);
  EXPECT_EQ(t.n_ff, 5632);
  EXPECT_EQ(t.n_head, 32);
  EXPECT_EQ(t.n_head_kv, 4);
  EXPECT_TRUE(t.vocab_from.empty());
  for (const auto& name : synth_preset_names()) EXPECT_NO_THROW(synth_preset(name)) << name;
  try {
    synth_preset("llama-70b");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tinyllama-1.1b"), std::string::npos) << e.what();
  }
}

TEST(SynthModel, BadSpecsAreRejected) {
  SynthSpec s;
  s = small(), s.arch = "gpt2", expect_error(s, "gpt2");
  s = small(), s.n_head = 3, s.n_head_kv = 0, expect_error(s, "embd = 64 is not a multiple of heads = 3");
  s = small(), s.n_head_kv = 3, expect_error(s, "kv-heads = 3");
  s = small(), s.n_head_kv = 8, expect_error(s, "kv-heads = 8 is outside");
  s = small(), s.head_dim = 15, expect_error(s, "head-dim = 15 is odd");
  s = small(), s.n_layer = 0, expect_error(s, "layers = 0");
  s = small(), s.n_embd = -5, expect_error(s, "embd = -5");
  s = small(), s.sliding_window = 8, expect_error(s, "sliding window");
  s = small("qwen2"), s.rope_freqs = true, expect_error(s, "rope_freqs");
  s = small(), s.type = "q4_k_s", expect_error(s, "unknown weight type 'q4_k_s'");
  s = small(), s.rope_base = -1.0f, expect_error(s, "rope base");
  s = small(), s.rms_eps = 0.0f, expect_error(s, "rms epsilon");
  s = small(), s.vocab_from = "", expect_error(s, "vocabulary is required");
  s = small(), s.vocab_from = "/nonexistent/vocab.gguf", expect_error(s, "/nonexistent/vocab.gguf");
  s = small(), s.vocab_from = test::shared_path("models/llama2c/tok512.bin"), expect_error(s, "tok512.bin");
  // A GGUF without a vocabulary.
  const fs::path bare = tmp("bare");
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.write(bare.string());
  s = small(), s.vocab_from = bare.string(), expect_error(s, "no tokenizer.ggml.tokens");
  fs::remove(bare);
  // Rows that no block of the type divides.
  s = small(), s.n_embd = 48, s.n_head = 4, s.type = "q4_0", expect_error(s, "not a multiple of the q4_0 block size");
  s = small(), s.type = "q2_k", expect_error(s, "q2_K block size 256");
}

TEST(SynthModel, UnwritableOutputIsAnIoError) {
  SynthSpec s = small();
  try {
    synth_model(s, "/nonexistent-dir/x.gguf", 1);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x.gguf"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
