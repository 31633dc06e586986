// AdamWStep: the hyper-parameters of one AdamW step, as every AdamW implementation takes them
// (optim/adamw.h on the host CPU, Backend::adamw on a device). A plain value type with no
// dependencies, so that backend/backend.h can include it without optim depending on backend.
#pragma once
#include <cstdint>

namespace sf {

struct AdamWStep {
  float lr = 0.f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.f;
  int64_t step = 1;        // 1-based, for bias correction
  float grad_scale = 1.f;  // multiplies the gradient first (clipping, averaging)
};

}  // namespace sf
