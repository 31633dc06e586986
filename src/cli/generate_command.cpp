// slideformer generate | chat: try a model. generate continues one prompt; chat holds a
// conversation read from stdin, one user turn per line, through the model's chat template.
// Text streams to stdout as it is decoded; the setup and the speed go to stderr.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "data/sample_set.h"
#include "generate/chat_session.h"
#include "generate/model_runtime.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;

namespace sf::cli {

namespace {

// The flags generate and chat share.
struct InferenceFlags {
  std::string model, backend = "auto", weights = "auto";
  int64_t max_new_tokens = 256, max_context = 0;
  SamplingOptions sampling;
  CLI::Option *top_k_opt = nullptr, *top_p_opt = nullptr, *seed_opt = nullptr;

  void add_to(CLI::App* cmd, const std::string& max_context_help) {
    cmd->add_option("--model", model, "Hugging Face model directory (config.json, "
                    "safetensors, tokenizer.json)")->required();
    cmd->add_option("--max-new-tokens,--max-tokens", max_new_tokens,
                    "most tokens to generate (per reply)");
    cmd->add_option("--temperature", sampling.temperature, "0: greedy; > 0: sample");
    top_k_opt = cmd->add_option("--top-k", sampling.top_k, "sample among the k most likely (0: off)");
    top_p_opt = cmd->add_option("--top-p", sampling.top_p, "sample within probability mass p (1: off)");
    cmd->add_option("--repetition-penalty", sampling.repetition_penalty,
                    "divide the logits of tokens already seen by this (1: off)");
    seed_opt = cmd->add_option("--seed", sampling.seed, "random seed of the sampler");
    cmd->add_option("--backend", backend, "auto, host or cuda");
    cmd->add_option("--weights", weights, "auto, resident or streamed (layers copied to the "
                    "GPU as they run, for a model larger than its memory)");
    cmd->add_option("--max-context", max_context, max_context_help);
  }

