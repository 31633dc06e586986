// A model's weights into a ParamStore of any state format (optim/param_store.h): a random
// initialisation or a Hugging Face model directory. An fp32 master is written in place; any
// other master through an fp32 scratch of one unit at a time (write_master_f32), so loading
// an 8B model into a bf16 master never holds an fp32 copy of the whole model.
// Both OVERWRITE every unit's master (padding zero); the moments are left as they are.
#pragma once
#include <cstdint>
#include <filesystem>

#include "io/model_config.h"
#include "model/param_layout.h"
#include "model/weights_io.h"
#include "optim/param_store.h"

namespace sf {

// init_unit (model/model_init.h) of every unit with `seed`.
void init_store_weights(const ModelLayout& layout, ParamStore& store, uint64_t seed);

// load_model_weights (model/weights_io.h) of dir into the store, with its checks and errors.
WeightsLoadInfo load_store_weights(const std::filesystem::path& dir, const ModelConfig& c,
                                   const ModelLayout& layout, ParamStore& store);

}  // namespace sf
