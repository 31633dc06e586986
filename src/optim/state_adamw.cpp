// Compact-state AdamW front end (state_adamw.h): checks the window against the unit's layout,
// cuts it into tasks (kAdamWChunk elements at most, never splitting an int8 block or
// straddling a range), and runs the chosen ISA's kernels on them over the thread pool; plus
// the fp32 decode / encode of a window.
#include "optim/state_adamw.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/adamw.h"
#include "optim/state_kernel_table.h"

namespace sf {

namespace ok = optim_kernels;

namespace {

// The part [b, e) (unit indices) of one range inside the window.
struct Piece {
  const RangeStateLayout* r;
  int64_t b, e;
};

size_t moment_size(MomentFormat f) {
  return f == MomentFormat::f32 ? 4 : f == MomentFormat::bf16 ? 2 : 1;
}
size_t master_size(MasterFormat f) { return f == MasterFormat::f32 ? 4 : 2; }

// Whether unit index x is a block boundary of int8 range r (its ends count).
bool on_block_edge(const RangeStateLayout& r, int64_t x) {
  if (x == r.offset || x == r.offset + r.numel) return true;
  if (r.row == 0) return x % kStateBlock == 0;
  return (x - r.offset) % r.row % kStateBlock == 0;
}

// The window's pieces of the given ranges, each matched to its layout range; checks the
// view, the window and (int8) that no block is split.
std::vector<Piece> window_pieces(const UnitStateView& s, int64_t off, int64_t len,
                                 std::span<const ParamRange> ranges, const char* who) {
  SF_CHECK(s.layout && s.layout->format == s.format, who,
           ": the state view of unit ", s.unit, " has no layout or one of another format");
  const UnitStateLayout& L = *s.layout;
  SF_CHECK(off >= 0 && len >= 0 && off + len <= L.numel, who, ": window [", off, ", ",
           off + len, ") outside unit ", s.unit, " of ", L.numel, " elements");
  std::vector<Piece> out;
  size_t j = 0;
  for (const ParamRange& pr : ranges) {
    while (j < L.ranges.size() && L.ranges[j].offset < pr.offset) ++j;
    SF_CHECK(j < L.ranges.size() && L.ranges[j].offset == pr.offset &&
                 L.ranges[j].numel == pr.numel && L.ranges[j].row == pr.row,
             who, ": range [", pr.offset, ", ", pr.offset + pr.numel, ") row ", pr.row,
             " is not one of unit ", s.unit, "'s layout ranges (pass the unit's full ranges)");
    const RangeStateLayout& r = L.ranges[j];
    const int64_t b = std::max(off, r.offset), e = std::min(off + len, r.offset + r.numel);
    if (b >= e) continue;
    SF_CHECK(r.moments != MomentFormat::int8 || (on_block_edge(r, b) && on_block_edge(r, e)),
             who, ": window [", off, ", ", off + len, ") splits an int8 block of range [",
             r.offset, ", ", r.offset + r.numel, ") row ", r.row, " of unit ", s.unit,
             "; windows must end on multiples of ", kStateBlock, " (or rows)");
    out.push_back({&r, b, e});
  }
  if (!out.empty())
    SF_CHECK(s.master && s.m && s.v &&
                 (s.format.moments != MomentFormat::int8 || s.layout->scale_count == 0 ||
                  (s.m_scale && s.v_scale)),
             who, ": null master/m/v/scale pointer in the state view of unit ", s.unit);
  return out;
}

// Calls fn(b, n, scale_index) for each block of piece [b, e) of int8 range r (dense ranges:
// one call for the whole piece, scale_index 0).
template <class Fn>
void for_each_block(const RangeStateLayout& r, int64_t b, int64_t e, Fn&& fn) {
  if (r.moments != MomentFormat::int8) return fn(b, e - b, int64_t(0));
  while (b < e) {
    int64_t n, idx;
    if (r.row == 0) {
      n = std::min(e, (b / kStateBlock + 1) * kStateBlock) - b;
      idx = r.scale_offset + b / kStateBlock - r.offset / kStateBlock;
    } else {
      const int64_t rel = b - r.offset, in_row = rel % r.row;
      n = std::min(kStateBlock, r.row - in_row);
      idx = r.scale_offset + rel / r.row * ((r.row + kStateBlock - 1) / kStateBlock) +
            in_row / kStateBlock;
    }
    fn(b, n, idx);
    b += n;
  }
}

// Pieces cut into tasks of at most ~kAdamWChunk elements at block (row) boundaries.
std::vector<Piece> cut_tasks(const std::vector<Piece>& pieces) {
  std::vector<Piece> tasks;
  for (const Piece& p : pieces) {
    const RangeStateLayout& r = *p.r;
    // Unit-absolute multiples of kAdamWChunk are block edges of a row == 0 range; a row > 0
    // range is cut at whole rows.
    const int64_t step = r.moments == MomentFormat::int8 && r.row > 0
                             ? std::max<int64_t>(1, kAdamWChunk / r.row) * r.row
                             : kAdamWChunk;
    const int64_t base = r.moments == MomentFormat::int8 && r.row > 0 ? r.offset : 0;
    for (int64_t b = p.b; b < p.e;) {
      const int64_t e = std::min(p.e, base + ((b - base) / step + 1) * step);
      tasks.push_back({p.r, b, e});
      b = e;
    }
  }
  return tasks;
}

// The int8 maps of the constants (all a codec needs).
ok::StateConsts map_consts() {
  ok::StateConsts k{};
  k.map_m = int8_map(false);
  k.mid_m = int8_midpoints(false);
  k.map_v = int8_map(true);
  k.mid_v = int8_midpoints(true);
  return k;
}

ok::StateConsts state_consts(const AdamWStep& s, bool decay, const UnitStateView& v) {
  const AdamWConstants c = adamw_constants(s, decay);
  ok::StateConsts k = map_consts();
  static_assert(sizeof(k.adam) == sizeof(c));
  std::memcpy(&k.adam, &c, sizeof c);
  k.round_key = stochastic_round_key(v.rounding_seed, v.unit, s.step);
  return k;
}

// StateFormat{}: exactly adamw_update_ranges on the window.
template <class G>
void run_fp32(const UnitStateView& s, int64_t off, int64_t len, const G* g, uint16_t* out,
              std::span<const ParamRange> ranges, const AdamWStep& st, ThreadPool* pool,
              CpuIsa isa) {
  SF_CHECK(s.layout && s.layout->format == s.format, "adamw_update_state: unit ", s.unit,
           " has no fp32 layout");
  SF_CHECK(off >= 0 && len >= 0 && off + len <= s.layout->numel, "adamw_update_state: window [",
           off, ", ", off + len, ") outside unit ", s.unit);
  const std::vector<ParamRange> w = clip_ranges(ranges, off, len);
  adamw_update_ranges(static_cast<float*>(s.master) + off, static_cast<float*>(s.m) + off,
                      static_cast<float*>(s.v) + off, g, out, len, w, st, pool, isa);
}

// Points each block's state at a copy of its bytes in this thread's scratch, so that the
// kernel's writes of master, m, v and scales land there and the store keeps its state.
void redirect_to_scratch(std::vector<ok::StateTask>& blocks, const RangeStateLayout& r, size_t ms) {
  thread_local std::vector<std::byte> scratch;
  const size_t es = moment_size(r.moments);
  size_t bytes = 0;
  for (const ok::StateTask& t : blocks) bytes += size_t(t.n) * (ms + 2 * es) + 2 * sizeof(float);
  if (scratch.size() < bytes) scratch.resize(bytes);
  std::byte* p = scratch.data();
  auto copy = [&p](void*& at, size_t n) {
    std::memcpy(p, at, n);
    at = p;
    p += n;
  };
  for (ok::StateTask& t : blocks) {
    copy(t.master, size_t(t.n) * ms);
    copy(t.m, size_t(t.n) * es);
    copy(t.v, size_t(t.n) * es);
    if (t.m_scale) {
      void* m = t.m_scale;
      void* v = t.v_scale;
      copy(m, sizeof(float));
      copy(v, sizeof(float));
      t.m_scale = static_cast<float*>(m);
      t.v_scale = static_cast<float*>(v);
    }
  }
}

// keep_state: only `out` is written (adamw_weights_of_update).
template <class G>
void run_state(const UnitStateView& s, int64_t off, int64_t len, const G* g, uint16_t* out,
               std::span<const ParamRange> ranges, const AdamWStep& st, ThreadPool* pool,
               CpuIsa isa, bool keep_state = false) {
  if (s.format.is_fp32()) {
    SF_CHECK(!keep_state, "adamw_weights_of_update: unit ", s.unit, " is fp32 (it has an exact undo instead)");
    return run_fp32(s, off, len, g, out, ranges, st, pool, isa);
  }
  const ok::StateKernelTable& table = ok::state_kernel_table(isa);
  const ok::StateConsts kc[2] = {state_consts(st, false, s), state_consts(st, true, s)};
  const std::vector<Piece> tasks = cut_tasks(window_pieces(s, off, len, ranges,
                                                           "adamw_update_state"));
  if (tasks.empty()) return;
  SF_CHECK(g, "adamw_update_state: null gradient for unit ", s.unit);
  const size_t ms = master_size(s.format.master);
  const int gi = std::is_same_v<G, float> ? 0 : 1, mi = s.format.master == MasterFormat::f32 ? 0 : 1;

  auto one = [&](int64_t t) {
    const Piece& p = tasks[size_t(t)];
    const RangeStateLayout& r = *p.r;
    const ok::StateKernel kernel = table.k[gi][int(r.moments)][mi];
    const size_t es = moment_size(r.moments);
    // The task's blocks in one kernel call (a task is at most kAdamWChunk elements: 256 int8
    // blocks, or one dense piece).
    thread_local std::vector<ok::StateTask> blocks;
    blocks.clear();
    for_each_block(r, p.b, p.e, [&](int64_t b, int64_t n, int64_t si) {
      const size_t mo = r.moment_offset + size_t(b - r.offset) * es;
      blocks.push_back({g + (b - off),
                        out ? out + (b - off) : nullptr,
                        static_cast<char*>(s.master) + size_t(b) * ms,
                        static_cast<char*>(s.m) + mo,
                        static_cast<char*>(s.v) + mo,
                        s.m_scale ? s.m_scale + si : nullptr,
                        s.v_scale ? s.v_scale + si : nullptr,
                        n,
                        uint32_t(b)});
    });
    if (keep_state) redirect_to_scratch(blocks, r, ms);
    kernel(blocks.data(), int64_t(blocks.size()), kc[r.decay ? 1 : 0]);
  };
  if (pool && tasks.size() > 1)
    pool->run_tasks(int64_t(tasks.size()), one);
  else
    for (size_t t = 0; t < tasks.size(); ++t) one(int64_t(t));
}

// Decodes n moments (of v if is_v) of format f at a (block scale `scale` for int8) into x.
void decode_moments(MomentFormat f, bool is_v, const char* a, int64_t n, float scale, float* x) {
  if (f == MomentFormat::f32) std::memcpy(x, a, size_t(n) * 4);
  if (f == MomentFormat::bf16)
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, a + 2 * i, 2);
      x[i] = bf16_to_f32(h);
    }
  if (f == MomentFormat::int8)
    ok::state_kernel_table(CpuIsa::automatic)
        .int8_decode(reinterpret_cast<const uint8_t*>(a), n, is_v, scale, map_consts(), x);
}

