#!/usr/bin/env python3
"""Summarises scripts/gpu/attention-vs-torch.sh's logs (issue 19's attention yardstick).

  python3 bench/attention_vs_torch.py --fastest ALL_LOG   torch's fastest backend at any row
  python3 bench/attention_vs_torch.py OUT_DIR             the markdown table of the rounds

A row is one shape ("seq L x B, H/KV heads, D d"). Per round, ours is bench_cuda_kernels'
fwd+bwd TFLOP/s, torch's is the fastest backend of that round's log; the table gives the
medians over the rounds, the median and range of the per-round ratio ours / torch, and the
forward and backward ratios of the medians, and the ratio of the pair timed one call per region
(host overhead counted). Where the rounds also timed FlashAttention-3 (fa3_D<d>_<r>.log, from
bench/fa3_jax_ref.py), two more columns: FA3's median fwd+bwd and the median per-round ratio
ours / FA3. Needs no torch: it runs wherever the logs are.
"""
import glob
import os
import re
import statistics
import sys

OURS = re.compile(r"^attention (forward|backward|fwd\+bwd) \[([^\]]+)\]\s+(seq .*?D \d+)\s+"
                  r"[\d.]+\s+([\d.]+) TFLOP/s")
TORCH = re.compile(r"^torch\s+sdpa (\w+) (forward|backward|fwd\+bwd) \(([^)]+)\)\s+(seq .*?D \d+)"
                   r"\s+[\d.]+ ms\s+([\d.]+) TFLOP/s")
FA3 = re.compile(r"^fa3\s+(forward|backward|fwd\+bwd) \(gqa\)\s+(seq .*?D \d+)\s+[\d.]+ ms\s+"
                 r"([\d.]+) TFLOP/s")
DIRS = {"forward": "fwd", "backward": "bwd", "fwd+bwd": "fb"}
# The backward's workspace (device memory beside its tensors), both sides.
OURS_WS = re.compile(r"^attention bwd workspace \[([^\]]+)\]\s+(seq .*?D \d+)\s+[\d.]+\s+"
                     r"([\d.]+) MiB")
TORCH_WS = re.compile(r"^torch\s+sdpa (\w+) bwd workspace \(([^)]+)\)\s+(seq .*?D \d+)\s+"
                      r"([\d.]+) MiB")


def ours_rows(path):
    """{shape: {"fwd"|"bwd"|"fb": TFLOP/s, "ws": MiB, "impl": name}} of one bench_cuda_kernels
    log."""
    rows = {}
    for line in open(path, errors="replace"):
        w = OURS_WS.match(line)
        if w:
            rows.setdefault(w.group(2).strip(), {})["ws"] = float(w.group(3))
            continue
        m = OURS.match(line)
        if m:
            r = rows.setdefault(m.group(3).strip(), {})
            if r.get("impl", m.group(2)) != m.group(2):
                sys.exit(f"{path}: {m.group(3).strip()} has rows of {r['impl']} and "
                         f"{m.group(2)}: run bench_cuda_kernels with --impl NAME")
            r[DIRS[m.group(1)]] = float(m.group(4))
            r["impl"] = m.group(2)
    return rows


def torch_rows(path):
    """{shape: {backend: {"fwd"|"bwd"|"fb": TFLOP/s, "ws": MiB, "tag": gqa|kv expanded}}} of
    one log."""
    rows = {}
    for line in open(path, errors="replace"):
        w = TORCH_WS.match(line)
        if w:
            rows.setdefault(w.group(3).strip(), {}).setdefault(w.group(1), {})["ws"] = \
                float(w.group(4))
            continue
        m = TORCH.match(line)
        if m:
            b = rows.setdefault(m.group(4).strip(), {}).setdefault(m.group(1), {})
            b[DIRS[m.group(2)]] = float(m.group(5))
            b["tag"] = m.group(3)
    return rows


def fa3_rows(path):
    """{shape: {"fwd"|"bwd"|"fb": TFLOP/s}} of one bench/fa3_jax_ref.py log ({} if absent)."""
    rows = {}
    if not os.path.exists(path):
        return rows
    for line in open(path, errors="replace"):
        m = FA3.match(line)
        if m:
            rows.setdefault(m.group(2).strip(), {})[DIRS[m.group(1)]] = float(m.group(3))
    return rows


def fa3_cells(shape, ours, fa3):
    """' FA3 fb | ours / FA3 (range) |' over the rounds that timed both, or dashes."""
    pairs = [(o[shape]["fb"], f[shape]["fb"]) for o, f in zip(ours, fa3)
             if shape in o and "fb" in o[shape] and shape in f and "fb" in f[shape]]
    if not pairs:
        return " - | - |"
    ratios = [a / b for a, b in pairs]
    return (f" {statistics.median(b for _, b in pairs):.1f} | **{statistics.median(ratios):.3f}x** "
            f"({min(ratios):.3f}-{max(ratios):.3f}) |")


