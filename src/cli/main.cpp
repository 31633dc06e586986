// slideformer command line: parses flags and calls the library. No logic lives here.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"slideformer: full-parameter fine-tuning of LLMs larger than the GPU"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
