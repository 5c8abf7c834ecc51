// std::vector storage that starts on a cache line (64 bytes): kernels may
// then write it with aligned and streaming (non-temporal) stores.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace tandem {

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};

  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}  // NOLINT: rebinding is implicit by design

  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) noexcept { ::operator delete(p, kAlign); }

  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept {
    return true;
  }
};

template <typename T>
using CacheAlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace tandem
