#include "data/data_source.h"

#include <filesystem>

#include "core/error.h"
#include "data/sample_source.h"
#include "data/token_file_source.h"

namespace sf {

namespace fs = std::filesystem;

const std::vector<std::string>& data_format_names() {
  static const std::vector<std::string> v = {"auto", "text", "prompt_completion", "messages",
                                             "tokens"};
  return v;
}

const std::vector<std::string>& overflow_names() {
  static const std::vector<std::string> v = {"auto", "truncate", "split", "drop"};
  return v;
}

DataSource open_data_source(const DataRequest& r) {
  SF_REQUIRE(!r.path.empty(), "no training data: pass --data FILE (JSONL or a token file)");
  SF_REQUIRE(fs::exists(r.path), r.path.string(), ": training data not found (--data)");
  SF_REQUIRE(r.eval_file.empty() || fs::exists(r.eval_file), r.eval_file.string(),
             ": evaluation data not found (--eval-file)");
  if (is_dataset_file(r.path, r.format)) return open_jsonl_source(r);
  return open_token_file_source(r);
}

std::string data_identity_mismatch(const nlohmann::json& saved, const nlohmann::json& now) {
  if (!saved.is_object()) return "the checkpoint records no training data";
  for (auto& [key, value] : now.items()) {
    if (key == "path") continue;
    if (!saved.contains(key))
      return cat("the checkpoint's data record lacks \"", key, "\"");
    if (saved.at(key) != value)
      return cat("the data's ", key, " is ", value.dump(), " but the checkpoint was trained with ",
                 saved.at(key).dump(), " (", saved.value("path", std::string("?")), ")");
  }
  return {};
}

}  // namespace sf
