// Sampler: the next token from one position's logits, as Hugging Face transformers' generate()
// chooses it, with its logits processors in its order: repetition penalty, then (sampling
// only) temperature, top-k, top-p, then a draw from the softmax.
//   repetition penalty r: each distinct token of the context has its logit divided by r where
//                         positive, multiplied by r where negative (r = 1: off);
//   greedy (temperature 0): the first index of the largest logit (torch.argmax);
//   top-k k: tokens whose logit is below the k-th largest are dropped (ties with it stay);
//   top-p p: tokens sorted by probability, the least likely dropped while the probability
//            mass they carry together is <= 1 - p; the most likely always stays.
// The draw uses a 64-bit Mersenne twister seeded with `seed` and a fixed mapping to [0, 1),
// so one seed gives one sequence of tokens on every machine and standard library.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace sf {

struct SamplingOptions {
  double temperature = 0;         // 0: greedy; > 0: sample from softmax(logits / temperature)
  int top_k = 0;                  // 0: off
  double top_p = 1;               // 1: off; in (0, 1]
  double repetition_penalty = 1;  // 1: off; > 0
  uint64_t seed = 0;
};

class Sampler {
 public:
  // Throws Error(input) for values outside the ranges above (the caller names the flags).
  explicit Sampler(const SamplingOptions& opt);
  const SamplingOptions& options() const { return opt_; }
  bool greedy() const { return opt_.temperature == 0; }

  // The next token given `logits` [vocab] and the tokens so far (for the repetition penalty).
  int32_t next(std::span<const float> logits, std::span<const int32_t> context);

 private:
  // The indices of the tokens top-k and top-p keep, most likely first.
  std::vector<int32_t> kept_tokens(const std::vector<float>& scores) const;
  double uniform();  // [0, 1)

  SamplingOptions opt_;
  std::mt19937_64 rng_;
  std::vector<float> scores_;
};

}  // namespace sf
