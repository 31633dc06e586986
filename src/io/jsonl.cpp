#include "io/jsonl.h"

#include "core/error.h"

namespace sf {

JsonlReader::JsonlReader(const std::filesystem::path& p) : path_(p), in_(p, std::ios::binary) {
  SF_REQUIRE(in_.good(), p.string(), ": cannot open the dataset file");
}

bool JsonlReader::next_block(std::vector<std::string_view>& lines, int64_t& first_line,
                             size_t block_bytes) {
  lines.clear();
  if (eof_ && carry_.empty()) return false;
  buf_ = std::move(carry_);
  carry_.clear();
  // Read until the block holds at least one '\n' past block_bytes, or the file ends.
  const size_t chunk = size_t(1) << 20;
  while (!eof_ && (buf_.size() < block_bytes || buf_.find('\n') == std::string::npos)) {
    const size_t old = buf_.size();
    buf_.resize(old + chunk);
    in_.read(buf_.data() + old, std::streamsize(chunk));
    buf_.resize(old + size_t(in_.gcount()));
    if (!in_) {
      SF_REQUIRE(in_.eof(), path_.string(), ": read error");
      eof_ = true;
    }
  }
  if (first_) {
    first_ = false;
    if (buf_.starts_with("\xEF\xBB\xBF")) buf_.erase(0, 3);
  }
  size_t end = buf_.size();
  if (!eof_) {  // keep the partial last line for the next block
    end = buf_.rfind('\n') + 1;
    carry_.assign(buf_, end, std::string::npos);
    buf_.resize(end);
  }
  first_line = next_line_;
  std::string_view all(buf_);
  size_t p = 0;
  while (p < all.size()) {
    size_t nl = all.find('\n', p);
    if (nl == std::string_view::npos) nl = all.size();
    std::string_view line = all.substr(p, nl - p);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    p = nl + 1;
  }
  next_line_ += int64_t(lines.size());
  return !lines.empty() || !(eof_ && carry_.empty());
}

bool blank_line(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

}  // namespace sf
