// What `generate` and `chat` set up before the first token: the backend ("auto": CUDA when
// this build has it and a device is visible, else host), where the weights go (resident when
// the decoder's memory fits the device, else streamed layer by layer), and a Decoder loaded
// from a Hugging Face model directory.
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "generate/decoder.h"

namespace sf {

struct BackendChoice {
  std::unique_ptr<Backend> backend;
  std::string reason;  // e.g. "auto: a CUDA device was found"
};
// name: auto | host | cuda. Throws Error(input) for cuda without a device or CUDA build.
BackendChoice make_inference_backend(const std::string& name);

struct PlacementChoice {
  WeightPlacement placement = WeightPlacement::placement_resident;
  std::string reason;  // e.g. "resident: 0.29 GiB of 139.1 GiB free"
};
// name: auto | resident | streamed. auto: resident unless the decoder's memory (with every
// weight on the device) exceeds the device's free memory less a margin; the host backend's
// memory is the host's, so auto is resident there.
PlacementChoice choose_placement(Backend& be, const ModelConfig& cfg, DecoderOptions opt,
                                 const std::string& name);

// A Decoder for the model in `dir` (config.json, safetensors) on `be`, weights loaded.
std::unique_ptr<Decoder> load_decoder(Backend& be, const std::filesystem::path& dir,
                                      const ModelConfig& cfg, const DecoderOptions& opt);

}  // namespace sf
