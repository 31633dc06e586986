#include "data/data_file_kind.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

constexpr int32_t kLlmcMagic = 20240520;  // data/token_file.h

std::string head_bytes(const fs::path& p, size_t n) {
  std::ifstream f(p, std::ios::binary);
  std::string s(n, '\0');
  f.read(s.data(), std::streamsize(n));
  s.resize(size_t(f.gcount()));
  return s;
}

// Printable UTF-8 text (tabs and line breaks allowed; a sequence cut at the end is fine).
bool looks_like_text(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) {
    const auto b = uint8_t(s[i]);
    if (b < 0x80) {
      if (b < 0x20 && b != '\t' && b != '\n' && b != '\r' && b != '\f') return false;
      ++i;
      continue;
    }
    const size_t n = (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0) return false;
    for (size_t k = 1; k < n && i + k < s.size(); ++k)
      if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

std::string quoted(const fs::path& p) { return p.string(); }

// The refusal of a file no reader takes: what it looks like and, for the common formats, the
// conversion to JSON Lines.
[[noreturn]] void refuse(const fs::path& p, const std::string& why) {
  const std::string seen = describe_file_content(p);
  const std::string name = p.string(), stem = p.stem().string() + ".jsonl";
  std::string fix;
  if (seen == "Parquet data")
    fix = cat("; convert it to JSON Lines, e.g. python3 -c \"import pandas; pandas.read_parquet('",
              name, "').to_json('", stem, "', orient='records', lines=True)\"");
  else if (seen == "CSV text")
    fix = cat("; convert it to JSON Lines, e.g. python3 -c \"import pandas; pandas.read_csv('",
              name, "').to_json('", stem, "', orient='records', lines=True)\"");
  else if (seen == "JSON Lines text" || seen == "a JSON array")
    fix = "; name it .jsonl (or .json for an array), or pass --data-format with its format";
  else if (seen == "text")
    fix = "; name it .txt to train on it as plain text (documents separated by blank lines)";
  SF_FAIL(input, quoted(p), ": ", why, " (it holds ", seen, ")", fix, ". ", supported_data_files());
}

}  // namespace

bool is_token_file_extension(const std::string& ext) {
  return ext == ".bin" || ext == ".tokens" || ext == ".u32" || ext == ".tok";
}

bool has_llmc_header(const fs::path& path) {
  const std::string h = head_bytes(path, 4);
  int32_t magic = 0;
  if (h.size() == 4) std::memcpy(&magic, h.data(), 4);
  return magic == kLlmcMagic;
}

std::string describe_file_content(const fs::path& path) {
  std::error_code ec;
  if (fs::file_size(path, ec) == 0 && !ec) return "nothing: the file is empty";
  const std::string h = head_bytes(path, 4096);
  if (h.starts_with("PAR1")) return "Parquet data";
  if (h.starts_with("\x1f\x8b")) return "gzip-compressed data";
  if (h.starts_with("PK\x03\x04")) return "a zip archive";
  if (h.starts_with("\x28\xb5\x2f\xfd")) return "zstd-compressed data";
  if (has_llmc_header(path)) return "llm.c token data";
  std::string_view t = h;
  if (t.starts_with("\xEF\xBB\xBF")) t.remove_prefix(3);
  if (!looks_like_text(t)) return "binary data";
  const size_t first = t.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && t[first] == '{') return "JSON Lines text";
  if (first != std::string_view::npos && t[first] == '[') return "a JSON array";
  const std::string_view line = t.substr(0, t.find('\n'));
  if (path.extension() == ".csv" || path.extension() == ".tsv" ||
      std::count(line.begin(), line.end(), ',') >= 2)
    return "CSV text";
  return "text";
}

std::string supported_data_files() {
  return "--data reads .jsonl / .json records ({\"text\"}, {\"prompt\", \"completion\"}, "
         "{\"messages\"}, ShareGPT {\"conversations\"}, Alpaca {\"instruction\", \"output\"}), "
         ".txt plain text, and token files (.bin / .tokens / .u32 / .tok: llm.c or raw uint32)";
}

DataFileKind classify_data_file(const fs::path& path, const std::string& format) {
  const std::string ext = path.extension().string();
  const bool dataset_ext = ext == ".jsonl" || ext == ".json" || ext == ".txt";
  if (format != "auto" && format != "tokens") return DataFileKind::dataset;
  if (has_llmc_header(path)) return DataFileKind::tokens;
  if (format == "auto" && dataset_ext) return DataFileKind::dataset;
  if (!is_token_file_extension(ext))
    refuse(path, format == "tokens"
                     ? "--data-format tokens reads an llm.c token file (this one has no llm.c "
                       "header) or a raw uint32 file named .bin, .tokens, .u32 or .tok"
                     : "not a format slideformer reads");
  // A raw token file has no header to check; refuse content that is clearly something else.
  const std::string seen = describe_file_content(path);
  if (seen != "binary data")
    refuse(path, cat("a ", ext, " file is read as raw uint32 token ids, but this is not token data"));
  return DataFileKind::tokens;
}

}  // namespace sf
