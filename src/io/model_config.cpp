#include "io/model_config.h"

#include <algorithm>
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

std::string_view rope_type_name(RopeScaling::Type t) {
  switch (t) {
    case RopeScaling::Type::none: return "default";
    case RopeScaling::Type::linear: return "linear";
    case RopeScaling::Type::dynamic: return "dynamic";
    case RopeScaling::Type::llama3: return "llama3";
    case RopeScaling::Type::yarn: return "yarn";
  }
  return "?";
}

namespace {

struct Reader {
  const json& j;
  const std::string& src;
  std::string prefix = {};  // "rope_parameters." for a nested object, so messages name the path

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
  std::optional<double> optional_number(const std::string& f) const {
    const json* v = find(f);
    if (!v) return std::nullopt;
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < 0)
      bad(f, cat("must be a non-negative number, got ", v->dump()));
    return v->get<double>();
  }
  bool boolean_or(const std::string& f, bool def) const {
    const json* v = find(f);
    if (!v) return def;
    if (!v->is_boolean()) bad(f, cat("must be true or false, got ", v->dump()));
    return v->get<bool>();
  }
  std::string string_or(const std::string& f, const std::string& def) const {
    const json* v = find(f);
    if (!v) return def;
    if (!v->is_string()) bad(f, cat("must be a string, got ", v->dump()));
    return v->get<std::string>();
  }
};

// transformers' defaults for fields a config.json may omit (each family's config class).
struct ArchDefaults {
  int64_t num_key_value_heads;  // 0: as many as attention heads
  int64_t head_dim;             // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings;
};
ArchDefaults defaults_of(Arch a) {
  switch (a) {
    case Arch::llama: return {0, 0, 2048};
    case Arch::mistral: return {8, 0, 131072};
    case Arch::qwen2: return {32, 0, 32768};
    case Arch::qwen3: return {32, 128, 32768};
  }
  return {0, 0, 4096};
}

bool version_4(const json& j) {
  auto it = j.find("transformers_version");
  return it != j.end() && it->is_string() && it->get<std::string>().rfind("4.", 0) == 0;
}

DType parse_dtype(const Reader& r, ModelConfig& c) {
  // transformers 5 reads "dtype" first and falls back to the older "torch_dtype".
  const char* key = r.find("dtype") ? "dtype" : r.find("torch_dtype") ? "torch_dtype" : nullptr;
  if (key) c.dtype_spelling = std::string_view(key) == "dtype" ? DtypeSpelling::dtype
                                                              : DtypeSpelling::torch_dtype;
  else c.dtype_spelling = version_4(r.j) ? DtypeSpelling::torch_dtype : DtypeSpelling::dtype;
  if (!key) return DType::bf16;
  std::string s = r.string_or(key, "");
  if (s == "bfloat16") return DType::bf16;
  if (s == "float16") return DType::f16;
  if (s == "float32") return DType::f32;
  r.bad(key, cat("is \"", s, "\"; supported: bfloat16, float16, float32"));
}

struct Rope {
  double theta = 10000.0;
  RopeScaling scaling;
  bool operator==(const Rope&) const = default;
};

RopeScaling parse_rope_type(const Reader& sub, const std::string& type, int64_t max_pos) {
  RopeScaling rs;
  const char* type_key = sub.find("rope_type") ? "rope_type" : "type";
  if (type == "default") return rs;
  if (type == "linear" || type == "dynamic") {
    rs.type = type == "linear" ? RopeScaling::Type::linear : RopeScaling::Type::dynamic;
    rs.factor = sub.positive_number("factor", 0, true);
    return rs;
  }
  if (type == "llama3" || type == "yarn") {
    // transformers 5 takes the pretraining context from max_position_embeddings when absent.
    rs.original_max_position_embeddings = sub.int_or("original_max_position_embeddings", max_pos);
    rs.factor = sub.positive_number("factor", 0, true);
  }
  if (type == "llama3") {
    rs.type = RopeScaling::Type::llama3;
    rs.low_freq_factor = sub.positive_number("low_freq_factor", 0, true);
    rs.high_freq_factor = sub.positive_number("high_freq_factor", 0, true);
    if (!(rs.high_freq_factor > rs.low_freq_factor))
      sub.bad("high_freq_factor", "must be greater than low_freq_factor");
    return rs;
  }
  if (type == "yarn") {
    rs.type = RopeScaling::Type::yarn;
    rs.beta_fast = sub.optional_number("beta_fast");
    rs.beta_slow = sub.optional_number("beta_slow");
    rs.attention_factor = sub.optional_number("attention_factor");
    rs.mscale = sub.optional_number("mscale");
    rs.mscale_all_dim = sub.optional_number("mscale_all_dim");
    if (sub.find("truncate")) rs.truncate = sub.boolean_or("truncate", true);
    return rs;
  }
  sub.bad(type_key, cat("is \"", type, "\"; supported: default, linear, dynamic, llama3, yarn"));
}

