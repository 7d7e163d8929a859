#!/usr/bin/env python3
# Writes tests/fixtures/tokenizer/*.json: reference token ids for the C++ tokenizers and reference
# chat-template renders. Pinned reference versions (scripts/ref_env.sh): tokenizers==0.20.3,
# transformers==4.46.3, gguf==0.10.0, sentencepiece==0.2.3; jinja2 as installed with transformers.
# Usage: $(bash scripts/ref_env.sh) scripts/make_tokenizer_fixture.py
# Inputs: models/SmolLM2-135M-Instruct.Q4_1.gguf and ../shared/models/{stories260K,tokenizers}.
import json
import pathlib
import struct
import sys

import gguf
import jinja2
import sentencepiece
import tokenizers
import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "models"
MODELS = ROOT / "models"
OUT = ROOT / "tests" / "fixtures" / "tokenizer"
SMOLLM_GGUF = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
VERSIONS = {
    "tokenizers": tokenizers.__version__,
    "transformers": transformers.__version__,
    "sentencepiece": sentencepiece.__version__,
    "gguf": "0.10.0",
    "jinja2": jinja2.__version__,
}


def long_paragraph():
    sentences = [
        "The river wound slowly through the valley, carrying leaves and small branches.",
        "In 1987, the town council approved a budget of $3,450,000 for new bridges.",
        "Dr. O'Neil didn't expect the results; they'd been tested 12 times already!",
        "Children played near the old mill while their parents talked about the harvest.",
        "\"Why won't it start?\" asked Maria, turning the key for the third time.",
        "Prices rose by 4.5% in March, then fell by 0.75% in April (see Table 3).",
        "She wrote: café, naïve, résumé, and jalapeño on the chalkboard.",
        "At 06:30 the train left platform 9 for a 240-kilometre journey north.",
    ]
    out, i = [], 0
    while sum(len(s) + 1 for s in out) < 5000:
        out.append(f"{sentences[i % len(sentences)]}")
        i += 1
    return " ".join(out)


TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "你好，世界！这是一个测试。日本語のテキストです。안녕하세요 세계",
    "I love 🍕 and 🎉🎉! Family: 👨‍👩‍👧‍👦 flags 🇫🇷",
    "Café naïve résumé façade — Ångström, Ærøskøbing, Straße.",
    "Combining: e\u0301 a\u0308 n\u0303 o\u0302\u0323 (decomposed marks)",
    "مرحبا بالعالم — שלום עולם",
    "1234567890 3.14159 2024-01-01 1,000,000 $42.50",
    "123456789012345678901234567890",
    "Non-ASCII digits: ½ ² ٣ ४ and Ⅻ",
    "def foo(x):\n    if x > 0:\n\treturn x * 2\n    return -x\n",
    "a  b   c    d",
    "trailing spaces   ",
    "\n\n\n",
    "line1\nline2\r\nline3\n\n  indented\n",
    " leading space",
    "\t\ttabs\tand\t\tmore",
    "don't I'll we're they've she'd it's I'M DON'T You'RE",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "Spaces: a\u00a0b\u3000c\u2009d",
    "Mixed 42abc abc42 x1y2z3 ...!!! ??? --- ***",
    "<think>\nreasoning\n</think>\n\nanswer",
    long_paragraph(),
]


def dump(name, obj):
    path = OUT / name
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)", file=sys.stderr)


