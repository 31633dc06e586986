// The subcommands: flags -> options structs -> library calls.
#include "cli/commands.h"
#include "cli/common.h"

#include <filesystem>
#include <iomanip>
#include <map>
#include <sstream>
#include <iostream>

#include "core/bytes.h"
#include "core/error.h"
#include "engine/executor_factory.h"
#include "engine/multi_gpu_plan.h"
#include "optim/param_store.h"
#include "optim/state_format.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/model_init.h"
#include "model/model_presets.h"
#include "text/tokenizer.h"
#include "train/model_dir.h"

namespace fs = std::filesystem;

namespace sf::cli {

// Where the bundled example lives: next to the source tree this binary was built from, or
// installed beside the binary.
fs::path examples_dir() {
  fs::path src = fs::path(SF_SOURCE_DIR) / "examples";
  if (fs::exists(src / "sotu")) return src;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path p = exe.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path())
    if (fs::exists(p / "examples" / "sotu")) return p / "examples";
  SF_FAIL(input, "the bundled example (examples/sotu) was not found next to ", SF_SOURCE_DIR,
          " or the binary; pass --model and --tokens");
}

DType parse_save_dtype(const std::string& s) {
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f16" || s == "float16") return DType::f16;
  if (s == "f32" || s == "float32") return DType::f32;
  SF_FAIL(input, "--dtype \"", s, "\" is unknown; use bf16, f16 or f32");
}

// The model's vocabulary must hold every id of the tokenizer it ships with (added tokens
// included). A named shape takes the tokenizer's size rounded up to a multiple of 64, as the
// presets round GPT-2's 50257 to 50304; a --from-config shape must already be large enough.
static void size_vocab_for_tokenizer(ModelConfig& cfg, const Tokenizer& tok, const fs::path& dir,
                                     const std::string& from_config) {
  int64_t n = tok.vocab_size();
  while (!tok.id_to_token(int32_t(n)).empty()) ++n;  // ids run past the count (a gap below)
  if (from_config.empty()) {
    const int64_t padded = (n + 63) / 64 * 64;
    if (padded != cfg.vocab_size)
      std::cout << "vocab_size " << padded << " from the tokenizer in " << dir.string() << " ("
                << n << " tokens incl. added ones, rounded up to a multiple of 64; the shape's own is "
                << cfg.vocab_size << ")\n";
    cfg.vocab_size = padded;
  } else {
    SF_REQUIRE(cfg.vocab_size >= n, from_config, ": vocab_size ", cfg.vocab_size,
               " is smaller than the tokenizer in ", dir.string(), " (", n,
               " tokens incl. added ones); set vocab_size to at least ", n,
               " (a multiple of 64, e.g. ", (n + 63) / 64 * 64, ")");
  }
}

// config.json's bos/eos/pad ids are the tokenizer's (tokenizer_config.json's bos_token,
// eos_token, pad_token): a shape's defaults (Llama's 1 and 2) name other tokens in another
// vocabulary. A token the tokenizer does not define leaves bos null and pad absent.
static void take_special_ids(ModelConfig& cfg, const Tokenizer& tok) {
  cfg.bos_token_id = tok.bos_id() ? *tok.bos_id() : -1;
  cfg.eos_token_ids.clear();
  if (tok.eos_id()) cfg.eos_token_ids.push_back(*tok.eos_id());
  if (!cfg.extra.is_object()) cfg.extra = nlohmann::json::object();
  cfg.extra.erase("pad_token_id");
  if (tok.pad_id()) cfg.extra["pad_token_id"] = *tok.pad_id();
  auto text = [&](std::optional<int32_t> id) {
    return id ? cat(*id, " (", tok.id_to_token(*id), ")") : std::string("none");
  };
  std::cout << "token ids from the tokenizer: bos " << text(tok.bos_id()) << ", eos "
            << text(tok.eos_id()) << ", pad " << text(tok.pad_id()) << "\n";
}

