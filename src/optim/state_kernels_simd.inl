// The compact-state AdamW loops (state_kernels.h) of state_kernels_avx2.cpp and
// state_kernels_avx512.cpp, written once over the primitives each of those files defines in
// its anonymous namespace before including this one:
//   V / VI (float / int32 vectors), M (their lane mask), kLanes, vload, vstore, vset1,
//   vadd, vsub, vmul, vdiv, vsqrt, vabs, vmax (returns its first operand iff it is greater,
//   else the second), load_grad(const float*), load_bf16(const uint16_t*) (bf16 bits
//   widened exactly), bf16_bits(V) (round to nearest even, in 32-bit lanes),
//   round_bits(V, VI noise) (stochastic: state_format.h), store_u16(uint16_t*, VI),
//   load_codes / store_codes (kLanes uint8 codes), vi_iota (0, 1, ..., kLanes - 1),
//   vi_set1, vi_add, vi_sub, vi_and, vi_or, vi_xor, vi_mul, vi_min (signed), vi_shr<k>
//   (logical), vi_shl<k>, as_int / as_float (bit casts), vf_ge / vf_le / vf_lt / vf_nan
//   (float compares, ordered), vf_ngt (!(a > b): true for NaN), m_and (mask and),
//   vi_eq / vi_lt (signed int compares), vi_sel / vf_sel
//   (mask ? a : b), vi_inc_if (c + 1 where the mask is set), vtable8 (a table of 8 floats
//   for vlookup8), vlookup8 (table[idx & 7] per lane), vlookup8_if (m ? table[idx & 7] : src),
//   vmul_unless (m ? src : a * b), T16 / vtable16 / vlookup16 (a table
//   of 16 uint32 and table[idx & 15] per lane),
// and SF_SIMD_NAME(name), which gives an exported kernel its ISA suffix.
// Same IEEE operations in the same order as state_kernels_scalar.cpp, no FMA: bitwise equal.
// The int8 tail (a block's last n % kLanes elements) runs the vector code on zero-padded
// copies: lanes are independent, so its bits are the scalar ones.
//
// int8 codecs without table gathers: the maps are 2^(-k/8) (state_format.h), i.e.
// M_k = M_(k % 8) * 2^-(k / 8) exactly, and every midpoint between M_k and M_(k+1) is
// D_(k % 8) * 2^-(k / 8) with D_j = the midpoints of the first octave, all in (0.5, 1):
// scaling by a power of two is exact in fp32, so the map's midpoints are D_j times powers of
// two bit for bit. Hence, for y >= 0 and a = |y| in the octave [2^-(e+1), 2^-e), the index k
// of the nearest magnitude M_k (the count of midpoints >= a, which fixes the scalar
// search's code 255 - k) is the 8 e midpoints of the octaves above plus those of its own
// octave that are >= a (D_j >= a * 2^e), capped at the last magnitude; or the zero code
// when a is at or below the midpoint to zero. For y < 0 the
// count of midpoints below y treats a tie the other way (toward the larger magnitude): the
// same formula applied to the next float above a. M_0..M_7, D_j and the zero midpoints are
// read from the tables the scalar kernel searches.
namespace {

enum Mom { kF32 = 0, kBf16 = 1, kInt8 = 2 };

struct Vc {
  V gs, b1, omb1, b2, omb2, decay, step_size, bc2_sqrt, eps;
};
Vc broadcast(const Consts& c) {
  return {vset1(c.grad_scale), vset1(c.beta1), vset1(c.one_minus_beta1),
          vset1(c.beta2),      vset1(c.one_minus_beta2), vset1(c.decay),
          vset1(c.step_size),  vset1(c.bc2_sqrt),        vset1(c.eps)};
}

inline V load_g(const float* g) { return load_grad(g); }
inline V load_g(const uint16_t* g) { return load_bf16(g); }

// adamw.h's update on kLanes lanes (kernels_simd.inl's update_v, the same operations).
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

// state_format.h's noise for unit indices index .. index + kLanes - 1.
inline VI round_noise(uint32_t key, uint32_t index) {
  VI h = vi_add(vi_set1(index), vi_iota());
  h = vi_xor(vi_mul(h, vi_set1(0x9e3779b9u)), vi_set1(key));
  h = vi_xor(h, vi_shr<16>(h));
  h = vi_mul(h, vi_set1(0x85ebca6bu));
  h = vi_xor(h, vi_shr<13>(h));
  h = vi_mul(h, vi_set1(0xc2b2ae35u));
  h = vi_xor(h, vi_shr<16>(h));
  return vi_shr<16>(h);
}

template <bool kBf16Master>
inline V load_master(const void* a, int64_t i) {
  if constexpr (kBf16Master) return load_bf16(static_cast<const uint16_t*>(a) + i);
  else return vload(static_cast<const float*>(a) + i);
}

// Stores the new master lanes and the bf16 copy (null out: none).
template <bool kBf16Master>
inline void store_master(void* a, uint16_t* out, int64_t i, V p, uint32_t key,
                         uint32_t index) {
  if constexpr (kBf16Master) {
    const VI bits = round_bits(p, round_noise(key, index + uint32_t(i)));
    store_u16(static_cast<uint16_t*>(a) + i, bits);
    if (out) store_u16(out + i, bits);
  } else {
    vstore(static_cast<float*>(a) + i, p);
    if (out) store_u16(out + i, bf16_bits(p));
  }
}

// f32 / bf16 moments: whole vectors here, the tail through the scalar kernel `tail`.
template <class G, int kMom, bool kBf16Master>
void dense_step(const StateTask& t, const StateConsts& c, StateKernel tail) {
  const G* g = static_cast<const G*>(t.g);
  const Vc k = broadcast(c.adam);
  int64_t i = 0;
  for (; i + kLanes <= t.n; i += kLanes) {
    V p = load_master<kBf16Master>(t.master, i), m, v;
    if constexpr (kMom == kF32) {
      m = vload(static_cast<const float*>(t.m) + i);
      v = vload(static_cast<const float*>(t.v) + i);
    } else {
      m = load_bf16(static_cast<const uint16_t*>(t.m) + i);
      v = load_bf16(static_cast<const uint16_t*>(t.v) + i);
    }
    update_v(load_g(g + i), p, m, v, k);  // g + i is read before out + i is written
    store_master<kBf16Master>(t.master, t.out, i, p, c.round_key, t.index);
    if constexpr (kMom == kF32) {
      vstore(static_cast<float*>(t.m) + i, m);
      vstore(static_cast<float*>(t.v) + i, v);
    } else {
      store_u16(static_cast<uint16_t*>(t.m) + i, bf16_bits(m));
      store_u16(static_cast<uint16_t*>(t.v) + i, bf16_bits(v));
    }
  }
  if (i == t.n) return;
  const size_t ms = kBf16Master ? 2 : 4, es = kMom == kF32 ? 4 : 2;
  const StateTask r{g + i, t.out ? t.out + i : nullptr,
                    static_cast<char*>(t.master) + size_t(i) * ms,
                    static_cast<char*>(t.m) + size_t(i) * es,
                    static_cast<char*>(t.v) + size_t(i) * es, nullptr, nullptr, t.n - i,
                    t.index + uint32_t(i)};
  tail(&r, 1, c);
}

// The tables' structure constants (see above). The octave search runs on buckets: r in
// [0.5, 1) is cut by its top 4 mantissa bits into 16 buckets of width 1/32; the D_j are more
// than 1/32 apart (the closest, D_6 - D_7, is (2^-0.75 - 2^-1) / 2 = 0.047), so a bucket holds
// at most one of them, and #{j : D_j >= r} = #{j : D_j in a higher bucket} + [r <= its own D].
struct QuantK {
  V tpos, tneg;    // vtable8s: M_(7 - i) and -M_i (decoding, below)
  T16 thr;         // per bucket: bits of the D_j in it, else 0 (0.0f: never >= r)
  T16 base;        // per bucket: 8 * 126 + #{j : D_j in a higher bucket}
  V z_pos;         // m: the midpoint between 0 and +M_127
  V z_neg_signed;  // m: the midpoint between -M_126 and 0 (negative)
  V z_v;           // v: the midpoint between 0 and M_254
};
QuantK quant_consts(const StateConsts& c) {
  QuantK q;
  float tpos[8], tneg[8];
  uint32_t thr[16] = {}, base[16];
  for (int b = 0; b < 16; ++b) base[b] = 8 * 126;
  for (int j = 0; j < 8; ++j) {
    tpos[7 - j] = c.map_v[255 - j];
    tneg[j] = -c.map_v[255 - j];
    const uint32_t bits = __builtin_bit_cast(uint32_t, c.mid_v[254 - j]);
    const uint32_t bucket = (bits >> 19) & 15;
    thr[bucket] = bits;
    for (uint32_t b = 0; b < bucket; ++b) ++base[b];
  }
  q.tpos = vtable8(tpos);
  q.tneg = vtable8(tneg);
  q.thr = vtable16(thr);
  q.base = vtable16(base);
  q.z_pos = vset1(c.mid_m[kZeroCodeM]);
  q.z_neg_signed = vset1(c.mid_m[kZeroCodeM - 1]);
  q.z_v = vset1(c.mid_v[0]);
  return q;
}

// k = 8 e + #{j : D_j >= a * 2^e} for the magnitude with bits abits (a in (0, 1 + ulp]),
// e = 126 - the biased exponent of a, r = a * 2^e in [0.5, 1).
inline VI magnitude_index(VI abits, const QuantK& q) {
  const V r = as_float(vi_or(vi_and(abits, vi_set1(0x007fffffu)), vi_set1(126u << 23)));
  const VI bucket = vi_shr<19>(abits);  // vlookup16 reads its low 4 bits: r's top mantissa bits
  const VI k = vi_sub(vlookup16(q.base, bucket), vi_shl<3>(vi_shr<23>(abits)));
  return vi_inc_if(k, vf_ge(as_float(vlookup16(q.thr, bucket)), r));
}

// The m map's codes of y: -M_k at code k (k <= 126), 0 at 127, +M_k at 255 - k (k <= 127).
inline VI code_m(V y, const QuantK& q) {
  const VI yb = as_int(y);
  const VI neg = vi_shr<31>(yb);                               // 1 for y < 0 (and -0)
  const VI ab = vi_add(vi_and(yb, vi_set1(0x7fffffffu)), neg);  // a, or the float above a
  const M is_neg = vi_eq(neg, vi_set1(1));
  const VI k = vi_min(magnitude_index(ab, q), vi_sub(vi_set1(127), neg));
  VI code = vi_sel(is_neg, k, vi_sub(vi_set1(255), k));
  // Zero: mid[126] < y <= mid[127], the scalar search's own test (false for NaN).
  code = vi_sel(m_and(vf_lt(q.z_neg_signed, y), vf_le(y, q.z_pos)), vi_set1(kZeroCodeM), code);
  return vi_sel(vf_nan(y), vi_set1(0), code);  // NaN is below no midpoint: code 0
}

// The v map's codes: 0 at code 0, M_k at 255 - k (k <= 254). Every y that is not above the
// zero midpoint z_v (y <= z_v, so every y <= 0, and NaN: the unordered compare) gives code 0,
// so the magnitude path only has to be right for y > 0, whose bits are |y|'s.
inline VI code_v(V y, const QuantK& q) {
  const VI k = vi_min(magnitude_index(as_int(y), q), vi_set1(254));
  return vi_sel(vf_ngt(y, q.z_v), vi_set1(0), vi_sub(vi_set1(255), k));
}

// Decoding: M_k (k = 8 o + j) has the bits of M_j less o << 23 (an exact power-of-two
// scaling; the exponent stays >= 95 for k <= 255). The tables are indexed by the code's own
// low 3 bits: a negative m code c is -M_c (j = c & 7, o = c >> 3); a positive m code and
// every v code is M_(255 - c) (j = 7 - (c & 7), o = 31 - (c >> 3) = (c >> 3) ^ 31).
inline V scaled_pow2(V x, VI o) { return as_float(vi_sub(as_int(x), vi_shl<23>(o))); }

// map_m[code] * s and map_v[code] * s, bit for bit (zs = 0 * s: the zero code's product).
inline V value_m(VI code, V s, V zs, const QuantK& q) {
  const M neg = vi_lt(code, vi_set1(kZeroCodeM));
  const VI hi = vi_shr<3>(code);
  const V mj = vlookup8_if(neg, q.tneg, code, vlookup8(q.tpos, code));
  const VI o = vi_sel(neg, hi, vi_xor(hi, vi_set1(31)));
  return vmul_unless(vi_eq(code, vi_set1(kZeroCodeM)), scaled_pow2(mj, o), s, zs);
}
inline V value_v(VI code, V s, V zs, const QuantK& q) {
  const V mj = vlookup8(q.tpos, code);
  const VI o = vi_xor(vi_shr<3>(code), vi_set1(31));
  return vmul_unless(vi_eq(code, vi_set1(0)), scaled_pow2(mj, o), s, zs);
}

// kLanes codes of x / d.
template <bool kIsV>
inline VI int8_codes(V x, V d, const QuantK& q) {
  const V y = vdiv(x, d);
  if constexpr (kIsV) return code_v(y, q);
  else return code_m(y, q);
}

// Encodes x[0, n) (x readable up to a whole vector past n) into codes and *scale.
template <bool kIsV>
inline void int8_encode(const float* x, int64_t n, float a, const QuantK& q, uint8_t* codes,
                        float* scale) {
  const V d = vset1(a > 0.0f ? a : 1.0f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store_codes(codes + i, int8_codes<kIsV>(vload(x + i), d, q));
  if (i < n) {
    uint8_t tmp[kLanes];
    store_codes(tmp, int8_codes<kIsV>(vload(x + i), d, q));
    for (int64_t j = 0; j < n - i; ++j) codes[i + j] = tmp[j];
  }
  *scale = a;
}

// Decode, update and stage one vector of an int8 block: mb / vb receive the new moments,
// amax_m / amax_v their running absmax.
template <class G, bool kBf16Master>
inline void int8_update_vec(const G* g, void* master, uint16_t* out, const uint8_t* mc,
                            const uint8_t* vc, int64_t i, const Vc& k, const QuantK& q,
                            uint32_t key, uint32_t index, const V (&sc)[4], float* mb,
                            float* vb, V& amax_m, V& amax_v) {
  V p = load_master<kBf16Master>(master, i);
  V m = value_m(load_codes(mc + i), sc[0], sc[1], q);
  V v = value_v(load_codes(vc + i), sc[2], sc[3], q);
  update_v(load_g(g + i), p, m, v, k);
  store_master<kBf16Master>(master, out, i, p, key, index);
  vstore(mb + i, m);
  vstore(vb + i, v);
  amax_m = vmax(vabs(m), amax_m);
  amax_v = vmax(vabs(v), amax_v);
}

// The lanes' absmax, combined as the scalar loop does (exact: max is order-free here).
inline float lanes_max(V a) {
  float l[kLanes];
  vstore(l, a);
  float r = 0.0f;
  for (int j = 0; j < kLanes; ++j) r = l[j] > r ? l[j] : r;
  return r;
}

// One int8 block (n <= kBlock): decode + update + stage, then encode both moments. k and q:
// broadcast(c.adam) and quant_consts(c), made once per call of the exported kernel.
template <class G, bool kBf16Master>
void int8_step(const StateTask& t, const StateConsts& c, const Vc& k, const QuantK& q) {
  const G* g = static_cast<const G*>(t.g);
  const uint8_t* mc = static_cast<const uint8_t*>(t.m);
  const uint8_t* vc = static_cast<const uint8_t*>(t.v);
  const V ms = vset1(*t.m_scale), vs = vset1(*t.v_scale);
  const V sc[4] = {ms, vmul(vset1(0.0f), ms), vs, vmul(vset1(0.0f), vs)};  // scale, 0 * scale
  alignas(64) float mb[kBlock + kLanes], vb[kBlock + kLanes];
  V amax_m = vset1(0.0f), amax_v = vset1(0.0f);
  int64_t i = 0;
  for (; i + kLanes <= t.n; i += kLanes)
    int8_update_vec<G, kBf16Master>(g, t.master, t.out, mc, vc, i, k, q, c.round_key, t.index,
                                    sc, mb, vb, amax_m, amax_v);
  if (i < t.n) {
    // Zero-padded copies of the tail; padding codes decode to 0, so padding lanes stay 0 and
    // leave the absmax alone.
    const int64_t r = t.n - i;
    constexpr size_t kMs = kBf16Master ? 2 : 4;
    G gt[kLanes] = {};
    alignas(64) unsigned char pt[kLanes * kMs] = {};
    uint16_t ot[kLanes];
    uint8_t mct[kLanes], vct[kLanes];
    for (int j = 0; j < kLanes; ++j) {
      mct[j] = kZeroCodeM;
      vct[j] = 0;
    }
    for (int64_t j = 0; j < r; ++j) {
      gt[j] = g[i + j];
      mct[j] = mc[i + j];
      vct[j] = vc[i + j];
    }
    const unsigned char* msrc = static_cast<const unsigned char*>(t.master) + size_t(i) * kMs;
    for (size_t j = 0; j < size_t(r) * kMs; ++j) pt[j] = msrc[j];
    int8_update_vec<G, kBf16Master>(gt, pt, t.out ? ot : nullptr, mct, vct, 0, k, q,
                                    c.round_key, t.index + uint32_t(i), sc, mb + i, vb + i,
                                    amax_m, amax_v);
    unsigned char* mdst = static_cast<unsigned char*>(t.master) + size_t(i) * kMs;
    for (size_t j = 0; j < size_t(r) * kMs; ++j) mdst[j] = pt[j];
    if (t.out)
      for (int64_t j = 0; j < r; ++j) t.out[i + j] = ot[j];
  }
  int8_encode<false>(mb, t.n, lanes_max(amax_m), q, static_cast<uint8_t*>(t.m), t.m_scale);
  int8_encode<true>(vb, t.n, lanes_max(amax_v), q, static_cast<uint8_t*>(t.v), t.v_scale);
}

}  // namespace

// The block codecs: the vector code on whole vectors, zero-padded copies for the tail.
void SF_SIMD_NAME(int8_encode)(const float* x, int64_t n, bool is_v, const StateConsts& c,
                               uint8_t* codes, float* scale) {
  const QuantK q = quant_consts(c);
  alignas(64) float xb[kBlock + kLanes] = {};
  V amax = vset1(0.0f);
  for (int64_t i = 0; i < n; ++i) xb[i] = x[i];
  for (int64_t i = 0; i < n; i += kLanes) amax = vmax(vabs(vload(xb + i)), amax);
  if (is_v)
    int8_encode<true>(xb, n, lanes_max(amax), q, codes, scale);
  else
    int8_encode<false>(xb, n, lanes_max(amax), q, codes, scale);
}
void SF_SIMD_NAME(int8_decode)(const uint8_t* codes, int64_t n, bool is_v, float scale,
                               const StateConsts& c, float* x) {
  const QuantK q = quant_consts(c);
  const V s = vset1(scale), zs = vmul(vset1(0.0f), s);
  uint8_t cb[kBlock + kLanes];
  for (int64_t i = 0; i < n; ++i) cb[i] = codes[i];
  for (int64_t i = n; i < n + kLanes; ++i) cb[i] = is_v ? 0 : kZeroCodeM;
  alignas(64) float xb[kBlock + kLanes];
  for (int64_t i = 0; i < n; i += kLanes)
    vstore(xb + i, is_v ? value_v(load_codes(cb + i), s, zs, q) : value_m(load_codes(cb + i), s, zs, q));
  for (int64_t i = 0; i < n; ++i) x[i] = xb[i];
}

#define SF_STATE_DENSE(GT, GN, MOM, MN, BM, BMN)                                                         \
  void SF_SIMD_NAME(state_##GN##_##MN##_##BMN)(const StateTask* t, int64_t n, const StateConsts& c) { \
    for (int64_t i = 0; i < n; ++i) dense_step<GT, MOM, BM>(t[i], c, state_##GN##_##MN##_##BMN##_scalar); \
  }
#define SF_STATE_INT8(GT, GN, BM, BMN)                                                                \
  void SF_SIMD_NAME(state_##GN##_int8_##BMN)(const StateTask* t, int64_t n, const StateConsts& c) { \
    const Vc k = broadcast(c.adam);                                                               \
    const QuantK q = quant_consts(c);                                                             \
    for (int64_t i = 0; i < n; ++i) int8_step<GT, BM>(t[i], c, k, q);                             \
  }
SF_STATE_DENSE(float, f32, kF32, f32, false, f32)
SF_STATE_DENSE(float, f32, kF32, f32, true, bf16)
SF_STATE_DENSE(float, f32, kBf16, bf16, false, f32)
SF_STATE_DENSE(float, f32, kBf16, bf16, true, bf16)
SF_STATE_DENSE(uint16_t, bf16, kF32, f32, false, f32)
SF_STATE_DENSE(uint16_t, bf16, kF32, f32, true, bf16)
SF_STATE_DENSE(uint16_t, bf16, kBf16, bf16, false, f32)
SF_STATE_DENSE(uint16_t, bf16, kBf16, bf16, true, bf16)
SF_STATE_INT8(float, f32, false, f32)
SF_STATE_INT8(float, f32, true, bf16)
SF_STATE_INT8(uint16_t, bf16, false, f32)
SF_STATE_INT8(uint16_t, bf16, true, bf16)
#undef SF_STATE_DENSE
#undef SF_STATE_INT8
