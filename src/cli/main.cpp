// slideformer command line: parses flags and calls the library. No training logic here.
#include <CLI/CLI.hpp>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "cli/cli_errors.h"
#include "cli/commands.h"
#include "cli/test_hooks.h"

namespace fs = std::filesystem;

namespace {

// A mapped file that cannot be read or written (the disk under --optimizer-dir failed or
// filled up, or a model file was truncated while mapped) raises SIGBUS: say what it means,
// then die of it as before (exit status and core dump unchanged).
extern "C" void on_sigbus(int) {
  static const char msg[] =
      "\nslideformer: a memory-mapped file could not be read or written (SIGBUS): the disk "
      "under --optimizer-dir failed or is full, or a model file was changed while in use. "
      "Resume from the last checkpoint (--resume auto) once the disk is sound.\n";
  ssize_t r = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)r;
  std::signal(SIGBUS, SIG_DFL);
  std::raise(SIGBUS);
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGBUS, on_sigbus);
  sf::cli::install_test_hooks();
  CLI::App app{"slideformer: full-parameter fine-tuning of LLMs larger than the GPU"};
  app.require_subcommand(1);
  app.set_config("--config", "", "read options from a TOML/INI file (flags override it)");
  sf::cli::add_init_command(app);
  sf::cli::add_train_command(app);
  sf::cli::add_info_command(app);
  sf::cli::add_plan_command(app);
  sf::cli::add_eval_command(app);
  sf::cli::add_bench_command(app);
  sf::cli::add_generate_command(app);
  sf::cli::add_chat_command(app);
  sf::cli::add_export_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return sf::cli::report_parse_error(app, e, std::vector<std::string>(argv + 1, argv + argc),
                                       std::cerr);
  } catch (const sf::Error& e) {
    std::cerr << "slideformer: error: " << e.what() << "\n";
    return sf::cli::kUserErrorExit;
  } catch (const std::exception& e) {
    std::cerr << "slideformer: error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
