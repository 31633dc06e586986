#!/usr/bin/env python3
"""Writes tests/data/configs: config.json files of the supported families as transformers 5 and
4 spell them, with the values transformers 5.17 derives from each (head_dim, kv heads, RoPE
inverse frequencies and attention scaling, sliding window, biases, dtype, ...) and, for the
model cases, the fp32 loss of a tiny model on fixed tokens. tests/io/test_config_vectors.cpp
and tests/model/test_config_models.cpp check slideformer against them.

usage: gen_config_vectors.py [OUT_DIR]   (default tests/data/configs; needs torch, transformers)
Deterministic: every weight comes from a seeded generator and is rounded to bf16, so the
weights file per family is small and exact in both implementations."""
import copy, json, math, os, sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data", "configs")
CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
           "qwen3": "Qwen3ForCausalLM"}

# One tiny shape per family (2 layers, head_dim 16 so that RoPE has 8 frequency bands), small
# enough that the four weight files together are ~200 KB.
TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
            rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
FAMILY_EXTRA = {"llama": {}, "mistral": {"sliding_window": None},
                "qwen2": {"tie_word_embeddings": True}, "qwen3": {}}
# RoPE settings whose bands all fall inside the tokens' 48 positions (original context 16).
ROPE = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
             "original_max_position_embeddings": 16},
}
ROWS, SEQ = 2, 48


def tokens():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, TINY["vocab_size"], (ROWS, SEQ), generator=g)


def legacy(cfg_json):
    """The same config as transformers 4.x wrote it: top-level rope_theta, rope_scaling
    (null for the default RoPE), torch_dtype."""
    j = copy.deepcopy(cfg_json)
    rp = j.pop("rope_parameters")
    j["rope_theta"] = rp.pop("rope_theta")
    j["rope_scaling"] = None if rp.get("rope_type") == "default" else rp
    if "dtype" in j:
        j["torch_dtype"] = j.pop("dtype")
    j["transformers_version"] = "4.57.1"
    return j


def rotary_of(model_or_config):
    """(inv_freq, attention_scaling) as the family's rotary embedding computes them."""
    cfg = model_or_config
    mod = getattr(transformers.models, cfg.model_type)
    cls = getattr(getattr(mod, f"modeling_{cfg.model_type}"),
                  {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}[cfg.model_type]
                  + "RotaryEmbedding")
    rot = cls(cfg)
    return [float(x) for x in rot.inv_freq], float(rot.attention_scaling)


def derived(cfg):
    """What transformers 5 computes with, from a loaded config (no weights needed)."""
    mt = cfg.model_type
    mod = getattr(getattr(transformers.models, mt), f"modeling_{mt}")
    attn_cls = getattr(mod, {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}[mt] + "Attention")
    windows = []
    with torch.device("meta"):
        for i in range(cfg.num_hidden_layers):
            a = attn_cls(cfg, i)
            w = getattr(a, "sliding_window", None)
            if mt == "mistral":
                w = getattr(cfg, "sliding_window", None)
            windows.append(int(w) if w else 0)
        a0 = attn_cls(cfg, 0)
        qkv_bias = a0.q_proj.bias is not None
        o_bias = a0.o_proj.bias is not None
    inv_freq, scaling = rotary_of(cfg)
    eos = cfg.eos_token_id
    return {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": a0.head_dim, "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps, "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        "qkv_bias": qkv_bias, "o_proj_bias": o_bias, "qk_norm": hasattr(a0, "q_norm"),
        "dtype": str(cfg.dtype).replace("torch.", "") if cfg.dtype is not None else None,
        "rope_type": cfg.rope_parameters["rope_type"], "rope_theta": cfg.rope_parameters["rope_theta"],
        "inv_freq": inv_freq, "attention_scaling": scaling,
        "sliding_window": max(windows), "sliding_layers": sum(1 for w in windows if w),
        "bos_token_id": cfg.bos_token_id,
        "eos_token_ids": eos if isinstance(eos, list) else ([] if eos is None else [eos]),
    }


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def model_cases(vectors):
    toks = tokens()
    vectors["tokens"] = toks.tolist()
    torch.manual_seed(0)
    for fam, cls in CLASSES.items():
        base = dict(TINY, **FAMILY_EXTRA[fam])
        cfg = getattr(transformers, cls.replace("ForCausalLM", "Config"))(**base, rope_parameters=dict(ROPE["default"]))
        cfg.architectures = [cls]
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():  # wider than the default init, so RoPE matters to the loss
                p.copy_((torch.randn_like(p) * 0.5).to(torch.bfloat16).to(torch.float32))
        wdir = os.path.join(OUT, "weights", fam)
        model.to(torch.bfloat16).save_pretrained(wdir)  # bf16 values: exact in both
        os.remove(os.path.join(wdir, "config.json"))
        gen = os.path.join(wdir, "generation_config.json")
        if os.path.exists(gen):
            os.remove(gen)
        state = {k: v.to(torch.float32) for k, v in model.state_dict().items()}
        for rope_name, rope in ROPE.items():
            c5 = getattr(transformers, cls.replace("ForCausalLM", "Config"))(**base, rope_parameters=dict(rope))
            c5.architectures = [cls]
            c5.dtype = torch.bfloat16
            d = os.path.join(OUT, f"{fam}_{rope_name}")
            c5.save_pretrained(d)  # config.json exactly as transformers 5 writes it
            j5 = json.load(open(os.path.join(d, "config.json")))
            write_json(os.path.join(OUT, f"{fam}_{rope_name}_v4", "config.json"), legacy(j5))
            for name in (f"{fam}_{rope_name}", f"{fam}_{rope_name}_v4"):
                loaded = AutoConfig.from_pretrained(os.path.join(OUT, name))
                expect = derived(loaded)  # before from_config, which sets the config's dtype
                m = AutoModelForCausalLM.from_config(loaded, dtype=torch.float32)
                m.load_state_dict(state, strict=False)
                if loaded.tie_word_embeddings:
                    m.tie_weights()
                m.eval()
                with torch.no_grad():
                    loss = float(m(input_ids=toks, labels=toks).loss)
                vectors["cases"][name] = dict(expect, weights=fam, loss=loss, spelling="v4" if name.endswith("_v4") else "v5")


