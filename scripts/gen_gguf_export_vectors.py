#!/usr/bin/env python3
"""Reads slideformer's GGUF export back with gguf-py (llama.cpp's own Python reader) and
records what it sees in tests/data/export/vectors.json, which tests/export/test_gguf_vectors.cpp
compares with what our reader sees in a fresh export of the same model.

The model: `slideformer init --size tiny --seed 7` (Qwen3 shape, tied embeddings) with the
bundled GPT-2 tokenizer (examples/sotu/tokenizer.json) and tests/data/export/tokenizer_config.json
(GPT-2's, plus Qwen2's ChatML chat template). Exported as f16, bf16 and q8_0.

Recorded per type: every metadata key with gguf-py's value type and value (arrays: the
length and the first 8 elements), every tensor's name, shape (innermost first), ggml type, the
float64 sum and absolute sum of its dequantized values (gguf.quants.dequantize), and
`matches_gguf_py`: whether its bytes equal what gguf-py's own quantizer
(gguf.quants.quantize, bit-exact with ggml's reference code) makes of the source weight
read from the model's safetensors (bf16 -> float32). The tiny model is a Qwen3, so no Q/K
permutation applies.

Usage: pip install gguf==0.19.0 numpy; python3 scripts/gen_gguf_export_vectors.py [--bin build/bin/slideformer]
"""
import argparse
import importlib.metadata
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import gguf
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize, quantize

ROOT = Path(__file__).resolve().parent.parent
TYPES = ["f16", "bf16", "q8_0"]


def value_of(field):
    t = field.types[0]
    if t == GGUFValueType.ARRAY:
        items = field.contents()
        return {"type": "array", "elem": field.types[1].name.lower() if len(field.types) > 1 else "?",
                "size": len(items), "head": items[:8]}
    v = field.contents()
    if isinstance(v, float):
        v = float(np.float32(v))
    return {"type": t.name.lower(), "value": v}


LEAVES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}


def hf_name(name):
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    _, layer, leaf, suffix = name.split(".")
    return f"model.layers.{layer}.{LEAVES[leaf]}.{suffix}"


def read_safetensors(path):
    """name -> float32 array, from a safetensors file of bf16 / f32 tensors (no torch needed)."""
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        if t["dtype"] == "BF16":
            x = (np.frombuffer(data[b:e], dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            x = np.frombuffer(data[b:e], dtype=np.float32)
        out[name] = x.reshape(t["shape"])
    return out


def read_back(path, source):
    r = GGUFReader(path)
    meta = {k: value_of(f) for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors = []
    for t in r.tensors:
        x = dequantize(t.data, t.tensor_type).astype(np.float64)
        entry = {"name": t.name, "dims": [int(d) for d in t.shape],
                 "type": t.tensor_type.name, "sum": float(x.sum()), "abs_sum": float(np.abs(x).sum())}
        want = quantize(source[hf_name(t.name)].astype(np.float32), t.tensor_type)
        entry["matches_gguf_py"] = bool(np.array_equal(np.asarray(want).view(np.uint8).ravel(),
                                                       np.asarray(t.data).view(np.uint8).ravel()))
        tensors.append(entry)
    return {"metadata": meta, "tensors": tensors}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "build/bin/slideformer"))
    ap.add_argument("--out", default=str(ROOT / "tests/data/export/vectors.json"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tok = tmp / "tok"
        tok.mkdir()
        shutil.copy(ROOT / "examples/sotu/tokenizer.json", tok / "tokenizer.json")
        shutil.copy(ROOT / "tests/data/export/tokenizer_config.json", tok / "tokenizer_config.json")
        subprocess.run([a.bin, "init", "--size", "tiny", "--seed", "7", "--tokenizer", str(tok),
                        "--out", str(tmp / "m")], check=True, stdout=subprocess.DEVNULL)
        result = {"made_with": {"gguf": importlib.metadata.version("gguf"),
                                "numpy": np.__version__},
                  "model": "slideformer init --size tiny --seed 7, examples/sotu/tokenizer.json, "
                           "tests/data/export/tokenizer_config.json",
                  "exports": {}}
        source = read_safetensors(tmp / "m" / "model.safetensors")
        for t in TYPES:
            out = tmp / f"m-{t}.gguf"
            subprocess.run([a.bin, "export", "--model", str(tmp / "m"), "--format", "gguf",
                            "--type", t, "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
            result["exports"][t] = read_back(out, source)
    Path(a.out).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    for t in TYPES:
        e = result["exports"][t]
        same = sum(x["matches_gguf_py"] for x in e["tensors"])
        print(f"{t}: {len(e['tensors'])} tensors ({same} byte-identical to gguf-py's quantizer), "
              f"{len(e['metadata'])} metadata keys, tokenizer {e['metadata']['tokenizer.ggml.model']['value']}"
              f" / {e['metadata']['tokenizer.ggml.pre']['value']}, "
              f"{e['metadata']['tokenizer.ggml.tokens']['size']} tokens, "
              f"{e['metadata']['tokenizer.ggml.merges']['size']} merges, chat template "
              f"{len(e['metadata']['tokenizer.chat_template']['value'])} chars")


if __name__ == "__main__":
    main()
