// What a request must satisfy before the engine takes it: its prompt's ids
// and length, its choices, logprobs and sampling parameters.
#pragma once

#include <cstdint>
#include <span>

#include "engine/request.h"

namespace tandem {

// The most choices (RequestParams::n) a request may ask for.
inline constexpr int32_t kMaxChoices = 16;

// Throws Error(kInvalidArgument) naming the first problem. `streaming_window`:
// the engine slides through any prompt, so its length is not bounded.
void check_request(std::span<const int32_t> prompt, const RequestParams& params, int32_t n_vocab,
                   int32_t max_context, bool streaming_window);

}  // namespace tandem
