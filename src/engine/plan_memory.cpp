// The plan's memory lines: the exact bytes each executor allocates, per tier, BEFORE anything
// is allocated. sliding_memory (SlidingWindowExecutor: state, the window's buffers from
// window_buffer_specs, the backend's workspaces), resident_memory (ResidentExecutor and
// DeviceResidentExecutor), and head_chunk_rows_for (the LM-head chunk both size their
// scratch with). Pure functions of the model, the engine settings and the compute dtype.
#include <algorithm>

#include "core/error.h"
#include "optim/param_store.h"
#include "engine/device_state.h"
#include "engine/planner.h"
#include "engine/window_buffers.h"
#include "model/device_batch.h"
#include "model/param_layout.h"
#include "model/recipes.h"
#include "optim/state_format.h"

namespace sf {

namespace {

size_t dev_round(size_t b) { return (std::max<size_t>(b, 1) + 255) / 256 * 256; }

// cuBLASLt + reduction workspaces the CUDA backend creates per stream that computes.
constexpr size_t kBackendWorkspace = (size_t(32) << 20) + (size_t(8) << 20);

// The host training state's line name: "fp32 master + AdamW m, v" by default, else its format.
std::string state_line_name(StateFormat f) {
  if (f.is_fp32()) return "fp32 master + AdamW m, v";
  return cat(master_format_name(f.master), " master + ", moment_format_name(f.moments), " AdamW m, v");
}

// The state as ParamStore allocates it: in RAM, or with the m and v (and, masters_on_disk,
// the bf16 masters) of ec.disk_moment_units units in --optimizer-dir's file (the int8 scales
// stay in RAM) and the tier's two slots.
void add_state_lines(const ModelLayout& l, const EngineConfig& ec, std::vector<MemoryLine>& m) {
  const std::vector<StateUnit> units = state_units(l);
  const StateFormat f = ec.state_format;
  if (ec.moments_dir.empty()) {
    size_t all = 0;
    for (const StateUnit& u : units) all += unit_state_bytes(u, f);
    m.push_back({state_line_name(f), all, false});
    return;
  }
  const DiskUnits disk{ec.disk_moment_units, ec.masters_on_disk};
  const std::vector<char> on_disk = disk_unit_choice(units, disk.count);
  const std::vector<char> master_on_disk = master_disk_choice(units, disk);
  size_t in_ram = 0, ram_moments = 0;
  int n_disk = 0, n_masters = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const UnitStateLayout ul = unit_state_layout(units[u], f);
    in_ram += (master_on_disk[u] ? 0 : ul.master_bytes) + 2 * size_t(ul.scale_count) * 4;
    n_masters += master_on_disk[u];
    if (on_disk[u]) ++n_disk;
    else ram_moments += 2 * ul.moment_bytes;
  }
  const int n = int(units.size());
  const std::string master = cat(master_format_name(f.master), " master",
                                 n_masters > 0 ? cat(" of ", n - n_masters, n - n_masters == 1 ? " unit" : " units")
                                               : std::string());
  m.push_back({cat(master, f.moments == MomentFormat::int8 ? " + int8 scales" : ""), in_ram, false});
  if (ram_moments > 0)
    m.push_back({cat("AdamW m, v of ", n - n_disk, " of ", n, " units (RAM)"), ram_moments, false});
  const std::string what = n_masters > 0 ? cat("m, v of ", n_disk, " + ", n_masters, " masters")
                           : n_disk == n ? std::string("AdamW m, v")
                                         : cat("AdamW m, v of ", n_disk, " units");
  m.push_back({cat(what, n_disk == n && n_masters == 0 ? " (a file in --optimizer-dir)" : " (--optimizer-dir)"),
               disk_file_bytes(units, f, disk), false, true});
  m.push_back({n_masters > 0 ? "disk tier slots (2 units' m, v, master)" : "disk tier slots (2 units' m, v)",
               disk_slot_bytes(units, f, disk), false});
}

// What the process holds on the host beside the executor's buffers and state, so that the
// plan bounds its peak RSS: the CUDA runtime, driver and libraries, and, for a compact state,
// the one unit of f32 weights that loading or initialising it goes through.
void add_process_lines(const ModelLayout& l, DType cd, StateFormat f, std::vector<MemoryLine>& m) {
  if (cd != DType::f32)
    m.push_back({"CUDA runtime, driver and libraries", kCudaRuntimeHostBytes, false, false, true});
  if (f.is_fp32()) return;
  int64_t largest = 0;
  for (const Unit& u : l.units) largest = std::max(largest, u.numel);
  m.push_back({"f32 weights of one unit (loading the state)", size_t(largest) * 4, false, false, true});
}

}  // namespace

std::string state_format_words(StateFormat f) {
  return cat(master_format_name(f.master), " master, ", moment_format_name(f.moments), " AdamW moments");
}

double state_bytes_per_param(const ModelConfig& cfg, StateFormat f) {
  size_t bytes = 0;
  for (const StateUnit& u : state_units(ModelLayout::build(cfg))) bytes += unit_state_bytes(u, f);
  return double(bytes) / double(cfg.num_parameters());
}

