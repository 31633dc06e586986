// launch_from_env: the torchrun-style variables parsed, and every bad or partial set refused
// with an Error that names the variable and the fix.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/error.h"
#include "dist/env_launch.h"

namespace sf::dist {
namespace {

using Vars = std::map<std::string, std::string>;

LaunchEnv parse(const Vars& vars) {
  return launch_from_env([&](const char* n) -> const char* {
    auto it = vars.find(n);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

Vars torchrun() {
  return {{"WORLD_SIZE", "4"}, {"RANK", "3"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.0.0.7"},
          {"MASTER_PORT", "29500"}};
}

// The message of the Error parse(vars) throws ("" if none).
std::string refusal(const Vars& vars) {
  try {
    parse(vars);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input);
    return e.what();
  }
  return "";
}

TEST(EnvLaunch, NoVariablesMeansOneProcess) {
  const LaunchEnv e = parse({});
  EXPECT_FALSE(e.from_env);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.local_rank, 0);
}

TEST(EnvLaunch, ReadsAllFive) {
  const LaunchEnv e = parse(torchrun());
  EXPECT_TRUE(e.from_env);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "10.0.0.7");
  EXPECT_EQ(e.master_port, 29500);
  Vars one = torchrun();
  one["WORLD_SIZE"] = std::string(1, '1');
  one["RANK"] = std::string(1, '0');
  one["LOCAL_RANK"] = std::string(1, '0');
  EXPECT_EQ(parse(one).world_size, 1);
}

TEST(EnvLaunch, APartialSetNamesWhatIsMissing) {
  Vars v = torchrun();
  v.erase("LOCAL_RANK");
  v.erase("MASTER_PORT");
  const std::string m = refusal(v);
  EXPECT_NE(m.find("but LOCAL_RANK, MASTER_PORT are not"), std::string::npos) << m;
  EXPECT_NE(m.find("torchrun"), std::string::npos) << m;
  const std::string one = refusal({{"RANK", "0"}});
  EXPECT_NE(one.find("RANK is set but WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not"),
            std::string::npos) << one;
}

TEST(EnvLaunch, RefusesBadValuesNamingTheVariable) {
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"WORLD_SIZE", "0", "WORLD_SIZE='0' is not a number of ranks"},
      {"WORLD_SIZE", "two", "WORLD_SIZE='two' is not a number of ranks"},
      {"WORLD_SIZE", "-2", "WORLD_SIZE='-2'"},
      {"WORLD_SIZE", "4 ", "WORLD_SIZE='4 '"},
      {"WORLD_SIZE", "99999999999", "WORLD_SIZE='99999999999'"},
      {"RANK", "4", "RANK='4' is not a rank of WORLD_SIZE=4"},
      {"RANK", "", "RANK='' is not a rank"},
      {"LOCAL_RANK", "7", "LOCAL_RANK='7' is not a GPU index"},
      {"MASTER_PORT", "0", "MASTER_PORT='0' is not a TCP port"},
      {"MASTER_PORT", "65536", "MASTER_PORT='65536' is not a TCP port"},
      {"MASTER_PORT", "29500x", "MASTER_PORT='29500x'"},
      {"MASTER_ADDR", "", "MASTER_ADDR is empty"},
      {"MASTER_ADDR", "10.0.0.1 10.0.0.2", "MASTER_ADDR='10.0.0.1 10.0.0.2' holds a blank"},
  };
  for (const auto& [name, value, want] : cases) {
    Vars v = torchrun();
    v[name] = value;
    const std::string m = refusal(v);
    EXPECT_NE(m.find(want), std::string::npos) << name << "=" << value << ": " << m;
    const std::string fix = name == "MASTER_ADDR" ? std::string("set it to rank 0's host name") : cat("set ", name, " to");
    EXPECT_NE(m.find(fix), std::string::npos) << "the fix: " << m;
  }
}

TEST(EnvLaunch, ListsTheFiveNames) {
  std::vector<std::string> names;
  for (const char* const* n = launch_env_names(); *n != nullptr; ++n) names.push_back(*n);
  EXPECT_EQ(names, (std::vector<std::string>{"WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}));
}

}  // namespace
}  // namespace sf::dist
