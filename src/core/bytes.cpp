#include "core/bytes.h"

#include <cctype>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "core/error.h"

namespace sf {

size_t parse_bytes(const std::string& text, const std::string& flag) {
  size_t i = 0;
  double v = 0;
  try {
    v = std::stod(text, &i);
  } catch (...) {
    SF_FAIL(input, flag, " \"", text, "\" is not a size; write e.g. 24GiB, 512MiB or 1.5TB");
  }
  std::string unit = text.substr(i);
  for (auto& ch : unit) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  double mul = 1;
  if (unit.empty() || unit == "b") mul = 1;
  else if (unit == "k" || unit == "kib") mul = 1024.0;
  else if (unit == "m" || unit == "mib") mul = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") mul = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mul = 1e3;
  else if (unit == "mb") mul = 1e6;
  else if (unit == "gb") mul = 1e9;
  else if (unit == "tb") mul = 1e12;
  else SF_FAIL(input, flag, " \"", text, "\": unknown unit \"", unit, "\"; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB");
  SF_REQUIRE(v >= 0 && std::isfinite(v), flag, " must be a non-negative size");
  return size_t(v * mul);
}

std::string format_bytes(size_t b) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2);
  if (b >= (size_t(1) << 30)) os << double(b) / double(size_t(1) << 30) << " GiB";
  else if (b >= (size_t(1) << 20)) os << double(b) / double(size_t(1) << 20) << " MiB";
  else os << double(b) / 1024.0 << " KiB";
  return os.str();
}

}  // namespace sf
