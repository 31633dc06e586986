#!/usr/bin/env python3
"""PyTorch FSDP2 with CPUOffloadPolicy on one GPU: the offloading baseline slideformer is
compared with (issue 4). Random-init Llama-3.1-8B shape cut to --layers, full parameters,
bf16 compute (MixedPrecisionPolicy), fp32 master + AdamW on the CPU via offload, gradient
checkpointing per layer, SDPA attention, one repeated random batch.

usage: torchrun --nproc_per_node=1 bench/fsdp2_offload.py --layers 8 --batch 8 --seq 1024 --steps 6
Prints one RESULT line like slideformer bench. Runs only where torch + transformers exist."""
import argparse, os, resource, time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=8)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--steps", type=int, default=6)
a = p.parse_args()

dist.init_process_group("nccl")
torch.cuda.set_device(0)
cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                  num_hidden_layers=a.layers, num_attention_heads=32, num_key_value_heads=8,
                  max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, attn_implementation="sdpa")
t0 = time.time()
# fp32 master on the host. Built on the meta device and filled directly (normal(0, 0.02),
# norms 1): transformers' own init of billions of parameters takes minutes, this seconds.
with torch.device("meta"):
    model = LlamaForCausalLM(cfg)
model.to_empty(device="cpu")
with torch.no_grad():
    for name, prm in model.named_parameters():
        if prm.dim() == 1:
            prm.fill_(1.0)
        else:
            prm.normal_(0.0, 0.02)
model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg)  # its buffers, on the CPU
model.gradient_checkpointing_enable()
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
off = CPUOffloadPolicy(pin_memory=True)
for layer in model.model.layers:
    fully_shard(layer, mp_policy=mp, offload_policy=off)
fully_shard(model, mp_policy=mp, offload_policy=off)
# The fastest CPU AdamW torch has (fused, AVX-512 on this host); foreach if this build lacks it.
try:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    opt_kind = "fused"
except (RuntimeError, TypeError):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    opt_kind = "foreach"
setup = time.time() - t0
n_params = sum(x.numel() for x in model.parameters())
g = torch.Generator().manual_seed(7)
ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq + 1), generator=g).cuda()
x, y = ids[:, :-1], ids[:, 1:]
times, losses = [], []
for step in range(a.steps):
    torch.cuda.synchronize()
    t = time.time()
    out = model(input_ids=x, labels=ids[:, :-1])  # HF shifts labels internally
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times.append(time.time() - t)
    losses.append(float(out.loss))
    print(f"step {step + 1} loss {losses[-1]:.4f} {times[-1]:.3f} s {a.batch * a.seq / times[-1]:.0f} tok/s", flush=True)
steady = times[1:] if len(times) > 1 else times
tps = a.batch * a.seq * len(steady) / sum(steady)
print(f"RESULT fsdp2_cpu_offload layers={a.layers} batch={a.batch}x{a.seq} params={n_params / 1e9:.2f}B "
      f"tokens/s={tps:.0f} setup_s={setup:.1f} peak_gpu_GiB={torch.cuda.max_memory_allocated() / 2**30:.2f} "
      f"peak_rss_GiB={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} adamw={opt_kind} "
      f"loss_first={losses[0]:.3f} loss_last={losses[-1]:.3f}", flush=True)
dist.destroy_process_group()
