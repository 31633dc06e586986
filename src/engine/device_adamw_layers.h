// The device-AdamW layers (EngineConfig::device_adamw_layers): the first layers keep their
// fp32 master, m and v on the device and run AdamW there, on the update thread's stream,
// from the f32 accumulator grads_out left the gradient in, with new compute-dtype weights
// straight into their resident homes. The host ParamStore's copy of their state is behind
// after each such update until params() brings it home.
#pragma once
#include "engine/unit_homes.h"
#include "engine/window_context.h"
#include "optim/adamw_step.h"

namespace sf {

class DeviceAdamWLayers {
 public:
  DeviceAdamWLayers(WindowContext& w, UnitHomes& homes) : w_(w), homes_(homes) {}
  // Unit u's fp32 master on the device (an fp32 compute dtype reads its weights there; with a
  // bf16 master it reads its home, which each update refreshes).
  float* master(int u) const;
  // Its AdamW on upd_h2d, after its gradient is home and before its next load.
  void adamw(int u, const AdamWStep& s);
  void bring_home_if_stale();  // params(): the host store becomes current
  void host_is_truth();        // params_changed(): the host store's state goes to the device

 private:
  // Every device-AdamW layer's state to or from the host store, synchronously.
  enum class Copy : uint8_t { to_host, to_device };
  void copy_state(Copy direction);
  UnitStateView compact_view(int u) const;  // a compact state's buffer (engine/device_state.h)
  void adamw_fp32(Stream& st, int u, float* p, float* m, float* v, const float* g, char* out,
                  const AdamWStep& s);

  WindowContext& w_;
  UnitHomes& homes_;
  bool host_stale_ = false;
};

}  // namespace sf
