#include "core/version.h"

namespace sf {

std::string_view build_commit() { return SF_GIT_DESCRIBE; }

}  // namespace sf