void encode_moments(MomentFormat f, bool is_v, const float* x, int64_t n, char* a,
                    float* scale) {
  if (f == MomentFormat::f32) std::memcpy(a, x, size_t(n) * 4);
  if (f == MomentFormat::bf16)
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = f32_to_bf16(x[i]);
      std::memcpy(a + 2 * i, &h, 2);
    }
  if (f == MomentFormat::int8)
    ok::state_kernel_table(CpuIsa::automatic)
        .int8_encode(x, n, is_v, map_consts(), reinterpret_cast<uint8_t*>(a), scale);
}

// Calls fn(range, b, n, moment byte offset, scale index) for every block of the window.
template <class Fn>
void for_each_window_block(const UnitStateView& s, int64_t off, int64_t len,
                           std::span<const ParamRange> ranges, const char* who, Fn&& fn) {
  for (const Piece& p : window_pieces(s, off, len, ranges, who)) {
    const RangeStateLayout& r = *p.r;
    for_each_block(r, p.b, p.e, [&](int64_t b, int64_t n, int64_t si) {
      fn(r, b, n, r.moment_offset + size_t(b - r.offset) * moment_size(r.moments), si);
    });
  }
}

}  // namespace

std::vector<StatePiece> state_window_pieces(const UnitStateView& state, int64_t off,
                                            int64_t len, std::span<const ParamRange> ranges) {
  std::vector<StatePiece> out;
  for (const Piece& p : window_pieces(state, off, len, ranges, "state_window_pieces"))
    out.push_back({p.r, p.b, p.e});
  return out;
}

