// Scratch memory a launcher may use for deterministic two-stage reductions (per-block
// partial sums, then one ordered pass). Owned by the stream the op runs on (CudaBackend gives
// each stream its own, allocated once), so ops on different streams never share it.
#pragma once
#include <cstddef>

namespace sf::cuda {

struct Workspace {
  void* reduce = nullptr;  // f32 partials; 256-byte aligned
  size_t reduce_bytes = 0;
};

}  // namespace sf::cuda