void add_init_command(CLI::App& app) {
  struct Opts {
    std::string size = "tiny";
    std::string config;
    std::string out;
    std::string dtype = "bf16";
    std::string tokenizer;
    uint64_t seed = 1234;
    bool overwrite = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("init", "write a randomly initialised model directory");
  cmd->add_option("--size", o->size, "named shape: " + [] {
    std::string s;
    for (auto& n : model_preset_names()) s += (s.empty() ? "" : ", ") + n;
    return s;
  }());
  cmd->add_option("--from-config", o->config, "a config.json to take the shape from");
  cmd->add_option("--out", o->out, "output model directory")->required();
  cmd->add_option("--dtype", o->dtype, "saved weight dtype: bf16, f16, f32");
  cmd->add_option("--tokenizer", o->tokenizer, "copy tokenizer files from this directory");
  cmd->add_option("--seed", o->seed, "random seed");
  cmd->add_flag("--overwrite", o->overwrite, "replace an existing non-empty --out directory");
  cmd->callback([o] {
    std::error_code ec;
    SF_REQUIRE(o->overwrite || !fs::exists(o->out, ec) ||
                   (fs::is_directory(o->out, ec) && fs::is_empty(o->out, ec)),
               "init: --out ", o->out, " already exists and is not empty; pass --overwrite to "
               "replace it, or choose another --out");
    ModelConfig cfg = o->config.empty() ? model_preset(o->size) : load_config(o->config);
    if (!o->tokenizer.empty()) {
      const fs::path dir = o->tokenizer;
      SF_REQUIRE(fs::exists(dir / "tokenizer.json"), "init: --tokenizer ", dir.string(),
                 ": no tokenizer.json there; point it at a Hugging Face model or tokenizer "
                 "directory");
      const Tokenizer tok = Tokenizer::load(dir);
      size_vocab_for_tokenizer(cfg, tok, dir, o->config);
      take_special_ids(cfg, tok);
    }
    ModelLayout layout = ModelLayout::build(cfg);
    ParamStore store(state_units(layout));  // reuses the trainer's memory type; m/v stay untouched
    for (int u = 0; u < store.n_units(); ++u)
      init_unit(layout.units[size_t(u)], store.master(u), o->seed);
    SaveModelOptions so;
    so.dtype = parse_save_dtype(o->dtype);
    so.tokenizer_dir = o->tokenizer;
    std::vector<const float*> w;
    for (int u = 0; u < store.n_units(); ++u) w.push_back(store.master(u));
    save_model_dir(o->out, cfg, layout, w, so);
    std::cout << "wrote " << o->out << ": " << arch_name(cfg.arch) << ", "
              << double(cfg.num_parameters()) / 1e6 << "M parameters\n";
  });
}

void RunFlags::add_to(CLI::App* cmd, bool with_accum) {
  // The second names are Hugging Face TrainingArguments' spellings.
  cmd->add_option("--batch-size,--per-device-train-batch-size", batch_size,
                  "sequences per micro-batch");
  cmd->add_option("--seq-len,--max-seq-length", seq_len, "tokens per sequence");
  if (with_accum)
    cmd->add_option("--grad-accum,--gradient-accumulation-steps", grad_accum,
                    "micro-batches per optimizer step");
  cmd->add_option("--backend", req.backend, "auto, host or cuda");
  cmd->add_option("--engine", req.engine, "auto, resident or sliding");
  cmd->add_option("--device-adamw-layers", req.device_adamw_layers,
                  "sliding window: the first layers whose AdamW runs on the GPU (auto or a count)");
  cmd->add_option("--gpu-memory", req.gpu_memory, "device memory budget, e.g. 24GiB");
  cmd->add_option("--host-memory", req.host_memory, "host memory budget, e.g. 100GiB");
  cmd->add_option("--optimizer-dir", req.optimizer_dir,
                  "a directory on a fast disk (NVMe) for the AdamW moments (and a bf16 master, with clipping) when RAM is short");
}

const char* const kCheckpointEveryHelp =
    "sliding window: save every layer's input for the backward (1), every 2nd's or every 3rd's "
    "(less host memory; the backward replays the forward of the others, +12.5% or +17% compute), "
    "or auto (the planner's choice)";

void RunFlags::add_deterministic_to(CLI::App* cmd) {
  cmd->add_flag("--deterministic", req.deterministic,
                "attention backwards that give the same bits every call (slower on Hopper from 2K "
                "tokens per sequence); default: the fastest");
}

void RunFlags::add_checkpoint_every_to(CLI::App* cmd) {
  cmd->add_option("--checkpoint-every", req.checkpoint_every, kCheckpointEveryHelp);
}

const char* const kOptimizerStateHelp =
    "how the AdamW moments m, v are kept in host memory: fp32 (8 B/param), bf16 (4) or int8 "
    "(block-wise codes with scales, about 2; norms and biases stay fp32)";
const char* const kMasterWeightsHelp =
    "how the master weights are kept in host memory: fp32 (4 B/param) or bf16 (2, updated "
    "with stochastic rounding)";

StateFormat parse_state_format(const std::string& optimizer_state, const std::string& master_weights) {
  const auto moments = parse_moment_format(optimizer_state);
  SF_REQUIRE(moments, "--optimizer-state \"", optimizer_state,
             "\" is unknown; use fp32, bf16 or int8");
  const auto master = parse_master_format(master_weights);
  SF_REQUIRE(master, "--master-weights \"", master_weights, "\" is unknown; use fp32 or bf16");
  return {*moments, *master};
}

void RunFlags::add_state_format_to(CLI::App* cmd) {
  cmd->add_option("--optimizer-state", optimizer_state, kOptimizerStateHelp);
  cmd->add_option("--master-weights", master_weights, kMasterWeightsHelp);
}

void RunFlags::check() const {
  // Parsed here even where unused (--gpu-memory on the host backend): no value is ignored.
  if (!req.gpu_memory.empty()) (void)parse_bytes(req.gpu_memory, "--gpu-memory");
  if (!req.host_memory.empty()) (void)parse_bytes(req.host_memory, "--host-memory");
  SF_REQUIRE(!(req.backend == "host" && !req.gpu_memory.empty()), "--gpu-memory ", req.gpu_memory,
             " does not apply with --backend host: the host backend runs in host RAM, whose "
             "budget is --host-memory; drop --gpu-memory, or drop --backend host to use a GPU");
}

// "backend    host (auto: no CUDA device found)", and the note of a flag it does not use.
std::string backend_lines(const PlannedRun& r) {
  std::string s = cat("backend    ", r.backend == BackendKind::cuda ? "cuda" : "host", " (",
                      r.backend_reason, ")\n");
  if (!r.note.empty()) s += r.note + "\n";
  return s;
}

// `plan --gpus N` (docs/MULTI_GPU.md): each rank's plan for its share of the global batch,
// within one GPU's budget less NCCL's buffers and the host's share left after one shared copy
// of the state (planned again while the ranks' buffers, N times over, do not fit), then the
// N-GPU prediction.
static void print_multi_gpu_plan(const ModelConfig& cfg, const RunFlags& flags, int gpus,
                                 const std::string& link) {
  SF_REQUIRE(flags.batch_size % gpus == 0, "--batch-size ", flags.batch_size, " does not split over --gpus ",
             gpus, ": --batch-size is the global batch (each GPU takes batch / gpus sequences); use a "
             "multiple of ", gpus, ", e.g. --batch-size ", (flags.batch_size / gpus + 1) * gpus);
  MultiGpuRequest mreq;
  mreq.gpus = gpus;
  mreq.link = parse_gpu_link(link.empty() ? std::string("nvlink") : link);
  ExecutorRequest req = flags.req;
  req.step.micro_tokens = int64_t(flags.batch_size / gpus) * flags.seq_len;
  if (gpus > 1) mreq.one_gpu_step_seconds = plan_run(cfg, req).plan.step_seconds;  // what one GPU runs alone
  req.step.data_parallel_ranks = gpus;
  PlannedRun r = plan_run(cfg, req);
  SF_REQUIRE(r.backend == BackendKind::cuda, "--gpus ", gpus, " plans several GPUs but the backend is the host's (",
             r.backend_reason, "): add --backend cuda (with --gpu-memory on a machine without those GPUs)");
  const size_t host = r.budget.host_bytes, device = r.budget.device_bytes;
  SF_REQUIRE(device > mreq.nccl_device_bytes, "--gpu-memory ", format_bytes(device), " leaves nothing beside NCCL's ",
             format_bytes(mreq.nccl_device_bytes), " per GPU: raise --gpu-memory");
  const double rank_tokens = double(req.step.micro_tokens) * req.step.grad_accum;
  MultiGpuPlan m;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const size_t share = rank_host_budget(r.plan, host, gpus);
    if (share == 0) break;  // the shared state alone exceeds the host: m says so
    req.gpu_memory = std::to_string(device - mreq.nccl_device_bytes);
    req.host_memory = std::to_string(share);
    r = plan_run(cfg, req);
    m = predict_multi_gpu(cfg, r.plan, rank_tokens, host, device, mreq);
    if (m.host_bytes <= host) break;
  }
  if (m.gpus != gpus) m = predict_multi_gpu(cfg, r.plan, rank_tokens, host, device, mreq);
  std::cout << backend_lines(r) << describe_plan(cfg, r.plan_request, r.budget, r.plan)
            << describe_multi_gpu(m, r.plan);
  if (!m.fits) throw Error(ErrorKind::input, cat("the run does not fit on ", gpus, " GPUs (see above)"));
}

