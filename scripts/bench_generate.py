#!/usr/bin/env python3
"""Decode speed of Hugging Face transformers' generate() on the GPU, to compare with
`slideformer generate` on the same model, prompt and number of new tokens (bf16, greedy,
batch 1, KV cache). The lead runs it on the GPU machine (torch 2.11 + transformers 5.17):

  python scripts/bench_generate.py --model DIR --prompt "The capital of France is" --new 256
  build/bin/slideformer generate --model DIR --prompt "The capital of France is" \
      --max-new-tokens 256 --backend cuda

Both print decode tokens/s: transformers' is (new tokens - 1) / (time of generate() - time of
the prefill alone), after one warm-up run; slideformer's stats line (stderr) counts the same
new tokens after the first over its decode loop. The eos token is suppressed here
(min_new_tokens) so that transformers always generates --new tokens; pass slideformer a prompt
that does not end early, or compare at the new-token count both reached."""
import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face model directory")
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--new", type=int, default=256, help="new tokens")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).cuda().eval()
    x = tok(a.prompt, return_tensors="pt").to("cuda")
    n_prompt = x["input_ids"].shape[1]

    def gen(n):
        return model.generate(**x, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                              pad_token_id=tok.eos_token_id)

    with torch.no_grad():
        gen(8)  # warm-up: kernels, allocator, caches
        best = None
        for _ in range(a.reps):
            _, prefill = timed(lambda: gen(1))
            out, total = timed(lambda: gen(a.new))
            rate = (a.new - 1) / max(total - prefill, 1e-9)
            best = rate if best is None else max(best, rate)
            print(f"prompt {n_prompt} tokens, {out.shape[1] - n_prompt} new tokens in {total:.2f} s "
                  f"(prefill {prefill * 1e3:.1f} ms): decode {rate:.1f} tokens/s")
    print(f"transformers best decode: {best:.1f} tokens/s "
          f"(bf16, greedy, batch 1, {torch.cuda.get_device_name()})")


if __name__ == "__main__":
    main()
