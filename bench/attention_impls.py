#!/usr/bin/env python3
"""Summarises scripts/gpu/attention-bwd.sh's logs: several of our attention implementations
(one bench_cuda_kernels log each, ours_<impl>_D<d>.log) against torch's cuDNN SDPA
(torch_D<d>.log), timed in the same call.

  python3 bench/attention_impls.py OUT_DIR

One markdown table per head dimension: per shape, each implementation's fwd+bwd TFLOP/s and,
in brackets, its backward's, then torch's, then each implementation's fwd+bwd ratio to torch's
(issue 19 item 1 asks >= 1.05x). Needs no torch. Shares the log formats with
bench/attention_vs_torch.py.
"""
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_vs_torch import fastest, ours_rows, shape_key, torch_rows  # noqa: E402


def ws_text(r):
    return f"{r['ws']:.0f} MiB" if "ws" in r else "- MiB"


def table(out):
    lines = []
    dims = sorted({int(m.group(1)) for m in (re.search(r"_D(\d+)\.log$", p) for p in
                   glob.glob(os.path.join(out, "ours_*_D*.log"))) if m})
    for d in dims:
        impls = {}
        for p in sorted(glob.glob(os.path.join(out, f"ours_*_D{d}.log"))):
            name = re.search(r"ours_(.+)_D\d+\.log$", p).group(1)
            impls[name] = ours_rows(p)
        torch = torch_rows(os.path.join(out, f"torch_D{d}.log")) \
            if os.path.exists(os.path.join(out, f"torch_D{d}.log")) else {}
        shapes = sorted({s for rows in impls.values() for s in rows}, key=shape_key)
        names = list(impls)
        lines.append(f"D {d}: fwd+bwd TFLOP/s (backward; its workspace in MiB, beside the "
                     "tensors); ratio = ours / torch")
        lines.append("| shape | " + " | ".join(names) + " | torch | " +
                     " | ".join(f"{n} / torch" for n in names) + " |")
        lines.append("| --- |" + " ---: |" * (2 * len(names) + 1))
        for s in shapes:
            cells = []
            for n in names:
                r = impls[n].get(s, {})
                cells.append(f"{r['fb']:.1f} ({r.get('bwd', 0):.1f}; {ws_text(r)})"
                             if "fb" in r else "-")
            t = fastest(torch[s])[1] if s in torch else {}
            tb = t.get("fb")
            cells.append(f"{tb:.1f} ({t.get('bwd', 0):.1f}; {ws_text(t)})" if tb else "-")
            for n in names:
                r = impls[n].get(s, {})
                cells.append(f"{r['fb'] / tb:.3f}x" if tb and "fb" in r else "-")
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: bench/attention_impls.py OUT_DIR")
    print(table(sys.argv[1]))
