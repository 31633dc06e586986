// model/gguf_import: the llama GGUF -> HF name table, the Q/K row un-permutation against an
// independent implementation of llama.cpp's forward permutation, and a tiny llama written as
// a GGUF here (F32/F16 tensors, permuted q/k) loaded back exactly; plus the refusals.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "core/dtype.h"
#include "core/error.h"
#include "model/gguf_import.h"
#include "model/model_init.h"
#include "test_util.h"

namespace sf {
namespace {

namespace fs = std::filesystem;

// ---- a minimal GGUF writer (test-only) ---------------------------------------------------

struct GgufOut {
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;  // innermost first
    uint32_t type;
    std::vector<uint8_t> data;
  };
  std::vector<std::pair<std::string, std::vector<uint8_t>>> kvs;  // key, type + value bytes
  std::vector<Tensor> tensors;

  static void put(std::vector<uint8_t>& b, const void* p, size_t n) {
    auto c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
  }
  static void put_u32(std::vector<uint8_t>& b, uint32_t v) { put(b, &v, 4); }
  static void put_u64(std::vector<uint8_t>& b, uint64_t v) { put(b, &v, 8); }
  static void put_str(std::vector<uint8_t>& b, const std::string& s) {
    put_u64(b, s.size());
    put(b, s.data(), s.size());
  }
  void u32(const std::string& k, uint32_t v) {
    std::vector<uint8_t> b;
    put_u32(b, 4);
    put_u32(b, v);
    kvs.emplace_back(k, b);
  }
  void f32(const std::string& k, float v) {
    std::vector<uint8_t> b;
    put_u32(b, 6);
    put(b, &v, 4);
    kvs.emplace_back(k, b);
  }
  void str(const std::string& k, const std::string& v) {
    std::vector<uint8_t> b;
    put_u32(b, 8);
    put_str(b, v);
    kvs.emplace_back(k, b);
  }
  // A row-major [rows, cols] (or 1-D) fp32 tensor stored as F32 or F16.
  void tensor(const std::string& name, const std::vector<int64_t>& shape, const float* v,
              uint32_t type = ggml_type::F32) {
    Tensor t{name, {}, type, {}};
    for (auto it = shape.rbegin(); it != shape.rend(); ++it) t.dims.push_back(uint64_t(*it));
    int64_t n = 1;
    for (auto d : shape) n *= d;
    if (type == ggml_type::F32) {
      put(t.data, v, size_t(n) * 4);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h = f32_to_f16(v[i]);
        put(t.data, &h, 2);
      }
    }
    tensors.push_back(std::move(t));
  }
  void write(const fs::path& p) const {
    std::vector<uint8_t> b;
    put(b, "GGUF", 4);
    put_u32(b, 3);
    put_u64(b, tensors.size());
    put_u64(b, kvs.size());
    for (auto& [k, v] : kvs) {
      put_str(b, k);
      put(b, v.data(), v.size());
    }
    uint64_t off = 0;
    for (auto& t : tensors) {
      put_str(b, t.name);
      put_u32(b, uint32_t(t.dims.size()));
      for (auto d : t.dims) put_u64(b, d);
      put_u32(b, t.type);
      put_u64(b, off);
      off += (t.data.size() + 31) / 32 * 32;
    }
    while (b.size() % 32) b.push_back(0);
    for (auto& t : tensors) {
      put(b, t.data.data(), t.data.size());
      while (b.size() % 32) b.push_back(0);
    }
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()),
                                             std::streamsize(b.size()));
  }
};

// llama.cpp's converter permutation (HF -> GGUF), written from its description: within each
// head, rows [x_0 .. x_{D/2-1}, y_0 .. y_{D/2-1}] become [x_0, y_0, x_1, y_1, ...].
std::vector<float> permute_like_llama_cpp(const float* w, int64_t rows, int64_t cols,
                                          int64_t heads) {
  std::vector<float> out(size_t(rows * cols));
  const int64_t D = rows / heads, half = D / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t r = 0; r < D; ++r) {
      const int64_t j = r / half, i = r % half;  // HF row r = j * half + i
      std::memcpy(&out[size_t((h * D + 2 * i + j) * cols)], w + (h * D + r) * cols,
                  size_t(cols) * 4);
    }
  return out;
}

