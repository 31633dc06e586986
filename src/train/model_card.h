// README.md of a saved checkpoint: a short Hugging Face model card saying what the model is
// and how it was made, from the checkpoint's own trainer_state.json (so it can never
// disagree with it): base model, data files, steps, tokens, learning rate and schedule, the
// last training and evaluation loss, and the slideformer commit. The license is the base
// model's: the `license:` of its README.md front matter, when it has one; the card says so
// when it has none rather than guessing.
#pragma once
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "io/model_config.h"

namespace sf {

// The `license:` value of a model card's YAML front matter (`---` ... `---` at the top of
// dir/README.md); nullopt when there is no README.md, no front matter or no license line.
std::optional<std::string> model_card_license(const std::filesystem::path& dir);

// trainer_state: as trainer_state_json writes it. base_model_dir: the run's --model (empty
// for the bundled example).
std::string model_card_markdown(const nlohmann::json& trainer_state, const ModelConfig& c,
                                const std::filesystem::path& base_model_dir);

}  // namespace sf
