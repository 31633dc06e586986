#!/usr/bin/env python3
"""torch SDPA, every CUDA backend, at bench_cuda_kernels' attention shapes (issue 19's yardstick).

Run on the GPU machine next to `bench_cuda_kernels --only attention`:
  python3 bench/torch_attention_ref.py [--backend flash|efficient|cudnn] [--quick]
      [--head-dim 64|128] [--span-ms T] [--data uniform|randn]
--span-ms T times regions of as many calls back to back as fill T ms (bench_cuda_kernels'
--span-ms): torch's host overhead per call is then hidden behind the GPU's work, as in a
training step, instead of being counted in a call's time. --data: uniform (default) draws what
bench_cuda_kernels draws, q/k/v ~ U(-2, 2) and dO ~ U(-1, 1); randn draws N(0, 1).
Shapes (as the C++ rows): causal attention, seq L x (16384 / L) sequences for L = 1K..16K,
then one sequence of 32K, 64K and 128K; D 128 with 32/8 heads and D 64 with 64/16 heads.
Tensors are contiguous [B, H, L, D] bf16 (torch's usual layout; its cuDNN backend runs
bench_cuda_kernels' packed [T, (H + 2 KV) D] layout at the same speed at 16K-64K, within 1%).
Each backend runs through torch.nn.attention.sdpa_kernel with enable_gqa=True where it accepts
it; otherwise k and v are expanded to the query heads once, outside the timed region, and the row says "kv expanded".
A backend that refuses a shape prints why instead of a row.
Rows: median ms (CUDA events) of the training forward (autograd on, so it keeps its
statistics) and of the backward (autograd.grad), and TFLOP/s with bench_cuda_kernels'
formula: forward 4*D*H*B*L^2/2 (causal), backward 2.5x, fwd+bwd 3.5x.

--varlen: instead, packed calls of unequal sequences, bench_cuda_kernels' varlen rows (the same
lengths: varlen_mix is its generator), each way torch can run them, credited with the same
FLOPs (4*D*H*sum(len^2)/2 forward): varlen_attn (torch.nn.attention.varlen, flash) on the
packed [T, H, D] tensors; every SDPA backend on the jagged nested tensor; every SDPA backend
once per sequence (contiguous [1, H, len, D] each, made outside the timed region); every SDPA
backend on the sequences padded to the longest, [n, H, max, D] (exact for causal attention with
the padding after each sequence: padded rows get a zero gradient). A way that refuses the call
prints why.
"""
import argparse
import inspect
import itertools
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_shapes import HEADS, shapes  # bench_cuda_kernels' rows (same folder)
from torch_ref import bench  # median of CUDA-event timings (same folder)

dev = "cuda"
bf = torch.bfloat16
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
SPAN_MS = 0.0       # --span-ms
DATA = "uniform"    # --data


def timed(fn, reps):
    """Median ms per call: regions of one call, or with --span-ms of as many as fill it."""
    if SPAN_MS <= 0:
        return bench(fn, reps=reps)
    one = bench(fn, reps=1)
    calls = min(256, max(1, math.ceil(SPAN_MS / max(one, 1e-3))))

    def burst():
        for _ in range(calls):
            fn()
    return bench(burst, reps=reps, warmup=1) / calls


def draw(*shape, grad=False):
    """A random bf16 tensor as --data says: q/k/v in U(-2, 2), an output gradient in U(-1, 1)."""
    if DATA == "randn":
        return torch.randn(*shape, device=dev, dtype=bf)
    half = 1.0 if grad else 2.0
    return ((torch.rand(*shape, device=dev) * 2 - 1) * half).to(bf)


def row(op, shape, ms, flops):
    print(f"torch  {op:<44} {shape:<34} {ms:10.3f} ms {flops / ms / 1e9:8.1f} TFLOP/s",
          flush=True)