void adamw_update_state(const UnitStateView& state, int64_t off, int64_t len,
                        const float* grad, uint16_t* bf16_out,
                        std::span<const ParamRange> ranges, const AdamWStep& s,
                        ThreadPool* pool, CpuIsa isa) {
  run_state(state, off, len, grad, bf16_out, ranges, s, pool, isa);
}
void adamw_update_state(const UnitStateView& state, int64_t off, int64_t len,
                        const uint16_t* grad_bf16, uint16_t* bf16_out,
                        std::span<const ParamRange> ranges, const AdamWStep& s,
                        ThreadPool* pool, CpuIsa isa) {
  run_state(state, off, len, grad_bf16, bf16_out, ranges, s, pool, isa);
}
void adamw_weights_of_update(const UnitStateView& state, int64_t off, int64_t len,
                             const uint16_t* grad_bf16, uint16_t* bf16_out,
                             std::span<const ParamRange> ranges, const AdamWStep& s,
                             ThreadPool* pool, CpuIsa isa) {
  SF_CHECK(bf16_out, "adamw_weights_of_update: no output for unit ", state.unit);
  run_state(state, off, len, grad_bf16, bf16_out, ranges, s, pool, isa, true);
}

void state_to_f32(const UnitStateView& s, int64_t off, int64_t len, float* master, float* m,
                  float* v, std::span<const ParamRange> ranges) {
  const bool bf16_master = s.format.master == MasterFormat::bf16;
  for_each_window_block(s, off, len, ranges, "state_to_f32",
                        [&](const RangeStateLayout& r, int64_t b, int64_t n, size_t mo,
                            int64_t si) {
    if (master)
      for (int64_t i = 0; i < n; ++i)
        master[b - off + i] = bf16_master ? bf16_to_f32(static_cast<uint16_t*>(s.master)[b + i])
                                          : static_cast<float*>(s.master)[b + i];
    const bool q = r.moments == MomentFormat::int8;
    if (m)
      decode_moments(r.moments, false, static_cast<char*>(s.m) + mo, n,
                     q ? s.m_scale[si] : 0.0f, m + (b - off));
    if (v)
      decode_moments(r.moments, true, static_cast<char*>(s.v) + mo, n,
                     q ? s.v_scale[si] : 0.0f, v + (b - off));
  });
}

void state_from_f32(const UnitStateView& s, int64_t off, int64_t len, const float* master,
                    const float* m, const float* v, std::span<const ParamRange> ranges) {
  const bool bf16_master = s.format.master == MasterFormat::bf16;
  for_each_window_block(s, off, len, ranges, "state_from_f32",
                        [&](const RangeStateLayout& r, int64_t b, int64_t n, size_t mo,
                            int64_t si) {
    if (master)
      for (int64_t i = 0; i < n; ++i) {
        const float x = master[b - off + i];
        if (bf16_master)
          static_cast<uint16_t*>(s.master)[b + i] = f32_to_bf16(x);
        else
          static_cast<float*>(s.master)[b + i] = x;
      }
    const bool q = r.moments == MomentFormat::int8;
    if (m)
      encode_moments(r.moments, false, m + (b - off), n, static_cast<char*>(s.m) + mo,
                     q ? s.m_scale + si : nullptr);
    if (v)
      encode_moments(r.moments, true, v + (b - off), n, static_cast<char*>(s.v) + mo,
                     q ? s.v_scale + si : nullptr);
  });
}

}  // namespace sf
