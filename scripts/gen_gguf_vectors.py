#!/usr/bin/env python3
"""Writes tests/data/gguf/vectors.gguf (a few KB) with gguf-py, for tests/io/test_gguf.cpp.

The file holds one metadata value of every GGUF value type (and arrays of them, nested
arrays), general.alignment = 64, and tensors of each type the C++ reader
dequantizes, each next to "<name>.expected": gguf-py's own dequantize() of it as F32. The
quantized blocks are random bytes (seeded), so every nibble / int8 value occurs, and their
f16 scales d and minimums m are random finite f16 values of every magnitude (subnormals,
negatives, large), so the one rounding that dequantization does (Q4_1's + m) is exercised
across the whole f16 range. F16 holds zeros, subnormals, infinities and NaNs (gguf-py keeps
their payload bits).

usage: gen_gguf_vectors.py [OUT.gguf]      needs gguf, numpy (e.g. the /tmp/venv venv)"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFValueType as V, GGUFWriter, dequantize

here = os.path.dirname(os.path.abspath(__file__))
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "data", "gguf", "vectors.gguf")
os.makedirs(os.path.dirname(out), exist_ok=True)
rng = np.random.default_rng(20250207)


def finite_f16_bits(n):
    """n random f16 bit patterns, none inf/nan, every exponent equally likely."""
    b = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    exp = (b >> 10) & 0x1F
    return np.where(exp == 0x1F, b & ~np.uint16(0x4000), b).astype(np.uint16)  # exp 31 -> 15


def blocks(n_blocks, n_scales, n_payload):
    """n_blocks blocks of n_scales f16 scales followed by n_payload random bytes."""
    s = finite_f16_bits(n_blocks * n_scales).reshape(n_blocks, n_scales).view(np.uint8)
    p = rng.integers(0, 256, size=(n_blocks, n_payload), dtype=np.uint8)
    return np.concatenate([s, p], axis=1)


w = GGUFWriter(out, arch="test")  # writes general.architecture = "test"
w.add_custom_alignment(64)  # general.alignment, and the writer pads to it
w.add_string("general.name", "slideformer gguf reader vectors")
w.add_key_value("t.u8", 200, V.UINT8)
w.add_key_value("t.i8", -100, V.INT8)
w.add_key_value("t.u16", 60000, V.UINT16)
w.add_key_value("t.i16", -30000, V.INT16)
w.add_key_value("t.u32", 4000000000, V.UINT32)
w.add_key_value("t.i32", -2000000000, V.INT32)
w.add_key_value("t.f32", 100000.0, V.FLOAT32)
w.add_key_value("t.bool", True, V.BOOL)
w.add_key_value("t.string", "héllo, gguf", V.STRING)
w.add_key_value("t.u64", 18000000000000000000, V.UINT64)
w.add_key_value("t.i64", -9000000000000000000, V.INT64)
w.add_key_value("t.f64", 0.1, V.FLOAT64)
w.add_array("t.arr_i32", [1, -2, 3])
w.add_key_value("t.arr_f32", [0.5, -1.25], V.ARRAY, sub_type=V.FLOAT32)
w.add_array("t.arr_str", ["a", "", "xyz"])
w.add_key_value("t.arr_bool", [True, False], V.ARRAY, sub_type=V.BOOL)
w.add_array("t.arr_nested", [[1, 2], [3]])

tensors = {}
# Q4_1: 32 blocks = a [2, 512] matrix (ne0 = 512 contiguous).
tensors["q4_1"] = (blocks(32, 2, 16).reshape(2, 320), (2, 512), T.Q4_1)
tensors["q8_0"] = (blocks(16, 1, 32).reshape(4, 136), (4, 128), T.Q8_0)
f16 = rng.integers(0, 1 << 16, size=256, dtype=np.uint32).astype(np.uint16)
f16[:8] = [0x0000, 0x8000, 0x0001, 0x03FF, 0x7BFF, 0x7C00, 0xFC00, 0x3C00]  # 0, -0, subnormals, max, inf
tensors["f16"] = (f16.view(np.uint8).reshape(16, 32), (16, 16), T.F16)
bf16 = rng.integers(0, 1 << 16, size=128, dtype=np.uint32).astype(np.uint16)
tensors["bf16"] = (bf16.view(np.uint8).reshape(256), (128,), T.BF16)
f32 = rng.standard_normal(24).astype(np.float32)
tensors["f32"] = (f32.view(np.uint8).reshape(2, 3, 16), (2, 3, 4), T.F32)

for name, (raw, shape, qt) in tensors.items():
    # raw: uint8 [.., bytes per row]; gguf-py derives the element shape from it
    w.add_tensor(name, raw, raw_dtype=qt)
    expected = dequantize(raw, qt).astype(np.float32).reshape(shape)
    w.add_tensor(name + ".expected", np.ascontiguousarray(expected))

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(f"wrote {out} ({os.path.getsize(out)} bytes)")
