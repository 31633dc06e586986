// generation_config.json for a saved model: the ids transformers' generate() (and vLLM, TGI,
// llama.cpp's converter) read to know where text starts and when to stop. A model trained on
// chat data must stop at its template's end-of-turn token (Qwen's <|im_end|>, Llama 3's
// <|eot_id|>), which is often not the tokenizer's eos_token: it goes among the eos ids.
//
// Fields written (others of a source generation_config.json, e.g. sampling defaults, kept):
//   bos_token_id  the tokenizer's bos token, else config.json's
//   eos_token_id  the tokenizer's eos, config.json's eos ids, the source file's, then the
//                 end-of-turn token; one id as a number, several as a list (as HF writes them)
//   pad_token_id  the tokenizer's pad token (absent when it has none)
//   max_length    max_position_embeddings (HF's default, 20, would cut every answer short)
#pragma once
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "io/model_config.h"

namespace sf {

// The token a chat template ends an assistant turn with, for the templates text/chat_template
// recognises (ChatML <|im_end|>, Llama 3 <|eot_id|>, Mistral: eos_token); nullopt for an
// empty or unrecognised template.
std::optional<std::string> end_of_turn_token(const std::string& chat_template,
                                             const std::string& eos_token);

// tokenizer_dir: where tokenizer.json / tokenizer_config.json (and a source
// generation_config.json) are; empty, or without tokenizer.json: config.json's ids only.
nlohmann::json generation_config_json(const ModelConfig& c,
                                      const std::filesystem::path& tokenizer_dir);

}  // namespace sf