  // Every value checked before the model is read, naming the flag.
  void check() const {
    SF_REQUIRE(max_new_tokens > 0, "--max-new-tokens ", max_new_tokens,
               " must be at least 1, e.g. --max-new-tokens 128");
    SF_REQUIRE(max_context >= 0, "--max-context ", max_context,
               " must be positive (0: the default)");
    SF_REQUIRE(std::isfinite(sampling.temperature) && sampling.temperature >= 0, "--temperature ",
               sampling.temperature, " must be 0 (greedy) or positive, e.g. --temperature 0.7");
    SF_REQUIRE(sampling.top_k >= 0, "--top-k ", sampling.top_k, " must be 0 (off) or positive");
    SF_REQUIRE(sampling.top_p > 0 && sampling.top_p <= 1, "--top-p ", sampling.top_p,
               " must be in (0, 1], e.g. --top-p 0.9 (1: off)");
    SF_REQUIRE(std::isfinite(sampling.repetition_penalty) && sampling.repetition_penalty > 0,
               "--repetition-penalty ", sampling.repetition_penalty,
               " must be positive, e.g. --repetition-penalty 1.1 (1: off)");
    // Sampling settings do nothing when decoding greedily: refuse rather than ignore them.
    if (sampling.temperature == 0)
      for (const CLI::Option* opt : {top_k_opt, top_p_opt, seed_opt})
        SF_REQUIRE(opt->count() == 0, "--", opt->get_lnames().front(), " applies only when "
                   "sampling, and --temperature is 0 (greedy): add --temperature (e.g. 0.7), "
                   "or drop --", opt->get_lnames().front());
  }
};

void check_model_dir(const fs::path& dir) {
  SF_REQUIRE(fs::exists(dir / "config.json"), "--model ", dir.string(), ": no config.json there; "
             "point --model at a Hugging Face model directory");
  SF_REQUIRE(fs::exists(dir / "tokenizer.json"), "--model ", dir.string(), ": no tokenizer.json "
             "there; generation needs the model's tokenizer (copy tokenizer.json and "
             "tokenizer_config.json into the directory)");
}

struct Runtime {
  ModelConfig cfg;
  BackendChoice backend;
  std::unique_ptr<Decoder> decoder;
};

Runtime start(const InferenceFlags& f, int64_t max_context) {
  const fs::path dir(f.model);
  Runtime r;
  r.cfg = load_config(dir / "config.json");
  DecoderOptions opt;
  opt.max_context = max_context;
  check_sequence_length(r.cfg, opt.max_context, (dir / "config.json").string(), "--max-context");
  r.backend = make_inference_backend(f.backend);
  const PlacementChoice p = choose_placement(*r.backend.backend, r.cfg, opt, f.weights);
  opt.placement = p.placement;
  std::cerr << "backend " << r.backend.backend->name() << " (" << r.backend.reason
            << "), weights " << p.reason << ", context " << opt.max_context << " tokens\n";
  r.decoder = load_decoder(*r.backend.backend, dir, r.cfg, opt);
  return r;
}

// The context the cache holds: --max-context, else `wanted`, within the model's positions.
int64_t context_for(const InferenceFlags& f, const ModelConfig& cfg, int64_t wanted) {
  if (f.max_context > 0) {
    SF_REQUIRE(cfg.max_position_embeddings <= 0 || f.max_context <= cfg.max_position_embeddings,
               "--max-context ", f.max_context, " is more than the model's ",
               cfg.max_position_embeddings, " positions (max_position_embeddings)");
    return f.max_context;
  }
  return cfg.max_position_embeddings > 0 ? std::min(wanted, cfg.max_position_embeddings) : wanted;
}

std::string stats_line(const GenerationResult& r) {
  const int64_t n = int64_t(r.new_tokens.size());
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << "prompt " << r.prompt_tokens << " tokens ("
    << double(r.prompt_tokens) / std::max(r.prefill_seconds, 1e-9) << " tokens/s), " << n
    << " new tokens (" << stop_reason_name(r.reason) << ") in " << std::setprecision(2)
    << r.decode_seconds << " s, " << std::setprecision(1)
    << (n > 1 ? double(n - 1) / std::max(r.decode_seconds, 1e-9) : 0.0) << " tokens/s";
  return o.str();
}

void print_piece(const std::string& piece) {
  std::cout << piece << std::flush;
}

}  // namespace

void add_generate_command(CLI::App& app) {
  struct Opts : InferenceFlags {
    std::string prompt;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("generate", "continue a prompt with a model, streaming the text");
  cmd->add_option("--prompt", o->prompt, "the text to continue (as is: no chat template)")
      ->required();
  o->add_to(cmd, "tokens the KV cache holds (default: prompt + --max-new-tokens, within the "
            "model's positions)");
  cmd->callback([o] {
    o->check();
    const fs::path dir(o->model);
    check_model_dir(dir);
    const Tokenizer tok = Tokenizer::load(dir);
    std::vector<int32_t> context = tok.encode(o->prompt);
    if (tok.add_bos() && tok.bos_id()) context.insert(context.begin(), *tok.bos_id());
    SF_REQUIRE(!context.empty(), "--prompt is empty: give the text to continue");
    const ModelConfig cfg = load_config(dir / "config.json");
    const int64_t ctx = context_for(*o, cfg, int64_t(context.size()) + o->max_new_tokens);
    SF_REQUIRE(int64_t(context.size()) < ctx, "the prompt has ", context.size(), " tokens; the "
               "context of ", ctx, " leaves no room to generate: shorten it or raise --max-context");
    Runtime rt = start(*o, ctx);
    Sampler sampler(o->sampling);
    GenerateLimits limits{o->max_new_tokens, stop_token_ids(dir, rt.cfg, tok)};
    TextStream text(tok);
    const GenerationResult r = generate(*rt.decoder, sampler, context, limits,
                                        [&](int32_t t) { print_piece(text.push(t)); });
    std::cout << "\n" << std::flush;
    std::cerr << stats_line(r) << "\n";
  });
}

void add_chat_command(CLI::App& app) {
  struct Opts : InferenceFlags {
    std::string system, chat_format = "auto";
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("chat", "talk with a model: one user turn per line of stdin");
  cmd->add_option("--system", o->system, "system prompt (default: the template's, if any)");
  cmd->add_option("--chat-format", o->chat_format, "auto (the tokenizer's chat_template) or one "
                  "of: " + [] {
                    std::string s;
                    for (auto& n : chat_format_names()) s += (s.empty() ? "" : ", ") + n;
                    return s;
                  }());
  o->add_to(cmd, "tokens the conversation may grow to (default: 4096, within the model's "
            "positions)");
  cmd->callback([o] {
    o->check();
    const fs::path dir(o->model);
    check_model_dir(dir);
    const Tokenizer tok = Tokenizer::load(dir);
    const ChatFormat fmt = resolve_chat_format(tok, o->chat_format,
                                               (dir / "tokenizer_config.json").string());
    const ModelConfig cfg = load_config(dir / "config.json");
    Runtime rt = start(*o, context_for(*o, cfg, 4096));
    Sampler sampler(o->sampling);
    ChatSession chat(*rt.decoder, sampler, tok, fmt,
                     GenerateLimits{o->max_new_tokens, stop_token_ids(dir, rt.cfg, tok, &fmt)},
                     o->system);
    const bool interactive = isatty(STDIN_FILENO);
    std::string line;
    for (;;) {
      if (interactive) std::cerr << "> " << std::flush;
      if (!std::getline(std::cin, line)) break;
      if (line.empty()) continue;
      const GenerationResult r = chat.reply(line, print_piece);
      std::cout << "\n" << std::flush;
      std::cerr << stats_line(r) << "; " << chat.reused_tokens() << " tokens from the cache\n";
    }
  });
}

}  // namespace sf::cli
