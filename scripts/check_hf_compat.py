#!/usr/bin/env python3
"""Checks that a model directory written by slideformer loads in Hugging Face transformers and
computes the same loss as slideformer on the same tokens.

usage: check_hf_compat.py MODEL_DIR TOKENS.bin SEQ_LEN BATCH SLIDEFORMER_LOSS [REL_TOL]
Runs where torch + transformers exist (the GPU machine); slideformer itself never needs it."""
import struct, sys

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

model_dir, tokens_path, seq_len, batch, sf_loss = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
tol = float(sys.argv[6]) if len(sys.argv) > 6 else 1e-4

raw = open(tokens_path, "rb").read()
magic, version, n = struct.unpack("<3i", raw[:12])
if magic == 20240520:
    ids = np.frombuffer(raw[1024:], dtype=np.uint32 if version == 2 else np.uint16)[:n]
else:
    ids = np.frombuffer(raw, dtype=np.uint32)
# The rows slideformer's TokenBatcher cuts: row r covers tokens [r*S, r*S + S + 1).
rows = np.stack([ids[r * seq_len: r * seq_len + seq_len + 1] for r in range(batch)]).astype(np.int64)

cfg = AutoConfig.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
model.eval()
dev = "cuda" if torch.cuda.is_available() else "cpu"
model.to(dev)
torch.backends.cuda.matmul.allow_tf32 = False
x = torch.from_numpy(rows).to(dev)
with torch.no_grad():
    out = model(input_ids=x, labels=x)
hf = float(out.loss)
rel = abs(hf - sf_loss) / abs(hf)
print(f"architecture {cfg.architectures[0]}  transformers loss {hf:.7f}  slideformer loss {sf_loss:.7f}  rel diff {rel:.2e}")
# Both compute in fp32 from the same weights: only summation order differs.
sys.exit(0 if rel < tol else 1)
