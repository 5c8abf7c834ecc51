// Device helpers shared by the .cu files: f16 / bf16 bits, warp reductions,
// programmatic dependent launch, and the launch wrapper every kernel goes
// through.
//
// The .cu files are compiled with --fmad=false: a * b + c is two roundings
// unless written fmaf(), as on the CPU (whose references the dequantizers
// match bit for bit); the reductions use fmaf() where they want it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/kernels.h"

namespace tandem::cuda {

__device__ __forceinline__ float f16_bits_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t float_to_f16_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ float bf16_bits_to_float(uint16_t h) { return __uint_as_float(uint32_t{h} << 16); }
// Round to nearest even, NaN kept quiet: as quant/quant.cpp's f32_to_bf16.
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over aligned groups of G lanes (G a power of two <= 32).
template <int G>
__device__ __forceinline__ int group_sum(int v) {
#pragma unroll
  for (int o = 1; o < G; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Programmatic dependent launch (sm_90): a kernel may start while the one
// before it in the stream finishes; it must wait before reading anything the
// earlier kernels wrote. Every kernel calls pdl_wait() before such reads and
// pdl_launch_dependents() to let the next kernel's blocks start (they
// prefetch their weights, which nothing writes, before waiting).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ uint4 ldg16(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

// Launches `kernel` on `s`, with the programmatic-serialization attribute
// when PDL is on, and throws on a launch error.
template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  // Not on the legacy default stream (tests launch there): PDL is for the
  // executor's own stream.
  cfg.numAttrs = pdl_enabled() && s != nullptr ? 1 : 0;
  TD_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Element size of an activation type's values (quantized: the int8 quants).
__host__ __device__ inline int act_value_bytes(ActType t) {
  return t == ActType::kF32 ? 4 : (t == ActType::kF16 || t == ActType::kBF16) ? 2 : 1;
}

}  // namespace tandem::cuda
