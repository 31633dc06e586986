// test_cuda compares GPU results bit for bit (two executors, kept vs recomputed activations, a
// kernel against its own second run): attention backwards must repeat exactly, so the whole
// binary runs with deterministic attention (cudnn_attention.h). The tests of cuDNN's fast
// non-deterministic backward turn it off for themselves and restore it.
#include <gtest/gtest.h>

#include "backend/cuda/cudnn_attention.h"

namespace {

struct DeterministicAttention : ::testing::Environment {
  void SetUp() override { sf::cuda::set_attention_deterministic(true); }
};

[[maybe_unused]] ::testing::Environment* const kDeterministic =
    ::testing::AddGlobalTestEnvironment(new DeterministicAttention);

}  // namespace
