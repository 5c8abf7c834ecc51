// What a model's linear layers would run, without loading it: for every
// weight matrix, the layout the options give it at load (choose_layout) and
// the product select_product picks (kernels/products.h) at one activation row
// (decode) and at the prefill chunk that matrix sees, with what it costs in
// bytes. This is `tandem inspect FILE --plan`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/options.h"
#include "kernels/products.h"

namespace tandem {

class GgufFile;

struct MatrixPlan {
  std::string name;  // the GGUF tensor
  GgmlType type = GgmlType::F32;
  int64_t rows = 0, cols = 0;
  size_t file_bytes = 0;
  LayoutChoice layout;        // at load
  size_t read_bytes = 0;      // what one pass of a product reads: the layout's buffer and the file rows it leaves
  int64_t prefill_rows = 0;   // activation rows of one prefill product (a chunk; 1 for the output matrix)
  Product decode, prefill;
  // A mixture-of-experts tensor: one line for its n_expert matrices (rows x
  // cols is one expert's; file_bytes all of them), routed by expert: a decode
  // row reads `experts_used` of them (read_bytes), a prefill chunk's rows are
  // grouped by expert (prefill_rows: an expert's mean share of the chunk).
  int32_t experts = 0, experts_used = 0;
};

struct ModelPlan {
  KernelLevel level = KernelLevel::kScalar;
  PrepackMode prepack = PrepackMode::kAuto;
  std::string note;  // why the layouts differ from what the options ask, or ""
  std::vector<MatrixPlan> matrices;
};

// Throws tandem::Error for a file Model::load would refuse.
ModelPlan plan_products(const GgufFile& f, const RuntimeOptions& opts);
// A table of the plan, one line a matrix, and the totals.
std::string describe_plan(const ModelPlan& plan);

}  // namespace tandem
