// Byte counts as people write them: parsing a size flag ("24GiB", "1.5TB") and printing a
// count in binary units. Owns nothing; pure functions.
#pragma once
#include <cstddef>
#include <string>

namespace sf {

// "24GiB", "24G", "1.5TB", "512MiB", "1000000" (bytes). Throws Error(input) naming `flag`.
size_t parse_bytes(const std::string& text, const std::string& flag);
// Two decimals in GiB, MiB or KiB, whichever is the largest under the count.
std::string format_bytes(size_t bytes);

}  // namespace sf