// RoPE as transformers 5 resolves it: a non-empty rope_scaling (the older name) replaces
// rope_parameters; rope_theta comes from that object, else the top level, else 10000.
Rope parse_rope(const Reader& r, int64_t max_pos) {
  const json* scaling = r.find("rope_scaling");
  const json* params = r.find("rope_parameters");
  for (const char* f : {"rope_scaling", "rope_parameters"})
    if (const json* v = r.find(f); v && !v->is_object()) r.bad(f, "must be an object or null");
  const bool use_scaling = scaling && !scaling->empty();
  const json empty = json::object();
  const json& obj = use_scaling ? *scaling : params ? *params : empty;
  Reader sub{obj, r.src, use_scaling ? "rope_scaling." : "rope_parameters."};
  Rope rope;
  rope.theta = sub.find("rope_theta") ? sub.positive_number("rope_theta", 0)
                                      : r.positive_number("rope_theta", 10000.0);
  const Reader& prf_at = sub.find("partial_rotary_factor") ? sub : r;
  if (auto prf = prf_at.optional_number("partial_rotary_factor"); prf && *prf != 1.0)
    prf_at.bad("partial_rotary_factor", cat("is ", *prf, "; these families rotate the whole "
                                            "head (transformers' own layers need 1.0)"));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (sub.find(key)) {
      // A non-string type used to read as "default" and silently drop the scaling.
      type = sub.string_or(key, "default");
      break;
    }
  rope.scaling = parse_rope_type(sub, type, max_pos);
  return rope;
}

RopeSpelling rope_spelling_of(const json& j) {
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null())
    return RopeSpelling::parameters;
  if (j.contains("rope_theta") || j.contains("rope_scaling")) return RopeSpelling::legacy;
  return version_4(j) ? RopeSpelling::legacy : RopeSpelling::parameters;
}

// The window of qwen2/qwen3's sliding layers: transformers uses sliding_window (default 4096)
// only when use_sliding_window is true, on the layers layer_types marks "sliding_attention"
// (default: those from max_window_layers on).
int64_t qwen_sliding_window(const Reader& r, int64_t n_layers) {
  const bool use = r.boolean_or("use_sliding_window", false);
  const int64_t window = r.find("sliding_window") ? r.positive_int("sliding_window") : 4096;
  int64_t sliding = 0;
  if (const json* lt = r.find("layer_types")) {
    if (!lt->is_array() || int64_t(lt->size()) != n_layers)
      r.bad("layer_types", cat("must list num_hidden_layers (", n_layers, ") entries"));
    for (auto& t : *lt) {
      if (!t.is_string() || (t != "full_attention" && t != "sliding_attention"))
        r.bad("layer_types", cat("has ", t.dump(),
                                 "; supported: \"full_attention\", \"sliding_attention\""));
      sliding += t == "sliding_attention";
    }
  } else {
    const json* mwl = r.find("max_window_layers");
    if (mwl && !mwl->is_number_integer())
      r.bad("max_window_layers", cat("must be an integer, got ", mwl->dump()));
    const int64_t first = mwl ? mwl->get<int64_t>() : 28;
    sliding = std::max<int64_t>(0, n_layers - std::max<int64_t>(first, 0));
  }
  return use && sliding > 0 ? window : 0;
}

int64_t sliding_window_of(const Reader& r, Arch arch, int64_t n_layers) {
  switch (arch) {
    case Arch::llama: return 0;  // LlamaAttention has no window
    case Arch::mistral:          // one window for every layer; absent means 4096, null none
      if (!r.j.contains("sliding_window")) return 4096;
      return r.find("sliding_window") ? r.positive_int("sliding_window") : 0;
    case Arch::qwen2:
    case Arch::qwen3: return qwen_sliding_window(r, n_layers);
  }
  return 0;
}

