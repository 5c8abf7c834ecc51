// Stop strings: where the generated text ends, and how much of it may be sent
// while a stop string could still be forming at its end.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace tandem {

// Finds the earliest occurrence of any stop string in `text` (empty stop
// strings are ignored). `safe_len` is how much of the text can be emitted now:
// up to the match, or, without one, everything before the longest tail of the
// text that is a proper prefix of some stop string (held back when streaming).
struct StopMatch {
  size_t pos = std::string::npos;      // where a full stop string starts
  size_t safe_len = 0;                 // prefix of text that can be emitted now
};
StopMatch find_stop(std::string_view text, std::span<const std::string> stops);

}  // namespace tandem
