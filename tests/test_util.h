// Shared helpers for tests: seeded random data, temp dirs, repository paths.
#pragma once
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace sf::test {

inline std::filesystem::path source_dir() { return SF_SOURCE_DIR; }

// A fresh empty directory under the system temp dir, removed by the destructor.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "sf") {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           (tag + "-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Uniform values in [lo, hi), seeded: never all zero.
inline std::vector<float> random_vec(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace sf::test