def backward_workspace(grad, o):
    """MiB the backward grad(o) allocates beyond its gradients (its workspace: bench_cuda_kernels'
    'attention bwd workspace' rows count the same)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    g = grad(o)
    torch.cuda.synchronize()
    out = sum(x.numel() * x.element_size() for x in g)
    extra = torch.cuda.max_memory_allocated() - base - out
    del g
    return max(extra, 0) / 2**20


def ws_row(op, shape, mib):
    print(f"torch  {op:<44} {shape:<34} {mib:10.1f} MiB", flush=True)


def run_once(backend, q, k, v, gqa):
    """Forward then backward once (does the backend take this shape and this GQA mode?)."""
    with sdpa_kernel(backend):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    torch.cuda.synchronize()


def time_backend(name, backend, L, B, H, KV, D, reps):
    torch.manual_seed(0)
    q = draw(B, H, L, D).requires_grad_(True)
    k = draw(B, KV, L, D).requires_grad_(True)
    v = draw(B, KV, L, D).requires_grad_(True)
    shape = f"seq {L} x {B}, {H}/{KV} heads, D {D}"
    gqa, tag = True, "gqa"
    try:
        run_once(backend, q, k, v, True)
    except RuntimeError:
        # No native GQA here: expand k/v to the query heads once, outside the timed region.
        k = k.detach().repeat_interleave(H // KV, 1).requires_grad_(True)
        v = v.detach().repeat_interleave(H // KV, 1).requires_grad_(True)
        gqa, tag = False, "kv expanded"
        try:
            run_once(backend, q, k, v, False)
        except RuntimeError as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"torch  sdpa {name:<39} {shape:<34} unsupported: {msg[:160]}", flush=True)
            return
    fwd_flops = 4.0 * D * H * B * L * L / 2
    with sdpa_kernel(backend):
        def fwd():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        ms = timed(fwd, reps)
        o = fwd()
        do = draw(*o.shape, grad=True)
        grad = lambda o: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # noqa: E731
        msb = timed(lambda: grad(o), reps)
        mib = backward_workspace(grad, o)
    row(f"sdpa {name} forward ({tag})", shape, ms, fwd_flops)
    row(f"sdpa {name} backward ({tag})", shape, msb, 2.5 * fwd_flops)
    row(f"sdpa {name} fwd+bwd ({tag})", shape, ms + msb, 3.5 * fwd_flops)
    ws_row(f"sdpa {name} bwd workspace ({tag})", shape, mib)


def varlen_mix(total, max_len, seed):
    """bench_cuda_kernels' varlen_mix: the same integer LCG, the same lengths."""
    x = seed

    def nxt():
        nonlocal x
        x = (x * 1103515245 + 12345) % 2147483648
        return x >> 4

    exps = 0
    while (64 << (exps + 1)) <= max_len:
        exps += 1
    lens, left = [], total
    while left > 0:
        base = 64 << (nxt() % (exps + 1))
        n = min(max_len, base + nxt() % base, left)
        lens.append(n)
        left -= n
    return lens


VARLEN_MIXES = ((16384, 2048, 1), (32768, 8192, 2), (65536, 32768, 3))


def first_line(e):
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return msg[:160]


def time_way(way, shape, make, flops, reps):
    """make() -> (fwd, grad): fwd() runs the forward and returns what grad(o) differentiates."""
    try:
        fwd, grad = make()
        o = fwd()
        grad(o)
        torch.cuda.synchronize()
    except (RuntimeError, TypeError, NotImplementedError, ValueError) as e:
        print(f"torch  {way:<44} {shape:<34} unsupported: {first_line(e)}", flush=True)
        return
    ms = timed(fwd, reps)
    o = fwd()
    msb = timed(lambda: grad(o), reps)
    mib = backward_workspace(grad, o)
    row(f"{way} forward", shape, ms, flops)
    row(f"{way} backward", shape, msb, 2.5 * flops)
    row(f"{way} fwd+bwd", shape, ms + msb, 3.5 * flops)
    ws_row(f"{way} bwd workspace", shape, mib)


def leaf(t):
    return t.detach().contiguous().requires_grad_(True)


def varlen_rows(names, quick):
    for H, KV, D in HEADS:
        for total, max_len, seed in VARLEN_MIXES:
            lens = varlen_mix(total, max_len, seed)
            shape = f"varlen {total} ({len(lens)} seqs <= {max_len}), {H}/{KV} heads, D {D}"
            flops = 4.0 * D * H * sum(n * n for n in lens) / 2
            reps = 5 if quick or flops > 2e13 else 20
            print(f"# {shape}: lengths {lens}", flush=True)
            varlen_call(names, lens, H, KV, D, shape, flops, reps)
            torch.cuda.empty_cache()


