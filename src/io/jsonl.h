// Reads a JSON Lines file in blocks of whole lines with their 1-based line numbers, so callers
// can parse a block in parallel and still report FILE:LINE. A UTF-8 byte-order mark at the start
// and the \r of CRLF line ends are dropped; a last line without \n counts. Owns only the buffer
// of the current block (the string_views point into it until the next call).
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace sf {

class JsonlReader {
 public:
  explicit JsonlReader(const std::filesystem::path& p);
  // The next lines, about `block_bytes` of them (at least one whole line); false at the end.
  bool next_block(std::vector<std::string_view>& lines, int64_t& first_line,
                  size_t block_bytes = size_t(32) << 20);
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::ifstream in_;
  std::string buf_;    // current block
  std::string carry_;  // partial line read past the previous block
  int64_t next_line_ = 1;
  bool first_ = true, eof_ = false;
};

// True if the line holds only spaces, tabs (a blank line: skipped by the readers).
bool blank_line(std::string_view line);

}  // namespace sf
