// AVX-512 kernels (none yet: every type falls back to a lower level).
#include "kernels/dot_impl.h"

namespace tandem::dot_detail {

VecDotFn avx512_fn(GgmlType, bool, bool) { return nullptr; }

}  // namespace tandem::dot_detail
