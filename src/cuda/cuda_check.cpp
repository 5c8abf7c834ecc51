#include "cuda/cuda_check.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "core/error.h"

namespace tandem::cuda {

void cuda_fail(const char* call, int code, const char* file, int line) {
  const auto e = static_cast<cudaError_t>(code);
  // Clear a sticky-free error so that a caller that survives the exception
  // does not see it again at the next call.
  (void)cudaGetLastError();
  const ErrorKind kind = e == cudaErrorMemoryAllocation ? ErrorKind::kResource
                         : (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) ? ErrorKind::kUnsupported
                                                                                         : ErrorKind::kIo;
  fail(kind, "CUDA: {} failed: {} ({}) at {}:{}", call, cudaGetErrorString(e), cudaGetErrorName(e), file, line);
}

void cublas_fail(const char* call, int status, const char* file, int line) {
  const auto st = static_cast<cublasStatus_t>(status);
  fail(st == CUBLAS_STATUS_ALLOC_FAILED ? ErrorKind::kResource : ErrorKind::kIo, "cuBLAS: {} failed: {} ({}) at {}:{}",
       call, cublasLtGetStatusString(st), cublasLtGetStatusName(st), file, line);
}

void usage_fail(const char* what) { fail(ErrorKind::kInvalidArgument, "CUDA kernels: {}", what); }

}  // namespace tandem::cuda
