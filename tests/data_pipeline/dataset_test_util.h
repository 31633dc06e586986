// Helpers of the data tests: the tokenizers the vectors were made with, vectors.json, files,
// token files.
#pragma once
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "data/token_file.h"
#include "test_util.h"
#include "text/tokenizer.h"

namespace sf::test {

inline nlohmann::json read_json_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

inline const nlohmann::json& dataset_vectors() {
  static const nlohmann::json v =
      read_json_file(source_dir() / "tests/data/datasets/vectors.json");
  return v;
}

inline void write_file(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

// GPT-2's BPE with the Llama 3 special tokens added (as this file builds the "llama"
// stand-in) and Llama-3.2-3B-Instruct's tokenizer_config.json (chat template, bos, eos).
inline std::filesystem::path llama32_tokenizer_dir(const std::filesystem::path& dir) {
  nlohmann::json tj = read_json_file(source_dir() / "tests/data/tokenizers/gpt2/tokenizer.json");
  int id = 50257;
  for (const auto& s : dataset_vectors()["llama_specials"])
    tj["added_tokens"].push_back({{"id", id++}, {"content", s}, {"single_word", false},
                                  {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                  {"special", true}});
  std::filesystem::create_directories(dir);
  write_file(dir / "tokenizer.json", tj.dump());
  nlohmann::json cfg =
      read_json_file(source_dir() / "tests/data/datasets/templates/llama3.2/tokenizer_config.json");
  cfg["add_bos_token"] = true;
  write_file(dir / "tokenizer_config.json", cfg.dump());
  return dir;
}

// "qwen3" (../shared, nullopt when absent), "mistral" (committed), "llama" (GPT-2's BPE plus the
// Llama 3 special tokens, built like scripts/gen_dataset_vectors.py builds it).
inline std::optional<Tokenizer> vector_tokenizer(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::optional<Tokenizer>> cache;
  static TempDir dir("sf-dstok");
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  std::optional<Tokenizer> t;
  if (name == "qwen3") {
    const auto p = source_dir() / ".." / "shared" / "data" / "tokenizers" / "qwen3";
    if (std::filesystem::exists(p / "tokenizer.json")) t = Tokenizer::load(p);
  } else if (name == "mistral") {
    t = Tokenizer::load(source_dir() / "tests/data/tokenizers/mistral");
  } else if (name == "llama") {
    nlohmann::json tj = read_json_file(source_dir() / "tests/data/tokenizers/gpt2/tokenizer.json");
    int id = 50257;
    for (const auto& s : dataset_vectors()["llama_specials"])
      tj["added_tokens"].push_back({{"id", id++}, {"content", s}, {"single_word", false},
                                    {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                    {"special", true}});
    const auto d = dir.path / "llama";
    std::filesystem::create_directories(d);
    write_file(d / "tokenizer.json", tj.dump());
    write_file(d / "tokenizer_config.json",
               R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "add_bos_token": true})");
    t = Tokenizer::load(d);
  }
  cache[name] = t;
  return t;
}

// n token ids below `vocab` with some structure (a noisy repeating pattern), so that a model
// can learn something; seeded.
inline std::filesystem::path make_tokens(const std::filesystem::path& p, int64_t n,
                                         int vocab = 53, uint64_t seed = 11) {
  std::mt19937_64 g(seed);
  std::vector<uint32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    ids[size_t(i)] = g() % 4 == 0 ? uint32_t(g() % uint64_t(vocab)) : uint32_t((i * 7) % vocab);
  write_token_file(p, ids.data(), n);
  return p;
}

}  // namespace sf::test
