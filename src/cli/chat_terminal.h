// `tandem run --chat` without a message: an interactive chat on the terminal.
// Each message is prefilled while it is typed (a background request under the
// chat's session, after every pause in the typing), so Enter costs about one
// decode step; the answer streams, then its phase figures.
#pragma once

#include <string>

#include "engine/request.h"

namespace tandem {
class Engine;
}

namespace tandem::cli {

// The engine must be started (its loop thread running). Reads the terminal
// key by key when stdin is one, else one message per line. Returns at
// Ctrl-D or Ctrl-C on an empty line, or at the end of the input.
int chat_in_terminal(Engine& engine, const RequestParams& params, const std::string& system);

}  // namespace tandem::cli
