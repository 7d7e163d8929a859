#!/usr/bin/env python3
"""Expected chat-template renders for tests/unit/test_jinja_chat_template.cc.

For seven model families it takes the model's own Jinja chat template and renders a fixed set of
conversations (system or not, single and multi-turn, generation prompt on and off, whitespace and
non-ASCII content, plus conversations the template refuses) with transformers'
PreTrainedTokenizerFast.apply_chat_template(tokenize=False), i.e. transformers' own Jinja
environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
raise_exception, strftime_now, tojson) and its context (messages, tools=None, documents=None,
add_generation_prompt, and the tokenizer's special tokens). kvbench must reproduce every render
byte for byte, and must refuse where transformers raised.

Template sources (pinned by sha256; the template texts are committed in the fixture, since they
are a few KB of model metadata and tests must not need the network):
  - SmolLM2 (ChatML with a default system message): tokenizer.chat_template of
    SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch_models.sh, default set);
  - Gemma 2, Llama-3.1, Qwen2.5, Qwen3, Mistral (Nemo), Phi-3.5: llama.cpp's models/templates/*.jinja
    (copies of each model's tokenizer_config.json chat_template), from the llama-cpp-python==0.3.16
    sdist on PyPI (the same sdist scripts/fetch_models.sh takes the minja headers from).
    (The Gemma-3-270M GGUF that fetch_models.sh ships is the pretrained model and carries no
    tokenizer.chat_template, and no pinned package here ships Gemma 3's; Gemma 2's template is the
    Gemma family's.)
bos/eos tokens are those of each model's tokenizer_config.json (None: the model defines none, and
the template sees the name undefined, as in transformers).

Pinned versions (/work/.venv-g3): transformers 4.53.3, tokenizers 0.21.4, Jinja2 3.1.6,
gguf 0.17.1. Run:
  /work/.venv-g3/bin/python scripts/make_chat_template_fixture.py --models models
Writes tests/fixtures/tokenizer/chat_template_renders.json. Deterministic (no template here
calls strftime_now; the script checks that by rendering twice with a different date).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile

import gguf
import jinja2
import tokenizers
import transformers
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

SDIST_REQ = "llama-cpp-python==0.3.16"
SDIST_SHA256 = "34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TEMPLATES = "llama_cpp_python-0.3.16/vendor/llama.cpp/models/templates/"

# name, source, bos, eos
FAMILIES = [
    ("smollm2", "gguf:SmolLM2-135M-Instruct.Q4_1.gguf", "<|im_start|>", "<|im_end|>"),
    ("gemma2", "sdist:google-gemma-2-2b-it.jinja", "<bos>", "<eos>"),
    ("llama3.1", "sdist:meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    ("qwen2.5", "sdist:Qwen-Qwen2.5-7B-Instruct.jinja", None, "<|im_end|>"),
    ("qwen3", "sdist:Qwen-Qwen3-0.6B.jinja", None, "<|im_end|>"),
    ("mistral-nemo", "sdist:mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>"),
    ("phi3.5", "sdist:microsoft-Phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>"),
]


def m(role, content):
    return {"role": role, "content": content}


# (name, messages, add_generation_prompt). Roles alternate where the template demands it; the
# refusals at the end are expected to raise in the templates that check roles.
CONVERSATIONS = [
    ("user", [m("user", "What is the capital of France?")], True),
    ("user_no_gen", [m("user", "What is the capital of France?")], False),
    ("system_user", [m("system", "You are a terse assistant."), m("user", "Name a prime.")], True),
    ("multi_turn", [m("user", "Hi!"), m("assistant", "Hello. How can I help?"),
                    m("user", "Count to three.")], True),
    ("system_multi_turn_no_gen",
     [m("system", "Answer in French."), m("user", "One?"), m("assistant", "Un."),
      m("user", "Two?"), m("assistant", "Deux.")], False),
    ("whitespace_unicode", [m("system", "  Sé bref.\n"), m("user", "\n  Grüße, 世界 ✓  \n")], True),
    ("empty_user", [m("user", "")], True),
    ("two_users", [m("user", "a"), m("user", "b")], True),
    ("assistant_first", [m("assistant", "I start."), m("user", "ok")], True),
    ("unknown_role", [m("narrator", "Once upon a time."), m("user", "Go on.")], True),
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def gguf_template(path, want_sha):
    got = sha256(path)
    if got != want_sha:
        sys.exit(f"{path}: sha256 {got}, expected {want_sha}")
    r = gguf.GGUFReader(path)
    f = r.fields["tokenizer.chat_template"]
    return bytes(f.parts[f.data[0]]).decode("utf-8")


def sdist_templates(sdist):
    got = sha256(sdist)
    if got != SDIST_SHA256:
        sys.exit(f"{sdist}: sha256 {got}, expected {SDIST_SHA256}")
    out = {}
    with tarfile.open(sdist) as t:
        for _, src, _, _ in FAMILIES:
            if src.startswith("sdist:"):
                out[src] = t.extractfile(TEMPLATES + src[6:]).read().decode("utf-8")
    return out


def tokenizer_for(template, bos, eos):
    vocab = {"[UNK]": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<bos>": 3, "<eos>": 4,
             "<|begin_of_text|>": 5, "<|eot_id|>": 6, "<s>": 7, "</s>": 8, "<|endoftext|>": 9}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    kw = {"unk_token": None}
    if bos is not None:
        kw["bos_token"] = bos
    if eos is not None:
        kw["eos_token"] = eos
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=template, **kw)


def render(tok, messages, gen):
    try:
        return {"expected": tok.apply_chat_template(messages, tokenize=False,
                                                    add_generation_prompt=gen)}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="models", help="folder with SmolLM2's GGUF")
    ap.add_argument("--sdist", default="", help="llama_cpp_python-0.3.16.tar.gz (else pip download)")
    ap.add_argument("--out", default="tests/fixtures/tokenizer/chat_template_renders.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sdist = a.sdist
        if not sdist:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--no-binary", ":all:", "--dest", tmp, SDIST_REQ], check=True)
            sdist = os.path.join(tmp, "llama_cpp_python-0.3.16.tar.gz")
        texts = sdist_templates(sdist)
    texts["gguf:SmolLM2-135M-Instruct.Q4_1.gguf"] = gguf_template(
        os.path.join(a.models, "SmolLM2-135M-Instruct.Q4_1.gguf"), SMOLLM2_SHA256)

    families = []
    for name, src, bos, eos in FAMILIES:
        template = texts[src]
        tok = tokenizer_for(template, bos, eos)
        cases = []
        for cname, messages, gen in CONVERSATIONS:
            r = render(tok, messages, gen)
            # A template that reads the clock would make the fixture depend on the day.
            assert "strftime_now" not in template or "date_string" in template, name
            cases.append({"name": cname, "messages": messages, "add_generation_prompt": gen, **r})
        ok = sum("expected" in c for c in cases)
        print(f"{name}: {ok} renders, {len(cases) - ok} refusals", file=sys.stderr)
        families.append({"name": name, "source": src, "bos_token": bos, "eos_token": eos,
                         "template": template, "cases": cases})
    doc = {
        "reference": "transformers PreTrainedTokenizerFast.apply_chat_template(tokenize=False) "
                     "of each model's own chat template; 'error' = transformers raised "
                     "TemplateError with this message",
        "versions": {"transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "jinja2": jinja2.__version__,
                     "gguf": "0.17.1"},
        "sources": {"sdist": SDIST_REQ + " sha256 " + SDIST_SHA256,
                    "SmolLM2-135M-Instruct.Q4_1.gguf": SMOLLM2_SHA256},
        "families": families,
    }
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {a.out} ({os.path.getsize(a.out)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
