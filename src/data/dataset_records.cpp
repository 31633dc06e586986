#include "data/dataset_records.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace sf {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string read_whole(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  SF_REQUIRE(f, p.string(), ": cannot open the dataset file");
  std::ostringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  if (s.starts_with("\xEF\xBB\xBF")) s.erase(0, 3);  // a UTF-8 byte-order mark
  return s;
}

// The paragraphs of `text` with the 1-based line each starts on: runs of lines separated by
// one or more blank lines (spaces, tabs and \r only), with the line breaks inside kept.
void split_paragraphs(std::string_view text, std::vector<Record>& out) {
  int64_t line = 1, start_line = 0;
  size_t begin = 0, end = 0;  // the current paragraph [begin, end)
  bool open = false;
  for (size_t p = 0; p <= text.size();) {
    size_t e = text.find('\n', p);
    if (e == std::string_view::npos) e = text.size();
    std::string_view l = text.substr(p, e - p);
    if (l.ends_with('\r')) l.remove_suffix(1);
    if (blank_line(l)) {
      if (open) out.push_back({text.substr(begin, end - begin), nullptr, start_line});
      open = false;
    } else {
      if (!open) begin = p, start_line = line, open = true;
      end = p + l.size();
    }
    p = e + 1;
    ++line;
  }
  if (open) out.push_back({text.substr(begin, end - begin), nullptr, start_line});
}

}  // namespace

RecordLayout record_layout(const fs::path& path) {
  const std::string ext = path.extension().string();
  if (ext == ".txt") return RecordLayout::text_documents;
  if (ext != ".json") return RecordLayout::jsonl;
  std::ifstream f(path, std::ios::binary);
  char c = 0;
  while (f.get(c)) {
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
    if (c == '\xEF') {  // a byte-order mark
      f.ignore(2);
      continue;
    }
    break;
  }
  return c == '[' ? RecordLayout::json_array : RecordLayout::jsonl;
}

RecordReader::RecordReader(const fs::path& path, RecordLayout layout)
    : path_(path), layout_(layout) {
  if (layout == RecordLayout::jsonl) lines_ = std::make_unique<JsonlReader>(path);
}

bool RecordReader::next_block(std::vector<Record>& out) {
  out.clear();
  if (layout_ == RecordLayout::jsonl) {
    std::vector<std::string_view> lines;
    int64_t first = 0;
    while (out.empty()) {
      if (!lines_->next_block(lines, first)) return false;
      for (size_t i = 0; i < lines.size(); ++i)
        if (!blank_line(lines[i])) out.push_back({lines[i], nullptr, first + int64_t(i)});
    }
    return true;
  }
  if (done_) return false;
  done_ = true;  // the other layouts come in one block: the file is read whole
  if (layout_ == RecordLayout::text_documents) {
    text_ = read_whole(path_);
    split_paragraphs(text_, out);
    return !out.empty();
  }
  try {
    array_ = json::parse(read_whole(path_));
  } catch (const json::exception& e) {
    std::string m = e.what();
    if (m.starts_with("[json.exception.")) m = m.substr(m.find(']') + 2);
    SF_FAIL(input, path_.string(), ": invalid JSON: ", m,
            " (a .json dataset is one JSON array of records, or JSON Lines: one record per line)");
  }
  SF_REQUIRE(array_.is_array(), path_.string(), ": expected a JSON array of records");
  for (size_t i = 0; i < array_.size(); ++i) out.push_back({{}, &array_[i], int64_t(i) + 1});
  return !out.empty();
}

std::string RecordReader::where(int64_t number) const {
  if (layout_ == RecordLayout::json_array) return cat(path_.string(), ": record ", number);
  return cat(path_.string(), ":", number);
}

}  // namespace sf
