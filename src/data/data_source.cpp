#include "data/data_source.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "data/data_file_kind.h"
#include "data/mixed_source.h"
#include "data/sample_source.h"
#include "data/token_file_source.h"

namespace sf {

namespace fs = std::filesystem;

const std::vector<std::string>& data_format_names() {
  static const std::vector<std::string> v = {
      "auto",   "text",   "prompt_completion", "messages", "sharegpt", "chat_prompt_completion",
      "alpaca", "plain_text", "tokens"};
  return v;
}

const std::vector<std::string>& overflow_names() {
  static const std::vector<std::string> v = {"auto", "truncate", "split", "drop"};
  return v;
}

namespace {

// "FILE:WEIGHT" -> {FILE, WEIGHT} when WEIGHT reads whole as a number and FILE itself is not
// the name of an existing file; else {value, 0}.
DataInput parse_one(const std::string& v) {
  const size_t colon = v.rfind(':');
  if (colon == std::string::npos || colon == 0 || fs::exists(v)) return {v, 0};
  const std::string w = v.substr(colon + 1);
  char* end = nullptr;
  const double weight = std::strtod(w.c_str(), &end);
  if (w.empty() || end != w.c_str() + w.size()) return {v, 0};
  SF_REQUIRE(std::isfinite(weight) && weight > 0, "--data ", v, ": the mixing weight ", w,
             " must be a positive number, e.g. --data ", v.substr(0, colon), ":0.25");
  return {v.substr(0, colon), weight};
}

// One file's source, its identity as before (a single file's checkpoint is unchanged).
DataSource open_one(const DataRequest& r) {
  SF_REQUIRE(!r.path.empty(), "no training data: pass --data FILE (JSONL or a token file)");
  SF_REQUIRE(fs::exists(r.path), r.path.string(),
             ": training data not found (--data; several files: --data FILE --data FILE, with "
             "optional weights FILE:WEIGHT)");
  SF_REQUIRE(!fs::is_directory(r.path), r.path.string(), ": is a directory; --data takes a file. ",
             supported_data_files());
  SF_REQUIRE(r.eval_file.empty() || fs::exists(r.eval_file), r.eval_file.string(),
             ": evaluation data not found (--eval-file)");
  if (classify_data_file(r.path, r.format) == DataFileKind::dataset) return open_jsonl_source(r);
  return open_token_file_source(r);
}

}  // namespace

std::vector<DataInput> parse_data_inputs(const std::string& spec) {
  std::vector<DataInput> in;
  std::stringstream ss(spec);
  std::string v;
  while (std::getline(ss, v, '\n'))
    if (!v.empty()) in.push_back(parse_one(v));
  if (in.empty()) return in;
  size_t weighted = 0;
  for (auto& i : in) weighted += i.weight > 0;
  SF_REQUIRE(in.size() > 1 || weighted == 0, "--data ", spec, ": a mixing weight needs two or "
             "more --data files; drop \":", in[0].weight, "\"");
  SF_REQUIRE(weighted == 0 || weighted == in.size(), "--data: give every file a weight "
             "(--data a.jsonl:0.75 --data b.jsonl:0.25) or none (each weighs its share of the "
             "tokens); ", in.size() - weighted, " of ", in.size(), " have none");
  return in;
}

std::string join_data_values(const std::vector<std::string>& values) {
  std::string s;
  for (auto& v : values) s += (s.empty() ? "" : "\n") + v;
  return s;
}

DataSource open_data_source(const DataRequest& r) {
  const std::vector<DataInput> in = parse_data_inputs(r.path.string());
  if (in.size() <= 1) return open_one(r);
  SF_REQUIRE(r.eval_file.empty(), "--eval-file ", r.eval_file.string(), " with several --data "
             "files is not supported: each file holds out its own --eval-fraction; drop "
             "--eval-file");
  std::vector<DataSource> sources;
  std::vector<double> weights;
  for (size_t i = 0; i < in.size(); ++i) {
    DataRequest one = r;
    one.path = in[i].path;
    one.seed = r.seed + 0x9e37 * (i + 1);  // each file its own shuffle
    sources.push_back(open_one(one));
    weights.push_back(in[i].weight > 0 ? in[i].weight : double(sources.back().train_tokens));
  }
  return mix_data_sources(std::move(sources), weights, r.seed);
}

std::string data_identity_mismatch(const nlohmann::json& saved, const nlohmann::json& now) {
  if (!saved.is_object()) return "the checkpoint records no training data";
  for (auto& [key, value] : now.items()) {
    if (key == "path") continue;
    if (!saved.contains(key))
      return cat("the checkpoint's data record lacks \"", key, "\"");
    if (key == "files" && value.is_array() && saved.at(key).is_array()) {
      if (value.size() != saved.at(key).size())
        return cat("the data has ", value.size(), " files but the checkpoint was trained on ",
                   saved.at(key).size());
      for (size_t i = 0; i < value.size(); ++i)
        if (std::string why = data_identity_mismatch(saved.at(key)[i], value[i]); !why.empty())
          return cat("--data file ", i + 1, ": ", why);
      continue;
    }
    if (saved.at(key) != value)
      return cat("the data's ", key, " is ", value.dump(), " but the checkpoint was trained with ",
                 saved.at(key).dump(), " (", saved.value("path", std::string("?")), ")");
  }
  return {};
}

}  // namespace sf
