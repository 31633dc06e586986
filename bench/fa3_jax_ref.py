#!/usr/bin/env python3
"""FlashAttention-3 (Dao-AILab's Hopper kernels) at bench_cuda_kernels' attention shapes: issue
19's question whether any published kernel runs causal GQA attention faster than cuDNN's.

FA3 reaches this machine as a library with no Python ABI: the PyPI wheel dew-flash-attn-cu13
builds its sm90a kernels (bf16/fp16, heads of 64-256, causal, GQA, variable lengths) into
libdew_flash_attn3.so, whose XLA FFI targets any CUDA 13 JAX can call. Only that file travels
(18 MB; the device image has jax 0.11 with the CUDA 13 plugin): scripts/fetch_fa3_baseline.sh
puts it in .fa3/ (git-ignored; a device call names it in `carry`), then on the GPU machine:
  python3 bench/fa3_jax_ref.py --lib .fa3/libdew_flash_attn3.so [--head-dim 64|128]
      [--span-ms T] [--quick] [--check-only]
It first checks FA3's forward and backward against a float32 reference at a small causal GQA
shape (a call the library misread, e.g. a mask it ignored, would otherwise pass for speed),
then times each row like bench/torch_attention_ref.py --span-ms: regions of calls enqueued back
to back filling T ms (JAX dispatches asynchronously, so the host runs ahead of the GPU), the
median over regions, wall clock from the first enqueue to the last result. Rows print as
`fa3    forward|backward|fwd+bwd (gqa)  seq L x B, H/KV heads, D d  ms  TFLOP/s`, FLOPs counted
as bench_cuda_kernels counts them (forward 4*D*H*B*L^2/2 causal, backward 2.5x). Inputs are
[B, L, H, D] bf16 (FA3's layout), q/k/v ~ U(-2, 2), dO ~ U(-1, 1), bench_cuda_kernels' draws.
The backward is the kernel's own call on a fixed (dO, q, k, v, o, lse), as torch's is timed.
"""
import argparse
import ctypes
import glob
import math
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from attention_shapes import HEADS, LENGTHS, shapes  # bench_cuda_kernels' rows (same folder)

FWD, BWD = "dew_flash3_mha_fwd", "dew_flash3_mha_bwd"


def load(path):
    """Registers the library's dense forward and backward FFI targets with JAX."""
    jax.devices("gpu")  # the CUDA plugin loads libcudart.so.13 first; the library links it
    for lib in glob.glob(os.path.join(os.path.dirname(jax.__file__), "..", "nvidia", "cu13",
                                      "lib", "libcudart.so.13")):
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(path)
    for name in (FWD, BWD):
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="CUDA")


def attrs(scale):
    return {"softmax_scale": np.float64(scale), "is_causal": True,
            "window_size_left": np.int64(-1), "window_size_right": np.int64(-1)}


def forward(q, k, v):
    """(o [B, L, H, D], lse [B, H, L] f32) of causal attention, k/v heads shared by groups."""
    B, L, H, D = q.shape
    out = (jax.ShapeDtypeStruct(q.shape, q.dtype),
           jax.ShapeDtypeStruct((B, H, L), jnp.float32),
           jax.ShapeDtypeStruct((1, 1, 1, 1), jnp.float32),  # split-key scratch: unused
           jax.ShapeDtypeStruct((1, 1, 1), jnp.float32))
    o, lse, _, _ = jax.ffi.ffi_call(FWD, out)(q, k, v, **attrs(1.0 / math.sqrt(D)))
    return o, lse


def backward(do, q, k, v, o, lse):
    """(dq, dk, dv): dk / dv per key head, as the kernel sums each group itself."""
    B, L, H, D = q.shape
    # Two f32 row buffers a query head: every token plus one 128-row block a sequence and one.
    scratch = jax.ShapeDtypeStruct((H * (B * L + 128 * (B + 1)),), jnp.float32)
    out = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, q.dtype),
           jax.ShapeDtypeStruct(v.shape, q.dtype), scratch, scratch)
    dq, dk, dv, _, _ = jax.ffi.ffi_call(BWD, out)(do, q, k, v, o, lse, **attrs(1.0 / math.sqrt(D)))
    return dq, dk, dv


def reference(q, k, v):
    """Causal GQA attention in float32, [B, L, H, D]."""
    B, L, H, D = q.shape
    g = H // k.shape[2]
    kf = jnp.repeat(k.astype(jnp.float32), g, axis=2)
    vf = jnp.repeat(v.astype(jnp.float32), g, axis=2)
    s = jnp.einsum("blhd,bmhd->bhlm", q.astype(jnp.float32), kf) / math.sqrt(D)
    s = jnp.where(jnp.tril(jnp.ones((L, L), bool)), s, -jnp.inf)
    return jnp.einsum("bhlm,bmhd->blhd", jax.nn.softmax(s, axis=-1), vf)


