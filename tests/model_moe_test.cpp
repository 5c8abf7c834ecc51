// Mixture-of-experts feed-forward blocks (model/moe_ffn.h) on small
// random-weight qwen3moe / qwen2moe / Mixtral-style models: the router's
// gating, files whose experts disagree with their metadata, and batch
// invariance with MoE rows in mixed steps on the serving engine. Agreement
// with llama.cpp is model_arch_test's (arch_*moe*.json).
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <utility>

#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/llm_engine.h"
#include "gguf/gguf.h"
#include "gguf/synth.h"
#include "model/model.h"
#include "model/moe_ffn.h"
#include "model/plan.h"
#include "test_support.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

TEST(MoeRoute, SoftmaxTopKRenormalised) {
  const float logits[] = {0.5f, 2.0f, -1.0f, 1.5f, 0.0f};
  float probs[5], w[2];
  int32_t ids[2];
  MoeGating g;
  g.normalize = true;
  moe_route(g, logits, nullptr, 5, 2, probs, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 3);
  const double e1 = std::exp(2.0), e3 = std::exp(1.5);
  EXPECT_NEAR(w[0], e1 / (e1 + e3), 1e-6);
  EXPECT_NEAR(w[1], e3 / (e1 + e3), 1e-6);

  // qwen2moe: the softmax probabilities themselves.
  g.normalize = false;
  moe_route(g, logits, nullptr, 5, 2, probs, ids, w);
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  EXPECT_NEAR(w[0], e1 / z, 1e-6);
  EXPECT_NEAR(w[1], e3 / z, 1e-6);

  // Softmax over the k picked logits (gpt-oss), scaled.
  g.func = MoeGating::Func::kSoftmaxTopK;
  g.scale = 2.5f;
  moe_route(g, logits, nullptr, 5, 2, probs, ids, w);
  EXPECT_NEAR(w[0], 2.5 * e1 / (e1 + e3), 1e-6);

  // Sigmoid scores with a selection bias that changes the pick but not the weight.
  g = {};
  g.func = MoeGating::Func::kSigmoid;
  const float bias[] = {0, 0, 5.0f, 0, 0};
  moe_route(g, logits, bias, 5, 2, probs, ids, w);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 1);
  EXPECT_NEAR(w[0], 1.0 / (1.0 + std::exp(1.0)), 1e-6);
}

SynthSpec small_moe(const std::string& arch, const std::string& type = "f32") {
  SynthSpec s;
  s.arch = arch;
  s.n_layer = 2;
  s.n_embd = 64;
  s.n_ff = 96;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.head_dim = 32;  // a q8_0 KV cache needs heads of a multiple of 32
  s.n_expert = 8;
  s.n_expert_used = 2;
  if (arch != "llama") s.n_ff_exp = 32;
  if (arch == "qwen2moe") s.n_ff_shexp = 64;
  if (arch == "gpt-oss") s.sliding_window = 8, s.yarn_factor = 32;  // layer 0's window inside every prompt
  s.type = type;
  s.vocab_from = test::shared_path("models/gguf/stories260K.gguf");
  return s;
}

std::string synth_to_temp(const SynthSpec& s, const std::string& tag) {
  const fs::path p = fs::temp_directory_path() / ("tandem_moe_" + tag + "_" + std::to_string(::getpid()) + ".gguf");
  synth_model(s, p.string(), 1);
  return p.string();
}

// The file at `path` rewritten with the metadata key `key` set to `value`
// (an integer key), everything else as it was.
std::string with_key(const std::string& path, const std::string& key, uint32_t value) {
  auto f = GgufFile::open(path);
  GgufWriter w;
  for (const GgufKV& kv : f->metadata()) {
    if (kv.key == key) w.add_u32(key, value);
    else w.add(kv.key, kv.value);
  }
  for (const GgufTensor& t : f->tensors())
    w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  const std::string out = path + "." + std::to_string(value) + ".gguf";
  w.write(out);
  return out;
}

