"""bench_cuda_kernels' attention rows, shared by the Python baselines (torch_attention_ref.py,
fa3_jax_ref.py): causal attention, seq L x (16384 / L) sequences for L = 1K..16K, then one
sequence of 32K, 64K and 128K; D 128 with 32/8 heads and D 64 with 64/16 heads (the same
hidden size)."""

HEADS = ((32, 8, 128), (64, 16, 64))  # (query heads, kv heads, D)
TOKENS = 16384


LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def shapes(head_dim=None, seq=None):
    """(L, sequences, query heads, kv heads, D) of every row, or of one head dimension's, or of
    one length's (seq: bench_cuda_kernels --seq)."""
    for H, KV, D in HEADS:
        if head_dim is not None and D != head_dim:
            continue
        for L in LENGTHS:
            if seq is None or L == seq:
                yield L, max(1, TOKENS // L), H, KV, D
