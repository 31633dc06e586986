// Each subcommand registers its flags and a callback that calls into the library.
#pragma once
#include <CLI/CLI.hpp>

namespace sf::cli {

void add_init_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_export_command(CLI::App& app);

}  // namespace sf::cli
