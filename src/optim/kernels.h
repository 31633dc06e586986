// Internal to src/optim: the per-ISA kernels behind adamw.h, adamw_undo.h and grad_norm.h.
//
// kernels_avx2.cpp and kernels_avx512.cpp are compiled with ISA flags. They include only
// this header, <immintrin.h> and kernels_simd.inl (their shared loops, all in an anonymous
// namespace), and this header must stay free of inline functions and templates: a weak copy
// of one, emitted from an AVX-512 translation unit, could be the one the linker keeps for
// every caller and crash CPUs without AVX-512. Tails (n not a multiple
// of the vector width) go through the exported scalar kernels, which do the same arithmetic.
// The front ends pick a variant's kernels only through kernel_table.h.
#pragma once
#include <cstdint>

namespace sf::optim_kernels {

// Same layout as sf::AdamWConstants (adamw.cpp checks); kept separate so this header
// includes nothing.
struct Consts {
  float grad_scale;
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float decay;
  float step_size;
  float bc2_sqrt;
  float eps;
};

// p, m, v (overwrite), out (overwrite; may be null) for n elements.
void adamw_f32_scalar(float* p, float* m, float* v, const float* g, uint16_t* out, int64_t n,
                      const Consts& c);
void adamw_bf16_scalar(float* p, float* m, float* v, const uint16_t* g, uint16_t* out,
                       int64_t n, const Consts& c);
void adamw_f32_avx2(float* p, float* m, float* v, const float* g, uint16_t* out, int64_t n,
                    const Consts& c);
void adamw_bf16_avx2(float* p, float* m, float* v, const uint16_t* g, uint16_t* out,
                     int64_t n, const Consts& c);
void adamw_f32_avx512(float* p, float* m, float* v, const float* g, uint16_t* out, int64_t n,
                      const Consts& c);
void adamw_bf16_avx512(float* p, float* m, float* v, const uint16_t* g, uint16_t* out,
                       int64_t n, const Consts& c);

// Undo one AdamW step (adamw_undo.h): p, m, v (overwrite) hold the state after the step
// with constants c and go back to the state before it, given the gradient g it used.
void adamw_undo_f32_scalar(float* p, float* m, float* v, const float* g, int64_t n,
                           const Consts& c);
void adamw_undo_bf16_scalar(float* p, float* m, float* v, const uint16_t* g, int64_t n,
                            const Consts& c);
void adamw_undo_f32_avx2(float* p, float* m, float* v, const float* g, int64_t n,
                         const Consts& c);
void adamw_undo_bf16_avx2(float* p, float* m, float* v, const uint16_t* g, int64_t n,
                          const Consts& c);
void adamw_undo_f32_avx512(float* p, float* m, float* v, const float* g, int64_t n,
                           const Consts& c);
void adamw_undo_bf16_avx512(float* p, float* m, float* v, const uint16_t* g, int64_t n,
                            const Consts& c);

// Undo the step with constants `done`, then apply the one with `redo`, per element in
// registers: p, m, v and out (may be null) overwritten as by undo followed by adamw_*.
// fresh: p, m, v hold the state BEFORE `done`, which is applied first (in registers too): the
// bits of adamw_* with `done` followed by the redo.
void adamw_redo_f32_scalar(float* p, float* m, float* v, const float* g, uint16_t* out,
                           int64_t n, const Consts& done, const Consts& redo, bool fresh);
void adamw_redo_bf16_scalar(float* p, float* m, float* v, const uint16_t* g, uint16_t* out,
                            int64_t n, const Consts& done, const Consts& redo, bool fresh);
void adamw_redo_f32_avx2(float* p, float* m, float* v, const float* g, uint16_t* out,
                         int64_t n, const Consts& done, const Consts& redo, bool fresh);
void adamw_redo_bf16_avx2(float* p, float* m, float* v, const uint16_t* g, uint16_t* out,
                          int64_t n, const Consts& done, const Consts& redo, bool fresh);
void adamw_redo_f32_avx512(float* p, float* m, float* v, const float* g, uint16_t* out,
                           int64_t n, const Consts& done, const Consts& redo, bool fresh);
void adamw_redo_bf16_avx512(float* p, float* m, float* v, const uint16_t* g, uint16_t* out,
                            int64_t n, const Consts& done, const Consts& redo, bool fresh);

// Sum of squares of one block of n elements, in a fixed order every variant shares:
// element i (counted from the block start) is squared in double (exactly) and added to
// accumulator lane i % 8, lanes summed in increasing i; then
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
double sum_squares_f32_scalar(const float* g, int64_t n);
double sum_squares_bf16_scalar(const uint16_t* g, int64_t n);
double sum_squares_f32_avx2(const float* g, int64_t n);
double sum_squares_bf16_avx2(const uint16_t* g, int64_t n);
double sum_squares_f32_avx512(const float* g, int64_t n);
double sum_squares_bf16_avx512(const uint16_t* g, int64_t n);
// Finishes a block for the SIMD variants: adds elements [i, n) (i a multiple of 8) to the
// lanes `acc` and returns the combined sum.
double sum_squares_f32_finish(double* acc, const float* g, int64_t i, int64_t n);
double sum_squares_bf16_finish(double* acc, const uint16_t* g, int64_t i, int64_t n);

}  // namespace sf::optim_kernels