def varlen_call(names, lens, H, KV, D, shape, flops, reps):
    torch.manual_seed(0)
    T, g = sum(lens), H // KV
    q, k, v = draw(T, H, D), draw(T, KV, D), draw(T, KV, D)
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), device=dev, dtype=torch.int32)
    do = draw(T, H, D, grad=True)
    starts = cu.tolist()

    def grad_of(leaves, dout):
        return lambda o: torch.autograd.grad(o, leaves, dout, retain_graph=True)

    def make_varlen():
        from torch.nn.attention import varlen as tv
        ql, kl, vl = leaf(q), leaf(k.repeat_interleave(g, 1)), leaf(v.repeat_interleave(g, 1))
        mx = max(lens)
        # Causal: is_causal in torch 2.10/2.11, a (-1, 0) window from 2.12 on.
        params = inspect.signature(tv.varlen_attn).parameters
        causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
        def fwd():
            return tv.varlen_attn(ql, kl, vl, cu, cu, mx, mx, **causal)
        return fwd, grad_of((ql, kl, vl), do)
    time_way("varlen_attn flash (kv expanded)", shape, make_varlen, flops, reps)

    for name in names:
        backend = BACKENDS[name]

        def make_nested():
            ql, kl, vl = leaf(q), leaf(k), leaf(v)
            off = cu.to(torch.int64)
            def fwd():
                nq, nk, nv = (torch.nested.nested_tensor_from_jagged(t, off).transpose(1, 2)
                              for t in (ql, kl, vl))
                with sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(nq, nk, nv, is_causal=True, enable_gqa=True)
                return o.transpose(1, 2).values()
            return fwd, grad_of((ql, kl, vl), do)
        time_way(f"sdpa {name} nested jagged", shape, make_nested, flops, reps)

        def make_loop():
            seqs = [tuple(leaf(t[a:b].transpose(0, 1).unsqueeze(0)) for t in (q, k, v))
                    for a, b in zip(starts, starts[1:])]
            douts = [do[a:b].transpose(0, 1).unsqueeze(0).contiguous()
                     for a, b in zip(starts, starts[1:])]
            leaves = [x for s3 in seqs for x in s3]
            def fwd():
                with sdpa_kernel(backend):
                    return [F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True)
                            for a, b, c in seqs]
            return fwd, lambda outs: torch.autograd.grad(outs, leaves, douts, retain_graph=True)
        time_way(f"sdpa {name} per sequence", shape, make_loop, flops, reps)

        def make_padded():
            n, mx = len(lens), max(lens)
            pads = []
            for t in (q, k, v, do):
                p = torch.zeros(n, mx, t.shape[1], D, device=dev, dtype=bf)
                for i, (a, b) in enumerate(zip(starts, starts[1:])):
                    p[i, : b - a] = t[a:b]
                pads.append(p.transpose(1, 2).contiguous())
            ql, kl, vl = (leaf(t) for t in pads[:3])
            def fwd():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(ql, kl, vl, is_causal=True, enable_gqa=True)
            return fwd, grad_of((ql, kl, vl), pads[3])
        time_way(f"sdpa {name} padded to the longest", shape, make_padded, flops, reps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=sorted(BACKENDS), action="append",
                    help="only these backends (repeatable); default: all")
    ap.add_argument("--quick", action="store_true", help="5 timed runs per row, not 20")
    ap.add_argument("--varlen", action="store_true",
                    help="packed unequal sequences (bench_cuda_kernels --only varlen) instead")
    ap.add_argument("--head-dim", type=int, choices=(64, 128),
                    help="only this head dimension's rows (bench_cuda_kernels --only attention:D64)")
    ap.add_argument("--span-ms", type=float, default=0.0,
                    help="time regions of calls back to back filling this many ms (default: one call)")
    ap.add_argument("--data", choices=("uniform", "randn"), default="uniform",
                    help="uniform: bench_cuda_kernels' distributions (default); randn: N(0, 1)")
    args = ap.parse_args()
    if args.span_ms < 0:
        ap.error(f"--span-ms {args.span_ms}: a span is a number of ms >= 0")
    global SPAN_MS, DATA
    SPAN_MS, DATA = args.span_ms, args.data
    names = args.backend or ["flash", "efficient", "cudnn"]
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}, data {DATA}, span {SPAN_MS} ms", flush=True)
    if args.varlen:
        varlen_rows(names, args.quick)
        return
    for L, B, H, KV, D in shapes(args.head_dim):
        big = 4.0 * D * H * B * L * L / 2 > 2e13  # the 64K / 128K rows run for seconds
        reps = 5 if args.quick or big else 20
        for name in names:
            time_backend(name, BACKENDS[name], L, B, H, KV, D, reps)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