# Config-only cases: hand-written files (the fields real checkpoints ship, and the defaults that
# apply when a field is absent).
def small(mt, **kw):
    j = {"model_type": mt, "architectures": [CLASSES[mt]], "vocab_size": 96, "hidden_size": 64,
         "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2}
    j.update(kw)
    return {k: v for k, v in j.items() if v is not DROP}


DROP = object()
FIELD_CASES = {
    # absent fields take each family's own default
    "llama_defaults": small("llama", num_key_value_heads=DROP),
    "mistral_defaults": small("mistral", num_attention_heads=8, num_key_value_heads=DROP),
    "qwen2_defaults": small("qwen2", num_attention_heads=32, hidden_size=256, num_key_value_heads=DROP),
    "qwen3_defaults": small("qwen3", num_attention_heads=32, hidden_size=256, num_key_value_heads=DROP),
    "llama_head_dim_explicit": small("llama", head_dim=32),
    "mistral_nemo_head_dim": small("mistral", hidden_size=80, num_attention_heads=4, head_dim=32),
    # dtype spellings: transformers 5 prefers "dtype" over "torch_dtype"
    "dtype_both": small("llama", dtype="float32", torch_dtype="bfloat16"),
    "torch_dtype_only": small("llama", torch_dtype="float16"),
    # RoPE spellings and their precedence
    "rope_parameters_and_top_theta": small("llama", rope_parameters={"rope_type": "default", "rope_theta": 5e5}, rope_theta=1e4),
    "rope_parameters_no_theta": small("llama", rope_parameters={"rope_type": "default"}, rope_theta=2e5),
    "rope_scaling_beats_parameters": small("llama", rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                                           rope_scaling={"type": "linear", "factor": 4.0}),
    "rope_legacy_type_key": small("qwen2", rope_theta=1e6, rope_scaling={"type": "yarn", "factor": 4.0,
                                                                         "original_max_position_embeddings": 32}),
    "rope_theta_integer": small("qwen3", rope_theta=1000000, rope_scaling=None),
    "yarn_no_original": small("qwen3", max_position_embeddings=128, rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}),
    "yarn_mscale": small("llama", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0,
                                                   "original_max_position_embeddings": 32, "mscale": 0.707, "mscale_all_dim": 1.0}),
    "yarn_attention_factor": small("mistral", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0,
                                                               "original_max_position_embeddings": 32, "attention_factor": 1.25,
                                                               "beta_fast": 16, "beta_slow": 2}),
    "yarn_no_truncate": small("qwen2", rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                                        "original_max_position_embeddings": 32, "truncate": False}),
    "llama31_8b_rope": small("llama", max_position_embeddings=131072, rope_theta=500000.0,
                             rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
    "dynamic_legacy": small("llama", rope_theta=1e4, rope_scaling={"type": "dynamic", "factor": 2.0}),
    # sliding windows
    "mistral_window_absent": small("mistral"),
    "mistral_window_null": small("mistral", sliding_window=None),
    "mistral_window_2048": small("mistral", sliding_window=2048),
    "qwen2_window_unused": small("qwen2", use_sliding_window=False, sliding_window=32, max_window_layers=1),
    "qwen2_window_upper_layers": small("qwen2", use_sliding_window=True, sliding_window=32, max_window_layers=2),
    "qwen2_window_no_layer": small("qwen2", use_sliding_window=True, sliding_window=32, max_window_layers=4),
    "qwen3_window_layer_types": small("qwen3", use_sliding_window=True, sliding_window=48, max_window_layers=4,
                                      layer_types=["full_attention", "sliding_attention", "full_attention", "full_attention"]),
    "qwen3_layer_types_all_full": small("qwen3", use_sliding_window=True, sliding_window=48,
                                        layer_types=["full_attention"] * 4),
    # biases and ties
    "qwen2_attention_bias_false": small("qwen2", attention_bias=False),
    "qwen3_tied": small("qwen3", tie_word_embeddings=True, head_dim=16),
    "mistral_attention_bias_ignored": small("mistral", attention_bias=True),
    "llama_hidden_act_swish": small("llama", hidden_act="swish"),
    "eos_list": small("llama", eos_token_id=[2, 5], bos_token_id=1),
}


def field_cases(vectors):
    for name, j in FIELD_CASES.items():
        d = os.path.join(OUT, "fields", name)
        write_json(os.path.join(d, "config.json"), j)
        cfg = AutoConfig.from_pretrained(d)
        vectors["cases"]["fields/" + name] = derived(cfg)


def main():
    vectors = {"transformers": transformers.__version__, "torch": torch.__version__, "rows": ROWS, "seq": SEQ,
               "cases": {}}
    model_cases(vectors)
    field_cases(vectors)
    write_json(os.path.join(OUT, "vectors.json"), vectors)
    print(f"wrote {len(vectors['cases'])} cases to {OUT}")


if __name__ == "__main__":
    main()
