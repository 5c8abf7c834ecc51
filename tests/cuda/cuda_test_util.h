// Helpers of the CUDA tests: the skip where no GPU is present, device
// buffers, random data, and comparisons that say where they fail.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tandem::cudatest {

// Empty when a CUDA device is usable, else why not.
inline std::string no_gpu_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
  }
  if (n == 0) return "cudaGetDeviceCount found no device";
  return "";
}

#define TD_REQUIRE_GPU()                                                    \
  do {                                                                      \
    const std::string td_why_ = ::tandem::cudatest::no_gpu_reason();        \
    if (!td_why_.empty()) GTEST_SKIP() << "no CUDA GPU here (" << td_why_ << ")"; \
  } while (0)

#define TD_CU(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

// A device array of T.
template <typename T>
class DevVec {
 public:
  DevVec() = default;
  explicit DevVec(size_t n) { resize(n); }
  explicit DevVec(const std::vector<T>& v) { upload(v); }
  DevVec(const DevVec&) = delete;
  DevVec& operator=(const DevVec&) = delete;
  ~DevVec() {
    if (p_) cudaFree(p_);
  }
  void resize(size_t n) {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = n;
    if (n && cudaMalloc(&p_, n * sizeof(T)) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
    if (n) cudaMemset(p_, 0, n * sizeof(T));
  }
  void upload(const std::vector<T>& v) {
    if (v.size() != n_) resize(v.size());
    if (!v.empty()) cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    cudaDeviceSynchronize();
    if (n_) cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  T* get() const { return static_cast<T*>(p_); }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Where two float arrays differ by more than atol + rtol * |want|: the
// count, the largest difference and the first offending index.
struct Diff {
  size_t bad = 0, first = SIZE_MAX, worst = 0;
  double max_abs = 0;
};
inline Diff compare(const float* got, const float* want, size_t n, double atol, double rtol) {
  Diff d;
  for (size_t i = 0; i < n; ++i) {
    const double e = std::fabs(double(got[i]) - double(want[i]));
    const bool nan = std::isnan(got[i]) != std::isnan(want[i]);
    if (e > d.max_abs || nan) d.max_abs = nan ? INFINITY : e, d.worst = i;
    if (nan || e > atol + rtol * std::fabs(double(want[i]))) {
      if (d.first == SIZE_MAX) d.first = i;
      ++d.bad;
    }
  }
  return d;
}
inline std::string describe(const Diff& d, const float* got, const float* want, size_t n) {
  std::ostringstream s;
  s << d.bad << " of " << n << " elements out of tolerance; max abs diff " << d.max_abs << " at " << d.worst;
  if (d.worst < n) s << " (got " << got[d.worst] << ", want " << want[d.worst] << ")";
  if (d.first != SIZE_MAX) s << "; first mismatch at " << d.first << " (got " << got[d.first] << ", want " << want[d.first] << ")";
  return s.str();
}
#define TD_EXPECT_CLOSE(got, want, n, atol, rtol, what)                                          \
  do {                                                                                          \
    const auto td_d_ = ::tandem::cudatest::compare((got), (want), (n), (atol), (rtol));          \
    EXPECT_EQ(td_d_.bad, 0u) << (what) << ": " << ::tandem::cudatest::describe(td_d_, (got), (want), (n)); \
  } while (0)

// First index where two byte ranges differ, or SIZE_MAX.
inline size_t first_byte_diff(const void* a, const void* b, size_t n) {
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i)
    if (x[i] != y[i]) return i;
  return SIZE_MAX;
}

}  // namespace tandem::cudatest
