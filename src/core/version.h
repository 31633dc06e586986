// Which slideformer made a file: the git commit of the build (`git describe --always --dirty`,
// re-read at every build by the sf_build_commit target), written into model cards so a model can be traced to its code.
#pragma once
#include <string_view>

namespace sf {

std::string_view build_commit();  // e.g. "a2bad3b1c2d3" or "a2bad3b1c2d3-dirty"; "unknown"

}  // namespace sf
