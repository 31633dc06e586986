// slideformer command line: parses flags and calls the library. No training logic here.
#include <CLI/CLI.hpp>
#include <csignal>
#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "cli/commands.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  CLI::App app{"slideformer: full-parameter fine-tuning of LLMs larger than the GPU"};
  app.require_subcommand(1);
  app.set_config("--config", "", "read options from a TOML/INI file (flags override it)");
  sf::cli::add_init_command(app);
  sf::cli::add_train_command(app);
  sf::cli::add_info_command(app);
  sf::cli::add_plan_command(app);
  sf::cli::add_eval_command(app);
  sf::cli::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const sf::Error& e) {
    std::cerr << "slideformer: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "slideformer: error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
