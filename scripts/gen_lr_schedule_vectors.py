#!/usr/bin/env python3
"""Expected learning rates for the LR-schedule test (tests/data/lr_schedule/vectors.json).

For each case below, transformers' scheduler is built the way Trainer / TRL build it
(transformers.get_scheduler with the Trainer's lr_scheduler_type names) on a real
torch.optim.AdamW, and the training loop is replayed as Trainer runs it: read the group's lr,
optimizer.step(), lr_scheduler.step(). lr_per_step[i] is therefore the lr optimizer step i+1
runs at, i.e. base_lr * lr_lambda(i) for i = 0..N-1.

Our kinds map to Trainer's names:
    constant -> "constant_with_warmup" (no min_lr_ratio: transformers has none)
    linear   -> "linear"               (min_lr_ratio 0 only: transformers has no linear-to-min)
    cosine   -> "cosine" when min_lr_ratio is 0, else "cosine_with_min_lr" with min_lr_rate

The script also checks, on torch's own AdamW, the fact our step-1 convention relies on: a step
at lr 0 leaves the weights as they are but still advances the moments and the step count.

Nothing here runs at training time. Needs torch and transformers (5.x):
    python3 scripts/gen_lr_schedule_vectors.py
"""
import json
import os

import torch
import transformers
from transformers import get_scheduler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "lr_schedule", "vectors.json")

# (kind, peak lr, warmup steps, total steps, min_lr_ratio)
CASES = [
    ("constant", 3e-4, 0, 5, 0.0),
    ("constant", 3e-4, 4, 10, 0.0),
    ("constant", 1e-3, 3, 3, 0.0),     # every step is a warmup step
    ("linear", 2e-3, 0, 4, 0.0),
    ("linear", 1e-3, 3, 10, 0.0),
    ("linear", 5e-5, 7, 7, 0.0),
    ("linear", 1e-2, 0, 1, 0.0),       # a single step
    ("linear", 2e-5, 30, 500, 0.0),
    ("cosine", 1e-3, 0, 7, 0.0),
    ("cosine", 1e-3, 2, 12, 0.0),
    ("cosine", 3e-4, 5, 50, 0.0),
    ("cosine", 1e-2, 1, 2, 0.0),
    ("cosine", 1e-3, 2, 12, 0.1),
    ("cosine", 2e-4, 0, 9, 0.5),
    ("cosine", 1e-3, 3, 3, 0.1),
    ("cosine", 2e-5, 100, 1000, 0.1),
    ("cosine", 1e-2, 2, 6, 0.1),       # tests/train's tiny_run
]


def scheduler_for(kind, optimizer, warmup, total, min_ratio):
    if kind == "constant":
        assert min_ratio == 0.0
        return "constant_with_warmup", get_scheduler("constant_with_warmup", optimizer,
                                                     num_warmup_steps=warmup)
    if kind == "linear":
        assert min_ratio == 0.0
        return "linear", get_scheduler("linear", optimizer, num_warmup_steps=warmup,
                                       num_training_steps=total)
    if min_ratio == 0.0:
        return "cosine", get_scheduler("cosine", optimizer, num_warmup_steps=warmup,
                                       num_training_steps=total)
    return "cosine_with_min_lr", get_scheduler(
        "cosine_with_min_lr", optimizer, num_warmup_steps=warmup, num_training_steps=total,
        scheduler_specific_kwargs={"min_lr_rate": min_ratio})


def trainer_lrs(kind, lr, warmup, total, min_ratio):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(4, dtype=torch.float64))
    opt = torch.optim.AdamW([p], lr=lr, weight_decay=0.1)
    name, sched = scheduler_for(kind, opt, warmup, total, min_ratio)
    lrs = []
    for _ in range(total):
        p.grad = torch.randn(4, dtype=torch.float64)
        lr_now = opt.param_groups[0]["lr"]
        lr_now = float(lr_now.item() if torch.is_tensor(lr_now) else lr_now)
        lrs.append(lr_now)
        opt.step()
        sched.step()
    # The lambda the scheduler applies, evaluated directly: the same numbers.
    lam = sched.lr_lambdas[0]
    assert lrs == [lr * lam(k) for k in range(total)], (kind, warmup, total)
    return name, lrs


def check_adamw_at_lr_zero():
    torch.manual_seed(1)
    p = torch.nn.Parameter(torch.randn(8))
    before = p.detach().clone()
    opt = torch.optim.AdamW([p], lr=0.0, weight_decay=0.1)
    p.grad = torch.randn(8)
    opt.step()
    st = opt.state[p]
    assert torch.equal(p.detach(), before), "AdamW at lr 0 changed the weights"
    assert float(st["step"]) == 1.0, "AdamW at lr 0 did not count the step"
    assert torch.count_nonzero(st["exp_avg"]) == 8 and torch.count_nonzero(st["exp_avg_sq"]) == 8


def main():
    check_adamw_at_lr_zero()
    cases = []
    for kind, lr, warmup, total, min_ratio in CASES:
        name, lrs = trainer_lrs(kind, lr, warmup, total, min_ratio)
        cases.append({"kind": kind, "lr": lr, "warmup_steps": warmup, "total_steps": total,
                      "min_lr_ratio": min_ratio, "transformers_scheduler": name,
                      "lr_per_step": lrs})
    doc = {
        "generator": "scripts/gen_lr_schedule_vectors.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "convention": "lr_per_step[i] is the lr of optimizer step i+1 (Trainer: read before "
                      "optimizer.step(), then lr_scheduler.step())",
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
