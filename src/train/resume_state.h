// The resume files of a checkpoint (<checkpoint>/resume/): the ParamStore's state AS IT IS
// in its StateFormat, one tensor per layout unit ("embedding", "layers.<i>", "head"):
//   master.safetensors   F32 [numel] (fp32 master) or BF16 [numel] (bf16 master)
//   adam_m.safetensors   F32 [numel], BF16 [numel], or int8: U8 [moment_bytes] (the unit's
//   adam_v.safetensors   packed codes and fp32 small ranges, optim/state_format.h) plus
//                        "<unit>.scale" F32 [scale_count] (one absmax per block)
// Each file's metadata names the format ("master_weights", "optimizer_state") and the int8
// block grid ("state_block", "int8_min_numel"), so the files describe themselves; files
// without them are the fp32 resume files of checkpoints before compact formats.
//
// Loading overwrites the store: bytes copied as they are when the checkpoint's format is the
// store's (a bit-exact resume), else converted unit by unit (state_to_f32 in the
// checkpoint's format, state_from_f32 in the store's).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "model/param_layout.h"
#include "optim/param_store.h"

namespace sf {

// "embedding", "layers.<i>", "head": unit u's tensor name in the resume files.
std::string resume_unit_name(const ModelLayout& layout, int u);

// Calls fn(off, len) for windows of about `chunk` (>= 2 * kStateBlock) elements that cover
// every range of `unit` in order, each inside one range and splitting no int8 block
// (state_format.h's grid: absolute multiples of kStateBlock, or whole rows of a row > 0
// range): the windows state_to_f32 / state_from_f32 take, for converting a unit piecewise.
void for_each_state_window(const StateUnit& unit, int64_t chunk,
                           const std::function<void(int64_t off, int64_t len)>& fn);

// Writes master, m and v of every unit of `store` into dir (resume/), recording `step`.
void write_resume_tensors(const std::filesystem::path& dir, const ModelLayout& layout,
                          const ParamStore& store, int64_t step);

// The StateFormat the resume files of checkpoint `dir` were written in (fp32 for files
// without a format: checkpoints before compact formats). Error(input) naming the file when
// they are missing or name an unknown format.
StateFormat resume_state_format(const std::filesystem::path& dir);

// Fills store's state of every unit from dir/resume/*.safetensors after checking every
// tensor's name, dtype and size against `layout` and the files' format; converts when that
// format is not store.format(). Returns the checkpoint's format.
StateFormat load_resume_tensors(const std::filesystem::path& dir, const ModelLayout& layout,
                                ParamStore& store);

}  // namespace sf
