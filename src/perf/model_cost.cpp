#include "perf/model_cost.h"

#include <algorithm>

#include "gguf/gguf.h"
#include "kernels/layouts.h"
#include "model/model.h"

namespace tandem {
namespace {

// What a decode step reads: the repacked panels where the model holds them.
uint64_t matrix_bytes(const WeightMatrix& w) {
  if (!w) return 0;
  if (w.panels()) return layout_bytes(w, WeightLayout::kPanels);
  return static_cast<uint64_t>(w.rows) * w.row_stride;
}
uint64_t matrix_macs(const WeightMatrix& w) { return w ? static_cast<uint64_t>(w.rows) * w.cols : 0; }

// Sum over positions p in [start, start+n) of min(p + 1, window) (window 0: no limit).
uint64_t context_sum(int64_t start, int64_t n, int64_t window) {
  uint64_t s = 0;
  for (int64_t p = start; p < start + n; ++p) s += static_cast<uint64_t>(window > 0 ? std::min(p + 1, window) : p + 1);
  return s;
}

}  // namespace

std::string file_type_name(int64_t ftype) {
  // llama_ftype numbering (part of the file format; gaps are removed types).
  static const std::map<int64_t, const char*> kNames = {
      {0, "f32"},     {1, "f16"},     {2, "q4_0"},    {3, "q4_1"},    {7, "q8_0"},    {8, "q5_0"},
      {9, "q5_1"},    {10, "q2_k"},   {11, "q3_k_s"}, {12, "q3_k_m"}, {13, "q3_k_l"}, {14, "q4_k_s"},
      {15, "q4_k_m"}, {16, "q5_k_s"}, {17, "q5_k_m"}, {18, "q6_k"},   {32, "bf16"},   {38, "mxfp4_moe"}};
  auto it = kNames.find(ftype);
  return it != kNames.end() ? it->second : "ftype " + std::to_string(ftype);
}

const char* compute_family_name(ComputeFamily f) {
  switch (f) {
    case ComputeFamily::kFp32: return "fp32";
    case ComputeFamily::kInt8: return "int8";
    case ComputeFamily::kBf16: return "bf16";
  }
  return "?";
}

ComputeFamily compute_family(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16: return ComputeFamily::kFp32;
    case GgmlType::BF16: return ComputeFamily::kBf16;
    default: return ComputeFamily::kInt8;
  }
}

uint64_t ModelCost::attention_macs(int64_t start, int64_t n) const {
  const uint64_t per_pos = static_cast<uint64_t>(n_head) * (head_dim + head_dim_v);
  const uint64_t full = context_sum(start, n, 0), windowed = context_sum(start, n, sliding_window);
  return per_pos * (full * static_cast<uint64_t>(n_layer - n_swa_layers) + windowed * static_cast<uint64_t>(n_swa_layers));
}

uint64_t ModelCost::prefill_macs(int64_t P) const {
  if (P <= 0) return 0;
  return layer_macs_per_token * static_cast<uint64_t>(P) - last_layer_tail_macs * static_cast<uint64_t>(P - 1) +
         output_macs + attention_macs(0, P);
}

double ModelCost::kv_read_bytes_per_step(int64_t start, int64_t n, double k_bytes, double v_bytes) const {
  if (n <= 0) return 0;
  const double per_pos = n_head_kv * (head_dim * k_bytes + head_dim_v * v_bytes);
  const uint64_t full = context_sum(start, n, 0), windowed = context_sum(start, n, sliding_window);
  const double total = static_cast<double>(per_pos) *
                       (static_cast<double>(full) * (n_layer - n_swa_layers) + static_cast<double>(windowed) * n_swa_layers);
  return total / static_cast<double>(n);
}

ModelCost model_cost(const Model& m) {
  const ModelConfig& c = m.config();
  const ModelWeights& w = m.weights();
  ModelCost mc;
  std::map<GgmlType, uint64_t> by_type, macs_by_type;
  auto add = [&](const WeightMatrix& x, bool per_token) {
    if (!x) return;
    mc.decode_weight_bytes += matrix_bytes(x);
    by_type[x.type] += matrix_bytes(x);
    (per_token ? mc.layer_macs_per_token : mc.output_macs) += matrix_macs(x);
    if (per_token) macs_by_type[x.type] += matrix_macs(x);
  };
  for (const LayerWeights& L : w.layers) {
    for (const WeightMatrix* x : L.matrices()) add(*x, true);
    for (const WeightMatrix* x : {&L.k_b, &L.v_b}) add(*x, true);  // latent attention's up-projections
    if (!L.moe) continue;
    // A token reads the router, the shared expert and its k experts (all
    // experts of a layer have one shape; which k varies by token).
    add(L.moe.router, true);
    for (const WeightMatrix* x : {&L.moe.sh_gate, &L.moe.sh_up, &L.moe.sh_down, &L.moe.sh_gate_inp}) add(*x, true);
    for (int32_t j = 0; j < c.n_expert_used; ++j)
      for (const WeightMatrix* x : {&L.moe.gate[0], &L.moe.up[0], &L.moe.down[0]}) add(*x, true);
  }
  add(w.output, false);
  if (!w.layers.empty()) {
    const LayerWeights& last = w.layers.back();
    for (const WeightMatrix* x : {&last.wo, &last.w_gate, &last.w_up, &last.w_down})
      mc.last_layer_tail_macs += matrix_macs(*x);
    if (last.moe) {
      mc.last_layer_tail_macs += matrix_macs(last.moe.router);
      for (const WeightMatrix* x : last.moe.matrices()) mc.last_layer_tail_macs += matrix_macs(*x);
      // All experts' products were counted: only k per token run.
      for (const WeightMatrix* x : {&last.moe.gate[0], &last.moe.up[0], &last.moe.down[0]})
        mc.last_layer_tail_macs -= matrix_macs(*x) * static_cast<uint64_t>(c.n_expert - c.n_expert_used);
    }
  }

  uint64_t best = 0;
  for (const auto& [t, b] : by_type) {
    mc.bytes_by_type[std::string(type_traits(t).name)] = b;
    if (b > best) {
      best = b;
      mc.main_type = t;
    }
  }
  best = 0;
  for (const auto& [t, macs] : macs_by_type)
    if (macs > best) {
      best = macs;
      mc.prefill_type = t;
    }
  mc.family = compute_family(mc.prefill_type);
  if (auto ft = m.file().get_int("general.file_type")) mc.file_type = file_type_name(*ft);
  mc.n_layer = c.n_layer;
  mc.n_head = c.n_head;
  mc.n_head_kv = c.n_head_kv;
  mc.head_dim = c.head_dim;
  mc.head_dim_v = c.head_dim_v;
  mc.sliding_window = c.sliding_window;
  for (int32_t il = 0; il < c.n_layer; ++il)
    if (il < static_cast<int32_t>(c.layer_is_swa.size()) && c.layer_is_swa[il] && c.sliding_window > 0) ++mc.n_swa_layers;
  return mc;
}

}  // namespace tandem
