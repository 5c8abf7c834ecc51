// Pieces shared by the subcommands.
#pragma once

#include <string>

namespace tandem::cli {

// -m when given, else $TANDEM_MODEL, else the default model installed by
// scripts/setup.sh. Throws tandem::Error when none exists.
std::string resolve_model_path(const std::string& flag);

}  // namespace tandem::cli
