// deepseek2 (multi-head latent attention) on a small random-weight model:
// batching never changes a row's logits, in every cache type; the older
// fused attn_kv_b form of the same weights gives the same logits; the cache
// holds the latent. With mixture-of-experts layers (the first dense, routed
// and shared experts) batching changes nothing either; MoE files missing the
// expert keys, or with grouped routing, are refused by name.
// The comparison with llama.cpp is in model_arch_test.cpp (arch_deepseek2_*).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/synth.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/thread_pool.h"
#include "test_support.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// The shape of tests/data/llamacpp/arch_deepseek2_f32.json.
SynthSpec small_spec() {
  SynthSpec s;
  s.arch = "deepseek2";
  s.n_layer = 2, s.n_embd = 128, s.n_ff = 256, s.n_head = 4;
  s.head_dim = 64, s.rope_dim = 32, s.kv_lora_rank = 64, s.head_dim_v = 32;
  s.vocab_from = test::shared_path("models/gguf/stories260K.gguf");
  return s;
}

std::string synth_file(const std::string& name, const SynthSpec& s) {
  const fs::path p = fs::temp_directory_path() / ("tandem_ds2_" + name + "_" + std::to_string(::getpid()) + ".gguf");
  synth_model(s, p.string(), 1);
  return p.string();
}

