// One unit's compact optimizer state (optim/state_format.h) in one backend buffer: master,
// m, v and the int8 scales one after another, each part 256-byte aligned (the CUDA backend's
// allocation granule, so every part is as aligned as a buffer of its own). The device-resident
// executor and the sliding window's device-AdamW layers keep their state this way; the host
// ParamStore holds the same bytes part by part, so the trips are plain copies.
#pragma once
#include <cstddef>

#include "backend/backend.h"
#include "optim/state_format.h"

namespace sf {

struct DeviceStateParts {
  size_t master = 0, m = 0, v = 0, m_scale = 0, v_scale = 0;  // byte offsets
  size_t bytes = 0;                                            // the buffer's size
};

DeviceStateParts device_state_parts(const UnitStateLayout& l);

// The view of a buffer laid out by device_state_parts (pointers into backend memory).
UnitStateView device_state_view(void* base, const UnitStateLayout& l, uint64_t rounding_seed,
                                int32_t unit);

// Copies between a host view (ParamStore::state) and a device buffer, on stream s (the caller
// synchronises). Both views must share the layout.
enum class StateCopy : uint8_t { to_device, to_host };
void copy_state(Backend& be, Stream& s, const UnitStateView& host, void* device_base, StateCopy dir);

}  // namespace sf
