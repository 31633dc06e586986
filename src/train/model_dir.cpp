#include "train/model_dir.h"

#include <unistd.h>

#include <fstream>

#include "core/error.h"
#include "export/generation_config.h"
#include "io/atomic_file.h"
#include "model/weights_io.h"

namespace sf {

namespace fs = std::filesystem;

void copy_tokenizer_files(const fs::path& from, const fs::path& to) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "generation_config.json", "tokenizer.model", "vocab.json",
                           "merges.txt", "chat_template.jinja"}) {
    fs::path src = from / name;
    if (!fs::exists(src)) continue;
    write_file_atomic(to / name, read_file(src));
  }
}

void replace_dir(const fs::path& tmp, const fs::path& dir) {
  fsync_dir(tmp);
  fs::path old = dir;
  old += ".old." + std::to_string(::getpid());
  std::error_code ec;
  bool had_old = fs::exists(dir);
  if (had_old) {
    fs::rename(dir, old, ec);
    if (ec) SF_FAIL(io, dir.string(), ": cannot move the previous version aside (", ec.message(), ")");
  }
  fs::rename(tmp, dir, ec);
  if (ec) {
    std::error_code ec2;
    if (had_old) fs::rename(old, dir, ec2);  // put the previous version back
    SF_FAIL(io, dir.string(), ": cannot rename the finished temporary ", tmp.string(),
            " into place (", ec.message(), ")");
  }
  fsync_dir(dir.has_parent_path() ? dir.parent_path() : fs::path("."));
  if (had_old) fs::remove_all(old, ec);
}

void write_model_files(const fs::path& dir, const ModelConfig& config, const ModelLayout& layout,
                       const std::vector<const float*>& unit_weights,
                       const SaveModelOptions& opt) {
  write_model_files(dir, config, layout, UnitWeights{unit_weights, {}}, opt);
}

void write_model_files(const fs::path& dir, const ModelConfig& config, const ModelLayout& layout,
                       const UnitWeights& weights, const SaveModelOptions& opt) {
  SF_CHECK(weights.f32.empty() != weights.bf16.empty(), "write_model_files: give fp32 or bf16 weights");
  SF_CHECK(weights.bf16.empty() || opt.dtype == DType::bf16,
           "write_model_files: bf16 weights are written as bf16 only, not ", dtype_name(opt.dtype));
  ModelConfig out = config;
  out.torch_dtype = opt.dtype;
  save_config(out, dir / "config.json");
  if (weights.bf16.empty())
    save_model_weights(dir, out, layout, weights.f32, opt.dtype, opt.max_shard_bytes);
  else
    save_model_weights_bf16(dir, out, layout, weights.bf16, opt.max_shard_bytes);
  if (!opt.tokenizer_dir.empty()) copy_tokenizer_files(opt.tokenizer_dir, dir);
  // After the copy: the source's generation_config.json is the base, ours replaces it.
  write_file_atomic(dir / "generation_config.json",
                    generation_config_json(out, opt.tokenizer_dir).dump(2) + "\n");
}

void save_model_dir(const fs::path& dir, const ModelConfig& config, const ModelLayout& layout,
                    const std::vector<const float*>& unit_weights, const SaveModelOptions& opt) {
  fs::path tmp = dir;
  tmp += ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) SF_FAIL(io, tmp.string(), ": cannot create directory (", ec.message(), ")");
  try {
    write_model_files(tmp, config, layout, unit_weights, opt);
    replace_dir(tmp, dir);
  } catch (...) {
    fs::remove_all(tmp, ec);  // the previous `dir` is untouched
    throw;
  }
}

}  // namespace sf
