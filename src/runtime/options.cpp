#include "runtime/options.h"

#include "core/error.h"

namespace tandem {

PrepackMode parse_prepack_mode(std::string_view name) {
  if (name == "off" || name == "0") return PrepackMode::kOff;
  if (name == "auto") return PrepackMode::kAuto;
  if (name == "all") return PrepackMode::kAll;
  fail(ErrorKind::kInvalidArgument, "unknown prepack mode '{}' (expected auto, all or off)", name);
}

const char* prepack_mode_name(PrepackMode mode) {
  static constexpr const char* kNames[] = {"off", "auto", "all"};  // in PrepackMode's order
  return kNames[static_cast<int>(mode)];
}

PrefetchMode parse_prefetch_mode(std::string_view name) {
  if (name == "auto") return PrefetchMode::kAuto;
  if (name == "on" || name == "1") return PrefetchMode::kOn;
  if (name == "off" || name == "0") return PrefetchMode::kOff;
  fail(ErrorKind::kInvalidArgument, "unknown prefetch mode '{}' (expected auto, on or off)", name);
}

void check_sparse_attention(const SparseAttention& s, int32_t block_size) {
  if (s.budget == 0) return;
  if (s.budget < 0) fail(ErrorKind::kInvalidArgument, "sparse attention budget {} is negative", s.budget);
  if (block_size <= 0) fail(ErrorKind::kInvalidArgument, "sparse attention needs a positive block size");
  auto whole = [&](int32_t n, const char* what) {
    if (n <= 0 || n % block_size != 0)
      fail(ErrorKind::kInvalidArgument, "sparse attention {} {} is not a positive multiple of the block size {}",
           what, n, block_size);
  };
  whole(s.budget, "budget");
  whole(s.sinks, "sinks");
  whole(s.window, "window");
  if (s.budget < s.sinks + s.window)
    fail(ErrorKind::kInvalidArgument,
         "sparse attention budget {} is below its sinks ({}) plus its recent window ({}): {} positions at least",
         s.budget, s.sinks, s.window, s.sinks + s.window);
}

}  // namespace tandem
