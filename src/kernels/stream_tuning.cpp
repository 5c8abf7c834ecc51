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
  //
  // The repacked q8_0 panels on Zen 4 (kernels_bench BM_Gemv/0/N/K/M/2/2, two
  // threads, three alternations, no prefetch / 2 KB ahead): with 8 rows
  // 5632 x 2048 532-589 / 404-506 us, 2048 x 2048 181-197 / 150-187, Gemma's
  // 262144 x 640 output 5646-6464 / 5129-5699; 16 rows (the first group of 8
  // streams) 2048 x 2048 303-331 / 260-310; but with 1-4 rows slower (1 row
  // 253-396 / 407-451 us), and 16 KB ahead was in between at 8 rows.
  if (f.vendor == CpuVendor::kAmd && f.family == 0x19) {
    t.software_prefetch = false;
    t.float_single_row = true;
    t.panel_prefetch_bytes = 2048;
    t.panel_prefetch_min_rows = 8;
  }
  if (const char* e = std::getenv("TANDEM_PREFETCH")) {
    if (std::strcmp(e, "0") == 0) {
      t.software_prefetch = false;
      t.panel_prefetch_bytes = 0;
      t.panel_prefetch_next = false;
    }
    if (std::strcmp(e, "1") == 0) {
      t.software_prefetch = true;
      t.panel_prefetch_min_rows = 1;
    }
  }
  if (const char* e = std::getenv("TANDEM_PANEL_PAIRS")) t.panel_pair_min_rows = std::atoi(e);
  if (const char* e = std::getenv("TANDEM_STREAM_OUT"); e && std::strcmp(e, "0") == 0) t.stream_out_min_bytes = -1;
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
