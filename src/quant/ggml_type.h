// Tensor element types as numbered by GGUF/ggml, with the block layout of each
// quantized format. The numbering is part of the file format and must not change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
  MXFP4 = 39,
};

struct TypeTraits {
  std::string_view name;  // "q4_K", as llama.cpp spells it
  int64_t block_elems;    // elements per block (1 for plain types)
  size_t block_bytes;     // bytes per block
  bool can_dequantize;    // Tandem has a dequantize routine for it
};

// nullopt for an id Tandem does not know (including the removed ids 4, 5).
std::optional<TypeTraits> type_traits(uint32_t type_id);
const TypeTraits& type_traits(GgmlType t);

// Bytes taken by one row of `n` elements; n must be a multiple of block_elems.
size_t row_bytes(GgmlType t, int64_t n);

}  // namespace tandem
