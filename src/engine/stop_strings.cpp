#include "engine/stop_strings.h"

#include <algorithm>

namespace tandem {

StopMatch find_stop(std::string_view text, std::span<const std::string> stops) {
  StopMatch m;
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    const size_t pos = text.find(s);
    if (pos < m.pos) m.pos = pos;
  }
  if (m.pos != std::string::npos) {
    m.safe_len = m.pos;
    return m;
  }
  m.safe_len = text.size();
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    // Longest tail of the text that is a proper prefix of s.
    for (size_t len = std::min(s.size() - 1, text.size()); len > 0; --len) {
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        m.safe_len = std::min(m.safe_len, text.size() - len);
        break;
      }
    }
  }
  return m;
}

}  // namespace tandem
