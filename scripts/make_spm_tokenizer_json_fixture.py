#!/usr/bin/env python3
"""SentencePiece-style tokenizer.json (byte-fallback BPE) and tokenizers' ids for it, for
tests/model/test_tokenizer_spm_json.cc.

Trains a small BPE with tokenizers' BpeTrainer on a few English sentences, then lays the vocabulary
out as Llama-2's tokenizer.json does: <unk> <s> </s> at ids 0-2, the 256 byte tokens <0x00>..<0xFF>
at ids 3-258 (plain vocabulary entries, not added tokens), then the trained pieces; model BPE with
byte_fallback true, fuse_unk true, unk_token <unk>. Sections are those of HF's Llama-2 conversion:
normalizer Sequence[Prepend "▁", Replace " " -> "▁"], no pre-tokenizer, decoder Sequence[Replace
"▁" -> " ", ByteFallback, Fuse, Strip " " 1 0], post-processor TemplateProcessing "<s> $A".
Characters the corpus lacks (CJK, emoji, most accents) need byte fallback.

The golden records, for that file ("llama2") and for variants that swap the normalizer /
pre-tokenizer / decoder sections (Metaspace prepend_scheme first / always with split, Gemma's
Replace-only normalizer without Strip, Gemma 3's no-op Split " " MergedWithPrevious, a Split "▁"
MergedWithPrevious that splits), tokenizers' ids (add_special_tokens False and True) and
decode() with skip_special_tokens False and True, for each text; and decode() of a few id
sequences on their own (invalid UTF-8 byte runs, specials, runs of "▁").

Pinned versions: tokenizers 0.21.4 (/work/.venv-g3). Run:
  /work/.venv-g3/bin/python scripts/make_spm_tokenizer_json_fixture.py
Writes tests/fixtures/tokenizer/spm_bpe/tokenizer.json and tests/fixtures/tokenizer/spm_bpe.json.
Deterministic: rerunning reproduces both files byte for byte.
"""
import json
import pathlib

import tokenizers
from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "fixtures" / "tokenizer"
SP = "\u2581"

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello there! How are you today?",
    "In 1987 the town council approved a budget of 3450 for new bridges.",
    "Children played near the old mill while their parents talked about the harvest.",
    "She wrote the numbers 0 1 2 3 4 5 6 7 8 9 on the board, then the letters a to z.",
    "Prices rose in March, then fell in April; see Table 3 (page 12).",
    "def foo(x):\n    return x * 2\n",
    "Why won't it start? asked Maria, turning the key for the third time.",
]

TEXTS = [
    "",
    " ",
    "   ",
    "Hello world",
    " Hello",
    "Hello ",
    "  two  spaces  between  ",
    "\n",
    "line one\nline two\n\n",
    "\ttab\tseparated\t",
    "12345 67.89 3.14159 2024-01-01",
    "The quick brown fox jumps over the lazy dog.",
    "Café naïve résumé façade, Ångström, Straße.",
    "你好，世界！日本語のテキスト",
    "I love 🍕 and 🎉🎉!",
    "Family: 👨\u200d👩\u200d👧\u200d👦 flag 🇫🇷",
    "Ω≈ç√∫˜µ≤≥÷",
    "<s>Hello</s>",
    "Hello<s> world</s>",
    "<s> leading space after bos",
    "<unk>",
    "<0x41> is text, not a byte token",
    SP + "already" + SP + "escaped",
    "def foo(x):\n    return x * 2\n",
    "zero\u200bwidth and\u00a0nbsp",
    "Why won't it start? asked Maria.",
    "a",
    "   leading spaces",
    "trailing spaces   ",
    "mixed\r\nline endings\r",
]

# Id sequences decoded on their own (not from encode): invalid UTF-8 byte runs (ByteFallback gives
# one U+FFFD per byte), byte runs split by a piece, leading specials and runs of "▁" pieces.
def decode_cases(vocab):
    b = lambda x: vocab[f"<0x{x:02X}>"]
    sp = vocab[SP]
    return [
        [b(0xE2), b(0x96)],
        [b(0xFF)],
        [b(0xE2), b(0x96), b(0x81), sp, b(0xC3), vocab["a"], b(0xA9)],
        [sp, sp, vocab["a"], sp],
        [1, sp, vocab["a"], 2, sp, 0],
        [0, b(0x41), 1, b(0x42)],
        [b(0xF0), b(0x9F), b(0x8D), b(0x95), b(0x9F)],
    ]


