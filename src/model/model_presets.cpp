#include "model/model_presets.h"

#include "core/error.h"

namespace sf {

namespace {

ModelConfig base(Arch arch, int64_t vocab, int64_t hidden, int64_t ffn, int64_t layers,
                 int64_t heads, int64_t kv_heads, int64_t head_dim, double theta, double eps,
                 bool tied) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = ffn;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.rope_theta = theta;
  c.rms_norm_eps = eps;
  c.tie_word_embeddings = tied;
  c.max_position_embeddings = 8192;
  c.qkv_bias = arch == Arch::qwen2;
  c.qk_norm = arch == Arch::qwen3;
  c.torch_dtype = DType::bf16;
  return c;
}

RopeScaling llama3_scaling() {
  RopeScaling r;
  r.type = RopeScaling::Type::llama3;
  r.factor = 32.0;
  r.low_freq_factor = 1.0;
  r.high_freq_factor = 4.0;
  r.original_max_position_embeddings = 8192;
  return r;
}

}  // namespace

std::vector<std::string> model_preset_names() {
  return {"tiny",        "small",       "llama3-1b",  "llama3-8b",          "llama3-70b",
          "mistral-7b",  "mistral-large-123b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b",
          "qwen3-0.6b",  "qwen3-8b"};
}

ModelConfig model_preset(const std::string& name) {
  // tiny/small use the bundled GPT-2 tokenizer's vocabulary (50257, padded to 50304), so
  // they train on the bundled text.
  if (name == "tiny") {  // ~7M parameters: trains on 2 CPU cores in CI
    // head_dim 64: the smallest the CUDA attention kernels take, so the example runs there too.
    return base(Arch::qwen3, 50304, 128, 384, 4, 2, 1, 64, 1e6, 1e-6, true);
  }
  if (name == "small") {  // ~45M parameters
    return base(Arch::qwen3, 50304, 512, 1536, 8, 8, 4, 64, 1e6, 1e-6, true);
  }
  if (name == "llama3-1b") {  // Llama-3.2-1B
    auto c = base(Arch::llama, 128256, 2048, 8192, 16, 32, 8, 64, 500000.0, 1e-5, true);
    c.rope_scaling = llama3_scaling();
    c.max_position_embeddings = 131072;
    return c;
  }
  if (name == "llama3-8b") {  // Llama-3.1-8B
    auto c = base(Arch::llama, 128256, 4096, 14336, 32, 32, 8, 128, 500000.0, 1e-5, false);
    c.rope_scaling = llama3_scaling();
    c.rope_scaling.factor = 8.0;
    c.max_position_embeddings = 131072;
    return c;
  }
  if (name == "mistral-7b") {  // Mistral-7B-v0.3
    auto c = base(Arch::mistral, 32768, 4096, 14336, 32, 32, 8, 128, 1000000.0, 1e-5, false);
    c.max_position_embeddings = 32768;
    return c;
  }
  if (name == "qwen2.5-7b") {
    auto c = base(Arch::qwen2, 152064, 3584, 18944, 28, 28, 4, 128, 1000000.0, 1e-6, false);
    c.max_position_embeddings = 32768;
    return c;
  }
  if (name == "llama3-70b") {  // Llama-3.1-70B
    auto c = base(Arch::llama, 128256, 8192, 28672, 80, 64, 8, 128, 500000.0, 1e-5, false);
    c.rope_scaling = llama3_scaling();
    c.rope_scaling.factor = 8.0;
    c.max_position_embeddings = 131072;
    return c;
  }
  if (name == "mistral-large-123b") {  // Mistral-Large-Instruct-2407's shape
    auto c = base(Arch::mistral, 32768, 12288, 28672, 88, 96, 8, 128, 1000000.0, 1e-5, false);
    c.max_position_embeddings = 131072;
    return c;
  }
  if (name == "qwen2.5-14b") {
    auto c = base(Arch::qwen2, 152064, 5120, 13824, 48, 40, 8, 128, 1000000.0, 1e-5, false);
    c.max_position_embeddings = 32768;
    return c;
  }
  if (name == "qwen2.5-32b") {
    auto c = base(Arch::qwen2, 152064, 5120, 27648, 64, 40, 8, 128, 1000000.0, 1e-5, false);
    c.max_position_embeddings = 32768;
    return c;
  }
  if (name == "qwen3-0.6b") {
    auto c = base(Arch::qwen3, 151936, 1024, 3072, 28, 16, 8, 128, 1000000.0, 1e-6, true);
    c.max_position_embeddings = 40960;
    return c;
  }
  if (name == "qwen3-8b") {
    auto c = base(Arch::qwen3, 151936, 4096, 12288, 36, 32, 8, 128, 1000000.0, 1e-6, false);
    c.max_position_embeddings = 40960;
    return c;
  }
  std::string names;
  for (auto& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  SF_FAIL(input, "unknown model size \"", name, "\"; known sizes: ", names,
          " (or pass a config.json)");
}

}  // namespace sf
