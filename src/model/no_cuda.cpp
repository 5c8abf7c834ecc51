// The CUDA entry points of a build without the CUDA backend (CMakeLists.txt
// links this or src/cuda/, never both): each says how to get one.
#include "core/error.h"
#include "model/executor.h"

namespace tandem {

std::unique_ptr<Executor> make_cuda_executor(Model&, const KvPlan&) {
  fail(ErrorKind::kUnsupported, "this build of Tandem has no CUDA backend (configure with -DTANDEM_CUDA=ON)");
}

double cuda_read_bandwidth_gb_s(size_t) {
  fail(ErrorKind::kUnsupported, "this build of Tandem has no CUDA backend (configure with -DTANDEM_CUDA=ON)");
}

}  // namespace tandem
