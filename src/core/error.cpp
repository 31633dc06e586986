#include "core/error.h"

namespace sf::detail {

void throw_error(ErrorKind kind, const char* expr, const char* file, int line,
                 const std::string& msg) {
  throw Error(kind, cat(msg, msg.empty() ? "" : " ", "[check `", expr, "` failed at ", file,
                        ":", line, "]"));
}

}  // namespace sf::detail
