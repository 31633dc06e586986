// tests/data/configs (scripts/gen_config_vectors.py): config.json cases with what transformers
// 5.17 derives from them, shared by tests/io (parsing) and tests/model (losses).
#pragma once
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace sf::test {

inline std::filesystem::path config_data_dir() { return source_dir() / "tests/data/configs"; }

inline const nlohmann::json& config_vectors() {
  static const nlohmann::json v = [] {
    std::ifstream f(config_data_dir() / "vectors.json");
    return nlohmann::json::parse(f);
  }();
  return v;
}

}  // namespace sf::test
