#!/usr/bin/env python3
"""PyTorch baselines for bench_cuda_kernels, same shapes (Llama-3.1-8B, 16K tokens per call).

Run on the GPU machine next to bench_cuda_kernels (scripts/gpu.sh check does both):
  python3 bench/torch_ref.py [--only attention]
Prints one line per op: median ms and GB/s or TFLOP/s, counted exactly as the C++ benchmark
counts them. Attention uses SDPA restricted to the flash backend; the LM head is
F.linear + F.cross_entropy on f32 logits (what transformers does), with its peak memory.
"""
import math
import sys

import torch
import torch.nn.functional as F

T, C, H, KV, D, FF, V = 16384, 4096, 32, 8, 128, 14336, 128256
dev = "cuda"
bf = torch.bfloat16


def bench(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def row(op, shape, ms, value, unit):
    print(f"torch  {op:<36} {shape:<30} {ms:9.3f} ms {value:9.1f} {unit}", flush=True)


def bw(op, shape, nbytes, ms):
    row(op, shape, ms, nbytes / ms / 1e6, "GB/s")


def attention():
    for L in (1024, 4096, 8192):
        B = T // L
        q = torch.randn(B, H, L, D, device=dev, dtype=bf, requires_grad=True)
        k = torch.randn(B, KV, L, D, device=dev, dtype=bf, requires_grad=True)
        v = torch.randn(B, KV, L, D, device=dev, dtype=bf, requires_grad=True)
        fwd_flops = 4.0 * D * H * B * L * L / 2
        shape = f"seq {L} x {B}, 32/8 heads, D 128"
        from torch.nn.attention import SDPBackend, sdpa_kernel
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                def fwd():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                o = fwd()
                gq = False
        except RuntimeError:
            # Flash without GQA support: expand k/v once, outside the timed region.
            k = k.repeat_interleave(H // KV, 1).detach().requires_grad_(True)
            v = v.repeat_interleave(H // KV, 1).detach().requires_grad_(True)
            gq = True
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            def fwd():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                      enable_gqa=not gq)
            ms = bench(fwd)
            o = fwd()
            do = torch.randn_like(o)
            msb = bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
        tag = " (kv expanded)" if gq else ""
        row("sdpa flash forward" + tag, shape, ms, fwd_flops / ms / 1e9, "TFLOP/s")
        row("sdpa flash backward" + tag, shape, msb, 2.5 * fwd_flops / msb / 1e9, "TFLOP/s")
        row("sdpa flash fwd+bwd" + tag, shape, ms + msb, 3.5 * fwd_flops / (ms + msb) / 1e9,
            "TFLOP/s")
        del q, k, v, o, do


def main():
    torch.manual_seed(0)
    if "--only" in sys.argv and sys.argv[sys.argv.index("--only") + 1] == "attention":
        attention()  # just the SDPA rows (for quick attention comparisons)
        return
    n = 1 << 29
    x = torch.randn(n, device=dev, dtype=bf)
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    bw("copy D2D (ceiling)", "1 GiB", 2 * n * 2, ms)
    del x, y

    x = torch.randn(T, C, device=dev, dtype=bf)
    w = torch.rand(C, device=dev, dtype=bf) + 0.5
    ms = bench(lambda: F.rms_norm(x, (C,), w, 1e-5))
    bw("rmsnorm_forward (F.rms_norm)", "16K x 4096", T * C * 4, ms)
    xr = x.clone().requires_grad_(True)
    wr = w.clone().requires_grad_(True)
    out = F.rms_norm(xr, (C,), wr, 1e-5)
    g = torch.randn_like(out)
    ms = bench(lambda: torch.autograd.grad(out, (xr, wr), g, retain_graph=True))
    bw("rmsnorm_backward (autograd)", "16K x 4096", T * C * 6, ms)
    del x, xr, out, g

    gu = torch.randn(T, 2 * FF, device=dev, dtype=bf) * 2
    gate, up = gu[:, :FF], gu[:, FF:]
    ms = bench(lambda: F.silu(gate) * up)
    bw("swiglu_forward (silu*up)", "16K x 14336", T * FF * 6, ms)
    del gu

    q = torch.randn(T, H, D, device=dev, dtype=bf)
    pos = torch.arange(T, device=dev) % 4096
    inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=dev).float() / D))
    fr = torch.outer(pos.float(), inv)
    emb = torch.cat([fr, fr], -1)
    cos, sin = emb.cos().to(bf)[:, None, :], emb.sin().to(bf)[:, None, :]

    def rope():
        x1, x2 = q[..., : D // 2], q[..., D // 2:]
        return q * cos + torch.cat([-x2, x1], -1) * sin

    ms = bench(rope)
    bw("rope_forward q (HF eager)", "16K x 32x128", T * H * D * 4, ms)
    del q

    xf = torch.randn(1 << 27, device=dev)
    ms = bench(lambda: xf.to(bf))
    bw("cast f32->bf16", "128M", (1 << 27) * 6, ms)
    del xf

    attention()

    h = torch.randn(T, C, device=dev, dtype=bf, requires_grad=True)
    W = (torch.randn(V, C, device=dev, dtype=bf) * 0.05).requires_grad_(True)
    labels = (torch.arange(T, device=dev) * 31) % V
    torch.cuda.synchronize()

    def lm():
        loss = F.cross_entropy(F.linear(h, W).float(), labels, reduction="sum") / T
        return torch.autograd.grad(loss, (h, W))

    ms = bench(lm, reps=5)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    lm()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    row("linear + cross_entropy fwd+bwd", "16K tok, V 128256, C 4096", ms,
        6.0 * T * V * C / ms / 1e9, "TFLOP/s")
    print(f"torch  linear + cross_entropy peak extra memory: {peak / 2**30:.2f} GiB", flush=True)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("torch_ref: no CUDA device")
        sys.exit(0)
    main()
