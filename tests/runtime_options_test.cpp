// The options struct the command line hands to the library: its parsers, and
// the stream tuning it overrides.
#include "runtime/options.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "kernels/stream_tuning.h"

namespace tandem {
namespace {

TEST(Options, ParsesPrepackAndPrefetchModes) {
  EXPECT_EQ(parse_prepack_mode("auto"), PrepackMode::kAuto);
  EXPECT_EQ(parse_prepack_mode("all"), PrepackMode::kAll);
  EXPECT_EQ(parse_prepack_mode("off"), PrepackMode::kOff);
  EXPECT_EQ(parse_prepack_mode("0"), PrepackMode::kOff);  // the old TANDEM_PREPACK=0
  EXPECT_THROW(parse_prepack_mode("sometimes"), Error);
  for (PrepackMode m : {PrepackMode::kOff, PrepackMode::kAuto, PrepackMode::kAll})
    EXPECT_EQ(parse_prepack_mode(prepack_mode_name(m)), m);
  EXPECT_EQ(parse_prefetch_mode("auto"), PrefetchMode::kAuto);
  EXPECT_EQ(parse_prefetch_mode("on"), PrefetchMode::kOn);
  EXPECT_EQ(parse_prefetch_mode("1"), PrefetchMode::kOn);
  EXPECT_EQ(parse_prefetch_mode("off"), PrefetchMode::kOff);
  EXPECT_EQ(parse_prefetch_mode("0"), PrefetchMode::kOff);
  EXPECT_THROW(parse_prefetch_mode("maybe"), Error);
}

TEST(Options, OverrideTheStreamTuning) {
  const StreamTuning cpu = stream_tuning();
  const StreamTuning off = stream_tuning({.prefetch = PrefetchMode::kOff});
  EXPECT_FALSE(off.software_prefetch);
  EXPECT_EQ(off.panel_prefetch_bytes, 0);
  EXPECT_FALSE(off.panel_prefetch_next);
  const StreamTuning on = stream_tuning({.prefetch = PrefetchMode::kOn});
  EXPECT_TRUE(on.software_prefetch);
  EXPECT_EQ(on.panel_prefetch_min_rows, 1);
  EXPECT_EQ(on.panel_prefetch_bytes, cpu.panel_prefetch_bytes);
  EXPECT_EQ(stream_tuning({.panel_pair_min_rows = 0}).panel_pair_min_rows, 0);
  EXPECT_EQ(stream_tuning({.panel_pair_min_rows = 17}).panel_pair_min_rows, 17);
  EXPECT_EQ(stream_tuning({.stream_out = false}).stream_out_min_bytes, -1);
  EXPECT_EQ(stream_tuning({}).stream_out_min_bytes, cpu.stream_out_min_bytes);
}

TEST(Options, ActiveKernelLevelIsSetOnce) {
  const KernelLevel best = best_kernel_level();
  EXPECT_EQ(active_kernel_level(), best);  // nothing set it in this process
  set_active_kernel_level(KernelLevel::kScalar);
  EXPECT_EQ(active_kernel_level(), KernelLevel::kScalar);
  EXPECT_STREQ(cpu_kernel_level(), "scalar");
  set_active_kernel_level(best);
}

}  // namespace
}  // namespace tandem
