// trainer_state.json written and read (see trainer_state.h). The field names and types are
// the checkpoint format: a change here needs kTrainerStateVersion raised.
#include "train/trainer_state.h"

#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "train/checkpoint.h"
#include "train/run_settings.h"

namespace sf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "slideformer-trainer-state";

std::string hex64(uint64_t v) {
  std::ostringstream os;
  os << std::hex << std::setw(16) << std::setfill('0') << v;
  return os.str();
}

uint64_t parse_hex64(const std::string& s) { return std::stoull(s, nullptr, 16); }

}  // namespace

uint64_t state_rounding_seed(uint64_t run_seed) {
  TrainerRng r{run_seed ^ 0x726f756e64696e67ull};  // "rounding": another stream than the data's
  return r.next();
}

json model_json(const ModelConfig& c, const ModelLayout& layout) {
  json units = json::array();
  for (auto& u : layout.units) units.push_back(u.numel);
  return {{"model_type", std::string(arch_name(c.arch))},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"head_dim", c.head_dim},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"qkv_bias", c.qkv_bias},
          {"qk_norm", c.qk_norm},
          {"rope_theta", c.rope_theta},
          {"rms_norm_eps", c.rms_norm_eps},
          {"num_parameters", c.num_parameters()},
          {"unit_numel", units}};
}

std::string model_mismatch(const json& saved, const json& now) {
  for (auto& [k, v] : now.items()) {
    if (!saved.contains(k)) return cat("the checkpoint does not record the model's ", k);
    if (saved.at(k) != v)
      return cat("the model's ", k, " is ", v.dump(), " but the checkpoint's is ",
                 saved.at(k).dump());
  }
  return {};
}

json trainer_state_json(const RunPosition& at, const TrainOptions& opt, const json& data_identity,
                        const json& data_state, const json& model,
                        const json& schedule_changes, const std::vector<json>& metrics) {
  json state;
  state["format"] = kFormat;
  state["version"] = kTrainerStateVersion;
  state["step"] = at.step;
  state["optimizer_step"] = at.optimizer_step;
  state["tokens_seen"] = at.tokens_seen;
  state["elapsed_seconds"] = at.elapsed_seconds;
  state["rng"] = {{"kind", "splitmix64"}, {"seed", opt.seed}, {"state", hex64(at.rng_state)}};
  state["state_format"] = {{"optimizer_state", moment_format_name(at.state_format.moments)},
                           {"master_weights", master_format_name(at.state_format.master)},
                           {"rounding_seed", hex64(at.rounding_seed)}};
  state["data"] = {{"identity", data_identity}, {"state", data_state}};
  state["schedule"] = {{"kind", LrSchedule::kind_name(opt.schedule.kind)},
                       {"lr", opt.schedule.lr},
                       {"warmup_steps", opt.schedule.warmup_steps},
                       {"warmup_ratio", opt.warmup_ratio},
                       {"total_steps", opt.schedule.total_steps},
                       {"min_lr_ratio", opt.schedule.min_lr_ratio}};
  state["settings"] = settings_json(opt);
  state["schedule_changes"] = schedule_changes;
  state["model"] = model;
  state["metrics"] = metrics;
  return state;
}

ResumePoint ResumePoint::read(const fs::path& dir) {
  ResumePoint r;
  r.dir_ = dir;
  r.state_ = read_trainer_state(dir);
  SF_REQUIRE(r.state_.value("format", std::string()) == kFormat &&
                 r.state_.value("version", 0) == kTrainerStateVersion,
             (dir / "trainer_state.json").string(),
             ": not a slideformer trainer state of version ", kTrainerStateVersion);
  return r;
}

int64_t ResumePoint::step() const { return state_.at("step").get<int64_t>(); }
int64_t ResumePoint::optimizer_step() const { return state_.at("optimizer_step").get<int64_t>(); }
uint64_t ResumePoint::rng_state() const {
  return parse_hex64(state_.at("rng").at("state").get<std::string>());
}
double ResumePoint::elapsed_seconds() const { return state_.value("elapsed_seconds", 0.0); }
int64_t ResumePoint::tokens_seen() const { return state_.value("tokens_seen", int64_t(0)); }
uint64_t ResumePoint::rounding_seed() const {
  if (state_.contains("state_format") && state_.at("state_format").contains("rounding_seed"))
    return parse_hex64(state_.at("state_format").at("rounding_seed").get<std::string>());
  return state_rounding_seed(state_.at("rng").at("seed").get<uint64_t>());
}
std::vector<json> ResumePoint::metrics() const {
  std::vector<json> history;
  for (auto& m : state_.value("metrics", json::array())) history.push_back(m);
  return history;
}

json ResumePoint::schedule_changes() const {
  json c = state_.value("schedule_changes", json::array());
  SF_REQUIRE(c.is_array(), (dir_ / "trainer_state.json").string(),
             ": \"schedule_changes\" is not an array; the checkpoint is damaged");
  return c;
}

fs::path resolve_resume(const std::string& arg, const fs::path& out, std::string* note) {
  if (arg == "auto") {
    auto c = find_latest_checkpoint(out, note);
    return c ? c->dir : fs::path();
  }
  fs::path p(arg);
  SF_REQUIRE(fs::exists(p), "--resume ", arg, ": no such directory; pass a checkpoint-<step> "
             "directory, an output directory, or auto");
  if (fs::exists(p / "trainer_state.json")) return p;
  auto c = find_latest_checkpoint(p, note);
  SF_REQUIRE(c, "--resume ", arg, ": neither a checkpoint (no trainer_state.json) nor an output "
             "directory holding one; pass a checkpoint-<step> directory or auto");
  return c->dir;
}


}  // namespace sf
