// Deterministic test input for the quantizer tests. Built from an integer LCG
// with exact float operations only (integer -> float, powers of two), so every
// platform gets bit-identical inputs and golden outputs stay valid.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace tandem::quant_test {

class Lcg {
 public:
  explicit Lcg(uint64_t seed) : s_(seed * 2862933555777941757ull + 3037000493ull) {}
  uint32_t next() {
    s_ = s_ * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s_ >> 32);
  }

 private:
  uint64_t s_;
};

enum class BlockKind { kTriangular, kZero, kConstant, kPositive, kSparse, kWideRange, kCount };

// n values; each 256-element super-block gets one BlockKind, cycling through
// all kinds (starting at `first`), so every quantizer path is exercised.
inline std::vector<float> make_input(int64_t n, uint64_t seed, int first = 0) {
  Lcg g(seed);
  std::vector<float> x(static_cast<size_t>(n));
  const int kinds = static_cast<int>(BlockKind::kCount);
  BlockKind kind = BlockKind::kTriangular;
  float amp = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 256 == 0) {
      kind = static_cast<BlockKind>((first + i / 256) % kinds);
      amp = std::ldexp(1.0f, static_cast<int>(g.next() % 16) - 10);
    }
    if (kind == BlockKind::kWideRange && i % 16 == 0) amp = std::ldexp(1.0f, static_cast<int>(g.next() % 20) - 12);
    // Sum of two uniforms on [-2^22, 2^22): a triangular distribution in (-1, 1).
    const int32_t a = static_cast<int32_t>(g.next() >> 9) - (1 << 22);
    const int32_t b = static_cast<int32_t>(g.next() >> 9) - (1 << 22);
    float v = static_cast<float>(a + b) * 0x1p-23f * amp;
    if (g.next() % 64 == 0) v *= 8.0f;  // occasional outlier
    switch (kind) {
      case BlockKind::kZero: v = 0.0f; break;
      case BlockKind::kConstant: v = amp * 0.75f; break;
      case BlockKind::kPositive: v = std::fabs(v) + amp; break;
      case BlockKind::kSparse:
        if (g.next() % 4 != 0) v = 0.0f;
        break;
      default: break;
    }
    x[static_cast<size_t>(i)] = v;
  }
  return x;
}

// Bell-shaped data like real weights: the sum of four uniforms (Irwin-Hall,
// close to a normal distribution, |x| < 2), with a per-super-block scale kept
// in the range where the f16 super-block scales stay normal numbers.
inline std::vector<float> make_bell(int64_t n, uint64_t seed) {
  Lcg g(seed);
  std::vector<float> x(static_cast<size_t>(n));
  float amp = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 256 == 0) amp = std::ldexp(1.0f, static_cast<int>(g.next() % 8) - 6);
    int32_t sum = 0;
    for (int k = 0; k < 4; ++k) sum += static_cast<int32_t>(g.next() >> 9) - (1 << 22);
    x[static_cast<size_t>(i)] = static_cast<float>(sum) * 0x1p-23f * amp;
  }
  return x;
}

inline uint64_t fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t h = 14695981039346656037ull;
  for (uint8_t c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace tandem::quant_test