// Fields of the supported families that change the computation in ways slideformer does
// not implement: refused, naming the field, rather than trained as something else.
void refuse_unsupported(const Reader& r, Arch arch) {
  if (r.find("quantization_config"))
    r.bad("quantization_config", "is set: the weights are quantized; slideformer trains "
                                 "full-precision checkpoints (dequantize the model first)");
  if (const json* d = r.find("attention_dropout");
      d && (!d->is_number() || d->get<double>() != 0.0))
    r.bad("attention_dropout", cat("is ", d->dump(), "; slideformer trains without dropout: "
                                   "set it to 0.0 to fine-tune without it"));
  if (const json* act = r.find("hidden_act");
      act && !(act->is_string() && (*act == "silu" || *act == "swish")))
    r.bad("hidden_act", cat("is ", act->dump(), "; only \"silu\" (SwiGLU) is supported"));
  if (arch == Arch::llama && r.boolean_or("mlp_bias", false))
    r.bad("mlp_bias", "is true; MLP biases are not supported");
  if ((arch == Arch::llama || arch == Arch::qwen3) && r.boolean_or("attention_bias", false))
    r.bad("attention_bias", "is true: transformers then gives o_proj a bias as well as q/k/v, "
                            "which slideformer does not implement");
}

Arch parse_arch(const Reader& r) {
  const json* mt = r.find("model_type");
  if (!mt) r.bad("model_type", "is missing; expected one of llama, mistral, qwen2, qwen3");
  if (!mt->is_string()) r.bad("model_type", cat("must be a string, got ", mt->dump()));
  std::string type = mt->get<std::string>();
  if (type == "llama") return Arch::llama;
  if (type == "mistral") return Arch::mistral;
  if (type == "qwen2") return Arch::qwen2;
  if (type == "qwen3") return Arch::qwen3;
  r.bad("model_type", cat("is \"", type,
                          "\", an architecture slideformer does not support; supported: "
                          "llama, mistral, qwen2, qwen3"));
}

