// ParamStore over memory from outside (ExternalStateMemory: the data-parallel ranks' one state):
// two stores carved from the same bytes see each other's writes in every array and format,
// allocate nothing of their own, stay inside external_bytes, leave the memory alone when they
// go, and refuse a moments directory and too little memory.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "model/model_init.h"
#include "model/param_layout.h"
#include "optim/param_store.h"

using namespace sf;

namespace {

std::vector<StateUnit> units() { return state_units(ModelLayout::build(tiny_config(Arch::llama))); }

TEST(ParamStoreExternal, TwoStoresOverOneMemoryShareTheState) {
  for (StateFormat f : {StateFormat{}, StateFormat{MomentFormat::bf16, MasterFormat::f32},
                        StateFormat{MomentFormat::int8, MasterFormat::bf16}}) {
    SCOPED_TRACE(cat(moment_format_name(f.moments), " moments, ", master_format_name(f.master), " master"));
    const size_t bytes = ParamStore::external_bytes(units(), f);
    HostArray mem(bytes + 4096, "test");  // a guard page's worth after the state
    std::memset(static_cast<char*>(mem.data()) + bytes, 0x5a, 4096);
    {
      ParamStore a(units(), f, "", false, {}, {mem.data(), bytes});
      ParamStore b(units(), f, "", false, {}, {mem.data(), bytes});
      for (int u = 0; u < a.n_units(); ++u) {
        const UnitStateView x = a.state(u), y = b.state(u);
        EXPECT_EQ(x.master, y.master) << "unit " << u;
        EXPECT_EQ(x.m, y.m) << "unit " << u;
        EXPECT_EQ(x.v, y.v) << "unit " << u;
        EXPECT_EQ(x.m_scale, y.m_scale) << "unit " << u;
        const char* lo = static_cast<const char*>(mem.data());
        for (const void* p : {x.master, x.m, x.v})
          EXPECT_TRUE(p >= lo && p < lo + bytes) << "unit " << u << ": outside the memory";
        // Written through one store, read through the other.
        std::vector<float> w(size_t(a.numel(u)));
        for (size_t i = 0; i < w.size(); ++i) w[i] = float(i % 97) * 0.25f - float(u);
        a.write_master_f32(u, w.data());
        std::vector<float> got(w.size());
        b.read_master_f32(u, got.data());
        EXPECT_EQ(std::memcmp(w.data(), got.data(), w.size() * 4), 0) << "unit " << u;
        std::memset(x.m, 0x11, a.layout(u).moment_bytes);
        EXPECT_EQ(static_cast<const unsigned char*>(y.m)[a.layout(u).moment_bytes - 1], 0x11) << "unit " << u;
      }
      EXPECT_FALSE(a.moments_on_disk());
    }
    // The stores are gone, the memory is still there (not unmapped) and nothing past the state
    // was written.
    for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(static_cast<unsigned char*>(mem.data())[bytes + i], 0x5a) << i;
  }
}

TEST(ParamStoreExternal, RefusesAMomentsDirectoryAndTooLittleMemory) {
  const size_t bytes = ParamStore::external_bytes(units());
  HostArray mem(bytes, "test");
  try {
    ParamStore s(units(), StateFormat{}, "/tmp", false, {}, {mem.data(), bytes});
    ADD_FAILURE() << "a moments directory with external memory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--optimizer-dir"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ParamStore(units(), StateFormat{}, "", false, {}, {mem.data(), bytes - 4096}), Error);
}

}  // namespace
