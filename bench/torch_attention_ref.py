#!/usr/bin/env python3
"""torch SDPA, every CUDA backend, at bench_cuda_kernels' attention shapes (issue 19's yardstick).

Run on the GPU machine next to `bench_cuda_kernels --only attention`:
  python3 bench/torch_attention_ref.py [--backend flash|efficient|cudnn] [--quick]
Shapes (as the C++ rows): causal attention, seq L x (16384 / L) sequences for L = 1K..16K,
then one sequence of 32K, 64K and 128K; D 128 with 32/8 heads and D 64 with 64/16 heads.
Tensors are contiguous [B, H, L, D] bf16 (torch's best layout). Each backend runs through
torch.nn.attention.sdpa_kernel with enable_gqa=True where it accepts it; otherwise k and v are
expanded to the query heads once, outside the timed region, and the row says "kv expanded".
A backend that refuses a shape prints why instead of a row.
Rows: median ms (CUDA events) of the training forward (autograd on, so it keeps its
statistics) and of the backward (autograd.grad), and TFLOP/s with bench_cuda_kernels'
formula: forward 4*D*H*B*L^2/2 (causal), backward 2.5x, fwd+bwd 3.5x.
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_ref import bench  # median of CUDA-event timings (same folder)

dev = "cuda"
bf = torch.bfloat16
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
TOKENS = 16384


def shapes():
    for H, KV, D in ((32, 8, 128), (64, 16, 64)):
        for L in (1024, 2048, 4096, 8192, 16384):
            yield L, TOKENS // L, H, KV, D
        for L in (32768, 65536, 131072):
            yield L, 1, H, KV, D


def row(op, shape, ms, flops):
    print(f"torch  {op:<44} {shape:<34} {ms:10.3f} ms {flops / ms / 1e9:8.1f} TFLOP/s",
          flush=True)


def run_once(backend, q, k, v, gqa):
    """Forward then backward once (does the backend take this shape and this GQA mode?)."""
    with sdpa_kernel(backend):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    torch.cuda.synchronize()


def time_backend(name, backend, L, B, H, KV, D, reps):
    torch.manual_seed(0)
    q = torch.randn(B, H, L, D, device=dev, dtype=bf, requires_grad=True)
    k = torch.randn(B, KV, L, D, device=dev, dtype=bf, requires_grad=True)
    v = torch.randn(B, KV, L, D, device=dev, dtype=bf, requires_grad=True)
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
        ms = bench(fwd, reps=reps)
        o = fwd()
        do = torch.randn_like(o)
        msb = bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), reps=reps)
    row(f"sdpa {name} forward ({tag})", shape, ms, fwd_flops)
    row(f"sdpa {name} backward ({tag})", shape, msb, 2.5 * fwd_flops)
    row(f"sdpa {name} fwd+bwd ({tag})", shape, ms + msb, 3.5 * fwd_flops)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=sorted(BACKENDS), action="append",
                    help="only these backends (repeatable); default: all")
    ap.add_argument("--quick", action="store_true", help="5 timed runs per row, not 20")
    args = ap.parse_args()
    names = args.backend or ["flash", "efficient", "cudnn"]
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    for L, B, H, KV, D in shapes():
        big = 4.0 * D * H * B * L * L / 2 > 2e13  # the 64K / 128K rows run for seconds
        reps = 5 if args.quick or big else 20
        for name in names:
            time_backend(name, BACKENDS[name], L, B, H, KV, D, reps)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