void parse_shape(const Reader& r, ModelConfig& c) {
  const ArchDefaults d = defaults_of(c.arch);
  c.vocab_size = r.positive_int("vocab_size");
  c.hidden_size = r.positive_int("hidden_size");
  c.intermediate_size = r.positive_int("intermediate_size");
  c.num_hidden_layers = r.positive_int("num_hidden_layers");
  c.num_attention_heads = r.positive_int("num_attention_heads");
  c.num_key_value_heads =
      r.int_or("num_key_value_heads", d.num_key_value_heads ? d.num_key_value_heads
                                                            : c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    r.bad("num_key_value_heads", cat("(", c.num_key_value_heads,
                                     ") must divide num_attention_heads (",
                                     c.num_attention_heads, ")"));
  if (r.find("head_dim")) {
    c.head_dim = r.positive_int("head_dim");
  } else if (d.head_dim) {
    c.head_dim = d.head_dim;
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      r.bad("head_dim", "is missing and hidden_size is not a multiple of num_attention_heads");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) r.bad("head_dim", cat("must be even for RoPE, got ", c.head_dim));
  c.max_position_embeddings = r.int_or("max_position_embeddings", d.max_position_embeddings);
  c.rms_norm_eps = r.positive_number("rms_norm_eps", 1e-6);
}

void parse_token_ids(const Reader& r, ModelConfig& c) {
  // LlamaConfig and MistralConfig default to 1 and 2 when the keys are absent (null: none).
  const bool llama_like = c.arch == Arch::llama || c.arch == Arch::mistral;
  if (llama_like && !r.j.contains("bos_token_id")) c.bos_token_id = 1;
  if (llama_like && !r.j.contains("eos_token_id")) c.eos_token_ids = {2};
  if (const json* b = r.find("bos_token_id"); b && b->is_number_integer())
    c.bos_token_id = b->get<int64_t>();
  if (const json* e = r.find("eos_token_id")) {
    if (e->is_number_integer()) c.eos_token_ids.push_back(e->get<int64_t>());
    else if (e->is_array())
      for (auto& x : *e)
        if (x.is_number_integer()) c.eos_token_ids.push_back(x.get<int64_t>());
  }
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
  c.arch = parse_arch(r);
  refuse_unsupported(r, c.arch);
  parse_shape(r, c);
  Rope rope = parse_rope(r, c.max_position_embeddings);
  c.rope_theta = rope.theta;
  c.rope_scaling = rope.scaling;
  c.rope_spelling = rope_spelling_of(j);
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);  // all four families
  c.torch_dtype = parse_dtype(r, c);
  c.sliding_window = sliding_window_of(r, c.arch, c.num_hidden_layers);
  // Qwen2 always has q/k/v biases (whatever attention_bias says, and none on o_proj);
  // attention_bias true on llama/qwen3 was refused above.
  c.qkv_bias = c.arch == Arch::qwen2;
  c.qk_norm = c.arch == Arch::qwen3;
  parse_token_ids(r, c);
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

namespace {

// The RoPE object as transformers 5 writes it after loading (with rope_theta for the
// rope_parameters spelling; rope_scaling carries none).
json rope_object(const ModelConfig& c, bool with_theta) {
  const RopeScaling& rs = c.rope_scaling;
  json o = {{"rope_type", std::string(rope_type_name(rs.type))}};
  if (with_theta) o["rope_theta"] = c.rope_theta;
  if (rs.type == RopeScaling::Type::none) return o;
  o["factor"] = rs.factor;
  if (rs.type == RopeScaling::Type::llama3 || rs.type == RopeScaling::Type::yarn)
    o["original_max_position_embeddings"] = rs.original_max_position_embeddings;
  if (rs.type == RopeScaling::Type::llama3) {
    o["low_freq_factor"] = rs.low_freq_factor;
    o["high_freq_factor"] = rs.high_freq_factor;
  }
  auto put = [&](const char* k, const auto& v) {
    if (v) o[k] = *v;
  };
  put("beta_fast", rs.beta_fast);
  put("beta_slow", rs.beta_slow);
  put("attention_factor", rs.attention_factor);
  put("mscale", rs.mscale);
  put("mscale_all_dim", rs.mscale_all_dim);
  put("truncate", rs.truncate);
  return o;
}

// Writes the RoPE fields in c's spelling only: the source's own object when it still means
// what c says (it may hold keys transformers ignores), else the canonical one.
void write_rope(json& j, const ModelConfig& c) {
  const json src = c.extra.is_object() ? c.extra : json::object();
  for (const char* k : {"rope_parameters", "rope_theta", "rope_scaling"}) j.erase(k);
  const bool params = c.rope_spelling == RopeSpelling::parameters;
  const char* key = params ? "rope_parameters" : "rope_scaling";
  bool same = false;
  if (src.contains(key) && (src[key].is_object() || (!params && src[key].is_null()))) {
    j[key] = src[key];
    if (!params) j["rope_theta"] = c.rope_theta;
    try {
      same = parse_rope(Reader{j, "(saved config)"}, c.max_position_embeddings) ==
             Rope{c.rope_theta, c.rope_scaling};
    } catch (const Error&) {
    }
  }
  if (same) return;
  if (params) {
    j["rope_parameters"] = rope_object(c, true);
  } else {
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = c.rope_scaling.type == RopeScaling::Type::none
                            ? json(nullptr) : rope_object(c, false);
  }
}

void write_sliding_window(json& j, const ModelConfig& c) {
  if (c.arch == Arch::mistral) {
    j["sliding_window"] = c.sliding_window ? json(c.sliding_window) : json(nullptr);
    return;
  }
  if (c.arch != Arch::qwen2 && c.arch != Arch::qwen3) return;
  bool same = false;
  try {
    same = qwen_sliding_window(Reader{j, "(saved config)"}, c.num_hidden_layers) ==
           c.sliding_window;
  } catch (const Error&) {
  }
  if (same) return;
  j.erase("layer_types");
  j["use_sliding_window"] = c.sliding_window > 0;
  j["sliding_window"] = c.sliding_window ? json(c.sliding_window) : json(nullptr);
  j["max_window_layers"] = 0;
}

const char* dtype_string(DType d) {
  return d == DType::f32 ? "float32" : d == DType::f16 ? "float16" : "bfloat16";
}

}  // namespace

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
  if (!j.contains("hidden_act")) j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j.erase("dtype");
  j.erase("torch_dtype");
  j[c.dtype_spelling == DtypeSpelling::dtype ? "dtype" : "torch_dtype"] =
      dtype_string(c.torch_dtype);
  if (c.arch == Arch::llama || c.arch == Arch::qwen3) j["attention_bias"] = false;
  if (c.arch == Arch::llama) j["mlp_bias"] = false;
  write_rope(j, c);
  write_sliding_window(j, c);
  // Written even when none: absent, llama and mistral would read 1 and 2.
  j["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  else if (!c.eos_token_ids.empty()) j["eos_token_id"] = c.eos_token_ids;
  else j["eos_token_id"] = nullptr;
  return j;
}

void save_config(const ModelConfig& c, const std::filesystem::path& p) {
  write_file_atomic(p, config_to_json(c).dump(2) + "\n");
}

namespace {

constexpr double kPi = 3.14159265358979323846;

// llama3: long wavelengths divided by the factor, short ones kept, a smooth blend between.
double llama3_freq(const RopeScaling& rs, double f) {
  double old_len = double(rs.original_max_position_embeddings);
  double low_wavelen = old_len / rs.low_freq_factor;
  double high_wavelen = old_len / rs.high_freq_factor;
  double wavelen = 2 * kPi / f;
  if (wavelen > low_wavelen) return f / rs.factor;
  if (wavelen < high_wavelen) return f;
  double smooth = (old_len / wavelen - rs.low_freq_factor) /
                  (rs.high_freq_factor - rs.low_freq_factor);
  return (1 - smooth) * f / rs.factor + smooth * f;
}

// yarn (transformers' _compute_yarn_parameters): dimensions below `low` keep their frequency
// (extrapolation), those above `high` are divided by the factor (interpolation), a linear
// ramp blends the range between.
std::vector<double> yarn_freqs(const ModelConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  const double dim = double(c.head_dim), base = c.rope_theta;
  const double beta_fast = rs.beta_fast.value_or(0) ? *rs.beta_fast : 32;
  const double beta_slow = rs.beta_slow.value_or(0) ? *rs.beta_slow : 1;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(double(rs.original_max_position_embeddings) / (rotations * 2 * kPi)) /
           (2 * std::log(base));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (rs.truncate.value_or(true)) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // as transformers: no division by zero
  std::vector<double> f(size_t(c.head_dim / 2));
  for (size_t i = 0; i < f.size(); ++i) {
    double extrapolated = 1.0 / std::pow(base, double(2 * i) / dim);
    double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    f[i] = extrapolated / rs.factor * ramp + extrapolated * (1 - ramp);
  }
  return f;
}

double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const auto& rs = c.rope_scaling;
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  if (rs.type == RopeScaling::Type::yarn) {
    std::vector<double> f = yarn_freqs(c);
    for (int64_t i = 0; i < half; ++i) inv[size_t(i)] = float(f[size_t(i)]);
    return inv;
  }
  for (int64_t i = 0; i < half; ++i) {
    // Same expression order as transformers: base ** (2i / dim), in double, then scaled.
    double f = 1.0 / std::pow(c.rope_theta, double(2 * i) / double(c.head_dim));
    if (rs.type == RopeScaling::Type::linear) f /= rs.factor;
    else if (rs.type == RopeScaling::Type::llama3) f = llama3_freq(rs, f);
    inv[size_t(i)] = float(f);
  }
  return inv;
}

double rope_attention_scaling(const ModelConfig& c) {
  const auto& rs = c.rope_scaling;
  if (rs.type != RopeScaling::Type::yarn) return 1.0;
  if (rs.attention_factor) return *rs.attention_factor;
  if (rs.mscale.value_or(0) && rs.mscale_all_dim.value_or(0))
    return yarn_mscale(rs.factor, *rs.mscale) / yarn_mscale(rs.factor, *rs.mscale_all_dim);
  return yarn_mscale(rs.factor, 1.0);
}

int64_t rope_max_sequence(const ModelConfig& c) {
  return c.rope_scaling.type == RopeScaling::Type::dynamic ? c.max_position_embeddings : 0;
}

void check_sequence_length(const ModelConfig& c, int64_t seq_len, const std::string& source,
                           const std::string& flag) {
  SF_REQUIRE(c.sliding_window == 0 || seq_len <= c.sliding_window, flag, " ", seq_len,
             " is longer than the model's sliding window of ", c.sliding_window, " tokens (",
             source, ": sliding_window); slideformer attends over whole sequences, which equals "
             "the window only up to its length: use ", flag, " ", c.sliding_window, " or less");
  const int64_t rope = rope_max_sequence(c);
  SF_REQUIRE(rope == 0 || seq_len <= rope, flag, " ", seq_len, " is longer than ", source,
             "'s max_position_embeddings (", rope, ") of a model with dynamic RoPE scaling "
             "(rope type \"dynamic\"), whose frequencies transformers recomputes per batch "
             "beyond it: use ", flag, " ", rope, " or less");
}

}  // namespace sf
