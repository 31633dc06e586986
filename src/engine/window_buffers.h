// Every buffer the sliding-window executor allocates, as one list of specs computed from the
// model, the engine settings and the compute dtype alone: the planner sums it (plan_memory.cpp's
// sliding_memory) and the executor allocates exactly it (WindowBuffers), so the two cannot
// drift apart. A test records the executor's allocations and compares them with the list to
// the byte.
//
// Not in the list: the fp32 master and AdamW moments (ParamStore; the planner counts them as
// state), the embedding table mapped from the master (no new memory) and the backend's own
// per-stream workspaces (the planner adds them).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "engine/engine_config.h"
#include "io/model_config.h"

namespace sf {

// host: pinned host memory (Backend::alloc_host). host_shared: pinned host memory that the
// data-parallel ranks of one host share, one copy for all (the GPU path's streamed homes:
// each rank reads the whole home and writes only its slice): it lives in a region the run
// maps (SharedHomeMemory) and the plan counts it once per host.
enum class Tier : uint8_t { device, host, host_shared };

// What a buffer is for; `index` in BufferSpec tells the instances apart (slot, unit, layer,
// chunk, ping-pong side).
enum class BufferRole : uint8_t {
  device_adamw_state,   // [layer]: fp32 master | m | v of a device-AdamW layer
  device_adamw_grad,    // [layer >= 2]: its own f32 gradient accumulator
  home,                 // [unit]: compute-dtype weights / gradient ([0]: tied table staging)
  embedding_grad,       // the sparse f32 embedding gradient's rows
  tied_table_grad_host, // the head's share of a tied table's gradient, on the host
  embedding_grad_stage, // tied: the step's dX, copied home for the host scatter
  embedding_rows_device,// untied: each token's gradient row, for the device scatter
  embedding_rows_host,
  update_ring,          // [2]: pinned pieces of device homes' update trips
  grad_ring,            // [2]: a streamed layer's gradient, landed for its update (from_master)
  master_stage,         // f32 pieces of the master on their way into a slot (from_master, bf16)
  master_mirror,        // [unit]: f32 weights decoded from a bf16 master (f32 compute only)
  grad_cast,            // [2]: a layer's gradient cast to the compute dtype for its trip home
  norms,                // f32 [units]: gradient sums of squares reduced on the device
  next_weights,         // [unit]: speculated weights (EngineConfig::has_next)
  weight_slot,          // [slot]
  head_weights,         // the head's weights when its home is not resident (or f32)
  head_grad,            // its f32 gradient accumulator
  tied_table,           // the tied table's compute-dtype weights for the head
  tied_table_grad,      // and its f32 gradient
  layer_grad,           // [2]: the alternating f32 layer gradient accumulators
  activations,          // [2]: the step's layer input / output [T_step, C] (ping-pong)
  saved_input,          // [2]: a chunk's saved input fetched back for the backward
  activation_grad,      // dX [T_step, C]
  scratch,              // one layer's (or the head's) working set
  loss,
  act_store,            // [layer]: its saved inputs [T_step, C], device or host
  kept_attention,       // [layer]: its att [T_step, Q] | each chunk's lse [Hq, T] f32, device or host
  kept_attention_stage, // [2]: one chunk's att | lse on the device, for a host attention store
  batch_inputs,         // [chunk]: DeviceBatch storage
  count_
};

struct BufferSpec {
  BufferRole role;
  int index = 0;
  Tier tier = Tier::device;
  size_t bytes = 0;   // exactly what is requested from the backend
  std::string what;   // the allocation's name (out-of-memory errors name it)
  std::string line;   // the plan's memory line that counts it
};

std::vector<BufferSpec> window_buffer_specs(const ModelConfig& cfg, const EngineConfig& ec,
                                            DType compute_dtype);

// The byte layout of a kept-attention buffer for `chunks` chunks of up to T tokens: att
// [chunks * T, Q] of the compute dtype (chunk c's rows from its token offset t0 in the step),
// then each chunk's lse [Hq, T_chunk] f32 at lse_offset + c * lse_stride. Both offsets are
// multiples of 256 bytes, as the layer scratch's slots are (vector loads and stores).
struct KeptAttentionLayout {
  size_t lse_offset = 0, lse_stride = 0, bytes = 0;
};
KeptAttentionLayout kept_attention_layout(const ModelConfig& cfg, int64_t T, int chunks, DType compute_dtype);

// What one spec costs on its tier: the CUDA backend rounds device allocations to 256 bytes,
// pinned host ones to 64 (the host backend rounds both to 64: the plan is then an upper bound);
// a shared one takes whole pages of its region (each is registered for DMA on its own).
size_t tier_bytes(const BufferSpec& s);

// The region the Tier::host_shared buffers of a list are placed in, in the list's order, each
// at a page boundary: shared_bytes(specs) bytes, page-aligned, made by the run (one per host).
struct SharedHomeMemory {
  void* base = nullptr;
  size_t bytes = 0;
};
size_t shared_bytes(const std::vector<BufferSpec>& specs);

// The buffers of one list, allocated in its order (the shared ones placed in `shared` and
// pinned there). find() is null for a buffer the configuration does not need; at() insists.
class WindowBuffers {
 public:
  WindowBuffers(Backend& be, const std::vector<BufferSpec>& specs, SharedHomeMemory shared = {});
  Buffer* find(BufferRole r, int index = 0) const;
  Buffer& at(BufferRole r, int index = 0) const;
  bool shared(BufferRole r, int index = 0) const;  // placed in the ranks' region (Tier::host_shared)

 private:
  // [role][index]
  std::vector<std::vector<std::unique_ptr<Buffer>>> bufs_;
  std::vector<std::vector<char>> shared_;  // [role][index]
};

}  // namespace sf
