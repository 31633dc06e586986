// The embedding in the sliding window: its state stays on the host. The forward's rows are
// read by the device from the mapped fp32 master table; the backward's gradient is sparse
// (EmbeddingGrad: the step's rows): an untied table's is scattered on the device into row
// blocks carved from the forward's X buffers (free by then) and copied home, a tied one's
// (which starts from the head's share) is scattered on the host from dX copied home.
#pragma once
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "engine/embedding_grad.h"
#include "engine/window_context.h"
#include "model/batch.h"
#include "optim/adamw_step.h"

namespace sf {

class EmbeddingPath {
 public:
  explicit EmbeddingPath(WindowContext& w);

  // Chunk c's rows into x0 (layer 0's input) on h2d; chunk 0 first takes the step's rows
  // (the previous update of the table, which used the old ones, must be done).
  void forward(const std::vector<Batch>& chunks, int c, Mat x0, const int32_t* tokens);
  // Chunk c's share of the gradient from dx_c (chunk c's rows of dX); the device scatter
  // takes every chunk at chunk 0. True once the step's gradient is complete.
  bool backward(const std::vector<Batch>& chunks, const std::vector<int64_t>& chunk_off, int c,
                Mat dx_c);
  // The gradient's sum of squares: the device's f32 sum of the rows it scattered (untied, a
  // reduced compute dtype: the GPU), else the landed rows summed on the host in double (the
  // fp32 host reference, as its homes are: its clipping then matches every other host sum,
  // the data-parallel ranks' included, beyond f32 rounding).
  bool device_norm() const { return device_scatter() && w_.reduced(); }
  double sum_squares(ThreadPool& pool) const;
  // The step's sparse gradient, once backward() returned true.
  const EmbeddingGrad& grad() const { return *grad_; }
  // AdamW of the touched or untouched rows (embedding_grad.h), bf16 copy of a tied table
  // (the staging home) included.
  void adamw(EmbeddingGrad::Kind kind, EmbeddingGrad::Rows rows, const AdamWStep& s,
             const AdamWStep& done, ThreadPool& pool);

 private:
  bool device_scatter() const { return !w_.layout.tied; }
  int64_t block_rows() const;  // rows of f32 [., C] one X buffer holds
  void grad_on_device(int64_t n_tokens);

  WindowContext& w_;
  std::unique_ptr<EmbeddingGrad> grad_;
  std::unique_ptr<Buffer> table_;  // the master table (or its f32 mirror), mapped for embedding_forward
  DType table_dtype_ = DType::f32;
  int64_t block_ = 0;              // this step's rows per block (device scatter)
  float sumsq_ = 0;                // norms[0] after grad_on_device
};

}  // namespace sf