LLAMA2 = {
    "normalizer": normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)]),
    "pre_tokenizer": None,
    "decoder": decoders.Sequence([decoders.Replace(SP, " "), decoders.ByteFallback(),
                                  decoders.Fuse(), decoders.Strip(" ", 1, 0)]),
}
VARIANTS = {
    "llama2": LLAMA2,
    "metaspace_first": {
        "normalizer": None,
        "pre_tokenizer": pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="first",
                                                  split=False),
        "decoder": decoders.Sequence([decoders.Replace(SP, " "), decoders.ByteFallback(),
                                      decoders.Fuse(), decoders.Strip(" ", 1, 0)]),
    },
    "metaspace_always_split": {
        "normalizer": None,
        "pre_tokenizer": pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="always",
                                                  split=True),
        "decoder": decoders.Metaspace(replacement=SP, prepend_scheme="always", split=True),
    },
    "gemma": {
        "normalizer": normalizers.Replace(" ", SP),
        "pre_tokenizer": None,
        "decoder": decoders.Sequence([decoders.Replace(SP, " "), decoders.ByteFallback(),
                                      decoders.Fuse()]),
    },
    # Gemma 3's own sections: a Split on " " after the normalizer has replaced every " " (a no-op,
    # so the same ids as "gemma").
    "gemma3": {
        "normalizer": normalizers.Replace(" ", SP),
        "pre_tokenizer": pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False),
        "decoder": decoders.Sequence([decoders.Replace(SP, " "), decoders.ByteFallback(),
                                      decoders.Fuse()]),
    },
    # A Split that does split: words end after each "▁".
    "split_after_space_piece": {
        "normalizer": normalizers.Replace(" ", SP),
        "pre_tokenizer": pre_tokenizers.Split(SP, behavior="merged_with_previous", invert=False),
        "decoder": decoders.Sequence([decoders.Replace(SP, " "), decoders.ByteFallback(),
                                      decoders.Fuse()]),
    },
}
SAME_IDS = {"gemma3": "gemma"}


def train():
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.normalizer = LLAMA2["normalizer"]
    trainer = trainers.BpeTrainer(vocab_size=330, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    trainer_tok.train_from_iterator(CORPUS, trainer=trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in
              trained["merges"]]
    return vocab, merges


def build(vocab, merges, sections):
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<unk>", "<s>", "</s>")])
    tok.normalizer = sections["normalizer"]
    tok.pre_tokenizer = sections["pre_tokenizer"]
    tok.decoder = sections["decoder"]
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    return tok


def main():
    vocab, merges = train()
    base = build(vocab, merges, LLAMA2)
    (OUT_DIR / "spm_bpe").mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / "spm_bpe" / "tokenizer.json"
    path.write_text(base.to_str(pretty=True) + "\n", encoding="utf-8")
    base_json = json.loads(path.read_text(encoding="utf-8"))
    golden = {"versions": {"tokenizers": tokenizers.__version__}, "vocab_size": len(vocab),
              "num_merges": len(merges), "variants": {}}
    for name, sections in VARIANTS.items():
        # Variants are the committed file with three sections replaced: the test does the same.
        variant_json = dict(base_json)
        built = json.loads(build(vocab, merges, sections).to_str())
        for key in ("normalizer", "pre_tokenizer", "decoder"):
            variant_json[key] = built[key]
        tok = Tokenizer.from_str(json.dumps(variant_json))
        cases, byte_fallbacks = [], 0
        for text in TEXTS:
            ids = tok.encode(text, add_special_tokens=False).ids
            with_bos = tok.encode(text, add_special_tokens=True).ids
            assert with_bos == ([1] + ids), (name, text)
            byte_fallbacks += sum(3 <= i <= 258 for i in ids)
            cases.append({"text": text, "ids": ids,
                          "decoded": tok.decode(ids, skip_special_tokens=False),
                          "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
        assert byte_fallbacks > 20, name
        golden["variants"][name] = {key: variant_json[key] for key in
                                    ("normalizer", "pre_tokenizer", "decoder")}
        golden["variants"][name]["cases"] = cases
        golden["variants"][name]["decode_cases"] = [
            {"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
             "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)}
            for ids in decode_cases(vocab)]
    # Distinct variants must tokenize differently somewhere, or the test could not tell them apart.
    seen = {}
    for name, v in golden["variants"].items():
        key = json.dumps([c["ids"] for c in v["cases"]] + [c["decoded"] for c in v["cases"]])
        if name in SAME_IDS:
            assert seen.get(key) == SAME_IDS[name], name
            continue
        assert key not in seen, (name, seen.get(key))
        seen[key] = name
    (OUT_DIR / "spm_bpe.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n",
                                          encoding="utf-8")
    print(f"vocab {len(vocab)}, merges {len(merges)}, {len(TEXTS)} texts, "
          f"{len(VARIANTS)} variants -> {path}")


if __name__ == "__main__":
    main()