// A copy of `in` with its metadata and tensors passed through `edit_kv`
// (return false to drop a key) and `edit_tensors` (may add and replace).
using Tensors = std::vector<std::tuple<std::string, GgmlType, std::vector<int64_t>, std::vector<uint8_t>>>;
std::string rewrite(const std::string& in, const std::string& name, const std::function<bool(GgufKV&)>& edit_kv,
                    const std::function<void(Tensors&)>& edit_tensors) {
  auto f = GgufFile::open(in);
  GgufWriter w;
  for (GgufKV kv : f->metadata())
    if (edit_kv(kv)) w.add(kv.key, kv.value);
  Tensors ts;
  for (const GgufTensor& t : f->tensors())
    ts.emplace_back(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  edit_tensors(ts);
  for (auto& [n, type, dims, data] : ts) w.add_tensor(n, type, dims, std::move(data));
  const std::string out = in + "." + name + ".gguf";
  w.write(out);
  return out;
}

GgufValue u32(uint32_t v) {
  GgufValue x;
  x.type = GgufType::UINT32;
  x.v = uint64_t{v};
  return x;
}

// Logits of the prompt's last row, then of each decode step, for each sequence
// run on its own.
std::vector<std::vector<float>> alone(Model& m, KvType type, const std::vector<std::vector<int32_t>>& prompts,
                                      int steps) {
  ThreadPool pool(2);
  std::vector<std::vector<float>> out;
  for (const auto& p : prompts) {
    KvCache kv(m.kv_shape(), 8, 16, type);
    SeqKv seq;
    EXPECT_TRUE(seq.reserve(kv, 64));
    Logits l;
    m.prefill(seq, p, kv, pool, l);
    std::vector<float> all(l.begin(), l.end());
    for (int i = 0; i < steps; ++i) {
      const int32_t tok = 3 + (i * 37 + static_cast<int32_t>(p.size())) % 500;
      Logits d;
      SeqKv* s[] = {&seq};
      const int32_t t[] = {tok};
      m.decode(s, t, kv, pool, d);
      all.insert(all.end(), d.begin(), d.end());
    }
    out.push_back(all);
  }
  return out;
}

std::vector<int32_t> prompt(int n, int seed) {
  std::vector<int32_t> p{1};
  for (int i = 1; i < n; ++i) p.push_back(3 + (i * 97 + seed * 31) % 509);
  return p;
}

// The shape of tests/data/llamacpp/arch_deepseek2_moe_f32.json: layer 0
// dense, layer 1 with 8 routed experts of 64 (2 used) and 2 shared.
SynthSpec moe_spec() {
  SynthSpec s = small_spec();
  s.n_expert = 8, s.n_expert_used = 2, s.n_ff_exp = 64, s.n_expert_shared = 2;
  return s;
}

void expect_batch_invariant(const std::string& name, const SynthSpec& spec) {
  const std::string path = synth_file(name, spec);
  auto m = Model::load(path);
  const int V = m->config().n_vocab;
  const std::vector<std::vector<int32_t>> prompts = {prompt(37, 1), prompt(5, 2), prompt(20, 3)};
  constexpr int kSteps = 3;
  for (KvType type : {KvType::kF32, KvType::kF16, KvType::kQ8_0}) {
    const auto want = alone(*m, type, prompts, kSteps);
    // Together: each step one batch with every sequence's rows, the prompts
    // in chunks of 16 beside the others' decode rows.
    ThreadPool pool(2);
    KvCache kv(m->kv_shape(), 24, 16, type);
    std::vector<SeqKv> seqs(prompts.size());
    std::vector<SeqKv*> ptrs;
    for (auto& s : seqs) {
      ASSERT_TRUE(s.reserve(kv, 64));
      ptrs.push_back(&s);
    }
    std::vector<size_t> fed(prompts.size(), 0);
    std::vector<std::vector<float>> got(prompts.size());
    std::vector<int> decoded(prompts.size(), 0);
    for (int round = 0; round < 16; ++round) {
      Batch b;
      for (size_t i = 0; i < prompts.size(); ++i) {
        if (fed[i] < prompts[i].size()) {
          const size_t n = std::min<size_t>(16, prompts[i].size() - fed[i]);
          for (size_t j = 0; j < n; ++j)
            b.push_back({prompts[i][fed[i] + j], static_cast<int32_t>(fed[i] + j), static_cast<int32_t>(i),
                         fed[i] + j + 1 == prompts[i].size()});
          fed[i] += n;
        } else if (decoded[i] < kSteps) {
          const int32_t tok = 3 + (decoded[i] * 37 + static_cast<int32_t>(prompts[i].size())) % 500;
          b.push_back({tok, seqs[i].n_tokens, static_cast<int32_t>(i), true});
          ++decoded[i];
        }
      }
      if (b.empty()) break;
      Logits l;
      m->forward(b, ptrs, kv, pool, l);
      size_t k = 0;
      for (const BatchRow& r : b)
        if (r.logits) {
          got[size_t(r.seq)].insert(got[size_t(r.seq)].end(), l.begin() + k * V, l.begin() + (k + 1) * V);
          ++k;
        }
    }
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(got[i], want[i]) << "sequence " << i << ", cache " << kv_type_name(type);
  }
  fs::remove(path);
}

TEST(Deepseek2, BatchingNeverChangesARowsLogits) { expect_batch_invariant("batch", small_spec()); }

TEST(Deepseek2, BatchingNeverChangesARowsLogitsWithExperts) {
  SynthSpec s = moe_spec();
  s.expert_weights_norm = true, s.expert_weights_scale = 2.5f;  // V3's gating options
  expect_batch_invariant("batch_moe", s);
}

TEST(Deepseek2, ExpertLayersFollowTheLeadingDenseCount) {
  SynthSpec s = moe_spec();
  s.n_layer = 3, s.n_layer_dense_lead = 1, s.expert_weights_scale = 16.0f;
  const std::string path = synth_file("lead", s);
  auto m = Model::load(path);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.n_layer_dense_lead, 1);
  EXPECT_EQ(c.n_expert, 8);
  EXPECT_EQ(c.n_expert_used, 2);
  EXPECT_EQ(c.n_ff_exp, 64);
  EXPECT_EQ(c.n_ff_shexp, 128);  // 2 shared experts of 64, one FFN
  EXPECT_EQ(c.moe_gating.func, MoeGating::Func::kSoftmax);
  EXPECT_FALSE(c.moe_gating.normalize);
  EXPECT_EQ(c.moe_gating.scale, 16.0f);
  fs::remove(path);
}

