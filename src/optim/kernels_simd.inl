// The AdamW loops (update, undo, redo) of kernels_avx2.cpp and kernels_avx512.cpp, written
// once over the vector primitives each of those files defines, in its anonymous namespace,
// before including this one:
//   V (the float vector), kLanes (its width), kOutAlign (bytes a non-temporal bf16 store
//   needs), vload / vstore (unaligned), vset1, vzero, vadd, vsub, vmul, vdiv, vsqrt, vmax,
//   load_grad(const float*), load_grad(const uint16_t*) (bf16 bits widened exactly),
//   store_bf16 / stream_bf16 (kLanes bf16 values, the second non-temporal),
// and SF_SIMD_NAME(name), which gives an exported kernel its ISA suffix.
// The loops live in an anonymous namespace (internal linkage), so a copy compiled with one
// ISA's flags is never linked into the other's callers (kernels.h says why that matters).
// Same IEEE operations in the same order as kernels_scalar.cpp, no FMA: bitwise equal.
namespace {

// The step's constants, broadcast.
struct Vc {
  V gs, b1, omb1, b2, omb2, decay, step_size, bc2_sqrt, eps;
};
Vc broadcast(const Consts& c) {
  return {vset1(c.grad_scale), vset1(c.beta1), vset1(c.one_minus_beta1),
          vset1(c.beta2),      vset1(c.one_minus_beta2), vset1(c.decay),
          vset1(c.step_size),  vset1(c.bc2_sqrt),        vset1(c.eps)};
}

// One AdamW step on kLanes lanes, p, m, v in place; graw is the unscaled gradient.
inline void update_v(const V graw, V& p, V& m, V& v, const Vc& k) {
  const V gi = vmul(graw, k.gs);
  const V mi = vadd(vmul(k.b1, m), vmul(k.omb1, gi));
  const V vi = vadd(vmul(k.b2, v), vmul(vmul(k.omb2, gi), gi));
  V pi = vmul(p, k.decay);
  const V denom = vadd(vdiv(vsqrt(vi), k.bc2_sqrt), k.eps);
  pi = vsub(pi, vdiv(vmul(k.step_size, mi), denom));
  m = mi;
  v = vi;
  p = pi;
}

// Its inverse, the scalar undo1's operations in its order. vmax(x, 0) returns its second
// operand unless x > 0, so NaN and -0 give +0 exactly like std::max(0.0f, x).
inline void undo_v(const V graw, V& p, V& m, V& v, const Vc& k) {
  const V gi = vmul(graw, k.gs);
  const V denom = vadd(vdiv(vsqrt(v), k.bc2_sqrt), k.eps);
  const V p_decayed = vadd(p, vdiv(vmul(k.step_size, m), denom));
  p = vdiv(p_decayed, k.decay);
  m = vdiv(vsub(m, vmul(k.omb1, gi)), k.b1);
  const V v_raw = vdiv(vsub(v, vmul(vmul(k.omb2, gi), gi)), k.b2);
  v = vmax(v_raw, vzero());
}

// kOut: 0 no bf16 copy, 1 unaligned stores, 2 non-temporal stores (out + i kOutAlign-byte
// aligned): the copy is write-only here, so streaming it skips reading its lines in first.
template <int kOut>
inline void put_bf16(uint16_t* out, V x) {
  if constexpr (kOut == 1) store_bf16(out, x);
  if constexpr (kOut == 2) stream_bf16(out, x);
}

template <class G, int kOut>
int64_t adamw_body(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                   const Consts& c) {
  const Vc k = broadcast(c);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    V pi = vload(p + i), mi = vload(m + i), vi = vload(v + i);
    update_v(load_grad(g + i), pi, mi, vi, k);
    vstore(m + i, mi);
    vstore(v + i, vi);
    vstore(p + i, pi);
    put_bf16<kOut>(out + i, pi);
  }
  if constexpr (kOut == 2) _mm_sfence();  // order the streamed stores before any later ones
  return i;
}

template <class G>
int64_t undo_body(float* p, float* m, float* v, const G* g, int64_t n, const Consts& c) {
  const Vc k = broadcast(c);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    V pi = vload(p + i), mi = vload(m + i), vi = vload(v + i);
    undo_v(load_grad(g + i), pi, mi, vi, k);
    vstore(m + i, mi);
    vstore(v + i, vi);
    vstore(p + i, pi);
  }
  return i;
}

