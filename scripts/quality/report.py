#!/usr/bin/env python3
"""The report of the compact-state quality study (issue 18, item 5): reads the one csv that
`scripts/gpu.sh quality` writes (columns mode, model, data, eval_set, step, train_loss,
eval_loss, tokens_per_s, peak_device_bytes, host_rss_bytes) and writes
  - one PNG (default docs/quality-compact-state.png): per model, the training loss (a running
    mean, since single steps are noisy), the eval loss and the eval loss relative to fp32's
    at the same step against the step, one line per mode;
  - to stdout, the Markdown table rows for docs/BENCHMARKS.md: per model and mode the final
    eval loss, its difference from the fp32/fp32 run of the same model, the target
    (int8/fp32: 0.5%, int8/bf16: 1.5%, issue 18) and whether it is met.
Final eval loss: for a model with "final-*" rows (SmolLM2: `slideformer eval` of the final
weights on the held-out years) the "final-all" loss, with "final-text" and "final-chat" shown
beside it; otherwise the eval loss of the last evaluated step (the 1B: --eval-file, also the
held-out years). "Met" means the mode's loss is at most the target above fp32's,
(loss - fp32) / fp32 <= target: a mode that ends lower than fp32 meets it (its difference is
still printed, signed).
A csv without an fp32/fp32 run of a model, or with a column missing, is an error.

usage: report.py CSV [--png docs/quality-compact-state.png] [--title TEXT]
Needs matplotlib (PyPI), only for the PNG."""
import argparse
import csv
import statistics
import sys

TARGETS = {"int8/fp32": 0.005, "int8/bf16": 0.015}  # issue 18, item 5
COLUMNS = ["mode", "model", "data", "eval_set", "step", "train_loss", "eval_loss",
           "tokens_per_s", "peak_device_bytes", "host_rss_bytes"]
SMOOTH = 20  # steps in the training loss's running mean
GIB = 1024 ** 3


def fail(msg):
    sys.exit(f"report.py: {msg}")


def number(s):
    return float(s) if s not in ("", None) else None


def read(path):
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (r.fieldnames or [])]
        if missing:
            fail(f"{path}: no column {', '.join(missing)} (the header scripts/gpu/quality.sh writes: {','.join(COLUMNS)})")
        rows = list(r)
    if not rows:
        fail(f"{path}: no rows")
    for i, row in enumerate(rows, 2):
        try:
            for c in COLUMNS[4:]:
                row[c] = number(row[c])
        except ValueError as e:
            fail(f"{path}:{i}: {e}")
    return rows


def runs(rows):
    """{model: {mode: {"train": [rows], "final": {set: loss}}}} in the csv's order."""
    out = {}
    for r in rows:
        run = out.setdefault(r["model"], {}).setdefault(r["mode"], {"train": [], "final": {}})
        if r["eval_set"] == "train":
            run["train"].append(r)
        elif r["eval_set"].startswith("final-"):
            run["final"][r["eval_set"][len("final-"):]] = r["eval_loss"]
        else:
            fail(f"eval_set {r['eval_set']!r} unknown (train or final-*)")
    return out


def final_loss(run):
    if run["final"]:
        if "all" not in run["final"]:
            fail("a run has final-* rows but no final-all")
        return run["final"]["all"]
    evals = [r for r in run["train"] if r["eval_loss"] is not None]
    if not evals:
        fail("a run has no eval loss at all")
    return max(evals, key=lambda r: r["step"])["eval_loss"]


