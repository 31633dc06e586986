// EngineConfig: how the sliding-window executor (engine/sliding_executor.h) lays out one
// step: weight slots, chunking, which homes and activations stay on the device, the update
// mode and where the AdamW moments live. The planner (engine/planner.h) fills it in; the
// executor allocates exactly what it says. A plain value type: no engine code behind it, so
// the planner and its users need not see the executor.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

#include "optim/state_format.h"

namespace sf {

// Elements per ring buffer of a device home's update trip (2 buffers, pinned host): small
// enough to cost little memory, large enough that each copy runs at full PCIe speed.
constexpr int64_t kRingPiece = int64_t(32) << 20;

// Tokens per MLP tile of the layer scratch (LayerActs, model/recipes.h): the MLP's gate_up
// [tile, 2F] and SwiGLU output [tile, F] instead of [chunk, 3F] (10.5 GiB at 8B and 128K
// tokens), so long chunks fit. 16K because a GEMM of M >= 16K rows runs at full rate on an
// H200 (docs/BENCHMARKS.md: 16384 x 6144 x 4096 at ~800 TFLOP/s; the planner's
// gemm_efficiency gives 16K / (16K + 512) = 97%); chunks up to 16K are one tile, as before.
// A multiple of 128 also keeps the host backend's results those of an untiled MLP, but for
// the MLP's weight gradients' summation order (tests/model/test_mlp_tiles.cpp). The sliding
// window uses EngineConfig::mlp_tile_tokens (this by default); the resident executors and
// their memory lines use this.
constexpr int64_t kMlpTileTokens = 16384;

struct EngineConfig {
  int n_slots = 2;                 // weight slots on the device (>= 2)
  int64_t max_chunk_tokens = 0;    // tokens per chunk (layer scratch is sized for this)
  int max_chunks = 1;              // chunks per step
  int64_t head_chunk_rows = 256;   // tokens per LM-head logits chunk
  int64_t mlp_tile_tokens = kMlpTileTokens;  // tokens per MLP tile (tests: small; 0 untiled)
  bool activations_on_device = false;  // activation store tier (all layers)
  // When >= 0: only the saved inputs of the first `device_act_layers` layers stay on the
  // device, the rest go to pinned host memory (the planner's split when neither tier alone
  // has room). -1: activations_on_device decides for every layer.
  int device_act_layers = -1;
  bool act_on_device(int layer) const {
    return device_act_layers < 0 ? activations_on_device : layer < device_act_layers;
  }
  int n_device_act_layers(int n_layers) const {
    return device_act_layers < 0 ? (activations_on_device ? n_layers : 0)
                                 : std::min(device_act_layers, n_layers);
  }
  // The first `kept_attention_layers` layers keep, per chunk, their attention output att
  // [T, Q] (compute dtype) and its log-sum-exp [Hq, T] (f32) from the forward to the backward
  // ("attention store"), so that the backward recomputes the rest of the layer's forward but
  // not the attention (model/recipes.h: Recompute::all_but_attention; the same bits). At long
  // sequences the attention forward is the costly part of the recompute (8B at 32K tokens:
  // ~12% of the step). On the device the forward writes them into the store and the backward
  // reads them there (no copies); on the host (pinned) they go out on d2h after the layer's
  // forward and come back on h2d with its saved input, through two device stages. 0: off.
  int kept_attention_layers = 0;
  bool kept_attention_on_device = true;
  bool keeps_attention(int layer) const { return layer < kept_attention_layers; }
  // Which layers' inputs the forward saves for the backward: the kept-attention layers' and,
  // after them, every `checkpoint_every`-th layer's (1: all). The backward reruns the forward
  // of a saved layer (and of the unsaved one after it) over all chunks into the step's two
  // activation buffers, idle in the backward, to give the unsaved layers above their inputs:
  // the same bits (the forward is deterministic), 1/checkpoint_every of the store's memory, for
  // one more layer forward per unsaved layer (+12.5% compute at 2, +17% at 3). Where the store
  // crowds out the optimizer state (32B: 40 GiB of layer inputs at 64 x 1024 pushed its moments
  // onto the disk) that memory buys more than the compute costs. At most 3: two buffers.
  int checkpoint_every = 1;
  // The stride applies from this layer up (and above the kept-attention layers); the layers
  // below it save their inputs. A plan a little short of memory replays only its top layers'
  // inputs (the host-stored ones, with a split store) instead of every other layer's.
  int strided_from = 0;
  bool saves_input(int layer) const {
    const int from = std::max(kept_attention_layers, strided_from);
    return layer < from || (layer - from) % checkpoint_every == 0;
  }
  int n_saved_inputs(int n_layers) const {
    int n = 0;
    for (int k = 0; k < n_layers; ++k) n += saves_input(k);
    return n;
  }
  // Homes kept on the device: the last `resident_layers` layers and (head_resident) the head.
  // The others live in pinned host memory and stream through the slots.
  int resident_layers = 0;
  bool head_resident = false;
  // Elements per ring buffer for the update trips of device homes (tests make it small to
  // cover many pieces).
  int64_t ring_piece = kRingPiece;
  // Speculative update: AdamW of each unit starts during the backward, as soon as its
  // gradient is home, with clip coefficient 1, as long as the norm so far cannot need
  // clipping; if the final global norm does clip (or is not finite) the speculated units are
  // redone in one fused pass (optim/adamw_undo.h) or undone. The gradient must survive until
  // then, so a speculated unit's new weights go to a second compute-dtype copy ("next",
  // pinned host). Only `next_units` units get one (-1: all), as host memory allows: the first
  // layers, then the head; the others, and whatever the backward outran, are updated after
  // it, pipelined into the next forward like the deferred update. (The first layers because
  // the next forward needs them first; the last ones and the head can be updated while it
  // runs through the others.)
  enum class Speculation { off, always } speculation = Speculation::off;
  int next_units = -1;
  // The first `device_adamw_layers` layers keep their fp32 master, m and v on the device and
  // run AdamW there (their homes are resident too). Layer 0's gradient is the backward's last
  // and the next forward needs it first: on the host its update (~80 ms at 8B) was a gap
  // between steps; every further layer also takes its share of the CPU optimizer's work
  // (which bounds small batches and clipped steps), for 12 B/param of device memory (16 from
  // layer 2 on: its own f32 gradient accumulator; layers 0 and 1 keep theirs until the
  // update, the next backward reuses them last). The host ParamStore gets their state back
  // when params() is asked for.
  int device_adamw_layers = 0;
  bool device_adamw(int u) const { return u >= 1 && u <= device_adamw_layers; }
  // The AdamW moments in a file in this directory (a fast disk) instead of RAM (see
  // ParamStore): the planner's choice when host memory is short and --optimizer-dir names
  // one. Empty: in RAM.
  std::string moments_dir;
  // Device bytes the attention backward's workspace takes for the largest chunk (planner.h:
  // attention_workspace_bytes; 0 where the implementation needs none): counted, not allocated
  // by the executor (the backend allocates it on first use).
  size_t attention_workspace_bytes = 0;
  // With moments_dir: how many units' moments go to the file (disk_unit_choice picks them,
  // spread over the sweep); the others stay in RAM. -1: every unit's. The planner's choice:
  // the fewest that let the rest fit in the host budget (each costs its bytes of disk traffic
  // twice per step).
  int disk_moment_units = -1;
  // With moments_dir and a bf16 master: those units' masters go to the file too, moved with
  // their moments by the optimizer's sweep, the only reader of a master whose weights stream
  // from compute-dtype homes (copies; not from_master, where the slots load the master itself,
  // and never the embedding's, whose table the GPU gathers from). The planner's choice when
  // even every unit's moments on the disk leave RAM short: 2 B/param less RAM for 2 B/param
  // more disk traffic each way.
  bool masters_on_disk = false;
  // The moments do not fit in the page cache (the planner's estimate): each unit's are
  // written back and dropped from the cache once its update is done (ParamStore), so the
  // sweep streams them at the disk's pace instead of stalling in page reclaim.
  bool moments_streamed = false;
  // grads_out's casts and sums of squares on their own stream, next to the following layer's
  // backward, instead of on the compute stream between layers. The H200 ran the GPU engine
  // tests with it and measured 8B batch 64 at 10,322 steady tokens/s against 10,186 without
  // (GPU idle in the backward 0.024 -> 0.007 s per step); its event ordering is checked by the
  // lazy threaded-streams tests, both ways. `bench --no-grads-stream` turns it off for an A/B.
  // The planner counts its workspace either way.
  bool grads_stream = true;
  // Where the streamed layers' weights and gradients live on the host:
  //  copies: a compute-dtype home per layer (2 B/param with bf16): the update writes the
  //          next step's weights there, and the gradient waits there for the global norm;
  //  master: none. Weights stream from the fp32 master (pinned, cast on the device) and each
  //          gradient lands in a ring of two layer buffers and is applied at once, during the
  //          backward: the host holds the 12 B/param of fp32 state and little else. No global
  //          norm precedes an update, so only for steps without clipping; resident homes
  //          only for the head, and no device-AdamW layers.
  enum class HostWeights { copies, master } host_weights = HostWeights::copies;
  bool from_master() const { return host_weights == HostWeights::master; }
  // f32 layer gradient accumulators on the device: 2 alternate, so that a layer's backward
  // never waits for the previous one's gradient to leave; 1 saves a layer's f32 gradient
  // (0.8 GiB at 8B) and makes each layer's backward wait for the cast of the one before
  // (~0.3 ms at 8B with a reduced compute dtype). 1 needs no device-AdamW layers (layers 0
  // and 1 keep theirs until their update).
  int layer_grad_buffers = 2;
  // How the host training state is stored (--optimizer-state, --master-weights;
  // optim/state_format.h). A compact format has no exact undo: it speculates only the weights
  // (HostUpdater: the state untouched until the step is kept), with a reduced compute dtype,
  // for streamed layers; a bf16 master streams to the device as it is (no fp32 stage, no cast).
  StateFormat state_format;
  bool bf16_master() const { return state_format.master == MasterFormat::bf16; }
  // Whether unit u (0 embedding, 1..L layers, L+1 head) gets a "next" buffer.
  bool has_next(int u, int n_units) const {
    if (!speculative() || u < 1 || device_adamw(u) || (next_units >= 0 && u > next_units)) return false;
    // A compact state's speculated weights wait in `next` while the home keeps the gradient
    // its commit reads: streamed layers only (a resident home is the device's).
    return state_format.is_fp32() || u <= n_units - 2 - resident_layers;
  }
  bool speculative() const { return speculation != Speculation::off; }
  // Data parallel (engine/data_parallel.h): the ranks of the run. With more than one, the f32
  // gradient accumulators (layers, head) hold world equal 64-aligned shards
  // (padded_for_ranks), so that a device reduce-scatter (NCCL's equal counts) leaves each rank
  // its slice in place; the pad is zero.
  int data_parallel_world = 1;
};

// n elements as world equal shards of ceil(n / world) rounded up to 64 (dist::shard_range with
// align 64 cuts the same slices): the padded length of a data-parallel accumulator.
inline int64_t padded_for_ranks(int64_t n, int world) {
  const int64_t per = (n + world - 1) / world;
  return world * ((per + 63) / 64 * 64);
}

// Modes only tests ask for, never a plan or a user: a separate argument of the executor, so
// that EngineConfig holds only what a plan decides.
struct EngineTestModes {
  // The device scatter of an untied embedding gradient uses both of its row blocks (half the
  // step's rows each) even when one would hold them all.
  bool split_embedding_scatter = false;
  // Phase A takes every unit before phase B starts and speculates each one it can, whatever
  // the norm so far, so clipped steps redo every such unit deterministically.
  bool speculate_everything = false;
  // Each update of a landing round first sleeps this long, so that the round still runs when
  // the next step starts (as on a GPU, where the CPU's AdamW lags the step's return).
  int landing_delay_ms = 0;
  // Data parallel: ranks other than 0 sleep this long before each slice update, so that a rank
  // that read a unit before every rank's slice was in would read old weights (and fail the bits).
  int rank_update_delay_ms = 0;
};

}  // namespace sf
