#include "core/version.h"

#include "build_commit.h"  // generated at build time: SF_GIT_DESCRIBE

namespace sf {

std::string_view build_commit() { return SF_GIT_DESCRIBE; }

}  // namespace sf