def gguf_strings(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def gguf_ints(reader, key):
    f = reader.fields[key]
    return [int(f.parts[i][0]) for i in f.data]


# ---- (a) SmolLM2: HF tokenizers built from the GGUF vocabulary ---------------------------------
def smollm2():
    r = gguf.GGUFReader(str(SMOLLM_GGUF))
    tokens = gguf_strings(r, "tokenizer.ggml.tokens")
    types = gguf_ints(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in gguf_strings(r, "tokenizer.ggml.merges")]
    # unk_token as SmolLM2's tokenizer.json (and transformers' GGUF conversion) has it: the 21
    # byte symbols missing from the vocabulary (e.g. 0x04, 0xF1-0xFF) encode as <|endoftext|>.
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                              unk_token=tokens[0]))
    # SmolLM2's own tokenizer.json pre-tokenizer and decoder.
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == 3])
    hf = transformers.AutoTokenizer.from_pretrained(str(MODELS), gguf_file=SMOLLM_GGUF.name)
    cases, notes = [], []
    for text in TEXTS:
        ids = tk.encode(text, add_special_tokens=False).ids
        assert tk.decode(ids, skip_special_tokens=False) == text, text
        ids_tf = hf.encode(text, add_special_tokens=False)
        if ids_tf != ids:
            notes.append(f"transformers AutoTokenizer(gguf_file) differs on {text[:40]!r}: "
                         f"{ids_tf[:16]} vs tokenizers {ids[:16]}")
        cases.append({"text": text, "ids": ids})
    unk_cases = []
    for text in ["a\x04b", "x\U00050000y \x13z"]:  # single missing bytes: fuse_unk is moot
        ids = tk.encode(text, add_special_tokens=False).ids
        assert ids == hf.encode(text, add_special_tokens=False), text
        unk_cases.append({"text": text, "ids": ids})
    if not notes:
        notes.append("transformers AutoTokenizer.from_pretrained(gguf_file=...) agrees on all texts")
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    multi = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": "Hi!"},
             {"role": "assistant", "content": "Hello. How can I help?"},
             {"role": "user", "content": "Name a color."}]
    renders = [
        {"messages": chat, "add_generation_prompt": True,
         "text": hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)},
        {"messages": multi, "add_generation_prompt": True,
         "text": hf.apply_chat_template(multi, tokenize=False, add_generation_prompt=True)},
        {"messages": chat, "add_generation_prompt": False,
         "text": hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)},
    ]
    rendered_ids = hf.apply_chat_template(chat, tokenize=True, add_generation_prompt=True)
    dump("smollm2_gguf.json", {
        "tokenizer": str(SMOLLM_GGUF.relative_to(ROOT)),
        "reference": "tokenizers.Tokenizer(BPE(GGUF vocab+merges)) with SmolLM2's tokenizer.json "
                     "pre-tokenizer Sequence[Digits(individual_digits=True), ByteLevel("
                     "add_prefix_space=False, use_regex=True)], ByteLevel decoder, and the "
                     "CONTROL (type 3) tokens added as special tokens; encode(add_special_tokens"
                     "=False). Cross-checked against transformers.AutoTokenizer(gguf_file=...).",
        "versions": VERSIONS,
        "notes": notes,
        "cases": cases,
        "unk_cases": unk_cases,
        "chat_template": r.fields["tokenizer.chat_template"].parts[-1].tobytes().decode(),
        "chat_renders": renders,
        "chat_render_ids": rendered_ids,
    })


# ---- (b) Qwen3 tokenizer.json -------------------------------------------------------------------
def qwen3():
    tk = Tokenizer.from_file(str(SHARED / "tokenizers/qwen3/tokenizer.json"))
    cases = []
    for text in TEXTS:
        ids = tk.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids})
    dump("qwen3_hf.json", {
        "tokenizer": "../shared/models/tokenizers/qwen3/tokenizer.json",
        "reference": "tokenizers.Tokenizer.from_file(...).encode(text, add_special_tokens=False)",
        "versions": VERSIONS,
        "notes": ["NFC normalizer: the decomposed-marks text encodes its composed form, so "
                  "decode(encode(x)) == NFC(x) for it"],
        "cases": cases,
    })


# ---- (c, d) SentencePiece llama2 and llama2.c tokenizer.bin -------------------------------------
def read_llama2c(path):
    data = pathlib.Path(path).read_bytes()
    off, pieces, scores = 4, [], []
    while off < len(data):
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        pieces.append(data[off:off + n])
        scores.append(score)
        off += n
    return pieces, scores


def runc_encode(pieces, scores, text, bos):
    """Line-by-line transliteration of llama2.c run.c encode() (master), for the reference."""
    lookup = {}
    for i, p in enumerate(pieces):
        lookup.setdefault(p, i)
    b = text.encode("utf-8")
    toks = [1] if bos else []
    if b:
        toks.append(lookup[b" "])
    buf = b""
    for i, c in enumerate(b):
        if (c & 0xC0) != 0x80:
            buf = b""
        buf += bytes([c])
        nxt = b[i + 1] if i + 1 < len(b) else 0
        if (nxt & 0xC0) == 0x80 and len(buf) < 4:
            continue
        if buf in lookup:
            toks.append(lookup[buf])
        else:
            toks.extend(x + 3 for x in buf)
        buf = b""
    while True:
        best_score, best_id, best_idx = -1e10, -1, -1
        for i in range(len(toks) - 1):
            j = lookup.get(pieces[toks[i]] + pieces[toks[i + 1]])
            if j is not None and scores[j] > best_score:
                best_score, best_id, best_idx = scores[j], j, i
        if best_idx == -1:
            break
        toks[best_idx:best_idx + 2] = [best_id]
    return toks


