#include "quant/ggml_type.h"

#include "core/error.h"

namespace tandem {
namespace {

struct Entry {
  uint32_t id;
  TypeTraits t;
};

// Block sizes and byte counts follow ggml's block structs.
constexpr Entry kTypes[] = {
    {0, {"f32", 1, 4, true}},
    {1, {"f16", 1, 2, true}},
    {2, {"q4_0", 32, 2 + 16, true}},
    {3, {"q4_1", 32, 2 + 2 + 16, true}},
    {6, {"q5_0", 32, 2 + 4 + 16, true}},
    {7, {"q5_1", 32, 2 + 2 + 4 + 16, true}},
    {8, {"q8_0", 32, 2 + 32, true}},
    {9, {"q8_1", 32, 2 + 2 + 32, false}},
    {10, {"q2_K", 256, 256 / 16 + 256 / 4 + 2 + 2, true}},
    {11, {"q3_K", 256, 256 / 8 + 256 / 4 + 12 + 2, true}},
    {12, {"q4_K", 256, 2 + 2 + 12 + 256 / 2, true}},
    {13, {"q5_K", 256, 2 + 2 + 12 + 256 / 8 + 256 / 2, true}},
    {14, {"q6_K", 256, 256 / 2 + 256 / 4 + 256 / 16 + 2, true}},
    {15, {"q8_K", 256, 4 + 256 + 256 / 16 * 2, false}},
    {24, {"i8", 1, 1, false}},
    {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},
    {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},
    {30, {"bf16", 1, 2, true}},
    {39, {"mxfp4", 32, 1 + 16, true}},
};

}  // namespace

std::optional<TypeTraits> type_traits(uint32_t type_id) {
  for (const auto& e : kTypes)
    if (e.id == type_id) return e.t;
  return std::nullopt;
}

const TypeTraits& type_traits(GgmlType t) {
  for (const auto& e : kTypes)
    if (e.id == static_cast<uint32_t>(t)) return e.t;
  fail(ErrorKind::kUnsupported, "unknown tensor type id {}", static_cast<uint32_t>(t));
}

size_t row_bytes(GgmlType t, int64_t n) {
  const TypeTraits& tt = type_traits(t);
  if (n < 0 || n % tt.block_elems != 0)
    fail(ErrorKind::kInvalidArgument, "row of {} elements is not a whole number of {} blocks ({} each)",
         n, tt.name, tt.block_elems);
  return static_cast<size_t>(n / tt.block_elems) * tt.block_bytes;
}

}  // namespace tandem
