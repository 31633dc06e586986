// Weights into a ParamStore (see store_weights.h).
#include "train/store_weights.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "model/model_init.h"

namespace sf {

namespace {

bool fp32_master(const ParamStore& s) { return s.format().master == MasterFormat::f32; }

// Scratch for the largest unit.
std::vector<float> unit_scratch(const ParamStore& store) {
  int64_t n = 0;
  for (int u = 0; u < store.n_units(); ++u) n = std::max(n, store.numel(u));
  return std::vector<float>(size_t(n));
}

}  // namespace

void init_store_weights(const ModelLayout& layout, ParamStore& store, uint64_t seed) {
  SF_CHECK(int(layout.units.size()) == store.n_units(), "layout and store disagree");
  if (fp32_master(store)) {
    for (int u = 0; u < store.n_units(); ++u) init_unit(layout.units[size_t(u)], store.master(u), seed);
    return;
  }
  std::vector<float> w = unit_scratch(store);
  for (int u = 0; u < store.n_units(); ++u) {
    init_unit(layout.units[size_t(u)], w.data(), seed);
    store.write_master_f32(u, w.data());
  }
}

WeightsLoadInfo load_store_weights(const std::filesystem::path& dir, const ModelConfig& c,
                                   const ModelLayout& layout, ParamStore& store) {
  SF_CHECK(int(layout.units.size()) == store.n_units(), "layout and store disagree");
  if (fp32_master(store)) return load_model_weights(dir, c, layout, store.master_ptrs());
  std::vector<float> w = unit_scratch(store);
  return load_model_weights(
      dir, c, layout, [&](size_t) { return w.data(); },
      [&](size_t u) { store.write_master_f32(int(u), w.data()); });
}

}  // namespace sf