// Undo with `done`, update with `redo`, in registers; kOut as for adamw_body.
template <class G, int kOut>
int64_t redo_body(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                  const Consts& done, const Consts& redo, bool fresh) {
  const Vc kd = broadcast(done), kr = broadcast(redo);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const V graw = load_grad(g + i);
    V pi = vload(p + i), mi = vload(m + i), vi = vload(v + i);
    if (fresh) update_v(graw, pi, mi, vi, kd);
    undo_v(graw, pi, mi, vi, kd);
    update_v(graw, pi, mi, vi, kr);
    vstore(m + i, mi);
    vstore(v + i, vi);
    vstore(p + i, pi);
    put_bf16<kOut>(out + i, pi);
  }
  if constexpr (kOut == 2) _mm_sfence();
  return i;
}

template <class G>
int64_t adamw_any(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                  const Consts& c) {
  if (!out) return adamw_body<G, 0>(p, m, v, g, out, n, c);
  if (reinterpret_cast<uintptr_t>(out) % kOutAlign == 0)
    return adamw_body<G, 2>(p, m, v, g, out, n, c);
  return adamw_body<G, 1>(p, m, v, g, out, n, c);
}

template <class G>
int64_t redo_any(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                 const Consts& done, const Consts& redo, bool fresh) {
  if (!out) return redo_body<G, 0>(p, m, v, g, out, n, done, redo, fresh);
  if (reinterpret_cast<uintptr_t>(out) % kOutAlign == 0)
    return redo_body<G, 2>(p, m, v, g, out, n, done, redo, fresh);
  return redo_body<G, 1>(p, m, v, g, out, n, done, redo, fresh);
}

}  // namespace

// The exported kernels: the vector loops, then the scalar kernels for the tail.
void SF_SIMD_NAME(adamw_f32)(float* p, float* m, float* v, const float* g, uint16_t* out,
                             int64_t n, const Consts& c) {
  const int64_t i = adamw_any(p, m, v, g, out, n, c);
  if (i < n) adamw_f32_scalar(p + i, m + i, v + i, g + i, out ? out + i : nullptr, n - i, c);
}
void SF_SIMD_NAME(adamw_bf16)(float* p, float* m, float* v, const uint16_t* g, uint16_t* out,
                              int64_t n, const Consts& c) {
  const int64_t i = adamw_any(p, m, v, g, out, n, c);
  if (i < n) adamw_bf16_scalar(p + i, m + i, v + i, g + i, out ? out + i : nullptr, n - i, c);
}
void SF_SIMD_NAME(adamw_undo_f32)(float* p, float* m, float* v, const float* g, int64_t n,
                                  const Consts& c) {
  const int64_t i = undo_body(p, m, v, g, n, c);
  if (i < n) adamw_undo_f32_scalar(p + i, m + i, v + i, g + i, n - i, c);
}
void SF_SIMD_NAME(adamw_undo_bf16)(float* p, float* m, float* v, const uint16_t* g, int64_t n,
                                   const Consts& c) {
  const int64_t i = undo_body(p, m, v, g, n, c);
  if (i < n) adamw_undo_bf16_scalar(p + i, m + i, v + i, g + i, n - i, c);
}
void SF_SIMD_NAME(adamw_redo_f32)(float* p, float* m, float* v, const float* g, uint16_t* out,
                                  int64_t n, const Consts& done, const Consts& redo,
                                  bool fresh) {
  const int64_t i = redo_any(p, m, v, g, out, n, done, redo, fresh);
  if (i < n)
    adamw_redo_f32_scalar(p + i, m + i, v + i, g + i, out ? out + i : nullptr, n - i, done,
                          redo, fresh);
}
void SF_SIMD_NAME(adamw_redo_bf16)(float* p, float* m, float* v, const uint16_t* g,
                                   uint16_t* out, int64_t n, const Consts& done,
                                   const Consts& redo, bool fresh) {
  const int64_t i = redo_any(p, m, v, g, out, n, done, redo, fresh);
  if (i < n)
    adamw_redo_bf16_scalar(p + i, m + i, v + i, g + i, out ? out + i : nullptr, n - i, done,
                           redo, fresh);
}