def draw(key, shape, half):
    return jax.random.uniform(key, shape, jnp.float32, -half, half).astype(jnp.bfloat16)


def inputs(B, L, H, KV, D, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    return (draw(ks[0], (B, L, H, D), 2.0), draw(ks[1], (B, L, KV, D), 2.0),
            draw(ks[2], (B, L, KV, D), 2.0), draw(ks[3], (B, L, H, D), 1.0))


def check(H, KV, D):
    """FA3 against the f32 reference at 2 x 640 tokens (a partial last block). Returns the worst
    error relative to each output's largest magnitude; exits if any exceeds 2%."""
    q, k, v, do = inputs(2, 640, H, KV, D, seed=1)
    o, lse = jax.jit(forward)(q, k, v)
    dq, dk, dv = jax.jit(backward)(do, q, k, v, o, lse)
    ref_o, vjp = jax.vjp(reference, q.astype(jnp.float32), k.astype(jnp.float32),
                         v.astype(jnp.float32))
    refs = (ref_o,) + vjp(do.astype(jnp.float32))
    worst = 0.0
    for name, got, want in zip(("o", "dq", "dk", "dv"), (o, dq, dk, dv), refs):
        err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want)) / jnp.max(jnp.abs(want)))
        print(f"# check D {D} {H}/{KV} heads: {name} max error {err:.2e} of its largest value",
              flush=True)
        worst = max(worst, err)
    if worst > 2e-2:
        sys.exit(f"fa3: D {D} disagrees with the f32 reference ({worst:.2e}): not timing it")
    return worst


def timed(fn, args, span_ms, regions):
    """Median ms per call over regions of calls enqueued back to back filling span_ms."""
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    one = (time.perf_counter() - t0) * 1e3
    calls = max(1, min(512, math.ceil(span_ms / max(one, 1e-3)))) if span_ms > 0 else 1
    per = []
    for _ in range(regions):
        t0 = time.perf_counter()
        r = None
        for _ in range(calls):
            r = fn(*args)
        jax.block_until_ready(r)
        per.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(per)


def row(op, shape, ms, flops):
    print(f"fa3    {op:<44} {shape:<34} {ms:10.3f} ms {flops / ms / 1e9:8.1f} TFLOP/s",
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="path of libdew_flash_attn3.so")
    ap.add_argument("--head-dim", type=int, choices=(64, 128))
    ap.add_argument("--span-ms", type=float, default=20.0,
                    help="regions of calls back to back filling this many ms (0: one call)")
    ap.add_argument("--quick", action="store_true", help="5 regions per row, not 11")
    ap.add_argument("--seq", type=int, choices=LENGTHS, help="the rows of this length only")
    ap.add_argument("--check-only", action="store_true", help="the correctness check alone")
    args = ap.parse_args()
    if args.span_ms < 0:
        ap.error(f"--span-ms {args.span_ms}: a span is a number of ms >= 0")
    if not os.path.isfile(args.lib):
        ap.error(f"--lib {args.lib}: no such file (scripts/fetch_fa3_baseline.sh fetches it)")
    load(args.lib)
    dev = jax.devices("gpu")[0]
    print(f"jax {jax.__version__}, {dev.device_kind}, FA3 from {os.path.basename(args.lib)}, "
          f"span {args.span_ms} ms", flush=True)
    for H, KV, D in HEADS:
        if args.head_dim in (None, D):
            check(H, KV, D)
    if args.check_only:
        return
    fwd, bwd = jax.jit(forward), jax.jit(backward)
    regions = 5 if args.quick else 11
    for L, B, H, KV, D in shapes(args.head_dim, args.seq):
        q, k, v, do = inputs(B, L, H, KV, D)
        o, lse = jax.block_until_ready(fwd(q, k, v))
        flops = 4.0 * D * H * B * L * L / 2
        shape = f"seq {L} x {B}, {H}/{KV} heads, D {D}"
        ms = timed(fwd, (q, k, v), args.span_ms, regions)
        msb = timed(bwd, (do, q, k, v, o, lse), args.span_ms, regions)
        row("forward (gqa)", shape, ms, flops)
        row("backward (gqa)", shape, msb, 2.5 * flops)
        row("fwd+bwd (gqa)", shape, ms + msb, 3.5 * flops)
        del q, k, v, do, o, lse


if __name__ == "__main__":
    main()
