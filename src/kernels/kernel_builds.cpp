// The builds of the kernels, the files of each, and which builds each level
// runs (kernels/kernel_builds.h).
#include "kernels/kernel_builds.h"

#include <array>
#include <iterator>
#include <span>

namespace tandem {
namespace {

struct Build {
  KernelLevel target;  // the level whose CPU features the build needs
  std::span<const TypeFnsOf> type_files;
  std::span<const LevelFnsOf> level_files;
};

constexpr TypeFnsOf kScalarTypes[] = {builds::scalar_dot, builds::scalar_products, builds::scalar_acts};
constexpr LevelFnsOf kScalarLevel[] = {builds::scalar_attention, builds::scalar_ops};
#if defined(__x86_64__)
constexpr TypeFnsOf kAvx512VnniTypes[] = {builds::avx512_panels, builds::avx512_q32_rows,
                                          builds::avx512_kquant_rows, builds::avx512_float_rows,
                                          builds::avx512_acts, builds::avx512_dot};
constexpr LevelFnsOf kAvx512VnniLevel[] = {builds::avx512_vnni_attention};
constexpr LevelFnsOf kAvx512Level[] = {builds::avx512_attention, builds::avx512_ops};
constexpr TypeFnsOf kAvx2VnniTypes[] = {builds::avx2_vnni_dot, builds::avx2_vnni_panels};
constexpr TypeFnsOf kAvx2Types[] = {builds::avx2_dot, builds::avx2_panels, builds::avx2_rows};
constexpr LevelFnsOf kAvx2Level[] = {builds::avx2_attention, builds::avx2_ops};
#endif

// Best first. The products have no AVX-512 build without VNNI, the
// attention, norms and activations no AVX-VNNI one.
constexpr Build kBuilds[] = {
#if defined(__x86_64__)
    {KernelLevel::kAvx512Vnni, kAvx512VnniTypes, kAvx512VnniLevel},
    {KernelLevel::kAvx512, {}, kAvx512Level},
    {KernelLevel::kAvx2Vnni, kAvx2VnniTypes, {}},
    {KernelLevel::kAvx2, kAvx2Types, kAvx2Level},
#endif
    {KernelLevel::kScalar, kScalarTypes, kScalarLevel},
};

// Whether `level` runs the build for `target`. The levels are ordered by
// their CPU features, except that avx512 has no AVX-VNNI (it is the level of
// AVX-512 CPUs without VNNI), and avx512-vnni takes AVX-VNNI's build only
// where the CPU has AVX-VNNI too.
bool runs(KernelLevel level, KernelLevel target) {
  if (target > level) return false;
  if (target == KernelLevel::kAvx2Vnni)
    return level != KernelLevel::kAvx512 && cpu_supports_level(KernelLevel::kAvx2Vnni);
  return true;
}

template <typename Fn>
void take(Fn& slot, Fn f) {
  if (slot == nullptr) slot = f;
}

LevelFns resolve_level(KernelLevel level) {
  LevelFns r;
  for (const Build& b : kBuilds) {
    if (!runs(level, b.target)) continue;
    for (const LevelFnsOf file : b.level_files) {
      const LevelFns f = file();
      take(r.attention_chunk, f.attention_chunk);
      take(r.sum_squares, f.sum_squares);
      take(r.log_sum_exp, f.log_sum_exp);
      take(r.gelu_gated, f.gelu_gated);
      take(r.silu_gated, f.silu_gated);
    }
  }
  return r;
}

}  // namespace

TypeFns type_fns(GgmlType w, KernelLevel level) {
  TypeFns r;
  for (const Build& b : kBuilds) {
    if (!runs(level, b.target)) continue;
    for (const TypeFnsOf file : b.type_files) {
      const TypeFns f = file(w);
      take(r.dot, f.dot);
      take(r.pack, f.pack);
      take(r.run, f.run);
      take(r.run2, f.run2);
      take(r.rows, f.rows);
      take(r.prepare, f.prepare);
    }
  }
  return r;
}

const LevelFns& level_fns(KernelLevel level) {
  static const auto table = [] {
    std::array<LevelFns, std::size(kAllKernelLevels)> t{};
    for (size_t l = 0; l < t.size(); ++l) t[l] = resolve_level(kAllKernelLevels[l]);
    return t;
  }();
  return table[static_cast<size_t>(level)];
}

}  // namespace tandem
