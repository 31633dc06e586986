// GGUF writing (version 3, the layout io/gguf.h describes), the counterpart of GgufView:
// metadata key/values and tensors are collected first, then write() streams the file through
// an AtomicFile (temporary name, fsync, rename), so a crash leaves no torn .gguf behind.
// Tensor data is not held: each tensor has a fill callback that produces its bytes when the
// writer reaches it, so exporting a model needs memory for one tensor, not for the file.
// Every tensor starts at a multiple of general.alignment (32, written explicitly).
//
// Also owns the f32 -> F16 / BF16 / Q8_0 encoders. Q8_0 is ggml's reference quantizer
// (quantize_row_q8_0_ref; gguf-py's Q8_0.quantize_blocks is bit-identical to it): per block
// of 32, d = max|x| / 127 in float32, q = roundf(x / d) computed as x * (1 / d), d stored
// as f16. So a dequantized value is within d/2 (+ the f16 rounding of d, x 127) of x.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "io/gguf.h"

namespace sf {

class GgufWriter {
 public:
  // dst receives exactly the tensor's bytes (gguf_tensor_bytes of its type and dims).
  using Fill = std::function<void(uint8_t* dst)>;

  GgufWriter();  // starts with general.alignment = 32

  void add_u32(std::string key, uint32_t v);
  void add_i32(std::string key, int32_t v);
  void add_f32(std::string key, float v);
  void add_bool(std::string key, bool v);
  void add_string(std::string key, std::string_view v);
  void add_strings(std::string key, const std::vector<std::string>& v);
  void add_i32s(std::string key, const std::vector<int32_t>& v);
  void add_f32s(std::string key, const std::vector<float>& v);

  // dims innermost first, as the file stores them (a PyTorch [out, in] matrix is {in, out}).
  // Error(internal) for a duplicate name, a name over 63 bytes, or dims the type cannot hold.
  void add_tensor(std::string name, std::vector<int64_t> dims, uint32_t ggml_type, Fill fill);

  bool has_key(std::string_view key) const;
  size_t tensor_count() const { return tensors_.size(); }
  // Writes the file atomically; Error(io) naming the file on a failed write. Returns its size.
  uint64_t write(const std::filesystem::path& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    uint32_t type;
    uint64_t bytes, offset;
    Fill fill;
  };
  void add_kv(std::string key, GgufType type, std::string encoded_value);
  std::string header() const;

  std::vector<std::pair<std::string, std::string>> kvs_;  // key, encoded (type + value)
  std::vector<Tensor> tensors_;
  uint64_t data_bytes_ = 0;  // the data section so far, each tensor padded to the alignment
};

// f32 -> ggml tensor bytes, n elements (Q8_0: n a multiple of 32). Types: F32, F16, BF16,
// Q8_0; F16/BF16 round to nearest even. Error(internal) for another type.
void gguf_encode(const float* src, uint32_t ggml_type, uint8_t* dst, int64_t n);

}  // namespace sf
