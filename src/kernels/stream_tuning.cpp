#include "kernels/stream_tuning.h"

#include <cstdlib>
#include <cstring>

#include "core/cpu_features.h"

namespace tandem {
namespace {

StreamTuning detect() {
  StreamTuning t;
  const CpuFeatures& f = cpu_features();
  // AMD family 19h (Zen 3, Zen 4). Measured on Zen 4 (1.1B decode, 2 threads):
  // q8_0 panels 34.5 -> 41.5 tok/s and Gemma 3 270M 122 -> 137 tok/s without
  // prefetch; f16 13.5 -> 16.6 tok/s reading one row at a time. Zen 5 (1Ah)
  // measured the opposite for the K-quant kernels' prefetch, so it keeps the default.
  if (f.vendor == CpuVendor::kAmd && f.family == 0x19) {
    t.software_prefetch = false;
    t.float_single_row = true;
  }
  if (const char* e = std::getenv("TANDEM_PREFETCH")) {
    if (std::strcmp(e, "0") == 0) t.software_prefetch = false;
    if (std::strcmp(e, "1") == 0) t.software_prefetch = true;
  }
  return t;
}

StreamTuning& current() {
  static StreamTuning t = detect();
  return t;
}

}  // namespace

const StreamTuning& stream_tuning() { return current(); }

ScopedStreamTuning::ScopedStreamTuning(const StreamTuning& t) : saved_(current()) { current() = t; }
ScopedStreamTuning::~ScopedStreamTuning() { current() = saved_; }

}  // namespace tandem
