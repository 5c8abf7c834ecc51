// Matrix-vector products for f32, f16 and bf16 weights, and the dispatcher.
#include "cuda/gemv_impl.cuh"

namespace tandem::cuda {

bool gemv_float(const GemvLaunch& L, const DevActs& x, int32_t row0, int32_t n_rows, cudaStream_t s) {
  switch (L.job[0].w.type) {
    case GgmlType::F32: gemv_launch<UnitFloat<GgmlType::F32>>(L, x, row0, n_rows, s); return true;
    case GgmlType::F16: gemv_launch<UnitFloat<GgmlType::F16>>(L, x, row0, n_rows, s); return true;
    case GgmlType::BF16: gemv_launch<UnitFloat<GgmlType::BF16>>(L, x, row0, n_rows, s); return true;
    default: return false;
  }
}

void gemv(const GemvJob* jobs, int32_t n_jobs, const DevActs& x, int32_t row0, int32_t n_rows, cudaStream_t s) {
  if (n_jobs < 1 || n_jobs > 3) usage_fail("gemv: 1 to 3 matrices per launch");
  GemvLaunch L;
  L.n = n_jobs;
  for (int32_t j = 0; j < n_jobs; ++j) {
    if (jobs[j].w.type != jobs[0].w.type || jobs[j].w.cols != jobs[0].w.cols)
      usage_fail("gemv: the matrices of one launch must share type and width");
    L.job[j] = jobs[j];
    L.start[j] = L.total;
    L.total += jobs[j].w.rows;
  }
  if (n_rows <= 0 || L.total == 0) return;
  if (gemv_q32(L, x, row0, n_rows, s) || gemv_kquant(L, x, row0, n_rows, s) || gemv_float(L, x, row0, n_rows, s))
    return;
  usage_fail("gemv: weight type without a kernel");
}

}  // namespace tandem::cuda
