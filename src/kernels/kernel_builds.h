// How the kernels pick an instruction set: builds, and one table that picks
// from them (products.cpp).
//
// A build is the kernels compiled for one target, named by the level whose
// CPU features it needs (scalar, avx2, avx2-vnni, avx512, avx512-vnni). Its
// files put that target's attribute on every function (TD_FN / TD_ATTR,
// simd_*.h); a body written once for two targets is compiled into each by
// including it per target (simd_avx2_variants.h). A file adds to its build
// the functions it has for each weight type, through one exported function
// that fills a TypeFns (null where it has none), and compares no levels.
//
// products.cpp lists the files of every build and which builds each level
// runs, best first; a level's function for a slot is that of the first of
// its builds that has one. Only that table decides what runs where.
#pragma once

#include "core/ggml_type.h"
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

namespace builds {
// scalar: the references every other build matches bit for bit.
TypeFns scalar_dot(GgmlType w);       // vec_dot_ref.cpp
TypeFns scalar_products(GgmlType w);  // product_ref.cpp
TypeFns scalar_acts(GgmlType w);      // product_acts.cpp
#if defined(__x86_64__)
// avx2 (AVX2 + FMA + F16C), and what AVX-VNNI's dpbusd changes of it.
TypeFns avx2_dot(GgmlType w);        // vec_dot_avx2.cpp
TypeFns avx2_vnni_dot(GgmlType w);
TypeFns avx2_panels(GgmlType w);     // product_panels_avx2.cpp
TypeFns avx2_vnni_panels(GgmlType w);
TypeFns avx2_rows(GgmlType w);       // product_rows_avx2.cpp
// avx512-vnni (AVX-512 F/BW/VL + VNNI).
TypeFns avx512_panels(GgmlType w);      // product_panels_avx512.cpp
TypeFns avx512_q32_rows(GgmlType w);    // product_rows_avx512_q32.cpp
TypeFns avx512_kquant_rows(GgmlType w); // product_rows_avx512_kquant.cpp
TypeFns avx512_float_rows(GgmlType w);  // product_rows_avx512_float.cpp
TypeFns avx512_acts(GgmlType w);        // product_acts_avx512.cpp
#endif
}  // namespace builds

}  // namespace tandem