def llama2():
    sp = sentencepiece.SentencePieceProcessor(
        model_file=str(SHARED / "tokenizers/llama2_sp32k/tokenizer.model"))
    spm_cases = []
    for text in TEXTS:
        ids = sp.encode(text)
        assert sp.decode(ids) == text, text
        spm_cases.append({"text": text, "ids": ids})
    dump("llama2_spm.json", {
        "tokenizer": "GGUF (llama model) written by the test from "
                     "../shared/models/tokenizers/llama2_sp32k/tokenizer.bin",
        "reference": "sentencepiece.SentencePieceProcessor(tokenizer.model).encode(text) (no BOS)",
        "versions": VERSIONS,
        "notes": [],
        "cases": spm_cases,
    })

    pieces, scores = read_llama2c(SHARED / "tokenizers/llama2_sp32k/tokenizer.bin")
    agree, differ = [], []
    for case in spm_cases:
        runc = runc_encode(pieces, scores, case["text"], bos=False)
        if runc == case["ids"]:
            agree.append({"text": case["text"], "ids": runc})
        else:
            differ.append({"text": case["text"], "ids": runc, "sentencepiece_ids": case["ids"]})
    dump("llama2c_32k.json", {
        "tokenizer": "../shared/models/tokenizers/llama2_sp32k/tokenizer.bin",
        "reference": "cases: texts where sentencepiece(tokenizer.model).encode equals llama2.c's "
                     "run.c encode rule (bos=0), ids from sentencepiece. runc_only_cases: texts "
                     "where they differ; ids there come from this script's transliteration of "
                     "run.c encode (the C++ must follow run.c, not sentencepiece), "
                     "sentencepiece_ids recorded for comparison.",
        "versions": VERSIONS,
        "notes": [f"{len(agree)} of {len(spm_cases)} texts agree between sentencepiece and run.c"],
        "cases": agree,
        "runc_only_cases": differ,
    })

    pieces, scores = read_llama2c(SHARED / "stories260K/tok512.bin")
    prompts = ["", "Once upon a time", "Lily and Tom went to the park.", "Hello",
               "The cat sat on the mat. It was happy!", "Café 🍕"]
    dump("stories260k_tok512.json", {
        "tokenizer": "../shared/models/stories260K/tok512.bin",
        "reference": "this script's transliteration of llama2.c run.c encode(text, bos=1, eos=0) "
                     "(no sentencepiece model exists for tok512); 'Once upon a time' -> "
                     "[1, ' Once', ' upon', ' a', ' time'] checked by hand against the pieces",
        "versions": VERSIONS,
        "notes": [],
        "cases": [{"text": p, "ids": runc_encode(pieces, scores, p, bos=True)} for p in prompts],
    })


# ---- chat templates rendered by jinja2 as transformers does -------------------------------------
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
    "<|end_header_id|>\n\n' }}{% endif %}")
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""


def chat_templates():
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders

    def render(template, bos, messages):
        return env.from_string(template).render(messages=messages, bos_token=bos,
                                                add_generation_prompt=True)
    convs = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": "  Hi!\n"},
         {"role": "assistant", "content": "Hello. How can I help?"},
         {"role": "user", "content": "Name a color."}],
    ]
    dump("chat_templates.json", {
        "reference": "jinja2 renders (trim_blocks, lstrip_blocks; add_generation_prompt=True) of "
                     "the Meta-Llama-3-8B-Instruct and gemma-3-it templates (bos_token given)",
        "versions": VERSIONS,
        "llama3_template": LLAMA3_TEMPLATE,
        "gemma_template": GEMMA3_TEMPLATE,
        "llama3": [{"messages": c, "text": render(LLAMA3_TEMPLATE, "<|begin_of_text|>", c)}
                   for c in convs],
        "gemma": [{"messages": c, "text": render(GEMMA3_TEMPLATE, "<bos>", c)} for c in convs],
    })


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    smollm2()
    qwen3()
    llama2()
    chat_templates()
