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

}  // namespace tandem
