// The planner: from a model, a batch shape and memory budgets, decide how to run a step —
// resident (everything on the device) or sliding window (slots, chunk size, activation tier)
// — count every byte on each tier BEFORE anything is allocated, predict the step time from
// measured bandwidths and throughputs, and refuse with a clear reason when nothing fits.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/bytes.h"        // parse_bytes, format_bytes: the planner's users print sizes
#include "core/dtype.h"
#include "core/host_memory.h"  // host_available_bytes
#include "engine/engine_config.h"
#include "io/model_config.h"
#include "optim/state_format.h"

namespace sf {

// Bandwidths and throughputs the prediction uses. Defaults: the H200 test machine
// (shared/ARCHITECTURE.md); the host backend measures its own GEMM rate.
struct HardwareModel {
  double device_flops = 600e12;     // sustained bf16 GEMM FLOP/s in a training step
  // Causal flash attention, forward and backward together (FLOPs counted as 4*D*ctx per query
  // head and token forward, 2.5x that backward), at sequences of 8K and longer; shorter ones
  // run slower (attention_rate). The H200 runs slideformer's wgmma kernels at 206 / 261 / 275
  // TFLOP/s at seq 1K / 4K / 8K (docs/bench-log/cuda-kernels.md, eighth session).
  double attention_flops = 275e12;
  // The attention rate at a mean causal context of ctx keys per query (seq / 2): 0.75 of
  // attention_flops at seq 1K, 0.95 at 4K, 1 from 8K, log-linear in between (the H200's
  // measured ratios; short sequences spend more of their time on tile edges and setup).
  double attention_rate(double ctx) const;
  // The attention backward allocates a workspace that grows with the chunk (cuDNN's
  // atomic-accumulating form: f32 dQ and softmax sums, attention_workspace_bytes): set where
  // that implementation will run, so that the plan leaves the room for it.
  bool attention_workspace = false;
  // The rate of the backward that needs no workspace (cuDNN's forward with slideformer's
  // deterministic backward), or 0 where there is no such choice: make_plan falls back to it
  // when that workspace is what keeps the step from fitting (Plan::attention_without_workspace).
  double attention_flops_no_workspace = 0;
  double h2d_bytes_per_s = 50e9;    // pinned host -> device
  double d2h_bytes_per_s = 50e9;
  // Host AdamW (fp32 master, m, v; bf16 gradient in, bf16 weights out): ours on the H200
  // machine's 16 cores, ~1.9 s per 8.03 B parameters (docs/bench-log/engine.md, "Previous
  // session's runs").
  double adamw_params_per_s = 4.2e9;
  // The disk of --optimizer-dir, when the AdamW moments live there: bytes per second read
  // and written together (measured by plan_run when the plan puts them there).
  double disk_bytes_per_s = 2e9;
  // Where the figures come from, for the plan's `hardware` line.
  std::string source = "the H200 test machine's GPU figures (no GPU measured)";
  static HardwareModel host_default();  // measures the host's fp32 GEMM rate briefly
  // The GPU figures above with this machine's CPU AdamW rate, measured briefly (~0.1-0.5 s,
  // 512 MiB): the optimizer's speed is the CPU's and its memory's, whatever the GPU.
  static HardwareModel device_default(StateFormat state_format = {});  // that format's AdamW
};

struct StepRequest {
  int64_t micro_tokens = 0;  // tokens of one micro-batch (batch size x sequence length)
  int grad_accum = 1;
  int64_t max_seq_len = 0;   // longest sequence
  // Global-norm clipping (max_grad_norm > 0): every gradient must exist before any update,
  // which rules out the plans that apply each as it lands (EngineConfig::HostWeights::master).
  bool clipping = true;
  // With clipping: the share of steps the plan search takes to clip (it minimises that mix
  // of the clipped and the unclipped step time). A fine-tuning run at max_norm 1 clips most
  // of its first steps and some later ones; 0 ranks plans by their unclipped steps alone.
  double clipped_share = 0.5;
  // How the host training state is stored (--optimizer-state, --master-weights): the
  // ParamStore's format, whose bytes per unit are unit_state_bytes.
  StateFormat state_format;
  // Whether a sliding window may keep its layers' attention output and lse for the backward
  // (EngineConfig::kept_attention_layers) when that is predicted faster and fits; false
  // plans without it (`bench --no-kept-attention`, for an A/B).
  bool kept_attention = true;
  // How often a sliding window saves a layer's input for the backward
  // (EngineConfig::checkpoint_every): 0 lets the planner choose among 1, 2 and 3 (the fastest
  // predicted that fits); 1-3 forces it (and with more than 1, a sliding window: the resident
  // plans keep every layer's input).
  int checkpoint_every = 0;
  // Data-parallel ranks on this host that the plan is one of (EngineConfig::data_parallel_world):
  // their accumulators are padded for that many and, on the GPU path, the streamed homes are
  // one copy the ranks share (a memory line host_line_shared counts once per host).
  int data_parallel_ranks = 1;
};

struct Budget {
  size_t device_bytes = 0;  // what the backend may allocate (CUDA context excluded)
  size_t host_bytes = 0;    // process memory for state, staging and stores
  bool unified = false;     // the device IS host memory (host backend): one pool
  // A directory on a fast disk where the AdamW moments may go when RAM is short
  // (--optimizer-dir; empty: none), and the bytes free there.
  std::string moments_dir;
  size_t moments_dir_free = 0;
  // RAM beyond host_bytes the kernel may use as page cache (moments on disk that fit there
  // and in the budget's slack stay cached: the optimizer then runs at the CPU's pace).
  size_t page_cache_bytes = 0;
};

struct MemoryLine {
  std::string what;
  size_t bytes = 0;
  bool device = false;
  bool disk = false;  // a file in Budget::moments_dir (neither device nor host memory)
  // Host memory the process holds beside our allocations (the CUDA runtime, a transient
  // scratch): counted against the budget, never allocated by an executor.
  bool process = false;
};

// The CUDA runtime's, driver's and libraries' host memory, which a plan on a GPU counts: the
// H200 machine's 8B runs peaked 1.1-1.8 GiB of RSS above their buffers and state.
constexpr size_t kCudaRuntimeHostBytes = size_t(2) << 30;

struct Plan {
  enum class Mode { resident, sliding } mode = Mode::sliding;
  EngineConfig engine;  // for Mode::sliding; its head_chunk_rows for both modes
  bool keep_activations = false;  // for Mode::resident: every layer's activations kept
  std::vector<MemoryLine> lines;
  size_t device_bytes = 0, host_bytes = 0, disk_bytes = 0;
  bool fits = false;
  // The step fits only without the attention backward's workspace (HardwareModel::
  // attention_flops_no_workspace): the run must use the backward that needs none.
  bool attention_without_workspace = false;
  std::string advice;   // when it does not fit: what to change
  double step_seconds = 0, tokens_per_second = 0;
  double compute_seconds = 0, transfer_seconds = 0, optimizer_seconds = 0;
  // A step whose gradient norm gets clipped: no update can start before the norm is known,
  // so all of the host AdamW follows the backward (a sliding window that speculates hides
  // it in the backward otherwise). Equal to step_seconds where nothing differs.
  double clipped_step_seconds = 0;
  // The predicted time of a step that follows one whose norm was (or was not) clipped: a
  // clipped step's AdamW runs in the next step's forward, so that is where it costs.
  double step_seconds_after(bool previous_clipped) const {
    return previous_clipped ? clipped_step_seconds : step_seconds;
  }
  // What the predicted step waits for beyond the GPU's compute, if anything (describe_plan
  // says what would help): the host optimizer, or transfers over PCIe.
  enum class Bound { gpu_compute, cpu_optimizer, transfers } bound = Bound::gpu_compute;
  // The optimizer's rate is the moments' disk's, not the CPU's (moments on disk).
  bool optimizer_disk_bound = false;
  double model_flops_per_step = 0;  // 6 N T + causal attention (no recompute)
  HardwareModel hw;                 // what the prediction assumed
};

// Exact byte counts of the two executors (they allocate exactly these).
std::vector<MemoryLine> sliding_memory(const ModelConfig& cfg, const EngineConfig& ec, DType cd);
// keep_activations: one layer scratch per layer (no recompute in the backward).
std::vector<MemoryLine> resident_memory(const ModelConfig& cfg, int64_t max_tokens, DType cd,
                                        bool keep_activations = false, int64_t head_chunk_rows = 256,
                                        StateFormat state_format = {}, size_t attention_workspace = 0);
// The attention backward's workspace for a chunk of T tokens where HardwareModel::
// attention_workspace is set: cuDNN's f32 dQ accumulator and its sums, 8 bytes per token and
// query channel plus 8 per token and head (measured: 1,082,131,712 B for 8B's 32K tokens, this
// formula + 1,280), and 2 MiB for its execution plan. Exact for chunks of equal sequences;
// packed unequal ones pad each sequence to the longest, so the backend runs them in parts whose
// padded rows fit in the chunk's tokens (cudnn_attention.cpp, parts_of): this bounds them too.
size_t attention_workspace_bytes(const ModelConfig& cfg, int64_t tokens);

// "fp32 master, int8 AdamW moments": the state format in the plan's words.
std::string state_format_words(StateFormat f);
// Bytes of host training state per model parameter in format f (12 for fp32; padding included).
double state_bytes_per_param(const ModelConfig& cfg, StateFormat f);

// Tokens per LM-head logits chunk for T tokens per layer visit. Each chunk adds its share of
// the head's weight gradient into the whole f32 [V, C] accumulator, which at 256 rows makes
// that GEMM memory-bound (8B: 4.2 GB of traffic per 256 tokens); up to 4096 rows it becomes
// compute-bound. With a reduced compute dtype: the largest power of two <= 4096 whose
// [rows, V] f32 scratch still fits in the layer scratch the head shares (no extra memory);
// otherwise (and for the fp32 host reference) 256.
int64_t head_chunk_rows_for(const ModelConfig& cfg, int64_t T, DType cd);

// allow_resident = false forces a sliding window even when everything would fit.
// device_adamw_layers: for a sliding window, how many of the first layers keep their optimizer
// on the device (EngineConfig::device_adamw_layers); -1: the planner's choice (only with a
// reduced compute dtype, i.e. a GPU); a forced count must fit.
Plan make_plan(const ModelConfig& cfg, const StepRequest& req, const Budget& budget, DType cd,
               const HardwareModel& hw, bool allow_resident = true, int device_adamw_layers = -1);

// The plan in words. summary: only the mode, the memory totals, the prediction and the bound
// (what `train` prints before it starts; `slideformer plan` prints the whole table).
std::string describe_plan(const ModelConfig& cfg, const StepRequest& req, const Budget& budget,
                          const Plan& p, bool summary = false);

}  // namespace sf
