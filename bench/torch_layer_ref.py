#!/usr/bin/env python3
"""transformers' LlamaDecoderLayer against slideformer's layer (bench_cuda_layer --dump DIR).

Run on the GPU machine after `bench_cuda_layer --dump DIR`:
  python3 bench/torch_layer_ref.py DIR [--ours-ms FWD BWD]
Loads the same bf16 weights, input x and output gradient dy, runs
  - transformers' LlamaDecoderLayer in bf16 with SDPA (what a PyTorch user trains with), and
  - the same layer in float32 on the upcast weights and inputs (the reference),
and prints the relative L2 error ||a - ref|| / ||ref|| of y, dx and every weight gradient for
slideformer and for transformers' bf16 layer, each against the f32 reference. Then it times
transformers' bf16 layer (CUDA events, median): forward with autograd, and forward+backward,
under each of PyTorch's SDPA backends (flash, efficient, cuDNN: torch.nn.attention.sdpa_kernel;
a backend that refuses the shape says why), and compares slideformer with the fastest, named.
cos/sin are built from slideformer's own inverse frequencies exactly as LlamaRotaryEmbedding
builds them (f32 product, cast to the activations' dtype); the script also checks them
against transformers' LlamaRotaryEmbedding for this config.
"""
import sys

import numpy as np
import torch

from torch_ref import bench  # median of CUDA-event timings (same folder)

dev = "cuda"
bf = torch.bfloat16


def load_bf16(path, shape):
    a = np.fromfile(path, dtype=np.uint16)
    return torch.from_numpy(a.view(np.int16)).view(bf).reshape(shape)


def rel(a, ref):
    a, ref = a.double(), ref.double()
    return ((a - ref).norm() / ref.norm()).item()


