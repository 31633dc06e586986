#!/usr/bin/env python3
"""Expected outputs for the dataset and chat-template tests (tests/data/datasets/vectors.json).

For each chat template under tests/data/datasets/templates (and Qwen3's real tokenizer_config.json
in ../shared/data/tokenizers/qwen3) and each conversation below, transformers'
apply_chat_template renders the text (or raises); the token ids are what
apply_chat_template(tokenize=True) gives with a tokenizer of the family; the assistant mask is
transformers' own return_assistant_tokens_mask, computed with a copy of the template in which
{% generation %} marks what the assistant produces (the copy is checked to render the same text
as the official template before its mask is used). Text and prompt/completion documents get
[BOS if add_bos] + ids + [EOS], with the completion mask from the tokenizer's offsets.

Nothing here runs at training time. Needs PyPI transformers (5.x), tokenizers, jinja2:
    python3 scripts/gen_dataset_vectors.py
"""
import copy
import json
import os
import sys
import tempfile

from transformers import PreTrainedTokenizerFast
import transformers
import tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "datasets")
TOK = os.path.join(ROOT, "tests", "data", "tokenizers")
SHARED = os.path.join(ROOT, "..", "shared", "data", "tokenizers")

# Llama 3 special tokens added to GPT-2's byte-level BPE: a stand-in Llama-3-style tokenizer
# (the real one is gated); the C++ test builds the same file from this list.
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]

