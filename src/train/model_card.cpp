#include "train/model_card.h"

#include <iomanip>
#include <sstream>

#include "core/error.h"  // cat
#include "core/version.h"
#include "io/atomic_file.h"

namespace sf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// s without surrounding blanks and YAML quotes.
std::string trim(std::string_view s) {
  constexpr std::string_view ws = " \t\r\"'";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

// The last value of `key` in the metrics history, with its step.
std::optional<std::pair<int64_t, double>> last_metric(const json& metrics, const char* key) {
  if (!metrics.is_array()) return std::nullopt;
  for (auto it = metrics.rbegin(); it != metrics.rend(); ++it)
    if (it->is_object() && it->contains(key) && it->at(key).is_number())
      return std::make_pair(it->value("step", int64_t(0)), it->at(key).get<double>());
  return std::nullopt;
}

// The data files of the run's settings: "tokens" is one path, or a list of them.
std::string data_files(const json& settings) {
  std::vector<std::string> files;
  const json t = settings.value("tokens", json());
  if (t.is_string() && !t.get<std::string>().empty()) files.push_back(t.get<std::string>());
  if (t.is_array())
    for (auto& f : t)
      if (f.is_string()) files.push_back(f.get<std::string>());
  std::string s;
  for (auto& f : files) s += (s.empty() ? "`" : ", `") + f + "`";
  const std::string eval = settings.value("eval-file", std::string());
  if (!eval.empty()) s += "; evaluation: `" + eval + "`";
  return s.empty() ? "the bundled example's token file" : s;
}

std::string schedule_text(const json& sch) {
  std::ostringstream o;
  o << std::setprecision(6) << sch.value("lr", 0.0) << ", " << sch.value("kind", std::string("?"))
    << " schedule, " << sch.value("warmup_steps", int64_t(0)) << " warmup steps";
  return o.str();
}

std::string loss_text(const json& metrics, const char* key) {
  auto m = last_metric(metrics, key);
  if (!m) return "not measured";
  std::ostringstream o;
  o << std::fixed << std::setprecision(4) << m->second << " (step " << m->first << ")";
  return o.str();
}

}  // namespace

std::optional<std::string> model_card_license(const fs::path& dir) {
  const fs::path p = dir / "README.md";
  std::error_code ec;
  if (dir.empty() || !fs::exists(p, ec)) return std::nullopt;
  std::istringstream in(read_file(p));
  std::string line;
  if (!std::getline(in, line) || trim(line) != "---") return std::nullopt;
  while (std::getline(in, line)) {
    if (trim(line) == "---") break;
    if (line.rfind("license:", 0) == 0) {
      std::string v = trim(std::string_view(line).substr(8));
      if (!v.empty()) return v;
    }
  }
  return std::nullopt;
}

std::string model_card_markdown(const json& state, const ModelConfig& c,
                                const fs::path& base_model_dir) {
  const json settings = state.value("settings", json::object());
  const json metrics = state.value("metrics", json::array());
  const auto license = model_card_license(base_model_dir);
  const std::string base = base_model_dir.empty()
                               ? std::string("the bundled example (random initialisation)")
                               : cat("`", base_model_dir.string(), "`");
  std::ostringstream o;
  o << "---\n";
  if (license) o << "license: " << *license << "\n";
  o << "library_name: transformers\ntags:\n- slideformer\n- full-fine-tuning\n---\n\n"
    << "# " << arch_name(c.arch) << " model fine-tuned with slideformer\n\n"
    << "Every parameter of " << base << " was trained (full fine-tuning, AdamW).\n\n"
    << "| | |\n|---|---|\n"
    << "| base model | " << base << " |\n"
    << "| data | " << data_files(settings) << " |\n"
    << "| steps | " << state.value("step", int64_t(0)) << " of "
    << settings.value("steps", int64_t(0)) << " |\n"
    << "| tokens seen | " << state.value("tokens_seen", int64_t(0)) << " |\n"
    << "| learning rate | " << schedule_text(state.value("schedule", json::object())) << " |\n"
    << "| final train loss | " << loss_text(metrics, "loss") << " |\n"
    << "| final eval loss | " << loss_text(metrics, "eval_loss") << " |\n"
    << "| parameters | " << c.num_parameters() << " |\n"
    << "| slideformer | commit " << build_commit() << " |\n"
    << "| license | "
    << (license ? *license + " (the base model's)"
                : std::string("not stated: the base model's README.md gives none"))
    << " |\n\n"
    << "Load it with transformers (`AutoModelForCausalLM.from_pretrained(dir)`); "
    << "`slideformer export --model DIR --format gguf --out model.gguf` writes a file for "
    << "llama.cpp and Ollama.\n";
  return o.str();
}

}  // namespace sf
