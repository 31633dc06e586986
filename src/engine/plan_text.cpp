// The plan in words (describe_plan): the model and the step, the mode, the memory table with
// its totals against the budgets, the hardware figures, the prediction, what bounds the step
// and whether it fits (or the advice when not). Reads the plan; prints, changes nothing.
#include <algorithm>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "engine/plan_internal.h"

namespace sf {

using plan_internal::resident_layer_count;

namespace {

// Which parts describe_plan prints: all (`slideformer plan`) or the summary `train` prints
// before it starts (the mode, the memory totals, the prediction and the bound).
enum class Detail { full, summary };

void say_model_and_step(const ModelConfig& cfg, const StepRequest& req, std::ostream& os) {
  const double T = double(req.micro_tokens) * req.grad_accum;
  os << "model      " << arch_name(cfg.arch) << ", " << std::setprecision(2)
     << double(cfg.num_parameters()) / 1e9 << " B parameters, " << cfg.num_hidden_layers
     << " layers\n";
  os << "step       " << req.grad_accum << " x " << req.micro_tokens << " tokens = "
     << int64_t(T) << " tokens per optimizer step\n";
}

std::string device_adamw_words(const EngineConfig& e) {
  if (e.device_adamw_layers == 1) return " (layer 0's on the device)";
  if (e.device_adamw_layers > 1) return cat(" (layers 0-", e.device_adamw_layers - 1, " on the device)");
  return std::string();
}

std::string activation_store_words(const ModelConfig& cfg, const EngineConfig& e) {
  const int on_device = e.n_device_act_layers(int(cfg.num_hidden_layers));
  if (on_device == cfg.num_hidden_layers) return "device";
  if (on_device == 0) return "host";
  return cat("device for ", on_device, " layers, host for the rest");
}

std::string kept_attention_words(const EngineConfig& e) {
  if (e.kept_attention_layers == 0) return std::string();
  return cat(", attention kept for ", e.kept_attention_layers, " layers (",
             e.kept_attention_on_device ? "device" : "host", "; not recomputed in the backward)");
}

std::string checkpoint_words(const EngineConfig& e) {
  if (e.checkpoint_every == 1) return std::string();
  const int from = std::max(e.kept_attention_layers, e.strided_from);
  return cat(", every ", e.checkpoint_every == 2 ? "2nd" : "3rd", " layer's input saved",
             from > e.kept_attention_layers ? cat(" from layer ", from, " up") : std::string(),
             " (the others' replayed in the backward)");
}

void say_state(const ModelConfig& cfg, const Plan& p, std::ostream& os) {
  const StateFormat f = p.engine.state_format;
  os << "state      " << state_format_words(f) << " (" << std::fixed << std::setprecision(2)
     << state_bytes_per_param(cfg, f) << " B/param"
     << (f.is_fp32() ? "; --optimizer-state int8 and --master-weights bf16 shrink it" : "") << ")\n";
}

void say_mode(const ModelConfig& cfg, const Plan& p, std::ostream& os) {
  if (p.mode == Plan::Mode::resident) {
    os << "mode       resident: the whole model stays on the device"
       << (p.keep_activations ? ", every layer's activations kept (no recompute)" : "") << "\n";
    say_state(cfg, p, os);
    return;
  }
  os << "mode       sliding window: " << p.engine.n_slots << " weight slots, "
     << resident_layer_count(cfg.num_hidden_layers, p.engine) << " of " << cfg.num_hidden_layers
     << " layers resident, "
     << (p.engine.from_master() ? cat("weights streamed from the ", master_format_name(p.engine.state_format.master),
                                      " master (no host copy), each gradient applied as it lands")
                                : p.engine.speculative() ? "speculative update" : "deferred update")
     << device_adamw_words(p.engine) << ", chunks of " << p.engine.max_chunk_tokens
     << " tokens (" << p.engine.max_chunks << " per step), activation store on the "
     << activation_store_words(cfg, p.engine) << kept_attention_words(p.engine) << checkpoint_words(p.engine)
     << "\n";
  say_state(cfg, p, os);
}

// One row of the memory table (os is left-aligned).
void say_memory_row(const std::string& what, const std::string& tier, const std::string& bytes,
                    std::ostream& os) {
  os << "  " << std::setw(42) << what << std::setw(8) << tier << bytes;
}

void say_memory_table(const Plan& p, std::ostream& os) {
  os << "\n";
  say_memory_row("memory", "tier", "bytes\n", os);
  for (auto& l : p.lines)
    say_memory_row(l.what, l.disk ? "disk" : l.device ? "device" : "host", format_bytes(l.bytes) + "\n", os);
}

void say_memory_totals(const Budget& budget, const Plan& p, std::ostream& os) {
  say_memory_row("total device", "", format_bytes(p.device_bytes), os);
  os << "  (budget " << format_bytes(budget.device_bytes) << ")\n";
  say_memory_row("total host", "", format_bytes(p.host_bytes), os);
  os << "  (budget " << format_bytes(budget.host_bytes) << ")\n";
  if (p.disk_bytes > 0) {
    say_memory_row(cat("total disk (", budget.moments_dir, ")"), "", format_bytes(p.disk_bytes), os);
    os << "  (free " << format_bytes(budget.moments_dir_free);
    if (p.fits)  // decided for a plan that fits only
      os << "; " << (p.engine.moments_streamed ? "streamed from disk every step" : "the page cache holds them: read once");
    os << ")\n";
  } else if (!budget.moments_dir.empty() && p.fits) {
    os << "  (--optimizer-dir " << budget.moments_dir << " is not used: the AdamW moments fit in RAM)\n";
  }
}

void say_hardware(const Plan& p, std::ostream& os) {
  if (!(p.step_seconds > 0)) return;  // no prediction (also NaN)
  os << std::setprecision(1) << "hardware   " << p.hw.source << "; CPU AdamW "
     << p.hw.adamw_params_per_s / 1e9 << " G params/s"
     << (p.disk_bytes > 0 ? cat("; optimizer disk ", std::fixed, std::setprecision(1),
                                p.hw.disk_bytes_per_s / 1e9, " GB/s read + write")
                          : std::string())
     << "\n";
}

void say_prediction(const Plan& p, std::ostream& os) {
  os << std::setprecision(3) << "predicted  step " << p.step_seconds << " s (compute "
     << p.compute_seconds << " s, transfers " << p.transfer_seconds << " s, optimizer "
     << p.optimizer_seconds << " s), " << std::setprecision(0) << p.tokens_per_second
     << " tokens/s, ";
  const double model_flops = p.model_flops_per_step / p.step_seconds;  // host plans: GFLOP/s
  if (model_flops >= 1e12) os << std::setprecision(1) << model_flops / 1e12 << " model TFLOP/s\n";
  else os << std::setprecision(1) << model_flops / 1e9 << " model GFLOP/s\n";
  // Worth saying when clipping costs >= 5%: the user can see clipped steps in the progress
  // line (the norm) and know why those are slower.
  if (p.clipped_step_seconds > 1.05 * p.step_seconds)
    os << std::setprecision(3) << "clipped    a step whose gradient norm is clipped: "
       << p.clipped_step_seconds << " s (its host AdamW waits for the global norm)\n";
}

void say_optimizer_bound(const Plan& p, std::ostream& os) {
  if (p.optimizer_disk_bound) {
    os << "bound      the optimizer's disk (" << std::setprecision(2) << p.optimizer_seconds
       << " s per step to " << (p.engine.moments_streamed ? "read and write" : "write back")
       << " the AdamW moments" << (p.engine.masters_on_disk ? " and bf16 masters" : "")
       << "): more tokens per step amortise it "
       << "while RAM holds their layer inputs (each GiB they take puts a GiB more of moments on "
       << "the disk); more RAM (fewer units' moments on the disk) or a faster disk removes it\n";
    return;
  }
  os << "bound      the CPU optimizer (" << std::setprecision(2) << p.optimizer_seconds
     << " s of host AdamW per step): more tokens per step (--batch-size, --grad-accum) "
     << "amortise it"
     // head_resident: the planner's sliding plans on a GPU (a reduced compute dtype)
     << (p.mode == Plan::Mode::sliding && p.engine.head_resident
             ? "; more GPU memory moves more layers' AdamW there (--device-adamw-layers)"
             : "")
     << "\n";
}

void say_bound(const Plan& p, std::ostream& os) {
  switch (p.bound) {
    case Plan::Bound::gpu_compute: os << "bound      compute: the step is as fast as its kernels\n"; break;
    case Plan::Bound::cpu_optimizer: say_optimizer_bound(p, os); break;
    case Plan::Bound::transfers:
      os << "bound      PCIe transfers (" << std::setprecision(2) << p.transfer_seconds
         << " s per step): more tokens per step hide them; more GPU memory keeps more layers' "
         << "weights resident\n";
      break;
  }
}

}  // namespace

std::string describe_plan(const ModelConfig& cfg, const StepRequest& req, const Budget& budget,
                          const Plan& p, bool summary) {
  const Detail detail = summary ? Detail::summary : Detail::full;
  std::ostringstream os;
  os << std::fixed;
  if (detail == Detail::full) say_model_and_step(cfg, req, os);
  say_mode(cfg, p, os);
  os << std::left;
  if (detail == Detail::full) say_memory_table(p, os);
  say_memory_totals(budget, p, os);
  os << (detail == Detail::summary ? "" : "\n") << std::right;
  say_hardware(p, os);
  say_prediction(p, os);
  say_bound(p, os);
  if (detail == Detail::full)
    os << (p.fits ? "fits       yes\n" : "fits       NO: ") << (p.fits ? "" : p.advice + "\n");
  return os.str();
}

}  // namespace sf
