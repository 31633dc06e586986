// libFuzzer target: arbitrary bytes as a whole safetensors file image through the header
// parser/validator (SafetensorsView::parse), then every accessor on what it accepted; the
// same bytes as text through the model.safetensors.index.json parser.
// Contract: the only allowed failure is sf::Error(input) with a message; anything else (a
// sanitizer report, another exception, an abort) is a bug.
// With SF_FUZZ_WRITE_SEEDS=<dir> it instead writes valid seed files there and exits.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

void write_seeds(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  std::vector<float> v(48);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.37f - 5.f;
  std::vector<int64_t> ids = {1, -2, 3};
  using sf::DType;
  sf::write_safetensors_file(dir / "mixed.safetensors",
                             {{"model.embed_tokens.weight", DType::bf16, {4, 3}, v.data(), nullptr},
                              {"model.norm.weight", DType::f32, {3}, v.data(), nullptr},
                              {"h", DType::f16, {2, 2, 2}, v.data(), nullptr},
                              {"ids", DType::i64, {3}, nullptr, ids.data()},
                              {"empty", DType::f32, {0, 7}, nullptr, nullptr},
                              {"scalar", DType::f32, {}, v.data(), nullptr}},
                             {{"note", "seed"}});
  sf::write_safetensors_file(dir / "one.safetensors", {{"w", DType::bf16, {5}, v.data(), nullptr}});
  sf::write_safetensors_file(dir / "none.safetensors", {});
  // A hand-made one: unaligned BF16 after a U8, a hole before the last tensor.
  std::string h =
      R"({"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
      R"("a":{"dtype":"BF16","shape":[2],"data_offsets":[1,5]},)"
      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  std::string img(8, '\0');
  for (int i = 0; i < 8; ++i) img[size_t(i)] = char(uint8_t(h.size() >> (8 * i)));
  img += h + std::string(12, '\x3f');
  FILE* f = std::fopen((dir / "hand.safetensors").c_str(), "wb");
  if (f) {
    std::fwrite(img.data(), 1, img.size(), f);
    std::fclose(f);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* d = std::getenv("SF_FUZZ_WRITE_SEEDS")) {
    write_seeds(d);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    sf::SafetensorsView v = sf::SafetensorsView::parse(data, size, "fuzz.safetensors");
    // What the validator promises about anything it accepts:
    if (v.data_offset() + v.data_bytes() != size) std::abort();
    if (std::memchr(data + 8, 0, size_t(v.header_bytes()))) std::abort();  // JSON has no NUL
    uint64_t sum = 0, covered = 0, prev_end = 0;
    for (const sf::TensorInfo& t : v.tensors()) {
      if (v.find(t.name) != &t) std::abort();  // names are unique and indexed
      if (t.end > v.data_bytes() || t.begin > t.end) std::abort();
      uint64_t numel = 1;
      for (int64_t d : t.shape) {
        if (d < 0) std::abort();
        numel *= uint64_t(d);  // cannot wrap: the validator checked
      }
      if (numel != uint64_t(t.numel) || t.bytes() != numel * sf::st_dtype_size(t.dtype))
        std::abort();
      if (t.bytes() > 0) {  // sorted by offset, and no byte belongs to two tensors
        if (t.begin < prev_end) std::abort();
        prev_end = t.end;
        covered += t.bytes();
      }
      // Touch every byte the view hands out: ASan checks they are inside the input.
      const uint8_t* p = v.raw(t);
      for (uint64_t i = 0; i < t.bytes(); ++i) sum += p[i];
      if (sf::st_weight_dtype(t.dtype) && t.numel <= (1 << 16)) {
        std::vector<float> out(size_t(t.numel));
        v.read_f32(t, out.data());
      }
    }
    if (covered + v.gap_bytes() != v.data_bytes()) std::abort();
    if (!v.metadata().is_object()) std::abort();
    for (auto it = v.metadata().begin(); it != v.metadata().end(); ++it)
      if (!it.value().is_string()) std::abort();
    volatile uint64_t sink = sum;
    (void)sink;
  } catch (const sf::Error& e) {
    if (e.kind() != sf::ErrorKind::input || std::strlen(e.what()) == 0) std::abort();
  }
  try {
    auto m = sf::parse_safetensors_index(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.index.json");
    for (auto& [name, file] : m)
      if (file.empty() || file.find('/') != std::string::npos) std::abort();
  } catch (const sf::Error& e) {
    if (e.kind() != sf::ErrorKind::input || std::strlen(e.what()) == 0) std::abort();
  }
  return 0;
}
