// MappedFile: a whole file mapped read-only (mmap, MAP_PRIVATE), unmapped when the object
// goes. Moving it keeps the mapping where it is, so views into data() stay valid. An empty
// file maps to no memory: data() is then a valid pointer to zero bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace sf {

class MappedFile {
 public:
  // Throws Error(input) when the path cannot be opened or is not a regular file, Error(io)
  // when mmap fails; messages name the path.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const uint8_t* data() const;
  size_t size() const { return size_; }

 private:
  void release();
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t size_ = 0;
};

}  // namespace sf
