// Tokenizer throughput: encodes the State of the Union corpus (one document per encode call)
// on one thread and prints MB/s (10^6 bytes of input text per second), for a fresh tokenizer
// (pass 1: the word cache fills as it goes) and a warm one (pass 2), plus decode MB/s.
//
//   build-x/bin/bench_tokenizer [--tokenizer DIR_OR_JSON]... [--corpus sotu.jsonl] [--passes N]
// Defaults: the Qwen3 tokenizer from ../shared/data (if present), the committed GPT-2 and
// Mistral test tokenizers, and ../shared/data/corpus/sotu.jsonl.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  const fs::path src = SF_SOURCE_DIR;
  std::vector<fs::path> toks;
  fs::path corpus = src / ".." / "shared" / "data" / "corpus" / "sotu.jsonl";
  int passes = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) {
      toks.emplace_back(argv[++i]);
    } else if (a == "--corpus" && i + 1 < argc) {
      corpus = argv[++i];
    } else if (a == "--passes" && i + 1 < argc) {
      passes = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--tokenizer PATH]... [--corpus FILE] [--passes N]\n", argv[0]);
      return 2;
    }
  }
  if (toks.empty()) {
    if (fs::exists(src / ".." / "shared" / "data" / "tokenizers" / "qwen3"))
      toks.push_back(src / ".." / "shared" / "data" / "tokenizers" / "qwen3");
    toks.push_back(src / "tests" / "data" / "tokenizers" / "gpt2");
    toks.push_back(src / "tests" / "data" / "tokenizers" / "mistral");
  }
  std::ifstream f(corpus);
  if (!f) {
    std::fprintf(stderr, "%s: cannot open (pass --corpus)\n", corpus.string().c_str());
    return 1;
  }
  std::vector<std::string> docs;
  size_t bytes = 0;
  for (std::string line; std::getline(f, line);) {
    docs.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
    bytes += docs.back().size();
  }
  std::printf("corpus: %zu documents, %.2f MB; one thread\n", docs.size(), bytes / 1e6);
  using clk = std::chrono::steady_clock;
  for (const auto& path : toks) {
    try {
      auto t0 = clk::now();
      const sf::Tokenizer tok = sf::Tokenizer::load(path);
      const double load_s = std::chrono::duration<double>(clk::now() - t0).count();
      std::printf("%s (load %.2f s)\n", path.string().c_str(), load_s);
      std::vector<std::vector<int32_t>> ids(docs.size());
      size_t n_ids = 0;
      for (int p = 0; p < passes; ++p) {
        t0 = clk::now();
        n_ids = 0;
        for (size_t i = 0; i < docs.size(); ++i) {
          ids[i] = tok.encode(docs[i]);
          n_ids += ids[i].size();
        }
        const double s = std::chrono::duration<double>(clk::now() - t0).count();
        std::printf("  encode pass %d (%s cache): %8.2f MB/s  (%zu tokens, %.2f bytes/token)\n", p + 1,
                    p == 0 ? "cold" : "warm", bytes / 1e6 / s, n_ids, double(bytes) / double(n_ids));
      }
      t0 = clk::now();
      size_t out_bytes = 0;
      for (const auto& v : ids) out_bytes += tok.decode(v).size();
      const double s = std::chrono::duration<double>(clk::now() - t0).count();
      std::printf("  decode:                    %8.2f MB/s of text\n", out_bytes / 1e6 / s);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", path.string().c_str(), e.what());
      return 1;
    }
  }
  return 0;
}
