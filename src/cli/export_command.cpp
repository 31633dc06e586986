// `slideformer export`: a trained model directory -> a file another runtime loads.
#include <iomanip>
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"
#include "export/gguf_export.h"

namespace fs = std::filesystem;

namespace sf::cli {

void add_export_command(CLI::App& app) {
  struct Opts {
    std::string model, format, out, type = "f16";
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "export", "write a model directory as one file for llama.cpp / Ollama (GGUF)");
  cmd->add_option("--model", o->model, "Hugging Face model directory (a checkpoint)")->required();
  cmd->add_option("--format", o->format, "output format: gguf")->required();
  cmd->add_option("--out", o->out, "output file, e.g. model.gguf")->required();
  cmd->add_option("--type", o->type,
                  "gguf: matrix type f16 (default), bf16 or q8_0; norms stay f32");
  cmd->callback([o] {
    SF_REQUIRE(o->format == "gguf", "--format \"", o->format,
               "\" is unknown; the one format is gguf (llama.cpp, Ollama, LM Studio)");
    const GgufExportType type = parse_gguf_export_type(o->type, "--type");
    const fs::path out = o->out;
    SF_REQUIRE(!fs::is_directory(out), "--out ", o->out, " is a directory; give a file name, "
               "e.g. ", (out / "model.gguf").string());
    SF_REQUIRE(out.parent_path().empty() || fs::is_directory(out.parent_path()), "--out ",
               o->out, ": the directory ", out.parent_path().string(), " does not exist");
    const GgufExportResult r = export_gguf(o->model, out, type);
    for (auto& n : r.notes) std::cout << "note: " << n << "\n";
    std::cout << "wrote " << o->out << ": " << r.architecture << ", " << r.tensors
              << " tensors (" << o->type << "), tokenizer " << r.tokenizer_model
              << (r.pre_tokenizer.empty() ? "" : " (pre " + r.pre_tokenizer + ")") << ", "
              << std::fixed << std::setprecision(1) << double(r.bytes) / double(1 << 20)
              << " MiB\n";
  });
}

}  // namespace sf::cli
