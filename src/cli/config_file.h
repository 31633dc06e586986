// Config files for `slideformer train --config FILE`: TOML/INI (`key = value`, an optional
// [train] section) or YAML (`key: value`, optionally under `train:`), chosen by the file's
// extension (.yaml / .yml: YAML). The keys are the long flags without "--", with - or _
// (so Hugging Face's spellings that the command line accepts, learning_rate or
// num_train_epochs, work too). Flags given on the command line win over the file.
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace sf::cli {

// One `key = value` of a config file.
struct ConfigEntry {
  std::string key;                  // as written
  std::vector<std::string> values;  // one, or several for a list in TOML
  std::string where;                // "run.yaml:3" (YAML) or "run.toml" for messages
};

// The entries of `path`; Error(input) naming the file (and line) when it cannot be read, is
// not a mapping of options, nests sections other than [train] / train:, or gives a list or
// mapping where an option takes one value.
std::vector<ConfigEntry> read_config_file(const std::string& path);

// Applies `path` to the options of `cmd` that the command line did not set. Error(input)
// naming the file, the key and the fix for an unknown key (with the nearest known one), a
// key given twice, or a value of the wrong type.
void apply_config_file(CLI::App* cmd, const std::string& path);

}  // namespace sf::cli
