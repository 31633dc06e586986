// The embedding's gradient on the host, kept sparse: only the rows of the step's tokens can
// be non-zero (an untied table), so they are stored compactly, [rows touched, C] in f32, in
// increasing token id. Tied tables get the head's dense share too: every row is touched.
//
// AdamW still updates every row (decay and the moments move even with a zero gradient). The
// rows the step did not touch have gradient 0 whatever the clip coefficient, so their update
// does not wait for the global norm: the engine runs it during the backward and leaves only
// the touched rows for after it. Row by row, the arithmetic is adamw.h's on a gradient of 0
// or of the row's sum, exactly as a dense f32 gradient would give.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/batch.h"
#include "optim/param_range.h"
#include "optim/state_format.h"

namespace sf {

class ThreadPool;

class EmbeddingGrad {
 public:
  // dense: every row is touched every step (tied tables). storage: [max_rows(), C] f32, the
  // caller's (it counts it in its memory plan).
  EmbeddingGrad(int64_t vocab, int64_t hidden, int64_t max_step_tokens, bool dense, float* storage);
  static int64_t max_rows(int64_t vocab, int64_t max_step_tokens, bool dense) {
    return dense ? vocab : (vocab < max_step_tokens ? vocab : max_step_tokens);
  }

  // The step's touched rows: those of `chunks`' tokens (dense: all). Throws Error(input) on a
  // token outside the vocabulary.
  void set_rows(std::span<const Batch> chunks);
  // The touched rows' gradient to zero, or (dense_init, [V, C]) to 0 + dense_init.
  void zero(const float* dense_init, ThreadPool& pool);
  // grad[row of ids[t]] += dx[t] (f32 or bf16 rows of C), tokens in order: repeated ids add
  // up in token order, as HostBackend::embedding_backward does.
  void scatter(const Batch& b, const void* dx, DType dx_type, ThreadPool& pool);
  // For a scatter on the device (backend embedding_backward into [n_rows, C] blocks of the
  // gradient): per token of `chunks`, in order, its row's index minus first_row, or -1 when
  // that falls outside [0, n_rows). out has one entry per token.
  void token_rows(std::span<const Batch> chunks, int64_t first_row, int64_t n_rows,
                  int32_t* out) const;
  // Sum of squares of the gradient, in double (the zero rows add nothing).
  double sum_squares(ThreadPool& pool) const;

  enum class Rows { touched, untouched };
  // update_redo: the bits of update(done) then redo(done -> s), in one pass.
  enum class Kind { update, undo, redo, update_redo };
  // One AdamW operation (adamw.h / adamw_undo.h) on the rows of `which` of the table p, m, v
  // ([V, C] f32, overwritten) with this step's gradient (0 for untouched rows); out: the
  // rows' bf16 copy (may be null). redo replaces step `done` by `s`; update and undo use s.
  void adamw(Kind kind, Rows which, float* p, float* m, float* v, uint16_t* out, bool decay,
             const AdamWStep& s, const AdamWStep& done, ThreadPool& pool) const;
  // The update on a compact state (optim/state_adamw.h), run by run; `ranges` the table
  // unit's (rows of C elements, so a run of whole rows splits no int8 block). after(off, len)
  // is called on each updated run (elements of the table).
  void adamw_state(Rows which, const UnitStateView& state, std::span<const ParamRange> ranges,
                   uint16_t* out, const AdamWStep& s, ThreadPool& pool,
                   const std::function<void(int64_t, int64_t)>& after) const;

  int64_t touched_rows() const { return int64_t(rows_.size()); }
  // The touched row ids (increasing) and their gradient rows, [touched_rows(), C] f32.
  std::span<const int32_t> rows() const { return rows_; }
  const float* data() const { return grad_; }

 private:
  void for_each_run(Rows which, ThreadPool& pool,
                    const std::function<void(int64_t, int64_t, const float*)>& fn) const;
  int64_t V_, C_;
  bool dense_;
  float* grad_;                  // [max_rows, C]
  int64_t capacity_rows_;
  std::vector<int32_t> rows_;    // touched row ids, increasing
  std::vector<int32_t> slot_;    // [V]: index into rows_, or -1
  // Runs of consecutive rows, at most kRunRows each: one AdamW call per run (contiguous in the
  // table, and for touched rows in grad_ too, since both are in increasing id order).
  struct Run {
    int64_t row, n_rows, slot;  // slot: the first row's index in grad_ (touched runs)
  };
  static constexpr int64_t kRunRows = 64;
  std::vector<Run> touched_runs_, untouched_runs_;
  std::vector<float> zeros_;     // [kRunRows, C]
};

}  // namespace sf
