// Config files (see config_file.h): TOML through CLI11's reader, YAML through yaml-cpp, both
// turned into ConfigEntry lists and applied by one function, so both formats accept the same
// keys and refuse the same mistakes with the same messages.
#include "cli/config_file.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <set>

#include "cli/cli_errors.h"
#include "core/error.h"

namespace sf::cli {

namespace {

bool is_yaml(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  return ext == ".yaml" || ext == ".yml";
}

std::vector<ConfigEntry> read_toml(const std::string& path) {
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_file(path);
  } catch (const CLI::Error& e) {
    SF_FAIL(input, "--config ", path, ": cannot read (", e.what(), ")");
  }
  std::vector<ConfigEntry> entries;
  for (auto& it : items) {
    if (it.name == "++" || it.name == "--") continue;  // section markers
    const bool top = it.parents.empty() || (it.parents.size() == 1 && it.parents[0] == "train");
    SF_REQUIRE(top, path, ": \"", it.fullname(),
               "\" is not a train option; put options at the top level or under [train]");
    entries.push_back({it.name, it.inputs, path});
  }
  return entries;
}

std::string yaml_where(const std::string& path, const YAML::Node& n) {
  return cat(path, ":", n.Mark().line + 1);
}

// The entries of one YAML mapping (the top level, or the `train:` section).
void add_yaml_map(const std::string& path, const YAML::Node& map, bool top,
                  std::vector<ConfigEntry>& entries) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    // Copies: Nodes are handles, and the iterator's pair is a temporary.
    const YAML::Node k = it->first, v = it->second;
    const std::string key = k.as<std::string>();
    const std::string where = yaml_where(path, k);
    if (top && key == "train" && v.IsMap()) {
      add_yaml_map(path, v, false, entries);
      continue;
    }
    SF_REQUIRE(!v.IsMap(), where, ": \"", key, "\" holds a mapping; ",
               top ? "only train: may hold options (put them at the top level or under train:)"
                   : "train options take one value each (key: value)");
    SF_REQUIRE(!v.IsSequence(), where, ": \"", key,
               "\" is a list; it takes one value (key: value)");
    SF_REQUIRE(!v.IsNull(), where, ": \"", key, "\" has no value; write ", key,
               ": VALUE or remove the line");
    entries.push_back({key, {v.as<std::string>()}, where});
  }
}

std::vector<ConfigEntry> read_yaml(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    SF_FAIL(input, "--config ", path, ": cannot read the file");
  } catch (const YAML::Exception& e) {
    SF_FAIL(input, path, ":", e.mark.line + 1, ": not valid YAML (", e.msg, ")");
  }
  std::vector<ConfigEntry> entries;
  if (root.IsNull()) return entries;  // an empty file
  SF_REQUIRE(root.IsMap(), path, ": expected a mapping of options (key: value lines), found ",
             root.IsSequence() ? "a list" : "a single value");
  add_yaml_map(path, root, true, entries);
  return entries;
}

std::vector<std::string> option_keys(const CLI::App* cmd) {
  std::vector<std::string> v;
  for (const CLI::Option* o : cmd->get_options())
    for (const std::string& n : o->get_lnames()) v.push_back(n);
  return v;
}

// The option `e` sets, or Error(input) naming the file and the nearest known key.
CLI::Option* option_for(CLI::App* cmd, const ConfigEntry& e, const std::string& key) {
  SF_REQUIRE(key != "config" && key != "print-config" && key != "help", e.where, ": \"", key,
             "\" cannot be set from a config file");
  SF_REQUIRE(key.rfind("no-", 0) != 0, e.where, ": write \"", key.substr(3),
             " = false\" instead of \"", e.key, "\"");
  CLI::Option* opt = cmd->get_option_no_throw("--" + key);
  if (!opt) {
    const std::string near = closest_name(key, option_keys(cmd));
    SF_FAIL(input, e.where, ": unknown option \"", e.key, "\"",
            near.empty() ? std::string() : cat("; did you mean \"", near, "\"?"),
            " (the keys are the long flags of `slideformer train --help` without the leading "
            "--)");
  }
  return opt;
}

}  // namespace

std::vector<ConfigEntry> read_config_file(const std::string& path) {
  return is_yaml(path) ? read_yaml(path) : read_toml(path);
}

void apply_config_file(CLI::App* cmd, const std::string& path) {
  const std::string sep = is_yaml(path) ? ": " : " = ";
  std::set<std::string> seen;
  for (const ConfigEntry& e : read_config_file(path)) {
    std::string key = e.key;
    for (char& c : key)
      if (c == '_') c = '-';
    CLI::Option* opt = option_for(cmd, e, key);
    SF_REQUIRE(seen.insert(opt->get_lnames().front()).second, e.where, ": \"", e.key,
               "\" is set twice (or under another of its names)");
    if (opt->count() > 0) continue;  // the command line wins
    try {
      opt->add_result(e.values);
      opt->run_callback();
    } catch (const CLI::Error& err) {
      std::string v;
      for (auto& s : e.values) v += (v.empty() ? "" : ", ") + s;
      auto [kind, example] = value_kind_and_example(opt);
      const bool conversion = dynamic_cast<const CLI::ConversionError*>(&err) != nullptr;
      SF_FAIL(input, e.where, ": ", e.key, sep, v, ": ",
              conversion ? cat("not ", kind, "; e.g. ", e.key, sep, example)
                         : std::string(err.what()),
              " (see --", key, " in `slideformer train --help`)");
    }
  }
}

}  // namespace sf::cli