def fastest(backends):
    """(name, figures) of the backend with the highest fwd+bwd."""
    return max(backends.items(), key=lambda kv: kv[1].get("fb", 0.0))


def shape_key(shape):
    m = re.match(r"seq (\d+) x (\d+), (\d+)/(\d+) heads, D (\d+)", shape)
    return tuple(int(x) for x in m.groups()) if m else (0,)


def table(out):
    lines = []
    for all_log in sorted(glob.glob(os.path.join(out, "all_D*.log"))):
        d = re.search(r"all_D(\d+)\.log", all_log).group(1)
        every = torch_rows(all_log)
        rounds = sorted(int(m.group(1)) for m in
                        (re.search(r"_(\d+)\.log$", p)
                         for p in glob.glob(os.path.join(out, f"ours_D{d}_*.log"))) if m)
        ours = [ours_rows(os.path.join(out, f"ours_D{d}_{r}.log")) for r in rounds]
        theirs = [torch_rows(os.path.join(out, f"torch_D{d}_{r}.log")) for r in rounds]
        fa3 = [fa3_rows(os.path.join(out, f"fa3_D{d}_{r}.log")) for r in rounds]
        with_fa3 = any(fa3)
        lines.append(f"D {d}, {len(rounds)} rounds interleaved")
        lines.append("")
        pc_o = os.path.join(out, f"ours_D{d}_percall.log")
        pc_t = os.path.join(out, f"torch_D{d}_percall.log")
        pc = (ours_rows(pc_o), torch_rows(pc_t)) if os.path.exists(pc_t) else ({}, {})
        lines.append("| seq x seqs | flash / efficient / cuDNN (one pass) | torch's fastest | "
                     "ours | torch | ratio (range) | fwd ratio | bwd ratio | one call per region |"
                     " bwd workspace MiB, ours / torch |"
                     + (" FA3 | ours / FA3 (range) |" if with_fa3 else ""))
        lines.append("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
                     + (" ---: | ---: |" if with_fa3 else ""))
        for shape in sorted(every, key=shape_key):
            one = " / ".join(f"{every[shape][b]['fb']:.1f}" if b in every[shape] else "-"
                             for b in ("flash", "efficient", "cudnn"))
            per = []
            for o, t in zip(ours, theirs):
                if shape in o and shape in t and "fb" in o[shape]:
                    per.append((o[shape], fastest(t[shape])))
            if not per:
                lines.append(f"| {shape} | {one} | - | - | - | - | - | - | - | - |"
                             + (fa3_cells(shape, ours, fa3) if with_fa3 else ""))
                continue
            med = statistics.median
            o_fb = med([p[0]["fb"] for p in per])
            t_fb = med([p[1][1]["fb"] for p in per])
            ratios = [p[0]["fb"] / p[1][1]["fb"] for p in per]
            fwd = med([p[0]["fwd"] for p in per]) / med([p[1][1]["fwd"] for p in per])
            bwd = med([p[0]["bwd"] for p in per]) / med([p[1][1]["bwd"] for p in per])
            o1, t1 = pc[0].get(shape), pc[1].get(shape)
            single = (f"{o1['fb']:.1f} / {fastest(t1)[1]['fb']:.1f} = "
                      f"{o1['fb'] / fastest(t1)[1]['fb']:.3f}x" if o1 and t1 and "fb" in o1 else "-")
            names = sorted({f"{p[1][0]} ({p[1][1]['tag']})" for p in per})
            impls = sorted({p[0]["impl"] for p in per})
            ws = (f"{per[0][0]['ws']:.0f} / {per[0][1][1]['ws']:.0f}"
                  if "ws" in per[0][0] and "ws" in per[0][1][1] else "-")
            lines.append(f"| {shape.split(',')[0]} | {one} | {', '.join(names)} | {o_fb:.1f} "
                         f"[{', '.join(impls)}] | {t_fb:.1f} | **{med(ratios):.3f}x** "
                         f"({min(ratios):.3f}-{max(ratios):.3f}) | {fwd:.3f} | {bwd:.3f} | {single} |"
                         f" {ws} |" + (fa3_cells(shape, ours, fa3) if with_fa3 else ""))
        lines.append("")
    return "\n".join(lines)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--fastest":
        rows = torch_rows(sys.argv[2])
        names = sorted({fastest(b)[0] for b in rows.values()}) or ["cudnn"]
        print(" ".join(names))
        return
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(table(sys.argv[1]))


if __name__ == "__main__":
    main()