CONVERSATIONS = [
    ("system_user_assistant", [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"}]),
    ("multi_turn_system", [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
        {"role": "assistant", "content": "Green, like grass."}]),
    ("no_system", [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi! How can I help?"}]),
    ("whitespace_unicode", [
        {"role": "system", "content": "  Be precise.\n"},
        {"role": "user", "content": "  Translate 'cat'\n\n"},
        {"role": "assistant", "content": "\n\nKatze, chat, 猫 🐈  \n"},
        {"role": "user", "content": "Thanks\t"},
        {"role": "assistant", "content": " You're welcome. "}]),
    ("think_in_content", [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "<think>\nadd one and one\n</think>\n\n2"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>two twos</think>4"}]),
    ("reasoning_field", [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "\nIt is Paris.\n"}]),
    ("system_in_middle", [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "system", "content": "Now answer in French."},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"}]),
    ("two_users", [
        {"role": "user", "content": "first"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "ok"}]),
    ("assistant_first", [
        {"role": "assistant", "content": "Welcome."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}]),
    ("two_assistants", [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": "<think>plan</think>Step 1"},
        {"role": "assistant", "content": "Step 2"}]),
    ("empty_system", [
        {"role": "system", "content": ""},
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y"}]),
    ("system_last_user", [
        {"role": "system", "content": "Sys."},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]),
]

TEXTS = ["Hello world", "  leading spaces and a trailing newline\n", "Ünïcödé 猫 🐈 and digits 12345",
         "<|im_start|> looks special", "line one\nline two\n\nline four"]
PROMPT_COMPLETIONS = [("The capital of France is", " Paris."), ("Q: 2+2?\nA:", " 4"),
                      ("Translate: cat ->", "Katze"), ("x", "\n\ny z"), ("猫は", "かわいい")]


def jinja_marked_llama(llama31):
    head = "{{- bos_token }}"
    if llama31:
        head += ("{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
                 "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}"
                 "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
                 "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\n"
                 "Today Date: ' + date_string + '\\n\\n' + system_message + '<|eot_id|>' }}")
    return head + ("{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
                   "{%- if message['role'] == 'assistant' %}{% generation %}{{- message['content']|trim + '<|eot_id|>' }}"
                   "{% endgeneration %}{%- else %}{{- message['content']|trim + '<|eot_id|>' }}{%- endif %}{%- endfor %}")


def jinja_marked_chatml(default_system):
    return ("{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
            + ("{%- else %}{{- '<|im_start|>system\\n" + default_system + "<|im_end|>\\n' }}" if default_system else "")
            + "{%- endif %}{%- for message in messages %}{%- if message['role'] == 'assistant' %}"
              "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
              "{%- elif not (loop.first and message['role'] == 'system') %}"
              "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}")


def jinja_marked_qwen3(official):
    # The official template with the assistant branch's output wrapped in {% generation %}:
    # the region that picks the think/no-think rendering is replaced by header + marked block.
    a = "{%- if loop.index0 > ns.last_query_index %}"
    b = "{%- if message.tool_calls %}"
    c = "{{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}"
    assert official.count(a) == 1 and official.count(b) == 1 and official.count(c) == 1, "Qwen3 template changed"
    i, j = official.index(a), official.index(b)
    block = ("{{- '<|im_start|>' + message.role + '\\n' }}{% generation %}"
             "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}"
             "{{- '<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
             "{%- else %}{{- content }}{%- endif %}\n        ")
    t = official[:i] + block + official[j:]
    return t.replace(c, "{{- '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}\n    {%- elif message.role == \"tool\" %}")


def jinja_marked_mistral(inst_open, inst_close, prefix, trim, system):
    sys_cond = {"first": "loop.first", "last": "loop.last", None: "false"}[system]
    content = "message['content']|trim" if trim else "message['content']"
    return ("{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
            "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
            "{{- bos_token }}{%- for message in loop_messages %}{%- if message['role'] == 'user' %}"
            "{%- if " + sys_cond + " and system_message is defined %}"
            "{{- '" + inst_open + "' + system_message + '\\n\\n' + message['content'] + '" + inst_close + "' }}"
            "{%- else %}{{- '" + inst_open + "' + message['content'] + '" + inst_close + "' }}{%- endif %}"
            "{%- else %}{% generation %}{{- '" + prefix + "' + " + content + " + eos_token }}{% endgeneration %}{%- endif %}{%- endfor %}")


def make_llama_tokenizer_dir(tmp):
    tj = json.load(open(os.path.join(TOK, "gpt2", "tokenizer.json")))
    for i, t in enumerate(LLAMA_SPECIALS):
        tj["added_tokens"].append({"id": 50257 + i, "content": t, "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": False, "special": True})
    d = os.path.join(tmp, "llama")
    os.makedirs(d)
    json.dump(tj, open(os.path.join(d, "tokenizer.json"), "w"))
    return os.path.join(d, "tokenizer.json")


def fast(tokenizer_file, bos, eos):
    return PreTrainedTokenizerFast(tokenizer_file=tokenizer_file, bos_token=bos, eos_token=eos)


def main():
    tmp = tempfile.mkdtemp()
    qwen_cfg_path = os.path.join(SHARED, "qwen3", "tokenizer_config.json")
    qwen_cfg = json.load(open(qwen_cfg_path))
    toks = {
        "qwen3": (os.path.join(SHARED, "qwen3", "tokenizer.json"), None, "<|im_end|>", False),
        "mistral": (os.path.join(TOK, "mistral", "tokenizer.json"), "<s>", "</s>", True),
        "llama": (make_llama_tokenizer_dir(tmp), "<|begin_of_text|>", "<|eot_id|>", True),
    }
    templates = {"qwen3": (qwen_cfg["chat_template"], qwen_cfg.get("bos_token"), qwen_cfg["eos_token"], "shared:qwen3")}
    for name in sorted(os.listdir(os.path.join(DATA, "templates"))):
        cfg = json.load(open(os.path.join(DATA, "templates", name, "tokenizer_config.json")))
        templates[name] = (cfg["chat_template"], cfg["bos_token"], cfg["eos_token"], name)
    family = lambda n: "qwen3" if n.startswith("qwen") else "llama" if n.startswith("llama") else "mistral"
    marked = {
        "qwen3": jinja_marked_qwen3(templates["qwen3"][0]),
        "qwen2.5": jinja_marked_chatml("You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
        "qwen2": jinja_marked_chatml("You are a helpful assistant."),
        "llama3": jinja_marked_llama(False), "llama3.1": jinja_marked_llama(True), "llama3.2": jinja_marked_llama(True),
        "mistral-legacy": jinja_marked_mistral("[INST] ", " [/INST]", "", False, None),
        "mistral-v1": jinja_marked_mistral(" [INST] ", " [/INST]", " ", False, "first"),
        "mistral-v3": jinja_marked_mistral("[INST] ", "[/INST]", " ", True, "last"),
        "mistral-nemo": jinja_marked_mistral("[INST]", "[/INST]", "", False, "last"),
    }
    chat = []
    for name, (tpl, bos, eos, src) in templates.items():
        tf, _, _, _ = toks[family(name)]
        tok = fast(tf, bos, eos)
        kwargs = {"date_string": "05 Mar 2025"} if name == "llama3.2" else {}
        for case, msgs in CONVERSATIONS:
            e = {"template": src, "tokenizer": family(name), "case": case}
            if kwargs:
                e["date_string"] = kwargs["date_string"]
            try:
                text = tok.apply_chat_template(msgs, chat_template=tpl, tokenize=False, **kwargs)
            except Exception as ex:  # the template's raise_exception
                e["error"] = str(ex)
                chat.append(e)
                continue
            out = tok.apply_chat_template(msgs, chat_template=marked[name], tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True, **kwargs)
            mtext = tok.apply_chat_template(msgs, chat_template=marked[name], tokenize=False, **kwargs)
            assert mtext == text, f"marked template of {name} renders differently on {case}:\n{mtext!r}\n{text!r}"
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert list(out["input_ids"]) == ids
            e.update(text=text, ids=ids, mask=list(out["assistant_masks"]))
            chat.append(e)
    docs = []
    for tname, (tf, bos, eos, add_bos) in toks.items():
        tok = fast(tf, bos, eos)
        pre = [tok.convert_tokens_to_ids(bos)] if add_bos else []
        eos_id = tok.convert_tokens_to_ids(eos)
        for t in TEXTS:
            ids = pre + tok(t, add_special_tokens=False)["input_ids"] + [eos_id]
            docs.append({"tokenizer": tname, "text": t, "ids": ids, "mask": [0] * len(pre) + [1] * (len(ids) - len(pre))})
        for p, c in PROMPT_COMPLETIONS:
            enc = tok(p + c, add_special_tokens=False, return_offsets_mapping=True)
            # A token is a completion token when its characters overlap the completion.
            mask = [int(e > len(p)) for (s, e) in enc["offset_mapping"]]
            ids = pre + enc["input_ids"] + [eos_id]
            docs.append({"tokenizer": tname, "prompt": p, "completion": c, "ids": ids,
                         "mask": [0] * len(pre) + mask + [1]})
    out = {"generator": f"scripts/gen_dataset_vectors.py; transformers {transformers.__version__}, tokenizers {tokenizers.__version__}",
           "llama_specials": LLAMA_SPECIALS,
           "tokenizers": {k: {"bos": v[1], "eos": v[2], "add_bos": v[3]} for k, v in toks.items()},
           "conversations": [{"case": c, "messages": m} for c, m in CONVERSATIONS],
           "chat": chat, "documents": docs}
    with open(os.path.join(DATA, "vectors.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{len(chat)} chat renders ({sum('error' in c for c in chat)} refused), {len(docs)} documents")


if __name__ == "__main__":
    sys.exit(main())
