// Which SIMD instruction set the host optimizer kernels (AdamW, sum of squares) run with.
// Owns: CPU feature detection, the SF_ADAMW_ISA override, and the names of the variants.
// Every variant gives bitwise identical results (see adamw.h), so the choice only changes
// speed; tests and benchmarks force one to compare them.
#pragma once
#include <cstdint>
#include <string_view>

namespace sf {

enum class CpuIsa : uint8_t {
  automatic,  // SF_ADAMW_ISA if set, else the best this CPU supports
  scalar,     // portable C++ (the compiler may still use baseline SSE2)
  avx2,       // 8 lanes; needs avx2
  avx512,     // 16 lanes; needs avx512f, avx512bw, avx512vl, avx512dq
};

std::string_view cpu_isa_name(CpuIsa isa);  // "automatic", "scalar", "avx2", "avx512"
// Parses "scalar" | "avx2" | "avx512" | "automatic"; throws Error(input) otherwise.
CpuIsa parse_cpu_isa(std::string_view s);
// Whether this CPU (and OS) can run the variant; automatic and scalar are always true.
bool cpu_isa_supported(CpuIsa isa);
// The best supported variant (never automatic).
CpuIsa best_cpu_isa();
// What `isa` means here: automatic -> SF_ADAMW_ISA (read once per process) or best_cpu_isa();
// an explicit variant must be supported. Throws Error(input) naming the variant and the
// missing features otherwise.
CpuIsa resolve_cpu_isa(CpuIsa isa);

}  // namespace sf
