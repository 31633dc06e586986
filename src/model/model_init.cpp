#include "model/model_init.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"

namespace sf {

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Standard normal draws from a splitmix64 stream (Box-Muller, both outputs used).
// Approximately normal(0, 1) samples, cheap enough to initialise 8B parameters in seconds:
// the sum of four uniform 16-bit numbers from one 64-bit draw (Irwin-Hall, n = 4), centred
// and scaled to unit variance. Bounded at +-3.46: a truncated normal, which is what
// initialisation wants anyway.
struct Normal {
  uint64_t state;
  float operator()() {
    uint64_t x = splitmix64(state);
    float sum = float(x & 0xffff) + float((x >> 16) & 0xffff) + float((x >> 32) & 0xffff) +
                float(x >> 48);
    // Each term is uniform on {0..65535}: mean 32767.5, variance (65536^2 - 1) / 12.
    constexpr float mean = 4 * 32767.5f;
    constexpr float inv_std = 1.0f / 37837.23f;  // 1 / sqrt(4 (65536^2 - 1) / 12)
    return (sum - mean) * inv_std;
  }
};

uint64_t unit_key(const Unit& u) {
  switch (u.kind) {
    case UnitKind::embedding: return 0;
    case UnitKind::layer: return 1 + uint64_t(u.layer);
    case UnitKind::head: return 0xffffffffull;
  }
  return 0;
}

bool is_norm(ParamKind k) {
  return k == ParamKind::attn_norm || k == ParamKind::mlp_norm || k == ParamKind::q_norm ||
         k == ParamKind::k_norm || k == ParamKind::final_norm;
}

}  // namespace

void init_unit(const Unit& unit, float* out, uint64_t seed, const InitOptions& opt) {
  // Zero only the alignment padding between slots; the rows below write everything else
  // (in parallel, so first touch of the pages is spread over the threads too).
  int64_t end = 0;
  for (auto& p : unit.params) {
    std::memset(out + end, 0, size_t(p.offset - end) * sizeof(float));
    end = p.offset + p.numel();
  }
  std::memset(out + end, 0, size_t(unit.numel - end) * sizeof(float));
  // One task per (slot, row).
  std::vector<std::pair<const ParamSlot*, int64_t>> rows;
  for (auto& p : unit.params)
    for (int64_t r = 0; r < p.rows; ++r) rows.push_back({&p, r});
  const uint64_t ukey = unit_key(unit);
  host_pool().parallel_for(int64_t(rows.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      auto [p, r] = rows[size_t(i)];
      uint64_t s = seed;
      s = splitmix64(s) ^ (ukey * 0x100000001b3ull);
      s = splitmix64(s) ^ (uint64_t(p->kind) << 40) ^ uint64_t(r);
      Normal n{splitmix64(s)};
      float* dst = out + p->offset + r * p->cols;
      for (int64_t c = 0; c < p->cols; ++c) {
        if (is_norm(p->kind)) dst[c] = 1.f + float(opt.norm_jitter * n());
        else if (p->kind == ParamKind::bqkv) dst[c] = float(opt.bias_std * n());
        else dst[c] = float(opt.matrix_std * n());
      }
    }
  }, 16);
}

std::vector<std::vector<float>> init_params(const ModelLayout& layout, uint64_t seed,
                                            const InitOptions& opt) {
  std::vector<std::vector<float>> units(layout.units.size());
  for (size_t i = 0; i < units.size(); ++i) {
    units[i].resize(size_t(layout.units[i].numel));
    init_unit(layout.units[i], units[i].data(), seed, opt);
  }
  return units;
}

ModelConfig tiny_config(Arch arch, bool tied) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 53;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 128;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  c.torch_dtype = DType::f32;
  switch (arch) {
    case Arch::llama:
      // Wavelengths 2*pi/inv_freq of D=8 at theta 1e4: ~6, ~63, ~628, ~6283. With an
      // original context of 64 and factors 1/4: low_wavelen 64, high_wavelen 16: one
      // frequency unscaled, one smoothed, two divided by the factor.
      c.rope_scaling.type = RopeScaling::Type::llama3;
      c.rope_scaling.factor = 8.0;
      c.rope_scaling.low_freq_factor = 1.0;
      c.rope_scaling.high_freq_factor = 4.0;
      c.rope_scaling.original_max_position_embeddings = 64;
      break;
    case Arch::mistral:
      c.rope_theta = 1e6;
      break;
    case Arch::qwen2:
      c.qkv_bias = true;
      c.rope_theta = 1e6;
      break;
    case Arch::qwen3:
      c.qk_norm = true;
      c.hidden_size = 24;  // q_dim 32 != hidden 24, as in real Qwen3 (head_dim 128)
      c.rope_theta = 1e6;
      break;
  }
  return c;
}

}  // namespace sf