TEST(GgufImport, NameTable) {
  EXPECT_EQ(gguf_llama_hf_name("token_embd.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(gguf_llama_hf_name("output_norm.weight"), "model.norm.weight");
  EXPECT_EQ(gguf_llama_hf_name("output.weight"), "lm_head.weight");
  EXPECT_EQ(gguf_llama_hf_name("blk.0.attn_norm.weight"), "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(gguf_llama_hf_name("blk.12.attn_q.weight"), "model.layers.12.self_attn.q_proj.weight");
  EXPECT_EQ(gguf_llama_hf_name("blk.3.attn_k.bias"), "model.layers.3.self_attn.k_proj.bias");
  EXPECT_EQ(gguf_llama_hf_name("blk.3.attn_v.weight"), "model.layers.3.self_attn.v_proj.weight");
  EXPECT_EQ(gguf_llama_hf_name("blk.3.attn_output.weight"), "model.layers.3.self_attn.o_proj.weight");
  EXPECT_EQ(gguf_llama_hf_name("blk.29.ffn_norm.weight"),
            "model.layers.29.post_attention_layernorm.weight");
  EXPECT_EQ(gguf_llama_hf_name("blk.1.ffn_gate.weight"), "model.layers.1.mlp.gate_proj.weight");
  EXPECT_EQ(gguf_llama_hf_name("blk.1.ffn_up.weight"), "model.layers.1.mlp.up_proj.weight");
  EXPECT_EQ(gguf_llama_hf_name("blk.1.ffn_down.weight"), "model.layers.1.mlp.down_proj.weight");
  for (const char* bad : {"blk.01.attn_q.weight", "blk..attn_q.weight", "blk.1.attn_q",
                          "blk.1.attn_q.scale", "blk.1.ffn_gate_exps.weight", "rope_freqs.weight",
                          "blk.x.attn_q.weight", "token_embd", "blk.1234567.attn_q.weight"})
    EXPECT_EQ(gguf_llama_hf_name(bad), std::nullopt) << bad;
}

TEST(GgufImport, UnpermuteUndoesLlamaCppPermutation) {
  // By hand, one head of D = 4, one column: GGUF [x0, y0, x1, y1] -> HF [x0, x1, y0, y1].
  const float g[4] = {10, 20, 11, 21};
  float hf[4];
  unpermute_qk_rows(g, hf, 4, 1, 1);
  EXPECT_EQ(std::vector<float>(hf, hf + 4), (std::vector<float>{10, 11, 20, 21}));
  // Random [heads * D, cols] matrices, several head counts.
  for (int64_t heads : {1, 3, 9}) {
    const int64_t D = 8, cols = 5, rows = heads * D;
    auto w = test::random_vec(size_t(rows * cols), 7 + uint64_t(heads));
    auto p = permute_like_llama_cpp(w.data(), rows, cols, heads);
    std::vector<float> back(w.size());
    unpermute_qk_rows(p.data(), back.data(), rows, cols, heads);
    EXPECT_EQ(back, w) << heads;
    EXPECT_NE(p, w);  // the permutation is not the identity (the test can fail)
  }
}

// A tiny llama (2 layers, 4 heads / 2 kv heads, untied or tied) as a GGUF of its params.
struct TinyGguf {
  ModelConfig cfg;
  ModelLayout layout;
  std::vector<std::vector<float>> params;
  GgufOut out;

  explicit TinyGguf(bool tied) : cfg(tiny_config(Arch::llama, tied)), layout(ModelLayout::build(cfg)) {
    InitOptions opt;
    opt.norm_jitter = 0.3f;
    params = init_params(layout, 99, opt);
    // f16-representable values, so the F16 tensors below store them exactly.
    for (auto& u : params)
      for (auto& x : u) x = f16_to_f32(f32_to_f16(x));
    out.str("general.architecture", "llama");
    out.u32("llama.block_count", uint32_t(cfg.num_hidden_layers));
    out.u32("llama.embedding_length", uint32_t(cfg.hidden_size));
    out.u32("llama.feed_forward_length", uint32_t(cfg.intermediate_size));
    out.u32("llama.attention.head_count", uint32_t(cfg.num_attention_heads));
    out.u32("llama.attention.head_count_kv", uint32_t(cfg.num_key_value_heads));
    out.f32("llama.rope.freq_base", float(cfg.rope_theta));
    auto gguf_name = [](const std::string& hf) {
      static const std::pair<const char*, const char*> m[] = {
          {"input_layernorm", "attn_norm"}, {"self_attn.q_proj", "attn_q"},
          {"self_attn.k_proj", "attn_k"},   {"self_attn.v_proj", "attn_v"},
          {"self_attn.o_proj", "attn_output"}, {"post_attention_layernorm", "ffn_norm"},
          {"mlp.gate_proj", "ffn_gate"},    {"mlp.up_proj", "ffn_up"},
          {"mlp.down_proj", "ffn_down"}};
      if (hf == "model.embed_tokens.weight") return std::string("token_embd.weight");
      if (hf == "model.norm.weight") return std::string("output_norm.weight");
      if (hf == "lm_head.weight") return std::string("output.weight");
      std::string rest = hf.substr(std::string("model.layers.").size());
      const size_t dot = rest.find('.');
      std::string layer = rest.substr(0, dot), leaf = rest.substr(dot + 1);
      for (auto& [h, g] : m)
        if (leaf.rfind(h, 0) == 0) return "blk." + layer + "." + g + leaf.substr(std::strlen(h));
      return std::string("?");
    };
    int i = 0;
    for (size_t u = 0; u < layout.units.size(); ++u)
      for (auto& s : layout.units[u].params)
        for (auto& part : s.parts) {
          const float* v = params[u].data() + part.offset;
          const std::string g = gguf_name(part.hf_name);
          std::vector<float> perm;
          const bool q = g.find(".attn_q.") != std::string::npos;
          if (q || g.find(".attn_k.") != std::string::npos) {
            perm = permute_like_llama_cpp(v, part.hf_shape[0], part.hf_shape[1],
                                          q ? cfg.num_attention_heads : cfg.num_key_value_heads);
            v = perm.data();
          }
          // Alternate F32 and F16 so that both paths are exercised.
          out.tensor(g, part.hf_shape, v, (i++ % 2) ? ggml_type::F16 : ggml_type::F32);
        }
  }
};

std::vector<float*> ptrs(std::vector<std::vector<float>>& v) {
  std::vector<float*> p;
  for (auto& x : v) p.push_back(x.data());
  return p;
}

std::vector<std::vector<float>> buffers(const ModelLayout& l) {
  std::vector<std::vector<float>> b;
  for (auto& u : l.units) b.emplace_back(size_t(u.numel), -7.f);  // padding must be zeroed
  return b;
}

TEST(GgufImport, LoadsATinyLlamaExactly) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied);
    test::TempDir dir("gguf-import");
    TinyGguf t(tied);
    if (tied) {  // a tied model whose file still carries output.weight: ignored, like HF
      std::vector<float> head(size_t(t.cfg.vocab_size * t.cfg.hidden_size), 1.f);
      t.out.tensor("output.weight", {t.cfg.vocab_size, t.cfg.hidden_size}, head.data());
    }
    t.out.tensor("rope_freqs.weight", {t.cfg.head_dim / 2}, t.params[0].data());
    const fs::path p = dir.path / "tiny.gguf";
    t.out.write(p);
    auto got = buffers(t.layout);
    WeightsLoadInfo info = load_gguf_weights(p, t.cfg, t.layout, ptrs(got));
    EXPECT_EQ(got, t.params);
    EXPECT_EQ(info.tensors, int64_t(t.layout.hf_names().size()));
    EXPECT_EQ(info.ignored.size(), tied ? 2u : 1u);
    EXPECT_TRUE(info.notes.empty());
  }
}

