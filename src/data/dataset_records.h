// The records of a dataset file, in blocks that the loader tokenizes in parallel, each with a
// number for FILE:WHERE errors. Three layouts:
//  - JSON Lines (.jsonl, or a .json file that does not start with '['): one record per line;
//  - a JSON array (.json starting with '['): one record per element;
//  - plain text (.txt): one document per paragraph, i.e. documents are separated by one or more
//    blank lines (as Hugging Face datasets' text loader with sample_by="paragraph").
// Owns the current block (the views and values point into it until the next call).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/jsonl.h"

namespace sf {

enum class RecordLayout { jsonl, json_array, text_documents };

// The layout of `path`: .txt -> text_documents; .json whose first non-blank byte is '[' ->
// json_array; anything else -> jsonl.
RecordLayout record_layout(const std::filesystem::path& path);

struct Record {
  std::string_view text;                  // jsonl: the line; text_documents: the document
  const nlohmann::json* value = nullptr;  // json_array: the element (text is empty)
  int64_t number = 0;                     // line (jsonl), first line (text), 1-based index (array)
};

class RecordReader {
 public:
  RecordReader(const std::filesystem::path& path, RecordLayout layout);
  // The next records (blank JSONL lines skipped); false at the end.
  bool next_block(std::vector<Record>& out);
  // "FILE:LINE" or "FILE: record N" for error messages.
  std::string where(int64_t number) const;
  RecordLayout layout() const { return layout_; }

 private:
  std::filesystem::path path_;
  RecordLayout layout_;
  std::unique_ptr<JsonlReader> lines_;
  nlohmann::json array_;
  std::string text_;
  bool done_ = false;
};

}  // namespace sf
