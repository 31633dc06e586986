// Which reader a --data file goes to, decided from its extension AND its content, so that a
// file is never misread: a JSON / text file as token ids, or a Parquet file as either.
//  - .jsonl, .json, .txt: a dataset (data/sample_set.h);
//  - a file starting with the llm.c header magic: a token file, whatever its name;
//  - .bin, .tokens, .u32, .tok without the header: a raw uint32 token stream, unless its
//    content is recognisably something else (text, JSON, Parquet, an archive);
//  - anything else (.parquet, .csv, no extension, ...): refused, saying what the content looks
//    like and what is supported.
#pragma once
#include <filesystem>
#include <string>

namespace sf {

enum class DataFileKind { dataset, tokens };

// The extensions of token files (with the dot).
bool is_token_file_extension(const std::string& ext);
// True when `path` starts with the llm.c token-file header magic.
bool has_llmc_header(const std::filesystem::path& path);
// What the first bytes look like, e.g. "Parquet data", "JSON Lines text", "CSV text", "text",
// "gzip-compressed data", "binary data" (for error messages).
std::string describe_file_content(const std::filesystem::path& path);

// The reader for `path` under --data-format `format` (auto, tokens, or a dataset format).
// Error(input) naming the file, what it looks like, what is supported and how to convert.
DataFileKind classify_data_file(const std::filesystem::path& path, const std::string& format);

// The sentence listing what --data reads (for errors and help).
std::string supported_data_files();

}  // namespace sf