std::string load_error(const GgufOut& out, const ModelConfig& cfg) {
  test::TempDir dir("gguf-import");
  const fs::path p = dir.path / "m.gguf";
  out.write(p);
  ModelLayout layout = ModelLayout::build(cfg);
  auto b = buffers(layout);
  try {
    load_gguf_weights(p, cfg, layout, ptrs(b));
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input) << e.what();
    EXPECT_NE(std::string(e.what()).find("m.gguf"), std::string::npos) << e.what();
    // Nothing was written before the error.
    for (auto& u : b)
      for (float x : u)
        if (x != -7.f) {
          ADD_FAILURE() << "a buffer was written before the error";
          return e.what();
        }
    return e.what();
  }
  return "";
}

TEST(GgufImport, Refusals) {
  auto expect = [](const std::string& msg, const std::string& needle) {
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
  };
  TinyGguf t(false);
  {  // head counts drive the un-permutation: a disagreement is an error
    ModelConfig c = t.cfg;
    c.num_key_value_heads = 4;
    expect(load_error(t.out, c), "head_count_kv");
  }
  {
    ModelConfig c = t.cfg;
    c.intermediate_size += 2;
    expect(load_error(t.out, c), "feed_forward_length");
  }
  {
    GgufOut o = t.out;
    o.kvs[0] = {"general.architecture", {}};
    GgufOut::put_u32(o.kvs[0].second, 8);
    GgufOut::put_str(o.kvs[0].second, "qwen2");
    expect(load_error(o, t.cfg), "only llama-architecture");
  }
  {
    GgufOut o = t.out;
    o.tensors.erase(o.tensors.begin() + 3);
    expect(load_error(o, t.cfg), "missing");
  }
  {
    GgufOut o = t.out;
    o.tensors.push_back(o.tensors.back());
    o.tensors.back().name = "blk.7.ffn_up.weight";
    expect(load_error(o, t.cfg), "not part of the model");
  }
  {  // untied config, file without output.weight: missing, with the hint
    TinyGguf tied(true);
    expect(load_error(tied.out, t.cfg), "tie_word_embeddings");
  }
  {
    GgufOut o = t.out;
    auto& d = o.tensors[2].dims;  // k_proj [KV, C], not square
    ASSERT_NE(d[0], d[1]);
    std::swap(d[0], d[1]);  // a transposed matrix
    expect(load_error(o, t.cfg), "has shape");
  }
  {  // an unreadable type (I32: same size as the F32 it replaces), named with the tensor
    GgufOut o = t.out;
    auto& x = o.tensors[2];
    ASSERT_EQ(x.type, ggml_type::F32);
    x.type = 26;
    const std::string msg = load_error(o, t.cfg);
    expect(msg, x.name);
    expect(msg, "type I32");
  }
  {  // rope freq_base disagreeing with the config is only a note (weights do not depend on it)
    test::TempDir dir("gguf-import");
    GgufOut o = t.out;
    o.f32("llama.rope.freq_base", 500000.f);
    o.kvs.erase(o.kvs.begin() + 6);  // the original freq_base
    const fs::path p = dir.path / "m.gguf";
    o.write(p);
    auto b = buffers(t.layout);
    WeightsLoadInfo info = load_gguf_weights(p, t.cfg, t.layout, ptrs(b));
    ASSERT_EQ(info.notes.size(), 1u);
    expect(info.notes[0], "rope_theta");
  }
}

}  // namespace
}  // namespace sf
