// Helpers shared by the subcommands.
#pragma once
#include <filesystem>
#include <string>

#include "core/dtype.h"

namespace sf::cli {

// Where the bundled example lives: the source tree this binary was built from, or an
// "examples" directory beside the binary or above it. Error(input) when neither exists.
std::filesystem::path examples_dir();
// --dtype values: bf16 (bfloat16), f16 (float16), f32 (float32).
DType parse_save_dtype(const std::string& s);

}  // namespace sf::cli