TEST(Deepseek2, FusedKvBGivesTheSameLogitsAsSplit) {
  const SynthSpec s = small_spec();
  const std::string split = synth_file("split", s);
  const int64_t H = s.n_head, KL = s.kv_lora_rank, nope = s.head_dim - s.rope_dim, Dv = s.head_dim_v;
  // attn_kv_b as older converters wrote it: per head, nope key rows then Dv
  // value rows, each KL wide; key_length / value_length per head.
  const std::string fused = rewrite(
      split, "fused",
      [&](GgufKV& kv) {
        if (kv.key.ends_with("key_length_mla") || kv.key.ends_with("value_length_mla")) return false;
        if (kv.key == "deepseek2.attention.key_length") kv.value = u32(uint32_t(s.head_dim));
        if (kv.key == "deepseek2.attention.value_length") kv.value = u32(uint32_t(Dv));
        if (kv.key == "deepseek2.attention.head_count_kv") kv.value = u32(uint32_t(H));
        return true;
      },
      [&](Tensors& ts) {
        Tensors out;
        for (size_t i = 0; i < ts.size(); ++i) {
          auto& [name, type, dims, data] = ts[i];
          if (name.ends_with("attn_v_b.weight")) continue;
          if (!name.ends_with("attn_k_b.weight")) {
            out.push_back(std::move(ts[i]));
            continue;
          }
          const auto* kb = reinterpret_cast<const float*>(data.data());  // [H][KL][nope]
          const auto& vb_data = std::get<3>(ts[i + 1]);                  // attn_v_b follows
          const auto* vb = reinterpret_cast<const float*>(vb_data.data());  // [H][Dv][KL]
          std::vector<float> kvb(size_t(H * (nope + Dv) * KL));
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t j = 0; j < nope; ++j)
              for (int64_t r = 0; r < KL; ++r) kvb[size_t((h * (nope + Dv) + j) * KL + r)] = kb[(h * KL + r) * nope + j];
            for (int64_t j = 0; j < Dv; ++j)
              for (int64_t r = 0; r < KL; ++r)
                kvb[size_t((h * (nope + Dv) + nope + j) * KL + r)] = vb[(h * Dv + j) * KL + r];
          }
          std::vector<uint8_t> bytes(kvb.size() * 4);
          std::memcpy(bytes.data(), kvb.data(), bytes.size());
          const std::string kvb_name = name.substr(0, name.size() - std::strlen("attn_k_b.weight")) + "attn_kv_b.weight";
          out.emplace_back(kvb_name, GgmlType::F32, std::vector<int64_t>{KL, H * (nope + Dv)}, std::move(bytes));
        }
        ts = std::move(out);
      });
  auto a = Model::load(split);
  auto b = Model::load(fused);
  EXPECT_FALSE(a->config().kv_b_fused);
  EXPECT_TRUE(b->config().kv_b_fused);
  const std::vector<std::vector<int32_t>> prompts = {prompt(30, 4)};
  EXPECT_EQ(alone(*a, KvType::kF32, prompts, 2), alone(*b, KvType::kF32, prompts, 2));
  fs::remove(split);
  fs::remove(fused);
}

TEST(Deepseek2, CacheHoldsTheLatentAndRopePart) {
  const std::string path = synth_file("shape", small_spec());
  auto m = Model::load(path);
  const KvShape s = m->kv_shape();
  EXPECT_EQ(s.n_head_kv, 1);
  EXPECT_EQ(s.k_width, 32);  // the rope part
  EXPECT_EQ(s.v_width, 64);  // the latent
  // 2 layers x (64 + 32) f16 values, against 2 x 4 heads x (64 + 32) per head.
  EXPECT_EQ(KvCache::bytes_per_token(s, kv_format(KvType::kF16, KvType::kF16)), 2u * 96 * 2);
  EXPECT_NE(describe_kv_cache(m->config()).find("384 bytes per token in f16"), std::string::npos)
      << describe_kv_cache(m->config());
  fs::remove(path);
}

TEST(Deepseek2, ExpertLayersWithoutExpertKeysAreRefusedByName) {
  const std::string path = synth_file("moe", small_spec());
  const std::string moe = rewrite(
      path, "moe",
      [](GgufKV& kv) {
        if (kv.key == "deepseek2.leading_dense_block_count") kv.value = u32(1);
        return true;
      },
      [](Tensors&) {});
  try {
    Model::load(moe);
    FAIL() << "a deepseek2 file with MoE layers but no expert_count loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile);
    EXPECT_NE(std::string(e.what()).find("mixture-of-experts"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("leading_dense_block_count = 1 of 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'deepseek2.expert_count'"), std::string::npos) << e.what();
  }
  fs::remove(path);
  fs::remove(moe);
}

TEST(Deepseek2, GroupedExpertRoutingIsRefusedByName) {
  const std::string path = synth_file("groups", moe_spec());
  auto kv_edit = [](uint32_t groups) {
    return [groups](GgufKV& kv) {
      // The gating key (softmax, also the default when absent) makes way for the group count.
      if (kv.key == "deepseek2.expert_gating_func") {
        kv.key = "deepseek2.expert_group_count";
        kv.value = u32(groups);
      }
      return true;
    };
  };
  const std::string one = rewrite(path, "g1", kv_edit(1), [](Tensors&) {});
  const std::string two = rewrite(path, "g2", kv_edit(2), [](Tensors&) {});
  EXPECT_NO_THROW(Model::load(one));  // one group (V2-Lite) is plain top-k
  try {
    Model::load(two);
    FAIL() << "a deepseek2 file with grouped expert routing loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("'deepseek2.expert_group_count' = 2"), std::string::npos) << e.what();
  }
  for (const auto& p : {path, one, two}) fs::remove(p);
}

}  // namespace
}  // namespace tandem
