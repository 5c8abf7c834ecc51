// The web page tandem serve answers at / (src/server/web/index.html, compiled
// in: the page works with no network beyond this server).
#pragma once

#include <string_view>

namespace tandem::server {

std::string_view web_page();

}  // namespace tandem::server