std::string load_error(const std::string& path) {
  try {
    Model::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A metadata key set to a value its tensors contradict, and what the
// refusal must name.
struct MetadataCase {
  const char* key;
  uint32_t value;
  const char* named;
};

// Each case written into a copy of `good` is refused at load, naming it.
void expect_each_refused(const std::string& good, std::span<const MetadataCase> cases) {
  for (const MetadataCase& c : cases) {
    const std::string bad = with_key(good, c.key, c.value);
    const std::string err = load_error(bad);
    EXPECT_NE(err.find(c.named), std::string::npos) << c.key << " = " << c.value << ": " << err;
    fs::remove(bad);
  }
}

TEST(MoeLoad, MetadataThatDisagreesWithTheTensorsIsRefusedNamingTheTensor) {
  const std::string good = synth_to_temp(small_moe("qwen3moe"), "meta");
  ASSERT_NO_THROW(Model::load(good));
  const MetadataCase cases[] = {
      {"qwen3moe.expert_count", 16, "blk.0.ffn_gate_inp.weight"},
      {"qwen3moe.expert_feed_forward_length", 64, "blk.0.ffn_gate_exps.weight"},
      {"qwen3moe.expert_used_count", 9, "qwen3moe.expert_used_count"},
      {"qwen3moe.embedding_length", 128, "token_embd.weight"},
  };
  expect_each_refused(good, cases);
  fs::remove(good);
}

// gpt-oss's own tensors (the biases, the sinks) are checked against the
// metadata too.
TEST(MoeLoad, GptOssMetadataThatDisagreesWithTheTensorsIsRefusedNamingIt) {
  const std::string good = synth_to_temp(small_moe("gpt-oss"), "gptoss_meta");
  {
    auto m = Model::load(good);
    const ModelConfig& c = m->config();
    EXPECT_TRUE(c.attn_sinks && c.attn_out_bias && c.qkv_bias);
    EXPECT_EQ(c.sliding_window, 8);
    EXPECT_TRUE(c.layer_is_swa[0]);
    EXPECT_FALSE(c.layer_is_swa[1]);
    EXPECT_EQ(c.moe_gating.func, MoeGating::Func::kSoftmaxTopK);
    EXPECT_FALSE(c.moe_gating.normalize);
    EXPECT_EQ(m->weights().layers[1].sinks.size(), 4u);
    EXPECT_EQ(m->weights().layers[1].moe.down_bias.size(), 8u * 64);
  }
  const MetadataCase cases[] = {
      {"gpt-oss.expert_count", 16, "blk.0.ffn_gate_inp.weight"},
      {"gpt-oss.expert_feed_forward_length", 64, "blk.0.ffn_gate_exps.weight"},
      {"gpt-oss.attention.head_count", 8, "blk.0.attn_q.weight"},
      {"gpt-oss.attention.head_count_kv", 4, "blk.0.attn_k.weight"},
      {"gpt-oss.expert_used_count", 9, "gpt-oss.expert_used_count"},
  };
  expect_each_refused(good, cases);
  fs::remove(good);
}

TEST(MoeLoad, ExpertTensorsAreThreeDimensionalPerExpertViews) {
  const std::string path = synth_to_temp(small_moe("qwen2moe"), "views");
  auto m = Model::load(path);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.n_expert, 8);
  EXPECT_EQ(c.n_expert_used, 2);
  EXPECT_EQ(c.n_ff_exp, 32);
  EXPECT_EQ(c.n_ff_shexp, 64);
  EXPECT_FALSE(c.moe_gating.normalize);  // qwen2moe keeps the softmax probabilities
  const MoeWeights& moe = m->weights().layers[1].moe;
  ASSERT_TRUE(moe);
  ASSERT_EQ(moe.gate.size(), 8u);
  EXPECT_TRUE(moe.sh_gate && moe.sh_gate_inp);
  const GgufTensor* t = m->file().find_tensor("blk.1.ffn_down_exps.weight");
  ASSERT_NE(t, nullptr);
  // Expert e's down matrix starts e matrices into the tensor.
  EXPECT_EQ(moe.down[3].data, t->data + 3 * moe.down[3].rows * moe.down[3].row_stride);
  EXPECT_EQ(moe.down[3].rows, 64);
  EXPECT_EQ(moe.down[3].cols, 32);

  // The plan lists each expert tensor once, routed by expert.
  const ModelPlan plan = plan_products(m->file(), RuntimeOptions{});
  const std::string table = describe_plan(plan);
  EXPECT_NE(table.find("blk.1.ffn_up_exps.weight"), std::string::npos) << table;
  EXPECT_NE(table.find("grouped by expert"), std::string::npos) << table;
  EXPECT_NE(table.find("x2 experts"), std::string::npos) << table;
  fs::remove(path);
}

struct Out {
  std::vector<int32_t> tokens;
  bool done = false;
};

EventSink collect(Out& o) {
  return [&o](const RequestEvent& ev) {
    o.tokens.insert(o.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    if (ev.finished) o.done = true;
  };
}

void run_until_idle(Engine& e) {
  for (int i = 0; i < 100000 && e.step(); ++i) {
  }
}


// Ten requests at once (prompt chunks and decodes in the same steps, the
// experts' rows grouped across sequences) give every request the tokens it
// gets alone; also with a q8_0 KV cache, with the prefix cache serving a
// shared prefix, and with n-gram speculation (several rows of a sequence
// per step). MXFP4 experts: panels for an expert's grouped rows, row
// kernels for one or two, the same bits. gpt-oss in llama.cpp's MXFP4_MOE
// mix: q8_0 attention with sinks and a window of 8 on layer 0 besides.
TEST(MoeEngine, MixedStepsAreBatchInvariant) {
  const std::pair<const char*, const char*> cases[] = {
      {"qwen3moe", "q8_0"}, {"qwen2moe", "q8_0"}, {"llama", "q8_0"}, {"qwen3moe", "mxfp4"},
      {"gpt-oss", "mxfp4_moe"}};
  for (const auto& [arch, type] : cases) {
    const std::string path = synth_to_temp(small_moe(arch, type), std::string(arch) + type);
    auto model = Model::load(path);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 10; ++i) {
      std::vector<int32_t> p = {1};
      // A shared 20-token prefix for half of them, then their own tokens.
      for (int j = 0; j < 20 + 3 * i; ++j) p.push_back(3 + ((i % 2 ? 0 : i) * 31 + j * 97) % 509);
      prompts.push_back(p);
    }
    for (KvType kv : {KvType::kF16, KvType::kQ8_0}) {
      for (bool spec : {false, true}) {
        EngineConfig base{.threads = 2, .max_context = 128, .kv_cache = {kv, kv}};
        if (spec) base.spec.mode = SpecMode::kNgram;
        std::vector<std::vector<int32_t>> alone;
        for (const auto& p : prompts) {
          Engine e(*model, base);
          Out o;
          e.submit(p, test::greedy_to(12), collect(o));
          run_until_idle(e);
          ASSERT_TRUE(o.done);
          alone.push_back(o.tokens);
        }
        EngineConfig mixed = base;
        mixed.max_batch_tokens = 24;
        Engine e(*model, mixed);
        std::vector<Out> outs(prompts.size());
        for (size_t i = 0; i < prompts.size(); ++i) e.submit(prompts[i], test::greedy_to(12), collect(outs[i]));
        run_until_idle(e);
        for (size_t i = 0; i < prompts.size(); ++i)
          EXPECT_EQ(outs[i].tokens, alone[i]) << arch << " " << type << " request " << i << " kv " << static_cast<int>(kv)
                                              << (spec ? " with speculation" : "");
      }
    }
    model.reset();
    fs::remove(path);
  }
}

}  // namespace
}  // namespace tandem
