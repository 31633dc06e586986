#include "engine/device_state.h"

namespace sf {

namespace {
size_t align256(size_t b) { return (b + 255) / 256 * 256; }
}  // namespace

DeviceStateParts device_state_parts(const UnitStateLayout& l) {
  DeviceStateParts p;
  const size_t scales = size_t(l.scale_count) * 4;
  p.m = align256(l.master_bytes);
  p.v = p.m + align256(l.moment_bytes);
  p.m_scale = p.v + align256(l.moment_bytes);
  p.v_scale = p.m_scale + align256(scales);
  p.bytes = p.v_scale + align256(scales);
  return p;
}

UnitStateView device_state_view(void* base, const UnitStateLayout& l, uint64_t rounding_seed,
                                int32_t unit) {
  const DeviceStateParts p = device_state_parts(l);
  char* b = static_cast<char*>(base);
  const bool scales = l.scale_count > 0;
  return UnitStateView{l.format, &l, b + p.master, b + p.m, b + p.v,
                       scales ? reinterpret_cast<float*>(b + p.m_scale) : nullptr,
                       scales ? reinterpret_cast<float*>(b + p.v_scale) : nullptr, rounding_seed, unit};
}

void copy_state(Backend& be, Stream& s, const UnitStateView& host, void* device_base, StateCopy dir) {
  const UnitStateLayout& l = *host.layout;
  const UnitStateView d = device_state_view(device_base, l, host.rounding_seed, host.unit);
  const size_t scales = size_t(l.scale_count) * 4;
  const std::pair<void*, void*> parts[] = {{host.master, d.master}, {host.m, d.m}, {host.v, d.v},
                                           {host.m_scale, d.m_scale}, {host.v_scale, d.v_scale}};
  const size_t sizes[] = {l.master_bytes, l.moment_bytes, l.moment_bytes, scales, scales};
  for (int i = 0; i < 5; ++i) {
    if (sizes[i] == 0) continue;
    if (dir == StateCopy::to_device) be.copy_to_device(s, parts[i].second, parts[i].first, sizes[i]);
    else be.copy_to_host(s, parts[i].first, parts[i].second, sizes[i]);
  }
}

}  // namespace sf
