// Shared by the compact-state tests (optim, train): every state format, a name for each, and a
// model whose int8 moments have ranges of both kinds.
#pragma once
#include <string>

#include "io/model_config.h"
#include "model/model_init.h"
#include "optim/state_format.h"

namespace sf::test {

// Every moments x master combination, fp32/fp32 first.
inline constexpr StateFormat kAllStateFormats[] = {
    {MomentFormat::f32, MasterFormat::f32},   {MomentFormat::bf16, MasterFormat::f32},
    {MomentFormat::int8, MasterFormat::f32},  {MomentFormat::f32, MasterFormat::bf16},
    {MomentFormat::bf16, MasterFormat::bf16}, {MomentFormat::int8, MasterFormat::bf16}};

// "int8_bf16" (moments_master): fit for a test parameter's name.
inline std::string state_format_label(StateFormat f) {
  return std::string(moment_format_name(f.moments)) + "_" + master_format_name(f.master);
}

// tiny_config widened so that int8 moments have both kinds of range: matrices of at least
// kInt8MinNumel elements (int8 codes, several blocks) and norms below it (fp32).
inline ModelConfig compact_config() {
  ModelConfig c = tiny_config(Arch::qwen3);
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.vocab_size = 80;
  c.head_dim = 16;
  return c;
}

}  // namespace sf::test
