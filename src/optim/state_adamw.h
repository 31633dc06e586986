// AdamW on compact optimizer state (state_format.h): the front end over the per-ISA kernels
// of state_kernels.h. Updates master, m, v (and int8 scales) in place (overwrite) and,
// optionally, writes the next step's bf16 weights (overwrite). Arithmetic per element is
// adamw.h's, in fp32 on the decoded values, then encoded back (state_format.h); scalar, AVX2
// and AVX-512 give identical bits, independent of the thread count.
//
// Windows: [off, off + len) of the unit, with `ranges` the unit's FULL ranges (each must be
// one of the layout's; the function clips them to the window). Elements outside the ranges
// are not touched. For int8 moments a window must split no block (state_format.h's grid):
// callers update windows whose ends are multiples of kStateBlock from the unit start (or the
// unit's end), or whole rows of a row > 0 range; a window that splits a block throws
// Error(internal).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "optim/adamw_step.h"
#include "optim/cpu_isa.h"
#include "optim/param_range.h"
#include "optim/state_format.h"

namespace sf {

class ThreadPool;

// One AdamW step on the window. grad and bf16_out point at the window's first element (like
// adamw_update_ranges' arguments after `+ off`). bf16_out may be null, and may alias a bf16
// grad exactly (element i is read before it is written). With master bf16, bf16_out (if
// given) receives the new master bits; with master fp32, round_bf16 of the new master.
// StateFormat{} (fp32/fp32) gives exactly the bits of adamw_update_ranges (it runs it).
void adamw_update_state(const UnitStateView& state, int64_t off, int64_t len,
                        const float* grad, uint16_t* bf16_out,
                        std::span<const ParamRange> ranges, const AdamWStep& s,
                        ThreadPool* pool, CpuIsa isa = CpuIsa::automatic);
void adamw_update_state(const UnitStateView& state, int64_t off, int64_t len,
                        const uint16_t* grad_bf16, uint16_t* bf16_out,
                        std::span<const ParamRange> ranges, const AdamWStep& s,
                        ThreadPool* pool, CpuIsa isa = CpuIsa::automatic);

// The bf16 weights adamw_update_state would write to bf16_out (the same bits), with the state
// left as it is: a speculative update of a compact state, whose clipped or skipped step then
// needs no undo (the state was never changed) and whose kept step commits the state with
// adamw_update_state later. Compact formats only (fp32 has an exact undo instead).
void adamw_weights_of_update(const UnitStateView& state, int64_t off, int64_t len,
                             const uint16_t* grad_bf16, uint16_t* bf16_out,
                             std::span<const ParamRange> ranges, const AdamWStep& s,
                             ThreadPool* pool, CpuIsa isa = CpuIsa::automatic);

// Decode / encode the window to / from fp32 (checkpoint conversion, tests, GPU upload of
// device-AdamW layers): master, m, v are window-sized fp32 arrays (any may be null = skip);
// only elements inside `ranges` are read or written. Encoding rounds a bf16 master to nearest
// even (not stochastically: a conversion, not a step), bf16 moments likewise, and int8
// moments per block (so the window must split no block, as above).
void state_to_f32(const UnitStateView& state, int64_t off, int64_t len, float* master,
                  float* m, float* v, std::span<const ParamRange> ranges);
void state_from_f32(const UnitStateView& state, int64_t off, int64_t len, const float* master,
                    const float* m, const float* v, std::span<const ParamRange> ranges);

// The part [begin, end) (unit indices) of one layout range inside a window.
struct StatePiece {
  const RangeStateLayout* range;
  int64_t begin, end;
};
// The window's pieces of `ranges` (the unit's full ranges, each one of the layout's), in
// order, after the checks adamw_update_state makes (window inside the unit, no int8 block
// split; throws Error(internal) naming the unit otherwise). For other executors of the same
// update (the CUDA backend).
std::vector<StatePiece> state_window_pieces(const UnitStateView& state, int64_t off,
                                            int64_t len, std::span<const ParamRange> ranges);

}  // namespace sf
