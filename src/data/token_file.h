// A training stream of token ids on disk, memory-mapped. Two formats:
//  - llm.c: a 256 x int32 header (magic 20240520, version 1 = uint16 tokens or 2 = uint32,
//    token count) followed by the tokens;
//  - raw: a bare little-endian uint32 stream (file size a multiple of 4).
#pragma once
#include <cstdint>
#include <filesystem>

namespace sf {

class TokenFile {
 public:
  explicit TokenFile(const std::filesystem::path& p);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return n_; }
  uint32_t operator[](int64_t i) const { return wide_ ? u32_[i] : u16_[i]; }
  // Largest id in the file (validated once against the vocabulary by the caller).
  uint32_t max_id() const;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint32_t* u32_ = nullptr;
  const uint16_t* u16_ = nullptr;
  bool wide_ = true;
  int64_t n_ = 0;
};

// Writes tokens as an llm.c version-2 (uint32) file, atomically.
void write_token_file(const std::filesystem::path& p, const uint32_t* ids, int64_t n);

}  // namespace sf