void add_plan_command(CLI::App& app) {
  struct Opts : RunFlags {
    std::string model, size = "llama3-8b";
    int layers = 0;  // 0: the model's
    float max_grad_norm = 1.0f;
    int gpus = 1;
    std::string gpu_link;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("plan", "show what a training run needs and whether it fits");
  cmd->add_option("--max-grad-norm", o->max_grad_norm,
                  "the run's global-norm clipping (0: off; then the plan may apply each gradient "
                  "as it lands, with no host copy of the weights)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--model", o->model, "Hugging Face model directory");
  cmd->add_option("--size", o->size, "named model shape (when no --model)");
  cmd->add_option("--layers", o->layers, "plan the model cut to this many layers (as bench does)")
      ->check(CLI::Validator(
          [](std::string& v) {
            return std::atoi(v.c_str()) > 0 ? std::string()
                                            : std::string("must be a positive number of layers, e.g. --layers 8");
          },
          "POSITIVE"));
  o->add_to(cmd);
  o->add_state_format_to(cmd);
  o->add_deterministic_to(cmd);
  o->add_checkpoint_every_to(cmd);
  cmd->add_option("--disk-speed", o->req.disk_speed,
                  "plan for --optimizer-dir on a disk of this read + write rate instead of measuring "
                  "it, e.g. 7GB/s (another machine's NVMe)");
  cmd->add_option("--gpus", o->gpus,
                  "plan N data-parallel GPUs of one host (docs/MULTI_GPU.md): --batch-size is then the "
                  "global batch, split over the GPUs; the prediction, not yet a training mode")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--gpu-link", o->gpu_link,
                  "with --gpus: how the GPUs exchange gradients, nvlink (default) or pcie");
  cmd->add_option("--disk-free", o->req.disk_free,
                  "plan with this much free space in --optimizer-dir instead of asking its filesystem, "
                  "e.g. 2TB (then the directory need not exist here)");
  cmd->callback([o] {
    ModelConfig cfg = o->model.empty() ? model_preset(o->size)
                                       : load_config(fs::path(o->model) / "config.json");
    if (o->layers > 0) cfg.num_hidden_layers = o->layers;
    o->resolve();
    o->req.step.clipping = o->max_grad_norm > 0;
    o->req.plan_only = true;
    if (o->gpus > 1) return print_multi_gpu_plan(cfg, *o, o->gpus, o->gpu_link);
    SF_REQUIRE(o->gpu_link.empty(), "--gpu-link ", o->gpu_link, " describes how several GPUs exchange "
               "gradients: it needs --gpus 2 or more");
    PlannedRun r = plan_run(cfg, o->req);
    std::cout << backend_lines(r) << describe_plan(cfg, r.plan_request, r.budget, r.plan);
    if (!r.plan.fits) throw Error(ErrorKind::input, "the run does not fit (see above)");
  });
}

