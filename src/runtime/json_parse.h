// JSON from outside (request bodies, schema files), parsed with bounds: how
// deep it nests and how many values it holds are checked while it is read,
// so no recursive code ever sees a document deeper than `max_depth` (printing
// or copying one 100,000 levels deep overflows the stack), and its tree costs
// at most its text's size in strings plus a bounded number of values.
#pragma once

#include <cstddef>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tandem {

struct JsonLimits {
  int max_depth = 64;               // nested arrays and objects
  // Every value, containers included. A value costs 16 bytes or more in the
  // tree against as little as 2 of text, so this, not the text's size,
  // bounds the tree: 8 MiB of numbers (64 prompts of 8,192 token ids fit).
  size_t max_values = size_t{1} << 19;
};

// Throws Error(kInvalidArgument) naming `what` ("the request body") when the
// text is not one JSON value, nests deeper or holds more than the limits.
nlohmann::json parse_json(std::string_view text, const JsonLimits& limits = {},
                          std::string_view what = "the request body");

}  // namespace tandem