def main():
    d = sys.argv[1]
    ours_ms = None
    if "--ours-ms" in sys.argv:
        i = sys.argv.index("--ours-ms")
        ours_ms = (float(sys.argv[i + 1]), float(sys.argv[i + 2]))
    import transformers
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    with open(f"{d}/meta.txt") as f:
        T, L, C = map(int, f.readline().split())
        slots = {}
        for line in f:
            name, off, r, c = line.split()
            slots[name] = (int(off), int(r), int(c))
    H, KV, D, FF = 32, 8, 128, 14336
    Q, KVD = H * D, KV * D
    B = T // L
    numel = max(o + r * c for o, r, c in slots.values())
    wflat = load_bf16(f"{d}/w.bf16", (-1,))
    gflat = torch.from_numpy(np.fromfile(f"{d}/g.f32", dtype=np.float32))

    def slot(flat, name):
        o, r, c = slots[name]
        return flat[o:o + r * c].reshape(r, c)

    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    common = dict(hidden_size=C, intermediate_size=FF, num_attention_heads=H,
                  num_key_value_heads=KV, head_dim=D, rms_norm_eps=1e-5,
                  max_position_embeddings=131072, attention_bias=False, mlp_bias=False)
    try:  # transformers >= 5: rope_parameters
        cfg = LlamaConfig(**common, rope_parameters={**rope, "rope_theta": 500000.0})
    except TypeError:
        cfg = LlamaConfig(**common, rope_theta=500000.0, rope_scaling=rope)
    cfg._attn_implementation = "sdpa"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"attn {cfg._attn_implementation}", flush=True)

    # name in transformers -> (slot, row block)
    parts = {
        "input_layernorm.weight": ("attn_norm", None),
        "self_attn.q_proj.weight": ("wqkv", (0, Q)),
        "self_attn.k_proj.weight": ("wqkv", (Q, Q + KVD)),
        "self_attn.v_proj.weight": ("wqkv", (Q + KVD, Q + 2 * KVD)),
        "self_attn.o_proj.weight": ("wo", None),
        "post_attention_layernorm.weight": ("mlp_norm", None),
        "mlp.gate_proj.weight": ("w_gate_up", (0, FF)),
        "mlp.up_proj.weight": ("w_gate_up", (FF, 2 * FF)),
        "mlp.down_proj.weight": ("w_down", None),
    }

    def take(flat, name):
        s, rows = parts[name]
        m = slot(flat, s)
        if rows:
            m = m[rows[0]:rows[1]]
        return m.reshape(-1) if name.endswith("layernorm.weight") else m

    x = load_bf16(f"{d}/x.bf16", (B, L, C)).to(dev)
    dy = load_bf16(f"{d}/dy.bf16", (B, L, C)).to(dev)
    y_ours = load_bf16(f"{d}/y.bf16", (B, L, C)).to(dev)
    dx_ours = load_bf16(f"{d}/dx.bf16", (B, L, C)).to(dev)
    inv_freq = torch.from_numpy(np.fromfile(f"{d}/inv_freq.f32", dtype=np.float32)).to(dev)

    pos = torch.arange(L, device=dev, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], -1)[None].expand(B, L, D)
    try:
        re = LlamaRotaryEmbedding(cfg).to(dev)
        cos_hf, _ = re(x, torch.arange(L, device=dev)[None].expand(B, L))
        print(f"cos vs LlamaRotaryEmbedding: max |diff| "
              f"{(cos_hf.float() - emb.cos().to(bf).float()).abs().max().item():.2e}", flush=True)
    except Exception as e:  # the check is informative only
        print(f"LlamaRotaryEmbedding check skipped: {e!r}", flush=True)

    def make(dtype):
        layer = LlamaDecoderLayer(cfg, layer_idx=0).to(dev, dtype)
        with torch.no_grad():
            for n, p in layer.named_parameters():
                p.copy_(take(wflat, n).to(dev, dtype))
        return layer

    def run(layer, dtype):
        xi = x.to(dtype).detach().requires_grad_(True)
        pe = (emb.cos().to(dtype), emb.sin().to(dtype))
        out = layer(xi, attention_mask=None, position_embeddings=pe)
        out = out[0] if isinstance(out, tuple) else out
        params = [p for _, p in layer.named_parameters()]
        grads = torch.autograd.grad(out, [xi] + params, dy.to(dtype))
        names = [n for n, _ in layer.named_parameters()]
        return out.detach(), grads[0], dict(zip(names, grads[1:]))

    ref = make(torch.float32)
    y32, dx32, g32 = run(ref, torch.float32)
    del ref
    torch.cuda.empty_cache()
    hf = make(bf)
    yh, dxh, gh = run(hf, bf)

    print(f"{'output':<34} {'slideformer vs f32':>18} {'transformers bf16 vs f32':>25}")
    print(f"{'y':<34} {rel(y_ours, y32):>18.2e} {rel(yh, y32):>25.2e}")
    print(f"{'dx':<34} {rel(dx_ours, dx32):>18.2e} {rel(dxh, dx32):>25.2e}")
    worst = max(rel(y_ours, y32), rel(dx_ours, dx32))
    for n in parts:
        ours = take(gflat, n).to(dev)
        e = rel(ours, g32[n])
        worst = max(worst, e)
        print(f"{'d ' + n:<34} {e:>18.2e} {rel(gh[n], g32[n]):>25.2e}")
    print(f"slideformer worst rel. L2 vs f32: {worst:.2e}", flush=True)
    del y32, dx32, g32, yh, dxh, gh
    torch.cuda.empty_cache()

    # Speed of transformers' bf16 layer: forward (building the autograd graph), fwd+bwd.
    xi = x.detach().requires_grad_(True)
    pe = (emb.cos().to(bf), emb.sin().to(bf))
    params = list(hf.parameters())

    def fwd():
        out = hf(xi, attention_mask=None, position_embeddings=pe)
        return out[0] if isinstance(out, tuple) else out

    def step():
        torch.autograd.grad(fwd(), [xi] + params, dy)

    from torch.nn.attention import SDPBackend, sdpa_kernel
    best = None  # (fwd+bwd ms, forward ms, backend name)
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                ms_f = bench(fwd, reps=10, warmup=2)
                ms_t = bench(step, reps=10, warmup=2)
        except RuntimeError as e:  # the backend refuses this shape or machine
            print(f"transformers LlamaDecoderLayer bf16 sdpa[{name}]: refused ({str(e).splitlines()[0][:160]})",
                  flush=True)
            continue
        print(f"transformers LlamaDecoderLayer bf16 sdpa[{name}] T {T} ({B} x {L}): forward {ms_f:.3f} ms, "
              f"backward {ms_t - ms_f:.3f} ms, fwd+bwd {ms_t:.3f} ms", flush=True)
        if best is None or ms_t < best[0]:
            best = (ms_t, ms_f, name)
    if best is None:
        print("transformers LlamaDecoderLayer: every SDPA backend refused", flush=True)
        return
    ms_t, ms_f, name = best
    print(f"transformers fastest: sdpa[{name}] fwd+bwd {ms_t:.3f} ms", flush=True)
    if ours_ms:
        of, ob = ours_ms
        print(f"slideformer layer: forward {of:.3f} ms, backward (incl. recompute) {ob:.3f} ms, "
              f"fwd+bwd {of + ob:.3f} ms -> {ms_t / (of + ob):.2f}x transformers sdpa[{name}]; "
              f"without the recompute (bwd - fwd) {ms_t / ob:.2f}x", flush=True)


if __name__ == "__main__":
    main()
