// `tandem inspect --plan` (model/plan.h) says what a load does: every matrix
// of the plan has the layout and buffer size the loaded model gives it, for
// each prepack mode, and the products it names are what select_product picks.
#include "model/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>

#include "gguf/gguf.h"
#include "gguf/synth.h"
#include "kernels/layouts.h"
#include "model/model.h"
#include "test_support.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

TEST(ModelPlan, LayoutsAreWhatTheLoadGives) {
  for (const char* type : {"q8_0", "q4_0", "q4_k_m", "f16"}) {
    SCOPED_TRACE(type);
    SynthSpec s;
    s.arch = "qwen2";  // tied: the output matrix is the embedding
    s.n_layer = 2, s.n_embd = 256, s.n_ff = 512, s.n_head = 4, s.n_head_kv = 2;
    s.type = type;
    s.vocab_from = test::shared_path("models/gguf/stories260K.gguf");
    const fs::path p = fs::temp_directory_path() / ("tandem_plan_" + std::string(type) + ".gguf");
    synth_model(s, p.string(), 1);
    auto f = GgufFile::open(p.string());
    for (PrepackMode mode : {PrepackMode::kOff, PrepackMode::kAuto, PrepackMode::kAll}) {
      const ModelPlan plan = plan_products(*f, {.prepack = mode});
      EXPECT_EQ(plan.level, active_kernel_level());
      ASSERT_EQ(plan.matrices.size(), 2u * 7u + 1u);
      EXPECT_EQ(plan.matrices.back().name, "token_embd.weight");
      EXPECT_EQ(plan.matrices.front().name, "blk.0.attn_q.weight");
      auto m = Model::load(p.string(), {.prepack = mode});
      // The layers' matrices that exist (attention ones first), then the output.
      std::vector<const WeightMatrix*> loaded;
      std::vector<int64_t> chunk_rows;
      for (const LayerWeights& L : m->weights().layers)
        for (const WeightMatrix* W : L.matrices())
          if (*W) {
            loaded.push_back(W);
            chunk_rows.push_back(W == &L.w_gate || W == &L.w_up || W == &L.w_down ? kFfnChunkRows : kAttnChunkRows);
          }
      loaded.push_back(&m->weights().output);
      chunk_rows.push_back(1);
      size_t repacked = 0;
      for (size_t i = 0; i < loaded.size(); ++i) {
        const MatrixPlan& mp = plan.matrices[i];
        EXPECT_EQ(mp.layout.layout, loaded[i]->layout) << mp.name;
        EXPECT_EQ(mp.layout.bytes, layout_bytes(*loaded[i], loaded[i]->layout)) << mp.name;
        repacked += mp.layout.bytes;
        EXPECT_EQ(mp.decode.route, select_product(mp.type, mp.layout.layout, 1, plan.level, stream_tuning()).route);
        EXPECT_EQ(mp.prefill_rows, chunk_rows[i]);
      }
      EXPECT_EQ(repacked, m->packed_bytes());
      const std::string text = describe_plan(plan);
      EXPECT_NE(text.find("blk.1.ffn_down.weight"), std::string::npos) << text;
      EXPECT_NE(text.find("read per decoded token"), std::string::npos) << text;
    }
    // Copies that would not fit stay in the file, as the load leaves them
    // (and the plan says so wherever the kernel level repacks this type).
    const ModelPlan roomy = plan_products(*f, {.prepack = PrepackMode::kAll});
    const bool repacks = std::any_of(roomy.matrices.begin(), roomy.matrices.end(),
                                     [](const MatrixPlan& mp) { return mp.layout.layout != WeightLayout::kFileRows; });
    const ModelPlan tight = plan_products(*f, {.prepack = PrepackMode::kAll, .memory_available = 1000});
    EXPECT_EQ(tight.note != "", repacks);
    for (const MatrixPlan& mp : tight.matrices) EXPECT_EQ(mp.layout.layout, WeightLayout::kFileRows) << mp.name;
    fs::remove(p);
  }
}

}  // namespace
}  // namespace tandem