// RoPE and context as the model computes them, e.g. "RoPE yarn, theta 1000000, factor 4
// (from 32768), beta_fast 32, beta_slow 1, attention x1.139; max 131072; sliding window 4096".
static std::string rope_summary(const ModelConfig& c) {
  std::ostringstream o;
  o << std::setprecision(10) << std::defaultfloat << "RoPE " << rope_type_name(c.rope_scaling.type) << ", theta "
    << c.rope_theta;
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type != RopeScaling::Type::none) o << ", factor " << rs.factor;
  if (rs.type == RopeScaling::Type::llama3 || rs.type == RopeScaling::Type::yarn)
    o << " (from " << rs.original_max_position_embeddings << ")";
  if (rs.type == RopeScaling::Type::llama3)
    o << ", low_freq_factor " << rs.low_freq_factor << ", high_freq_factor " << rs.high_freq_factor;
  if (rs.type == RopeScaling::Type::yarn)  // absent betas are transformers' 32 and 1
    o << ", beta_fast " << rs.beta_fast.value_or(32.0) << ", beta_slow " << rs.beta_slow.value_or(1.0);
  if (double a = rope_attention_scaling(c); a != 1.0) o << ", attention x" << std::setprecision(4) << a;
  o << "; max " << c.max_position_embeddings;
  if (c.sliding_window) o << "; sliding window " << c.sliding_window;
  return o.str();
}

