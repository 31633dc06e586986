// The schedule of one optimizer step as data: the ordered list of operations the
// sliding-window executor performs. Built from the shape of the step (layers, chunks,
// weight slots) alone, so it can be printed, checked and tested without running anything.
//
// Forward visits layer k for EVERY chunk before layer k+1 (many tokens per weight transfer);
// layer k+1's weights are loaded into the next slot while layer k computes. Backward runs the
// layers in reverse; the last n_slots layers of the forward are still resident and are not
// reloaded. Each layer's saved inputs are fetched one chunk ahead into two input buffers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sf {

enum class OpKind : uint8_t {
  load_weights,    // h2d: weights of `unit` -> `slot` (slot -1: the head's own buffer)
  embed_forward,   // host gather of embedding rows -> device layer-0 input of `chunk`
  layer_forward,   // compute: input of `layer` for `chunk` -> output, weights in `slot`
  offload_input,   // copy the input of `layer` for `chunk` to the activation store
  head,            // compute: final norm + LM head + loss + d(head input) for `chunk`
  grads_out,       // copy the gradients of `unit` to the host
  fetch_input,     // activation store -> input buffer `buf` (saved input of `layer`, `chunk`)
  layer_backward,  // compute: recompute + backward of `layer` for `chunk`
  embed_backward,  // d(layer-0 input) of `chunk` -> host, scatter into the embedding gradient
};
std::string_view op_kind_name(OpKind k);

struct Op {
  OpKind kind;
  int unit = -1;  // index into ModelLayout::units (embedding 0, layer k -> k + 1, head L + 1)
  int layer = -1;
  int chunk = -1;
  int slot = -1;
  int buf = -1;
};

struct StepShape {
  int n_layers = 0;
  int n_chunks = 0;
  int n_slots = 2;  // >= 2: one computing, one loading
  bool backward = true;  // false: forward + loss only (evaluation)
};

std::vector<Op> build_step_schedule(const StepShape& shape);
std::string describe(const Op& op);

}  // namespace sf
