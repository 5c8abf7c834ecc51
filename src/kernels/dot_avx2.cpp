// AVX2 kernels (none yet: every type uses the scalar reference).
#include "kernels/dot_impl.h"

namespace tandem::dot_detail {

VecDotFn avx2_fn(GgmlType, bool) { return nullptr; }

}  // namespace tandem::dot_detail
