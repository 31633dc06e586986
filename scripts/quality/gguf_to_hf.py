#!/usr/bin/env python3
"""GGUF (llama architecture: F32, F16, Q8_0, Q4_1 tensors) -> a Hugging Face model directory
that `slideformer train --model` reads, for the quality study on the GPU machine: the 93 MB
GGUF travels there, the 540 MB fp32 safetensors it becomes could not.

Writes OUT/model.safetensors (fp32), copies CONFIG (tests/data/smollm2/config.json, what
transformers wrote for this GGUF) and the tokenizer files of TOKENIZER_DIR (made here by
smollm2_tokenizer.py). The values are what transformers holds after loading the GGUF, the
same as src/model/gguf_import.cpp (the layout of that file, re-read here in Python):
  Q8_0 block (34 bytes): f16 d, 32 x int8 q          -> d * q
  Q4_1 block (20 bytes): f16 d, f16 m, 16 bytes of nibbles; value j < 16 is the low nibble
                         of byte j, value j + 16 its high nibble   -> d * q + m  (float32)
  GGUF dims are innermost first: [ne0, ne1] is the row-major [ne1, ne0] matrix.
  attn_q / attn_k rows: llama.cpp interleaves each head's rotary halves; GGUF row
  h*D + 2i + j is HF row h*D + j*D/2 + i (undone here).
With --check VECTORS (tests/data/smollm2/vectors.json) every tensor's 64-bit checksum must
equal the one recorded from transformers (bit for bit), else the script fails.

usage: gguf_to_hf.py GGUF OUT --config CONFIG --tokenizer TOKENIZER_DIR [--check VECTORS]
Needs numpy only."""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

F32, F16, Q4_1, Q8_0 = 0, 1, 3, 8
BLOCK = {Q4_1: (32, 20), Q8_0: (32, 34)}  # values, bytes per block
NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
         "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
         "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
          10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, path):
        self.buf = np.memmap(path, dtype=np.uint8, mode="r")
        self.pos = 0
        self.path = path

    def take(self, fmt):
        n = struct.calcsize(fmt)
        if self.pos + n > len(self.buf):
            sys.exit(f"gguf_to_hf: {self.path}: truncated at byte {self.pos}")
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return v

    def string(self):
        n = self.take("<Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            it, n = self.take("<I"), self.take("<Q")
            return [self.value(it) for _ in range(n)]
        if t not in SCALAR:
            sys.exit(f"gguf_to_hf: {self.path}: metadata value type {t} unknown")
        return self.take(SCALAR[t])


def read_gguf(path):
    """(metadata dict, {name: (dims innermost first, type, absolute offset)})."""
    r = Reader(path)
    if bytes(r.buf[:4]) != b"GGUF":
        sys.exit(f"gguf_to_hf: {path}: not a GGUF file (magic)")
    r.pos = 4
    version = r.take("<I")
    if version not in (2, 3):
        sys.exit(f"gguf_to_hf: {path}: GGUF version {version}; 2 or 3 expected")
    n_tensors, n_kv = r.take("<Q"), r.take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take("<I"))
    infos = {}
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        infos[name] = (dims, r.take("<I"), r.take("<Q"))
    align = meta.get("general.alignment", 32)
    base = (r.pos + align - 1) // align * align
    return meta, {k: (d, t, base + o) for k, (d, t, o) in infos.items()}, r.buf


def dequantize(buf, dims, t, off):
    n = int(np.prod(dims))
    if t == F32:
        return np.frombuffer(buf, np.float32, n, off).copy()
    if t == F16:
        return np.frombuffer(buf, np.float16, n, off).astype(np.float32)
    if t not in BLOCK:
        sys.exit(f"gguf_to_hf: tensor type {t} not supported (F32, F16, Q8_0, Q4_1)")
    per, size = BLOCK[t]
    blocks = np.frombuffer(buf, np.uint8, n // per * size, off).reshape(-1, size)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    if t == Q8_0:
        return (d * blocks[:, 2:].view(np.int8).astype(np.float32)).reshape(-1)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    return (d * q + m).reshape(-1)


def unpermute(w, heads):
    rows = w.shape[0]
    D = rows // heads
    return w.reshape(heads, D // 2, 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


def hf_name(name):
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in NAMES:
        return f"model.layers.{parts[1]}.{NAMES[parts[2]]}.{parts[3]}"
    return None


def checksum(t):
    """tests/model/test_real_model.cpp's checksum of fp32 bits (row-major)."""
    b = np.ascontiguousarray(t, dtype=np.float32).reshape(-1).view(np.uint32)
    with np.errstate(over="ignore"):
        i = np.arange(1, b.size + 1, dtype=np.uint64)
        m = ((b.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)) ^ (i * np.uint64(0xC2B2AE3D27D4EB4F))
        m = m * np.uint64(0x165667B19E3779F9)
        m ^= m >> np.uint64(29)
        return f"{int(m.sum(dtype=np.uint64)):016x}"


def write_safetensors(path, tensors):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, t in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path + ".part", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for t in tensors.values():
            f.write(np.ascontiguousarray(t, dtype="<f4").tobytes())
    os.replace(path + ".part", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--config", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--check")
    a = ap.parse_args()
    meta, infos, buf = read_gguf(a.gguf)
    if meta.get("general.architecture") != "llama":
        sys.exit(f"gguf_to_hf: {a.gguf}: architecture {meta.get('general.architecture')}; llama expected")
    heads = {"attn_q": meta["llama.attention.head_count"], "attn_k": meta["llama.attention.head_count_kv"]}
    tensors = {}
    for name, (dims, t, off) in infos.items():
        hf = hf_name(name)
        if hf is None:
            if name == "rope_freqs.weight":
                continue
            sys.exit(f"gguf_to_hf: {a.gguf}: tensor {name} has no Hugging Face name here")
        w = dequantize(buf, dims, t, off).reshape(list(reversed(dims)))
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        tensors[hf] = unpermute(w, heads[kind]) if kind in heads else w
    if a.check:
        want = json.load(open(a.check))["tensor_checksums"]
        bad = [n for n in want if n not in tensors or checksum(tensors[n]) != want[n]]
        if bad or len(want) != len(tensors):
            sys.exit(f"gguf_to_hf: checksums differ from {a.check} for {bad[:5]} "
                     f"({len(bad)} tensors; {len(tensors)} converted, {len(want)} recorded)")
        print(f"gguf_to_hf: all {len(want)} tensors equal transformers' (checksums of {a.check})")
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "model.safetensors"), dict(sorted(tensors.items())))
    shutil.copy(a.config, os.path.join(a.out, "config.json"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer, f), os.path.join(a.out, f))
    print(f"gguf_to_hf: wrote {a.out} ({len(tensors)} tensors, "
          f"{sum(t.size for t in tensors.values()) / 1e6:.1f} M parameters)")


if __name__ == "__main__":
    main()
