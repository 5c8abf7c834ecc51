// How the kernels pick an instruction set: builds, and one table that picks
// from them (products.cpp).
//
// A build is the kernels compiled for one target, named by the level whose
// CPU features it needs (scalar, avx2, avx2-vnni, avx512, avx512-vnni). Its
// files put that target's attribute on every function (TD_FN / TD_ATTR,
// simd_*.h); a body written once for two targets is compiled into each by
// including it per target (simd_avx2_variants.h, attention_chunk.h). A file
// adds to its build what it has, through one exported function: per weight
// type (TypeFns: the products) or per build (LevelFns: attention, norms,
// activations), null where it has nothing. No kernel file compares levels.
//
// kernel_builds.cpp lists the files of every build and which builds each
// level runs, best first; a level's function for a slot is that of the first
// of its builds that has one. products.cpp's table holds the products'
// functions per (type, level) from there.
#pragma once

#include "runtime/cpu_features.h"
#include "quant/ggml_type.h"
#include "kernels/product_kernels.h"
#include "kernels/vec_dot.h"

namespace tandem {

// The functions of one weight type in one build (see GemmKernel for the
// product slots).
struct TypeFns {
  VecDotFn dot = nullptr;
  GemmPackFn pack = nullptr;
  GemmRunFn run = nullptr;
  GemmRun2Fn run2 = nullptr;
  GemmRowsFn rows = nullptr;
  GemmPrepareFn prepare = nullptr;  // the activations in the kernels' layout
};

// What one file adds to its build for weight type w.
using TypeFnsOf = TypeFns (*)(GgmlType w);

namespace attn_detail {
struct ChunkJob;
}

// The functions of one build that no weight type selects.
struct LevelFns {
  void (*attention_chunk)(const attn_detail::ChunkJob& job) = nullptr;  // attention.cpp
  double (*sum_squares)(const float* x, int64_t n) = nullptr;          // ops.cpp
  float (*log_sum_exp)(const float* x, int64_t n) = nullptr;
  void (*gelu_gated)(float* gate, const float* up, int64_t n) = nullptr;
  void (*silu_gated)(float* gate, const float* up, int64_t n) = nullptr;
};
using LevelFnsOf = LevelFns (*)();

// What `level` runs, each slot from the first of its builds that has it.
// Neither checks that the CPU runs `level`: their callers do.
TypeFns type_fns(GgmlType w, KernelLevel level);
const LevelFns& level_fns(KernelLevel level);  // resolved once per level

namespace builds {
// scalar: the references every other build matches bit for bit.
TypeFns scalar_dot(GgmlType w);       // vec_dot_ref.cpp
TypeFns scalar_products(GgmlType w);  // product_ref.cpp
TypeFns scalar_acts(GgmlType w);      // product_acts.cpp
LevelFns scalar_attention();          // attention_ref.cpp
LevelFns scalar_ops();                // ops.cpp
#if defined(__x86_64__)
// avx2 (AVX2 + FMA + F16C), and what AVX-VNNI's dpbusd changes of it.
TypeFns avx2_dot(GgmlType w);        // vec_dot_avx2.cpp
TypeFns avx2_vnni_dot(GgmlType w);
TypeFns avx2_panels(GgmlType w);     // product_panels_avx2.cpp
TypeFns avx2_vnni_panels(GgmlType w);
TypeFns avx2_rows(GgmlType w);       // product_rows_avx2.cpp
LevelFns avx2_attention();           // attention_avx2.cpp
LevelFns avx2_ops();                 // ops.cpp
// avx512 (AVX-512 F/BW/VL, no VNNI).
LevelFns avx512_attention();  // attention_avx512.cpp
LevelFns avx512_ops();        // ops.cpp
// avx512-vnni (AVX-512 F/BW/VL + VNNI).
TypeFns avx512_panels(GgmlType w);      // product_panels_avx512.cpp
TypeFns avx512_q32_rows(GgmlType w);    // product_rows_avx512_q32.cpp
TypeFns avx512_kquant_rows(GgmlType w); // product_rows_avx512_kquant.cpp
TypeFns avx512_float_rows(GgmlType w);  // product_rows_avx512_float.cpp
TypeFns avx512_acts(GgmlType w);        // product_acts_avx512.cpp
TypeFns avx512_dot(GgmlType w);         // vec_dot_avx512.cpp
LevelFns avx512_vnni_attention();        // attention_avx512.cpp
#endif
}  // namespace builds

}  // namespace tandem
