#include "generate/model_runtime.h"

#include <iomanip>
#include <sstream>

#include "backend/host/host_backend.h"
#include "core/error.h"
#include "model/weights_io.h"
#if SF_WITH_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#endif

namespace sf {

namespace {

int cuda_devices() {
#if SF_WITH_CUDA
  return CudaBackend::device_count();
#else
  return 0;
#endif
}

// Free device memory of the backend's GPU (0 where unknown).
size_t device_free_bytes(Backend& be) {
#if SF_WITH_CUDA
  if (be.kind() != BackendKind::cuda) return 0;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
  return free_b;
#else
  (void)be;
  return 0;
#endif
}

std::string gib(size_t b) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(2) << double(b) / double(size_t(1) << 30) << " GiB";
  return o.str();
}

}  // namespace

BackendChoice make_inference_backend(const std::string& name) {
  SF_REQUIRE(name == "auto" || name == "host" || name == "cuda", "--backend \"", name,
             "\" is unknown; use auto, host or cuda");
  BackendChoice c;
  if (name == "cuda" || (name == "auto" && cuda_devices() > 0)) {
#if SF_WITH_CUDA
    SF_REQUIRE(cuda_devices() > 0, "--backend cuda: no CUDA device is visible (check "
               "nvidia-smi and CUDA_VISIBLE_DEVICES), or use --backend host");
    c.backend = std::make_unique<CudaBackend>(0);
    c.reason = name == "cuda" ? "--backend cuda" : "auto: a CUDA device was found";
    return c;
#else
    SF_FAIL(input, "--backend cuda: this build has no CUDA backend (rebuild with nvcc "
            "installed), or use --backend host");
#endif
  }
  c.backend = std::make_unique<HostBackend>();
#if SF_WITH_CUDA
  c.reason = name == "host" ? "--backend host" : "auto: no CUDA device found";
#else
  c.reason = name == "host" ? "--backend host" : "auto: this build has no CUDA backend";
#endif
  return c;
}

PlacementChoice choose_placement(Backend& be, const ModelConfig& cfg, DecoderOptions opt,
                                 const std::string& name) {
  SF_REQUIRE(name == "auto" || name == "resident" || name == "streamed", "--weights \"", name,
             "\" is unknown; use auto, resident or streamed");
  PlacementChoice c;
  opt.placement = WeightPlacement::placement_resident;
  const size_t resident = Decoder::device_bytes(cfg, opt, be.compute_dtype());
  opt.placement = WeightPlacement::placement_streamed;
  const size_t streamed = Decoder::device_bytes(cfg, opt, be.compute_dtype());
  if (name != "auto") {
    c.placement = name == "resident" ? WeightPlacement::placement_resident
                                     : WeightPlacement::placement_streamed;
    c.reason = cat(name, " (--weights ", name, "): ",
                   gib(name == "resident" ? resident : streamed), " on the ", be.name());
    return c;
  }
  const size_t free_b = device_free_bytes(be);
  // Leave room for the CUDA context's growth and the libraries' workspaces.
  const size_t margin = size_t(1) << 30;
  if (be.kind() == BackendKind::host || resident + margin <= free_b) {
    c.reason = be.kind() == BackendKind::host
                   ? cat("resident (host memory): ", gib(resident))
                   : cat("resident: ", gib(resident), " of ", gib(free_b), " free");
    return c;
  }
  c.placement = WeightPlacement::placement_streamed;
  c.reason = cat("streamed: every weight on the device needs ", gib(resident), ", ",
                 gib(free_b), " is free; layers are copied in as they run (", gib(streamed),
                 " on the device)");
  return c;
}

std::unique_ptr<Decoder> load_decoder(Backend& be, const std::filesystem::path& dir,
                                      const ModelConfig& cfg, const DecoderOptions& opt) {
  auto d = std::make_unique<Decoder>(be, cfg, opt);
  std::vector<std::vector<float>> fp32(size_t(d->n_units()));
  std::vector<float*> ptrs;
  for (int u = 0; u < d->n_units(); ++u) {
    fp32[size_t(u)].resize(size_t(d->layout().units[size_t(u)].numel));
    ptrs.push_back(fp32[size_t(u)].data());
  }
  load_model_weights(dir, cfg, d->layout(), ptrs);
  for (int u = 0; u < d->n_units(); ++u) {
    d->set_unit_weights(u, ptrs[size_t(u)]);
    std::vector<float>().swap(fp32[size_t(u)]);  // the fp32 copy of a unit is done with
  }
  return d;
}

}  // namespace sf
