// CPU feature detection for the optimizer kernels and the SF_ADAMW_ISA override.
#include "optim/cpu_isa.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace sf {

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::automatic: return "automatic";
    case CpuIsa::scalar: return "scalar";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
  }
  return "?";
}

CpuIsa parse_cpu_isa(std::string_view s) {
  for (CpuIsa isa : {CpuIsa::automatic, CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512})
    if (s == cpu_isa_name(isa)) return isa;
  SF_REQUIRE(false, "unknown CPU ISA '", s,
             "': use one of scalar, avx2, avx512 (or automatic for the best this CPU has)");
  return CpuIsa::scalar;
}

bool cpu_isa_supported(CpuIsa isa) {
  // libgcc's checks include the OS (XCR0) enabling the AVX / AVX-512 register state.
  __builtin_cpu_init();
  switch (isa) {
    case CpuIsa::automatic:
    case CpuIsa::scalar: return true;
    case CpuIsa::avx2: return __builtin_cpu_supports("avx2");
    case CpuIsa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  return false;
}

CpuIsa best_cpu_isa() {
  if (cpu_isa_supported(CpuIsa::avx512)) return CpuIsa::avx512;
  if (cpu_isa_supported(CpuIsa::avx2)) return CpuIsa::avx2;
  return CpuIsa::scalar;
}

namespace {
void require_supported(CpuIsa isa, const char* source) {
  SF_REQUIRE(cpu_isa_supported(isa), source, " asks for the ", cpu_isa_name(isa),
             " optimizer kernels, but this CPU lacks ",
             isa == CpuIsa::avx2 ? "avx2" : "one of avx512f/avx512bw/avx512vl/avx512dq",
             "; ask for ", cpu_isa_name(best_cpu_isa()), " (or unset SF_ADAMW_ISA)");
}

CpuIsa default_isa() {
  const char* env = std::getenv("SF_ADAMW_ISA");
  if (!env || !*env) return best_cpu_isa();
  CpuIsa isa;
  try {
    isa = parse_cpu_isa(env);
  } catch (const Error&) {
    SF_REQUIRE(false, "SF_ADAMW_ISA='", env,
               "' is not one of scalar, avx2, avx512, automatic; fix or unset it");
  }
  if (isa == CpuIsa::automatic) return best_cpu_isa();
  require_supported(isa, "SF_ADAMW_ISA");
  return isa;
}
}  // namespace

CpuIsa resolve_cpu_isa(CpuIsa isa) {
  if (isa == CpuIsa::automatic) {
    static const CpuIsa chosen = default_isa();  // a throw leaves it unset: retried next call
    return chosen;
  }
  require_supported(isa, "the caller");
  return isa;
}

}  // namespace sf