// The weights' headers, opened and validated (a truncated file is an error naming the file
// and the tensor): "dtype          bf16 (config.json) ...\nweights        ...".
static std::string weights_summary(const fs::path& dir, const ModelConfig& c) {
  std::ostringstream o;
  o << "dtype          " << dtype_name(c.torch_dtype) << " (config.json)";
  std::error_code ec;
  if (!fs::exists(dir / "model.safetensors", ec) &&
      !fs::exists(dir / "model.safetensors.index.json", ec)) {
    o << "\nweights        none (no model.safetensors or model.safetensors.index.json in "
      << dir.string() << ")\n";
    return o.str();
  }
  SafetensorsModel m(dir);
  std::map<std::string, int64_t> tensors_of;  // safetensors dtype -> tensors
  uint64_t bytes = 0;
  for (const SafetensorsFile& f : m.files())
    for (const TensorInfo& t : f.tensors()) {
      ++tensors_of[std::string(st_dtype_name(t.dtype))];
      bytes += t.bytes();
    }
  std::string kinds;
  for (auto& [k, n] : tensors_of) kinds += (kinds.empty() ? "" : ", ") + k + " " + std::to_string(n);
  o << ", in the files: " << kinds << " tensors\n"
    << "weights        " << m.size() << " tensors, " << std::setprecision(2)
    << double(bytes) / double(1 << 30) << " GiB in " << m.files().size()
    << (m.sharded() ? " shards" : " file") << " (" << (m.sharded() ? "model.safetensors.index.json" : "model.safetensors")
    << "; headers checked)\n";
  return o.str();
}

// The training state's host bytes in each --master-weights / --optimizer-state mode, from
// the layout's units (unit_state_bytes: padding, int8 scales and fp32 small ranges counted).
static std::string state_size_lines(const ModelConfig& c) {
  const std::vector<StateUnit> units = state_units(ModelLayout::build(c));
  const double params = double(c.num_parameters());
  std::ostringstream o;
  o << std::fixed;
  const char* label = "state per mode ";
  for (MasterFormat w : {MasterFormat::f32, MasterFormat::bf16})
    for (MomentFormat m : {MomentFormat::f32, MomentFormat::bf16, MomentFormat::int8}) {
      size_t bytes = 0;
      for (const StateUnit& u : units) bytes += unit_state_bytes(u, {m, w});
      o << label << "--master-weights " << master_format_name(w) << " --optimizer-state "
        << std::left << std::setw(4) << moment_format_name(m) << std::right << "  "
        << std::setprecision(2) << double(bytes) / params << " B/param, "
        << double(bytes) / double(1 << 30) << " GiB\n";
      label = "               ";
    }
  return o.str();
}

void add_info_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("info", "describe a model directory");
  cmd->add_option("--model", *dir, "Hugging Face model directory")->required();
  cmd->callback([dir] {
    ModelConfig c = load_config(fs::path(*dir) / "config.json");
    const std::string weights = weights_summary(fs::path(*dir), c);  // may refuse: before any output
    int64_t n = c.num_parameters();
    std::cout << "architecture   " << arch_name(c.arch) << "\n"
              << "parameters     " << n << " (" << std::fixed << std::setprecision(2)
              << double(n) / 1e9 << " B)\n"
              << "layers         " << c.num_hidden_layers << "\n"
              << "hidden         " << c.hidden_size << ", ffn " << c.intermediate_size << "\n"
              << "heads          " << c.num_attention_heads << " q, " << c.num_key_value_heads
              << " kv, head_dim " << c.head_dim << "\n"
              << "vocab          " << c.vocab_size << (c.tie_word_embeddings ? " (tied)" : "")
              << "\n"
              << "positions      " << rope_summary(c) << "\n"
              << "context        " << c.max_position_embeddings
              << " tokens (max_position_embeddings)\n"
              << weights
              << "training state " << double(n) * 12 / double(1 << 30)
              << " GiB host (fp32 master + AdamW m, v; with --optimizer-dir "
              << double(n) * 4 / double(1 << 30) << " GiB host + " << double(n) * 8 / double(1 << 30)
              << " GiB on disk)\n"
              << state_size_lines(c);
  });
}

}  // namespace sf::cli
