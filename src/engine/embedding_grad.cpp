#include "engine/embedding_grad.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/adamw.h"
#include "optim/adamw_undo.h"
#include "optim/state_adamw.h"
#include "optim/grad_norm.h"

namespace sf {

EmbeddingGrad::EmbeddingGrad(int64_t vocab, int64_t hidden, int64_t max_step_tokens, bool dense,
                             float* storage)
    : V_(vocab), C_(hidden), dense_(dense), grad_(storage),
      capacity_rows_(max_rows(vocab, max_step_tokens, dense)) {
  SF_CHECK(storage, "embedding gradient: no storage");
  slot_.assign(size_t(vocab), -1);
  zeros_.assign(size_t(kRunRows * hidden), 0.f);
  if (dense) {
    rows_.resize(size_t(vocab));
    for (int64_t r = 0; r < vocab; ++r) rows_[size_t(r)] = int32_t(r), slot_[size_t(r)] = int32_t(r);
    for (int64_t r = 0; r < vocab; r += kRunRows)
      touched_runs_.push_back({r, std::min(kRunRows, vocab - r), r});
  }
}

void EmbeddingGrad::set_rows(std::span<const Batch> chunks) {
  for (const Batch& b : chunks)
    for (size_t t = 0; t < b.tokens.size(); ++t)
      SF_REQUIRE(b.tokens[t] >= 0 && b.tokens[t] < V_, "token id ", b.tokens[t], " at position ",
                 t, " is outside the vocabulary (", V_, " entries); check the tokenizer and the data");
  if (!dense_) {
    for (int32_t r : rows_) slot_[size_t(r)] = -1;
    rows_.clear();
    for (const Batch& b : chunks)
      for (int32_t id : b.tokens) {
        if (slot_[size_t(id)] < 0) {
          slot_[size_t(id)] = 0;
          rows_.push_back(id);
        }
      }
    std::sort(rows_.begin(), rows_.end());
    SF_CHECK(int64_t(rows_.size()) <= capacity_rows_, "embedding gradient: ", rows_.size(),
             " rows do not fit the planned ", capacity_rows_);
    for (size_t i = 0; i < rows_.size(); ++i) slot_[size_t(rows_[i])] = int32_t(i);
    touched_runs_.clear();
    untouched_runs_.clear();
    // Walk the table once: extend the current run while rows stay consecutive and on the
    // same side, up to kRunRows.
    for (int64_t r = 0; r < V_; ++r) {
      const int64_t slot = slot_[size_t(r)];
      std::vector<Run>& runs = slot >= 0 ? touched_runs_ : untouched_runs_;
      if (!runs.empty() && runs.back().row + runs.back().n_rows == r && runs.back().n_rows < kRunRows)
        ++runs.back().n_rows;
      else
        runs.push_back({r, 1, slot});
    }
  }
}

void EmbeddingGrad::zero(const float* dense_init, ThreadPool& pool) {
  float* g = grad_;
  const int64_t n = int64_t(rows_.size()) * C_;
  pool.parallel_for(n, [&](int64_t b, int64_t e) {
    if (dense_init) {
      for (int64_t i = b; i < e; ++i) g[i] = 0.0f + dense_init[i];  // as added to zeros
    } else {
      std::memset(g + b, 0, size_t(e - b) * sizeof(float));
    }
  }, 1 << 16);
}

void EmbeddingGrad::token_rows(std::span<const Batch> chunks, int64_t first_row, int64_t n_rows,
                               int32_t* out) const {
  for (const Batch& b : chunks)
    for (int32_t id : b.tokens) {
      const int64_t r = int64_t(slot_[size_t(id)]) - first_row;
      SF_CHECK(slot_[size_t(id)] >= 0, "embedding token_rows: token ", id, " was not announced");
      *out++ = r >= 0 && r < n_rows ? int32_t(r) : -1;
    }
}

void EmbeddingGrad::scatter(const Batch& b, const void* dx, DType dt, ThreadPool& pool) {
  SF_CHECK(dt == DType::f32 || dt == DType::bf16, "embedding scatter: f32 or bf16 rows");
  const int64_t T = b.n_tokens(), C = C_;
  const int32_t* ids = b.tokens.data();
  float* grad = grad_;
  for (int64_t t = 0; t < T; ++t)
    SF_CHECK(ids[t] >= 0 && ids[t] < V_ && slot_[size_t(ids[t])] >= 0,
             "embedding scatter: token ", ids[t], " was not announced by begin_step");
  // Parallel over column blocks, every token in order within a block.
  pool.parallel_for(C, [&](int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < T; ++t) {
      float* d = grad + int64_t(slot_[size_t(ids[t])]) * C;
      if (dt == DType::f32) {
        const float* g = static_cast<const float*>(dx) + t * C;
        for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
      } else {
        const uint16_t* g = static_cast<const uint16_t*>(dx) + t * C;
        for (int64_t c = c0; c < c1; ++c) d[c] += bf16_to_f32(g[c]);
      }
    }
  }, 256);
}

