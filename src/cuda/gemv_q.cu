// Matrix-vector products for q4_0, q5_0 and q8_0 weights (q8_0 activations).
#include "cuda/gemv_impl.cuh"

namespace tandem::cuda {

bool gemv_q32(const GemvLaunch& L, const DevActs& x, int32_t row0, int32_t n_rows, cudaStream_t s) {
  switch (L.job[0].w.type) {
    case GgmlType::Q8_0: gemv_launch<UnitQ8_0>(L, x, row0, n_rows, s); return true;
    case GgmlType::Q4_0: gemv_launch<UnitQ4_0>(L, x, row0, n_rows, s); return true;
    case GgmlType::Q5_0: gemv_launch<UnitQ5_0>(L, x, row0, n_rows, s); return true;
    default: return false;
  }
}

}  // namespace tandem::cuda
