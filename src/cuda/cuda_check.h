// Error checks for CUDA runtime and cuBLASLt calls: a failing call throws
// tandem::Error naming the call, the error and where it was made. Free of
// fmt so that .cu files can include it.
#pragma once

namespace tandem::cuda {

[[noreturn]] void cuda_fail(const char* call, int code, const char* file, int line);
[[noreturn]] void cublas_fail(const char* call, int status, const char* file, int line);
// A kernel asked for something it does not do (kInvalidArgument).
[[noreturn]] void usage_fail(const char* what);

}  // namespace tandem::cuda

#define TD_CUDA_CHECK(call)                                                   \
  do {                                                                        \
    const cudaError_t td_err_ = (call);                                       \
    if (td_err_ != cudaSuccess)                                               \
      ::tandem::cuda::cuda_fail(#call, static_cast<int>(td_err_), __FILE__, __LINE__); \
  } while (0)

#define TD_CUBLAS_CHECK(call)                                                 \
  do {                                                                        \
    const cublasStatus_t td_st_ = (call);                                     \
    if (td_st_ != CUBLAS_STATUS_SUCCESS)                                      \
      ::tandem::cuda::cublas_fail(#call, static_cast<int>(td_st_), __FILE__, __LINE__); \
  } while (0)
