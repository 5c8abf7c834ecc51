// Available memory as sizing checks see it.
#include "runtime/memory_info.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

TEST(MemoryInfo, ParsesMemAvailable) {
  const std::string meminfo =
      "MemTotal:       24576000 kB\n"
      "MemFree:        20000000 kB\n"
      "MemAvailable:   22000000 kB\n"
      "HugePages_Total:       0\n";
  EXPECT_EQ(parse_mem_available(meminfo), uint64_t{22000000} * 1024);
  EXPECT_EQ(parse_mem_available("MemTotal: 5 kB\n"), std::nullopt);
  EXPECT_EQ(parse_mem_available(""), std::nullopt);
}

TEST(MemoryInfo, ThisMachineHasSome) {
  const auto avail = available_memory_bytes();
  ASSERT_TRUE(avail.has_value());  // Linux with /proc: what CI and users run
  EXPECT_GT(*avail, uint64_t{16} << 20);
  // RuntimeOptions::memory_available stands in for the machine's figure.
  EXPECT_EQ(available_memory_bytes(uint64_t{12345}), uint64_t{12345});
}

}  // namespace
}  // namespace tandem
