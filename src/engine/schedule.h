// The schedule of one optimizer step as data: the ordered list of operations the
// sliding-window executor performs. Built from the shape of the step (layers, chunks,
// weight slots, which units' weights are already on the device, which layers update on the
// device) alone, so it can be printed, checked and tested without running anything.
//
// Forward visits layer k for EVERY chunk before layer k+1 (many tokens per weight transfer);
// layer k+1's weights are loaded into the next slot while layer k computes, after the host
// waited for that unit's update of the previous step (wait_update). Backward runs the layers
// in reverse; the last n_slots layers of the forward are still in their slots and are not
// reloaded. Each layer's saved inputs are fetched one chunk ahead into two input buffers.
// Layers whose input the forward did not save (EngineConfig::checkpoint_every) get it back
// from a replay: the forward of the saved layer below them (and of the next one up) run again
// in the backward, into the activation buffers. A training step ends with the units' updates,
// in the order the update thread runs them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sf {

enum class OpKind : uint8_t {
  wait_update,     // host: unit's update of the previous step is done (its weights are current)
  load_weights,    // h2d: weights of `unit` -> `slot` (the head: its own buffer)
  home_weights,    // weights of `unit` are on the device already (resident home or device
                   // master): order after their trip home; `slot` is only the ready signal
  embed_forward,   // embedding rows (read from the host table) -> layer-0 input of `chunk`
  layer_forward,   // compute: input of `layer` for `chunk` -> output, weights in `slot`
                   // (a kept-attention layer's att + lse into its store, or out via d2h)
  offload_input,   // copy the input of `layer` for `chunk` to the activation store
  head,            // compute: final norm + LM head + loss + d(head input) for `chunk`
  grads_out,       // the gradient of `unit` leaves its accumulator for its home
  fetch_input,     // activation store -> input buffer `buf` (saved input of `layer`, `chunk`;
                   // a host-kept layer's att + lse with it, into stage `buf`)
  layer_backward,  // compute: recompute (but a kept layer's attention) + backward of `layer`
                   // for `chunk`, its input in buffer `buf` (saved) or activation buffer `act`
  replay_forward,  // compute: the forward of `layer` for `chunk` again, from buffer `buf` (its
                   // saved input) or activation buffer `act` - 1, into activation buffer `act`:
                   // the input of the unsaved layer above
  embed_backward,  // d(layer-0 input) of `chunk` -> the embedding's sparse gradient
  update,          // AdamW of `unit` (on the update thread; `device`: on the device)
};
std::string_view op_kind_name(OpKind k);

struct Op {
  OpKind kind;
  int unit = -1;  // index into ModelLayout::units (embedding 0, layer k -> k + 1, head L + 1)
  int layer = -1;
  int chunk = -1;
  int slot = -1;
  int buf = -1;
  int act = -1;  // layer_backward / replay_forward: an activation buffer (see OpKind)
  bool device = false;  // update: the unit's AdamW runs on the device
};

// A training step, or an evaluation: forward and loss only.
enum class Pass : uint8_t { train, evaluate };

struct StepShape {
  int n_layers = 0;
  int n_chunks = 0;
  int n_slots = 2;  // >= 2: one computing, one loading
  Pass pass = Pass::train;
  bool backward() const { return pass == Pass::train; }
  // Per unit (empty: none): its weights are on the device already (home_weights instead of
  // load_weights), and its AdamW runs on the device (updated first: only an enqueue).
  std::vector<char> weights_on_device;
  std::vector<char> device_adamw;
  // Each unit is updated as its gradient lands (EngineConfig::HostWeights::master): the
  // update order is the backward's (head, last layer ... first, embedding).
  bool updates_as_gradients_land = false;
  // Per layer (empty: every one): the forward saves its input; the others' are replayed. Layer
  // 0's is always saved, and at most two layers in a row are not.
  std::vector<char> saved_input;
  bool saves_input(int layer) const { return saved_input.empty() || saved_input[size_t(layer)]; }
};

std::vector<Op> build_step_schedule(const StepShape& shape);
std::string describe(const Op& op);
// Every op's producers come before it and nothing overwrites what a later op still reads:
// weights in the slot a compute op uses, inputs offloaded before they are fetched and fetched
// into the buffer the backward reads, gradients complete before they leave, each unit's
// update waited for before its first load and updated once after its gradient. Empty when
// the list is sound, else what is wrong with which op.
std::string check_schedule(const StepShape& shape, const std::vector<Op>& ops);

}  // namespace sf
