#include "model/plan.h"

#include <algorithm>

#include <fmt/format.h>

#include "runtime/memory_info.h"
#include "gguf/gguf.h"
#include "kernels/layouts.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weights.h"

namespace tandem {
namespace {

std::string tensor_name(const GgufFile& f, const WeightMatrix& W) {
  for (const GgufTensor& t : f.tensors())
    if (t.data == W.data) return t.name;
  return "?";
}

double mib(size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

}  // namespace

ModelPlan plan_products(const GgufFile& f, const RuntimeOptions& opts) {
  ModelConfig cfg = ModelConfig::from_gguf(f);
  const ModelWeights w = ModelWeights::bind(f, cfg);
  ModelPlan plan;
  plan.level = opts.kernels.value_or(active_kernel_level());
  plan.prepack = opts.prepack;
  const StreamTuning tuning = stream_tuning(opts);

  // In forward order, as Model::prepack_weights lays them out; the output
  // matrix computes logits for the prompt's last row only.
  struct Entry {
    const WeightMatrix* W;
    int64_t chunk;
    int32_t experts = 0;  // a MoE tensor: W is its first expert
  };
  std::vector<Entry> all;
  // Rows an expert meets in a prefill chunk, on average (a balanced router).
  const int64_t expert_rows =
      cfg.n_expert > 0 ? std::max<int64_t>(1, kMoeChunkRows * cfg.n_expert_used / cfg.n_expert) : 0;
  for (const LayerWeights& L : w.layers) {
    for (const WeightMatrix* W : {&L.wq_a, &L.wq, &L.wk, &L.wv, &L.wo}) all.push_back({W, kAttnChunkRows});
    for (const WeightMatrix* W : {&L.w_gate, &L.w_up, &L.w_down}) all.push_back({W, kFfnChunkRows});
    if (!L.moe) continue;
    all.push_back({&L.moe.router, kMoeChunkRows});
    for (const auto* kind : {&L.moe.gate, &L.moe.up, &L.moe.down}) all.push_back({&(*kind)[0], expert_rows, cfg.n_expert});
    for (const WeightMatrix* W : {&L.moe.sh_gate_inp, &L.moe.sh_gate, &L.moe.sh_up, &L.moe.sh_down})
      all.push_back({W, kMoeChunkRows});
  }
  all.push_back({&w.output, 1});

  size_t repacked = 0;
  for (const auto& [W, chunk, experts] : all) {
    if (!*W) continue;
    MatrixPlan m;
    m.name = tensor_name(f, *W);
    m.type = W->type;
    m.rows = W->rows;
    m.cols = W->cols;
    const size_t copies = experts > 0 ? static_cast<size_t>(experts) : 1;
    m.file_bytes = static_cast<size_t>(W->rows) * W->row_stride * copies;
    m.layout = choose_layout(*W, plan.level, opts.prepack);
    m.layout.bytes *= copies;
    m.prefill_rows = chunk;
    m.experts = experts;
    m.experts_used = experts > 0 ? cfg.n_expert_used : 0;
    repacked += m.layout.bytes;
    plan.matrices.push_back(m);
  }
  // As the load does: copies that would not fit stay in the file's layout.
  if (const auto avail = available_memory_bytes(opts.memory_available); avail && repacked > *avail) {
    plan.note = fmt::format("repacking takes {:.1f} MiB and {:.1f} MiB are available: every matrix stays in the "
                            "file's rows",
                            mib(repacked), mib(*avail));
    for (MatrixPlan& m : plan.matrices) m.layout = {};
  }
  for (MatrixPlan& m : plan.matrices) {
    // Rows past the last whole tile stay in the file's rows.
    int64_t moved = 0;
    if (m.layout.layout == WeightLayout::kPanels) moved = m.rows;
    if (m.layout.layout == WeightLayout::kTiles) moved = m.rows / 16 * 16;
    m.read_bytes = m.layout.bytes + static_cast<size_t>(m.rows - moved) * (m.file_bytes / static_cast<size_t>(m.rows));
    if (m.experts > 0) m.read_bytes = m.read_bytes / static_cast<size_t>(m.experts) * static_cast<size_t>(m.experts_used);
    m.decode = select_product(m.type, m.layout.layout, 1, plan.level, tuning);
    m.prefill = select_product(m.type, m.layout.layout, m.prefill_rows, plan.level, tuning);
  }
  return plan;
}

std::string describe_plan(const ModelPlan& plan) {
  std::string out = fmt::format(
      "kernels {}, prepack {}; a prefill runs attention in chunks of {} rows, the feed-forward in {}\n",
      kernel_level_name(plan.level), prepack_mode_name(plan.prepack), kAttnChunkRows, kFfnChunkRows);
  if (!plan.note.empty()) out += "note: " + plan.note + "\n";
  out += fmt::format("\n{:<28} {:<5} {:>14} {:<7} {:>9} {:>8}  {:<24} {}\n", "tensor", "type", "rows x cols",
                     "layout", "read MiB", "new MiB", "decode (1 row)", "prefill");
  size_t file = 0, read = 0, fresh = 0;
  for (const MatrixPlan& m : plan.matrices) {
    const std::string shape = m.experts > 0 ? fmt::format("{} x {} x {}", m.experts, m.rows, m.cols)
                                            : fmt::format("{} x {}", m.rows, m.cols);
    // An expert tensor's route: k of its experts per decode row; prefill
    // rows grouped by expert, a GEMM per picked expert.
    const std::string decode = m.experts > 0 ? fmt::format("{} x{} experts", m.decode.name(), m.experts_used)
                                             : std::string(m.decode.name());
    out += fmt::format("{:<28} {:<5} {:>14} {:<7} {:>9.2f} {:>8.2f}  {:<24} {} row{}{}: {}\n", m.name,
                       type_traits(m.type).name, shape, weight_layout_name(m.layout.layout), mib(m.read_bytes),
                       mib(m.layout.bytes), decode, m.prefill_rows, m.prefill_rows == 1 ? "" : "s",
                       m.experts > 0 ? " per expert, grouped by expert" : "", m.prefill.name());
    file += m.file_bytes;
    read += m.read_bytes;
    fresh += m.layout.bytes;
  }
  out += fmt::format(
      "\n{} matrices: {:.1f} MiB in the file, {:.1f} MiB repacked at load (new memory), {:.1f} MiB read per "
      "decoded token\n",
      plan.matrices.size(), mib(file), mib(fresh), mib(read));
  return out;
}

}  // namespace tandem
