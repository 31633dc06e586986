// The f32 dQ accumulator of the one-pass attention backward (launch_attention_backward_atomic):
// where each query head's 64-row tiles sit and, inside a tile, which float is which. Host and
// device code share it (the layout is checked on the host, tests/cuda).
//
// A tile holds 64 x D floats in the order the tensor cores leave them in a warpgroup's
// registers, not row-major: each thread's eight float4 are then one contiguous 16-byte store or
// atomic each, and a warpgroup's [64, 64] share of the tile is one contiguous 16 KiB block that
// a single bulk reduce-add can add into global memory. The conversion into dq reads it back
// through dq_acc_slot.
//
// Beside it, the warp-specialised backward keeps each row's lse and delta in the same rows (one
// float per row), so that an item's 64 values are one aligned 256-byte copy.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define SF_HOST_DEVICE __host__ __device__
#else
#define SF_HOST_DEVICE
#endif

namespace sf::cuda::attn {

constexpr int kAccTileRows = 64;

SF_HOST_DEVICE constexpr int64_t round_up_tile(int64_t x) {
  return (x + kAccTileRows - 1) / kAccTileRows * kAccTileRows;
}

// Rows per head: sequence s (first token `start`) has its tiles from row round_up_tile(start) +
// 64 s on, so that every tile starts at a multiple of 64 rows (256-byte aligned per-row f32
// arrays, for the copy engine) and a sequence's last, partial tile ends before the next
// sequence's first.
SF_HOST_DEVICE constexpr int64_t dq_acc_rows(int64_t T, int n_seqs) {
  return round_up_tile(T) + int64_t(kAccTileRows) * n_seqs;
}

// The first row of the tile of head h, sequence seq (first token start), query rows
// q0 .. q0 + 63 (q0 a multiple of 64, within the sequence), counted over all heads' rows
// (rows = dq_acc_rows): the tile's floats start at row x D, its per-row values at row.
SF_HOST_DEVICE constexpr int64_t dq_acc_row(int64_t rows, int h, int seq, int64_t start,
                                            int q0) {
  return int64_t(h) * rows + round_up_tile(start) + int64_t(kAccTileRows) * seq + q0;
}

// Inside a tile, float4 number f = (cb * 8 + j) * 128 + t (0 <= f < 16 D) belongs to thread t
// of a warpgroup's m64nNk16 accumulator (warp t / 32, lane t % 32), column block cb (64 columns)
// and 8-column group j: its floats are (row, col), (row, col + 1), (row + 8, col),
// (row + 8, col + 1), the thread's registers 4 j .. 4 j + 3.
struct AccSlot {
  int row, col;
};
SF_HOST_DEVICE constexpr AccSlot dq_acc_slot(int f) {
  const int t = f & 127, j = (f >> 7) & 7, cb = f >> 10;
  const int lane = t & 31;
  return {(t >> 5) * 16 + (lane >> 2), cb * 64 + j * 8 + 2 * (lane & 3)};
}

}  // namespace sf::cuda::attn