def summary(run):
    tr = [r for r in run["train"] if r["train_loss"] is not None]
    tps = [r["tokens_per_s"] for r in tr[len(tr) // 10:] if r["tokens_per_s"]]  # past warm-up
    peak = [r["peak_device_bytes"] for r in tr if r["peak_device_bytes"] is not None]
    rss = [r["host_rss_bytes"] for r in tr if r["host_rss_bytes"] is not None]
    return {"steps": int(max((r["step"] for r in tr), default=0)),
            "tps": statistics.median(tps) if tps else None,
            "peak": max(peak) / GIB if peak else None, "rss": max(rss) / GIB if rss else None}


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def table(by_model):
    lines = ["| model | mode (state / master) | steps | final eval loss | text / chat | vs fp32 | target | met | tokens/s (median) | peak GPU GiB | peak host RSS GiB |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for model, modes in by_model.items():
        if "fp32/fp32" not in modes:
            fail(f"model {model}: no fp32/fp32 run to compare with")
        ref = final_loss(modes["fp32/fp32"])
        for mode, run in modes.items():
            loss, s = final_loss(run), summary(run)
            rel = round((loss - ref) / ref, 4) + 0.0  # + 0.0: no "-0.00%"
            target = TARGETS.get(mode)
            met = "-" if target is None else ("yes" if rel <= target else "**no**")
            split = " / ".join(fmt(run["final"].get(k), ".4f") for k in ("text", "chat")) if run["final"] else "-"
            lines.append(f"| {model} | {mode} | {s['steps']} | {loss:.4f} | {split} | {rel * 100:+.2f}% | "
                         f"{'-' if target is None else f'{target * 100:.1f}%'} | {met} | {fmt(s['tps'], ',.0f')} | "
                         f"{fmt(s['peak'], '.2f')} | {fmt(s['rss'], '.2f')} |")
    return "\n".join(lines)


def running_mean(xs, n):
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x - (xs[i - n] if i >= n else 0.0)
        out.append(acc / min(i + 1, n))
    return out


def plot(by_model, png, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(by_model), 3, figsize=(17, 4.4 * len(by_model)), squeeze=False)
    for (model, modes), (ax_t, ax_e, ax_d) in zip(by_model.items(), axes):
        ref = {r["step"]: r["eval_loss"] for r in modes["fp32/fp32"]["train"] if r["eval_loss"] is not None}
        for mode, run in modes.items():
            tr = [r for r in run["train"] if r["train_loss"] is not None]
            ax_t.plot([r["step"] for r in tr], running_mean([r["train_loss"] for r in tr], SMOOTH),
                      label=mode, lw=1.2)
            ev = [r for r in run["train"] if r["eval_loss"] is not None]
            ax_e.plot([r["step"] for r in ev], [r["eval_loss"] for r in ev], marker="o", ms=3,
                      label=f"{mode}: final {final_loss(run):.4f}", lw=1.2)
            ev = [r for r in ev if r["step"] in ref]
            ax_d.plot([r["step"] for r in ev], [100 * (r["eval_loss"] / ref[r["step"]] - 1) for r in ev],
                      marker="o", ms=3, label=mode, lw=1.2)
        held = "2% of the training files held out" if any(r["final"] for r in modes.values()) else "held-out years"
        ax_t.set_title(f"{model}: training loss (running mean of {SMOOTH} steps)", fontsize=10)
        ax_e.set_title(f"{model}: eval loss ({held};\nlegend: final eval loss, held-out years)", fontsize=10)
        ax_d.set_title(f"{model}: eval loss relative to fp32/fp32, %", fontsize=10)
        for ax in (ax_t, ax_e, ax_d):
            ax.set_xlabel("optimizer step")
            ax.grid(alpha=0.3)
            ax.legend(title="optimizer state / master", fontsize=8, title_fontsize=8)
        ax_t.set_ylabel("loss")
        ax_e.set_ylabel("loss")
        ax_d.set_ylabel("% above fp32")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print(f"wrote {png}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--png", default="docs/quality-compact-state.png")
    ap.add_argument("--title", default="Compact training state vs fp32: same seed, same data order")
    a = ap.parse_args()
    by_model = runs(read(a.csv))
    print(table(by_model))
    if a.png:
        plot(by_model, a.png, a.title)


if __name__ == "__main__":
    main()
