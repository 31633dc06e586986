#include "io/model_config.h"

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "io/atomic_file.h"

namespace sf {

using nlohmann::json;

std::string_view arch_name(Arch a) {
  switch (a) {
    case Arch::llama: return "llama";
    case Arch::mistral: return "mistral";
    case Arch::qwen2: return "qwen2";
    case Arch::qwen3: return "qwen3";
  }
  return "?";
}

namespace {

struct Reader {
  const json& j;
  const std::string& src;
  std::string prefix = {};  // "rope_scaling." for a nested object, so messages name the path

  [[noreturn]] void bad(const std::string& field, const std::string& why) const {
    SF_FAIL(input, src, ": field \"", prefix, field, "\" ", why);
  }
  const json* find(const std::string& f) const {
    auto it = j.find(f);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t positive_int(const std::string& f) const {
    const json* v = find(f);
    if (!v) bad(f, "is missing; it is required for this architecture");
    if (!v->is_number_integer() || v->get<int64_t>() <= 0)
      bad(f, cat("must be a positive integer, got ", v->dump()));
    return v->get<int64_t>();
  }
  int64_t int_or(const std::string& f, int64_t def) const {
    return find(f) ? positive_int(f) : def;
  }
  double positive_number(const std::string& f, double def, bool required = false) const {
    const json* v = find(f);
    if (!v) {
      if (required) bad(f, "is missing");
      return def;
    }
    if (!v->is_number() || !(v->get<double>() > 0) || !std::isfinite(v->get<double>()))
      bad(f, cat("must be a positive number, got ", v->dump()));
    return v->get<double>();
  }
  bool boolean_or(const std::string& f, bool def) const {
    const json* v = find(f);
    if (!v) return def;
    if (!v->is_boolean()) bad(f, cat("must be true or false, got ", v->dump()));
    return v->get<bool>();
  }
};

DType parse_dtype(const Reader& r) {
  const json* v = r.find("torch_dtype");
  if (!v) v = r.find("dtype");  // newer transformers write "dtype"
  if (!v) return DType::bf16;
  if (!v->is_string()) r.bad("torch_dtype", "must be a string such as \"bfloat16\"");
  std::string s = v->get<std::string>();
  if (s == "bfloat16") return DType::bf16;
  if (s == "float16") return DType::f16;
  if (s == "float32") return DType::f32;
  r.bad("torch_dtype", cat("is \"", s, "\"; supported: bfloat16, float16, float32"));
}

RopeScaling parse_rope_scaling(const Reader& r) {
  RopeScaling rs;
  const json* v = r.find("rope_scaling");
  if (!v) return rs;
  if (!v->is_object()) r.bad("rope_scaling", "must be an object or null");
  Reader sub{*v, r.src, "rope_scaling."};
  std::string type;
  const char* type_key = sub.find("rope_type") ? "rope_type" : "type";
  if (const json* t = sub.find(type_key)) {
    // A non-string type used to read as "default" and silently drop the scaling.
    if (!t->is_string()) sub.bad(type_key, cat("must be a string, got ", t->dump()));
    type = t->get<std::string>();
  }
  if (type == "default" || type.empty()) return rs;
  if (type == "llama3") {
    rs.type = RopeScaling::Type::llama3;
    rs.factor = sub.positive_number("factor", 0, true);
    rs.low_freq_factor = sub.positive_number("low_freq_factor", 0, true);
    rs.high_freq_factor = sub.positive_number("high_freq_factor", 0, true);
    rs.original_max_position_embeddings = sub.positive_int("original_max_position_embeddings");
    if (!(rs.high_freq_factor > rs.low_freq_factor))
      sub.bad("high_freq_factor", "must be greater than low_freq_factor");
    return rs;
  }
  if (type == "linear") {
    rs.type = RopeScaling::Type::linear;
    rs.factor = sub.positive_number("factor", 0, true);
    return rs;
  }
  sub.bad(type_key, cat("is \"", type, "\"; supported: default, llama3, linear"));
}

}  // namespace

int64_t ModelConfig::num_parameters() const {
  int64_t C = hidden_size, F = intermediate_size;
  int64_t per_layer = C * q_dim() + 2 * C * kv_dim() + q_dim() * C + 3 * C * F + 2 * C;
  if (qkv_bias) per_layer += q_dim() + 2 * kv_dim();
  if (qk_norm) per_layer += 2 * head_dim;
  int64_t n = num_hidden_layers * per_layer + vocab_size * C + C;
  if (!tie_word_embeddings) n += vocab_size * C;
  return n;
}

ModelConfig config_from_json(const json& j, const std::string& source) {
  SF_REQUIRE(j.is_object(), source, ": expected a JSON object");
  Reader r{j, source};
  ModelConfig c;
  const json* mt = r.find("model_type");
  if (!mt) r.bad("model_type", "is missing; expected one of llama, mistral, qwen2, qwen3");
  if (!mt->is_string()) r.bad("model_type", cat("must be a string, got ", mt->dump()));
  std::string type = mt->get<std::string>();
  if (type == "llama") c.arch = Arch::llama;
  else if (type == "mistral") c.arch = Arch::mistral;
  else if (type == "qwen2") c.arch = Arch::qwen2;
  else if (type == "qwen3") c.arch = Arch::qwen3;
  else
    r.bad("model_type", cat("is \"", type,
                            "\", an architecture slideformer does not support; supported: "
                            "llama, mistral, qwen2, qwen3"));

  c.vocab_size = r.positive_int("vocab_size");
  c.hidden_size = r.positive_int("hidden_size");
  c.intermediate_size = r.positive_int("intermediate_size");
  c.num_hidden_layers = r.positive_int("num_hidden_layers");
  c.num_attention_heads = r.positive_int("num_attention_heads");
  c.num_key_value_heads = r.int_or("num_key_value_heads", c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    r.bad("num_key_value_heads", cat("(", c.num_key_value_heads,
                                     ") must divide num_attention_heads (",
                                     c.num_attention_heads, ")"));
  if (r.find("head_dim")) {
    c.head_dim = r.positive_int("head_dim");
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      r.bad("head_dim", "is missing and hidden_size is not a multiple of num_attention_heads");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) r.bad("head_dim", cat("must be even for RoPE, got ", c.head_dim));
  c.max_position_embeddings = r.int_or("max_position_embeddings", 4096);
  c.rms_norm_eps = r.positive_number("rms_norm_eps", 1e-6);
  c.rope_theta = r.positive_number("rope_theta", 10000.0);
  c.rope_scaling = parse_rope_scaling(r);
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  c.torch_dtype = parse_dtype(r);

  switch (c.arch) {
    case Arch::llama:
      c.qkv_bias = r.boolean_or("attention_bias", false);
      if (r.boolean_or("mlp_bias", false))
        r.bad("mlp_bias", "is true; MLP biases are not supported");
      break;
    case Arch::mistral:
      break;
    case Arch::qwen2:
      c.qkv_bias = true;  // Qwen2 always has q/k/v biases (and none on o_proj)
      break;
    case Arch::qwen3:
      c.qk_norm = true;
      c.qkv_bias = r.boolean_or("attention_bias", false);
      break;
  }
  if (const json* act = r.find("hidden_act")) {
    if (!act->is_string() || act->get<std::string>() != "silu")
      r.bad("hidden_act", cat("is ", act->dump(), "; only \"silu\" (SwiGLU) is supported"));
  }
  if (const json* b = r.find("bos_token_id"); b && b->is_number_integer())
    c.bos_token_id = b->get<int64_t>();
  if (const json* e = r.find("eos_token_id")) {
    if (e->is_number_integer()) c.eos_token_ids.push_back(e->get<int64_t>());
    else if (e->is_array())
      for (auto& x : *e)
        if (x.is_number_integer()) c.eos_token_ids.push_back(x.get<int64_t>());
  }
  c.extra = j;
  return c;
}

ModelConfig load_config(const std::filesystem::path& p) {
  std::ifstream f(p);
  SF_REQUIRE(f.good(), p.string(), ": cannot open (a model directory needs a config.json)");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::parse_error& e) {
    SF_FAIL(input, p.string(), ": not valid JSON: ", e.what());
  }
  return config_from_json(j, p.string());
}

json config_to_json(const ModelConfig& c) {
  json j = c.extra.is_object() ? c.extra : json::object();
  j["model_type"] = std::string(arch_name(c.arch));
  static const char* archs[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                "Qwen3ForCausalLM"};
  j["architectures"] = json::array({archs[int(c.arch)]});
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = c.torch_dtype == DType::f32 ? "float32"
                     : c.torch_dtype == DType::f16 ? "float16" : "bfloat16";
  if (c.arch == Arch::llama || c.arch == Arch::qwen3) j["attention_bias"] = c.qkv_bias;
  if (c.arch == Arch::llama) j["mlp_bias"] = false;
  switch (c.rope_scaling.type) {
    case RopeScaling::Type::none: j["rope_scaling"] = nullptr; break;
    case RopeScaling::Type::llama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope_scaling.factor},
                           {"low_freq_factor", c.rope_scaling.low_freq_factor},
                           {"high_freq_factor", c.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings",
                            c.rope_scaling.original_max_position_embeddings}};
      break;
    case RopeScaling::Type::linear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
      break;
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  else if (!c.eos_token_ids.empty()) j["eos_token_id"] = c.eos_token_ids;
  return j;
}

void save_config(const ModelConfig& c, const std::filesystem::path& p) {
  write_file_atomic(p, config_to_json(c).dump(2) + "\n");
}

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  int64_t half = c.head_dim / 2;
  std::vector<float> inv(half);
  const auto& rs = c.rope_scaling;
  for (int64_t i = 0; i < half; ++i) {
    // Same expression order as transformers: base ** (2i / dim), in double, then scaled.
    double f = 1.0 / std::pow(c.rope_theta, double(2 * i) / double(c.head_dim));
    if (rs.type == RopeScaling::Type::linear) {
      f /= rs.factor;
    } else if (rs.type == RopeScaling::Type::llama3) {
      const double pi = 3.14159265358979323846;
      double old_len = double(rs.original_max_position_embeddings);
      double low_wavelen = old_len / rs.low_freq_factor;
      double high_wavelen = old_len / rs.high_freq_factor;
      double wavelen = 2 * pi / f;
      if (wavelen > low_wavelen) {
        f /= rs.factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (old_len / wavelen - rs.low_freq_factor) /
                        (rs.high_freq_factor - rs.low_freq_factor);
        f = (1 - smooth) * f / rs.factor + smooth * f;
      }
    }
    inv[i] = float(f);
  }
  return inv;
}

}  // namespace sf