// Exactly the bits sum_squares_ranges() gives on the dense [V, C] gradient (a range from
// element 0): the zero rows add +0.0 to their lanes, so each dense block's lane sums are the
// touched rows' contributions in element order, lane = element index within the block % 8.
double EmbeddingGrad::sum_squares(ThreadPool& pool) const {
  const int64_t B = kSumSquaresBlock, C = C_;
  std::vector<int64_t> blocks;  // dense blocks holding touched elements, increasing
  for (int32_t r : rows_) {
    const int64_t b0 = int64_t(r) * C / B, b1 = (int64_t(r) * C + C - 1) / B;
    for (int64_t b = b0; b <= b1; ++b)
      if (blocks.empty() || blocks.back() < b) blocks.push_back(b);
  }
  std::vector<double> sums(blocks.size(), 0.0);
  pool.parallel_for(int64_t(blocks.size()), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t lo = blocks[size_t(k)] * B, hi = std::min(lo + B, V_ * C);
      double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      // Touched rows intersecting [lo, hi), in order.
      auto it = std::lower_bound(rows_.begin(), rows_.end(), int32_t(lo / C));
      for (; it != rows_.end() && int64_t(*it) * C < hi; ++it) {
        const int64_t r = *it, i = int64_t(it - rows_.begin());
        const int64_t e0 = std::max(lo, r * C), e1 = std::min(hi, r * C + C);
        for (int64_t e = e0; e < e1; ++e) {
          const double x = double(grad_[i * C + (e - r * C)]);
          acc[(e - lo) & 7] += x * x;
        }
      }
      sums[size_t(k)] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
  }, 1);
  double range_sum = 0.0;
  for (double x : sums) range_sum += x;
  return 0.0 + range_sum;
}

// fn(off, n, g) for each run of `which` rows, in parallel: elements [off, off + n) of the
// table and their gradient g (zeros for untouched rows).
void EmbeddingGrad::for_each_run(Rows which, ThreadPool& pool,
                                 const std::function<void(int64_t, int64_t, const float*)>& fn) const {
  const std::vector<Run>& runs = which == Rows::touched ? touched_runs_ : untouched_runs_;
  const int64_t C = C_;
  pool.parallel_for(int64_t(runs.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const Run& run = runs[size_t(i)];
      fn(run.row * C, run.n_rows * C, which == Rows::touched ? grad_ + run.slot * C : zeros_.data());
    }
  }, 1);
}

void EmbeddingGrad::adamw(Kind kind, Rows which, float* p, float* m, float* v, uint16_t* out,
                          bool decay, const AdamWStep& s, const AdamWStep& done,
                          ThreadPool& pool) const {
  for_each_run(which, pool, [&](int64_t off, int64_t n, const float* g) {
    const ParamRange all{0, n, decay};
    const std::span<const ParamRange> one(&all, 1);
    float *pr = p + off, *mr = m + off, *vr = v + off;
    uint16_t* o = out ? out + off : nullptr;
    switch (kind) {
      case Kind::update: adamw_update_ranges(pr, mr, vr, g, o, n, one, s, nullptr); break;
      case Kind::undo: adamw_undo_ranges(pr, mr, vr, g, n, one, s, nullptr); break;
      case Kind::redo: adamw_redo_ranges(pr, mr, vr, g, o, n, one, done, s, nullptr); break;
      case Kind::update_redo: adamw_update_redo_ranges(pr, mr, vr, g, o, n, one, done, s, nullptr); break;
    }
  });
}

void EmbeddingGrad::adamw_state(Rows which, const UnitStateView& state, std::span<const ParamRange> ranges,
                                uint16_t* out, const AdamWStep& s, ThreadPool& pool,
                                const std::function<void(int64_t, int64_t)>& after) const {
  for_each_run(which, pool, [&](int64_t off, int64_t n, const float* g) {
    adamw_update_state(state, off, n, g, out ? out + off : nullptr, ranges, s, nullptr);
    after(off, n);
  });
}

}  // namespace sf
