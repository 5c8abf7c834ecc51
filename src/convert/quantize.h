// tandem quantize: a GGUF model rewritten in another weight type, the way
// llama.cpp's llama-quantize (llama_model_quantize, without an importance
// matrix) writes it, so the two tools' files are interchangeable:
//
// - Types by llama-quantize's names (case-insensitive) or general.file_type
//   numbers; the _M/_S/_L mixes pick each tensor's type by the rules of
//   llama_tensor_get_type (src/llama-quant.cpp): the output matrix (or a tied
//   token embedding) in Q6_K, attn_v and ffn_down with more bits on the
//   "use_more_bits" layers, and so on. A row width that the chosen type's
//   block does not divide falls back as llama.cpp does (Q2_K/Q3_K -> Q4_0,
//   Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16). Only 2-d and larger
//   tensors whose name ends in "weight" are converted, norms never; the rest
//   are copied in their own type.
// - Blocks from quant/quant.h's reference quantizers, which reproduce ggml's
//   quantize_row_*_ref (and the K-quant scale searches) bit for bit; a tensor
//   already in its target type is copied byte for byte.
// - Metadata copied in order, less the split keys, then
//   general.quantization_version = 2 and general.file_type = the llama_ftype;
//   tensors in llama.cpp's order (non-layer tensors by name, then layer by
//   layer, by name within a layer), data aligned to 32 bytes (or to the
//   input's general.alignment, which llama.cpp copies but does not honour).
//
// Differences from llama-quantize, by choice: converting a tensor that is
// already quantized into another quantized type needs allow_requantize (as
// there), but dequantizing into F32/F16/BF16 does not; and the output is
// written to a temporary file beside it and renamed into place only once
// complete, so a failure leaves no partial file.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "quant/ggml_type.h"

namespace tandem {

class GgufFile;

// One --type choice: llama-quantize's name and its llama_ftype number.
struct QuantizeType {
  const char* name;       // "Q4_K_M", as llama-quantize spells it
  uint32_t ftype;         // general.file_type (llama_ftype)
  GgmlType default_type;  // the type most tensors get
  const char* desc;       // one line for the list of types
};

// The types tandem quantize makes, in llama-quantize's order of its list.
const std::vector<QuantizeType>& quantize_types();
// "q4_k_m", "Q4_K_M" and "15" all give Q4_K_M; Q3_K, Q4_K and Q5_K are the _M
// mixes, as in llama-quantize. nullopt for anything else.
std::optional<QuantizeType> find_quantize_type(const std::string& name);
// "F32, F16, BF16, ..." for error messages.
std::string quantize_type_list();

struct QuantizeOptions {
  int n_threads = 0;              // <= 0: physical cores; the output does not depend on it
  bool allow_requantize = false;  // convert quantized tensors into other quantized types
  bool pure = false;              // every convertible tensor in the default type (no mix rules)
  bool leave_output_tensor = false;  // keep output.weight in its own type
  bool dry_run = false;           // plan and sizes only; no file is written
  // Progress lines (without line breaks); none when empty.
  std::function<void(const std::string&)> log;
  // When set and true, the run stops at the next slab of rows (kIo "interrupted")
  // and removes its temporary file: the CLI's SIGINT/SIGTERM handler sets it.
  const std::atomic<bool>* cancel = nullptr;
};

// The type chosen for one tensor.
struct TensorPlanEntry {
  std::string name;
  std::vector<int64_t> dims;
  GgmlType src_type;
  GgmlType dst_type;
  bool converted;  // dst_type != src_type
  bool fallback;   // the mix's type did not fit the row width
  uint64_t src_bytes = 0, dst_bytes = 0;
};

// Every tensor in output order with its type, by llama.cpp's rules. Throws
// kInvalidArgument for a conversion that is refused (requantizing without
// allow_requantize, a type Tandem cannot dequantize).
std::vector<TensorPlanEntry> plan_quantization(const GgufFile& in, const QuantizeType& type,
                                               const QuantizeOptions& opts);

struct QuantizeReport {
  int64_t n_tensors = 0, n_converted = 0, n_fallback = 0;
  int64_t n_elements = 0;
  uint64_t bytes_in = 0, bytes_out = 0;  // tensor data, as llama-quantize counts it
  uint64_t file_bytes = 0;               // the output file (0 for a dry run)
  double seconds = 0;
  std::map<std::string, int> tensors_per_type;  // "q6_K" -> count, in the output
  double bpw_in() const { return n_elements ? 8.0 * static_cast<double>(bytes_in) / static_cast<double>(n_elements) : 0; }
  double bpw_out() const { return n_elements ? 8.0 * static_cast<double>(bytes_out) / static_cast<double>(n_elements) : 0; }
};

// Reads in_path, writes out_path. Throws tandem::Error: kInvalidArgument
// (output path is the input, refused conversion), kInvalidFile / kIo (input),
// kIo (the output cannot be written; nothing is left behind).
QuantizeReport quantize_model(const std::string& in_path, const std::string& out_path,
                              const QuantizeType& type, const QuantizeOptions& opts);

}  // namespace tandem