std::vector<MemoryLine> sliding_memory(const ModelConfig& cfg, const EngineConfig& ec, DType cd) {
  ModelLayout l = ModelLayout::build(cfg);
  std::vector<MemoryLine> m;
  add_state_lines(l, ec, m);
  // The buffers, one line per label in the list's order, host lines first.
  std::vector<MemoryLine> dev;
  for (const BufferSpec& s : window_buffer_specs(cfg, ec, cd)) {
    const bool on_device = s.tier == Tier::device;
    std::vector<MemoryLine>& to = on_device ? dev : m;
    auto it = std::find_if(to.begin(), to.end(), [&](const MemoryLine& x) { return x.what == s.line; });
    if (it == to.end()) it = to.insert(to.end(), MemoryLine{s.line, 0, on_device});
    it->bytes += tier_bytes(s);
  }
  m.insert(m.end(), dev.begin(), dev.end());
  // Streams that run compute ops: compute, grads (casts and norms, EngineConfig::grads_stream;
  // counted either way), update (device AdamW).
  m.push_back({"backend workspaces", 3 * kBackendWorkspace, true});
  if (ec.attention_workspace_bytes > 0)
    m.push_back({"attention backward workspace (cuDNN)", ec.attention_workspace_bytes, true});
  add_process_lines(l, cd, ec.state_format, m);
  return m;
}

size_t attention_workspace_bytes(const ModelConfig& cfg, int64_t tokens) {
  const size_t T = size_t(std::max<int64_t>(tokens, 0));
  return 8 * T * (size_t(cfg.q_dim()) + size_t(cfg.num_attention_heads)) + (size_t(2) << 20);
}

int64_t head_chunk_rows_for(const ModelConfig& cfg, int64_t T, DType cd) {
  const int64_t base = std::min<int64_t>(256, std::max<int64_t>(1, T));
  if (cd == DType::f32) return base;
  const size_t layer = layer_acts_bytes(cfg, T, cd, kMlpTileTokens);
  for (int64_t r = 4096; r > 256; r /= 2)
    if (r <= T && head_acts_bytes(cfg, T, cd, r) <= layer) return r;
  return base;
}

std::vector<MemoryLine> resident_memory(const ModelConfig& cfg, int64_t T, DType cd, bool keep,
                                        int64_t head_rows, StateFormat f, size_t attention_workspace) {
  // The fp32 master and AdamW moments live on the device when the compute dtype is reduced
  // (CUDA: DeviceResidentExecutor), on the host for the fp32 reference (ResidentExecutor).
  const bool state_on_device = cd != DType::f32;
  ModelLayout l = ModelLayout::build(cfg);
  const size_t es = dtype_size(cd), C = size_t(cfg.hidden_size);
  size_t w = 0, g = 0, state = 0, dev_state = 0, host_g = 0, decode = 0;
  for (auto& u : l.units) {
    w += dev_round(size_t(u.numel) * es);
    g += dev_round(size_t(u.numel) * 4);
    if (f.is_fp32()) dev_state += 3 * dev_round(size_t(u.numel) * 4);
    host_g += size_t(u.numel) * 4;
    decode = std::max(decode, size_t(u.numel) * 4);
  }
  for (const StateUnit& u : state_units(l)) {
    state += unit_state_bytes(u, f);
    if (!f.is_fp32()) dev_state += dev_round(device_state_parts(unit_state_layout(u, f)).bytes);
  }
  size_t x = size_t(T) * C * es;
  int64_t rows = std::min<int64_t>(head_rows, T);
  std::vector<MemoryLine> m = {
      {state_on_device ? state_line_name(f) + " (checkpoint copy)" : state_line_name(f), state, false}};
  if (state_on_device) m.push_back({state_line_name(f), dev_state, true});
  else m.push_back({"gradient copy (f32)", host_g, false});
  // Both executors decode a bf16 master unit by unit for their models' weights.
  if (f.master == MasterFormat::bf16)
    m.push_back({"f32 weights of one unit, decoded from the bf16 master", decode, false});
  for (MemoryLine line : std::vector<MemoryLine>{
           {"weights (compute dtype)", w, true},
           {"gradients (f32)", g, true},
           {"layer inputs + activation gradient", dev_round(x * size_t(l.n_layers + 1)) + dev_round(x), true},
           keep ? MemoryLine{cat("kept activations (", l.n_layers, " layers) + head scratch"),
                             size_t(l.n_layers) * dev_round(layer_acts_bytes(cfg, T, cd, kMlpTileTokens)) +
                                 dev_round(head_acts_bytes(cfg, T, cd, rows)),
                             true}
                : MemoryLine{"layer/head scratch",
                             dev_round(std::max(layer_acts_bytes(cfg, T, cd, kMlpTileTokens),
                                                head_acts_bytes(cfg, T, cd, rows))),
                             true},
           {"batch inputs + loss", dev_round(DeviceBatch::storage_bytes(cfg, T)) + dev_round(4) * 2, true},
           {"backend workspaces", kBackendWorkspace, true}})
    m.push_back(line);
  if (attention_workspace > 0) m.push_back({"attention backward workspace (cuDNN)", attention_workspace, true});
  add_process_lines(l, cd, f, m);
  return m;
}

}  // namespace sf
