// Matrix-vector products for q4_K, q5_K and q6_K weights (q8_K activations).
#include "cuda/gemv_impl.cuh"

namespace tandem::cuda {

bool gemv_kquant(const GemvLaunch& L, const DevActs& x, int32_t row0, int32_t n_rows, cudaStream_t s) {
  switch (L.job[0].w.type) {
    case GgmlType::Q4_K: gemv_launch<UnitK4<false>>(L, x, row0, n_rows, s); return true;
    case GgmlType::Q5_K: gemv_launch<UnitK4<true>>(L, x, row0, n_rows, s); return true;
    case GgmlType::Q6_K: gemv_launch<UnitQ6K>(L, x, row0, n_rows, s); return true;
    default: return false;
  }
}

}  // namespace tandem::cuda
