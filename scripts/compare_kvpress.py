#!/usr/bin/env python3
"""Runs one prompt through NVIDIA kvpress's presses and kvbench's policies and compares what each
keeps, per (layer, KV head), after the prompt's compression.

Peer check, not a test: kvpress (0.5.5, on transformers 4.57.1 and torch 2.9.1 in .venv-kvpress;
`bash scripts/ref_env.sh kvpress`) loads the same GGUF file as kvbench. For each pair and each
kvpress compression ratio r (the fraction removed), kvbench runs `kvbench generate
--max-new-tokens 1 --dump-keep-sets` with the budget kvpress keeps (max(1, int(n * (1 - r))),
kvpress's compute_n_kept), so its cache holds exactly the compressed prompt; kvpress runs the
model's prefill under the press, and the kept slots are identified by matching each retained key
row to the full cache's keys. Printed per pair and ratio: heads whose keep-sets are identical,
mean Jaccard overlap, and the worst head; differing heads go to stderr, with whether every
swapped token is an exact tie (layer 0: the same token id gives the same pre-RoPE key; kvbench
breaks ties towards the recent token, kvpress by float noise).

LeverageScorePress and CompactorPress draw a Gaussian sketch with torch.randn at every call;
kvbench draws its own from a counter (kernels/cpu/sketch.h). For their pairs the script hands
kvpress kvbench's sketch in place of torch.randn's (kvpress_common.kvbench_sketches), so the
comparison is of the method, not of two random draws. BlockPress and ChunkPress score subsets, so
their differing heads are reported without kvpress's per-slot scores. ThinKPress prunes key
channels, not tokens: its table compares the channels each side zeroes per (layer, KV head), alone
and after SnapKV (ComposedPress), at the same ratios as the channel fraction. KeyRerotationPress
over SnapKV compares the kept tokens and the greedy continuation on the re-rotated cache.
ComposedPress of two token presses (kvbench's `then:`) compares the final keep-sets of nine
pairs, the first press and the second at the same ratio; a second press whose score depends on
the survivors' order is compared with kvpress's first press re-ordered by position (kvbench's
order; kvpress's own is its first press's top-k order).
FinchPress takes the prompt's last 48 tokens as its question (a delimiter token before them, which
its embedding hook removes; kvbench: window_size=48): keep-sets without re-rotation, then the
greedy continuation with it. KVzipPress runs with kvbench's reconstruction prompt (no template).

Measured tables: kernels/policies/README.md "kvpress's presses".

  $(bash scripts/ref_env.sh kvpress) scripts/compare_kvpress.py --kvbench build/kvbench \
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf --ratios 0.25,0.5,0.75
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from transformers import DynamicCache

import kvpress

import kvpress_common
from kvpress_common import PAIRS, kvpress_version, layer_ratios, load_model


def layer_keys(cache, layer):
    """Layer `layer`'s keys [kv_heads, n, head_dim] of a transformers DynamicCache (4.56+: layers;
    earlier: key_cache)."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys[0]
    return cache.key_cache[layer][0]


def num_layers(cache):
    return len(cache.layers) if hasattr(cache, "layers") else len(cache.key_cache)



def prompt_text(shared):
    path = os.path.join(shared, "data", "wikitext-2", "test.txt")
    with open(path, encoding="utf-8") as f:
        return f.read()


def kvbench_keep_sets(args, policy, opts, budget, prompt_file, dump, new_tokens=1, ratio=None):
    """kvbench's keep-sets at `budget` tokens, or at kvpress's compression ratio `ratio` (the same
    token budget, with the ratio itself handed to the policy: pyramidkv's kvpress formula)."""
    flag = ["--compression-ratio", str(ratio)] if ratio is not None else ["--kv-budget", str(budget)]
    cmd = [args.kvbench, "generate", "--model", args.model, "--prompt-file", prompt_file,
           "--max-new-tokens", str(new_tokens), "--policy", policy, *flag,
           "--dump-keep-sets", dump]
    for o in opts:
        cmd += ["--policy-opt", o]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(dump) as f:
        return json.load(f)


def kept_indices(full_keys, kept_keys):
    """Indices of full_keys' rows equal (to 1e-4) to each row of kept_keys, per head."""
    out = []
    for h in range(full_keys.shape[0]):
        d = torch.cdist(kept_keys[h].double(), full_keys[h].double())
        idx = d.argmin(dim=1)
        assert (d.min(dim=1).values < 1e-3).all(), "a kept key matches no key of the full cache"
        out.append(sorted(idx.tolist()))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvbench", default="build/kvbench")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--shared", default="../shared")
    ap.add_argument("--ratios", default="0.25,0.5,0.75",
                    help="kvpress compression ratios (the fraction removed), comma-separated")
    ap.add_argument("--chars", type=int, default=4500, help="characters of WikiText-2 test")
    ap.add_argument("--only", default="", help="run the pairs whose name contains this")
    ap.add_argument("--decode-steps", type=int, default=24,
                    help="generated tokens fed back for the pairs that compress at decode")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = load_model(args.model)
    sdpa = None  # AdaKVPress refuses eager attention: its pairs run on an sdpa copy

    with tempfile.TemporaryDirectory() as tmp:
        # kvbench tokenizes the prompt (its tokenizer matches HF's on the fixtures); kvpress gets
        # exactly those ids, from kvbench's dump.
        prompt_file = os.path.join(tmp, "prompt.txt")
        with open(prompt_file, "w", encoding="utf-8") as f:
            f.write(prompt_text(args.shared)[: args.chars])
        ids = kvbench_keep_sets(args, "full", [], 1, prompt_file, os.path.join(tmp, "full.json"))[
            "prompt_ids"]
        n = len(ids)
        input_ids = torch.tensor([ids])
        with torch.no_grad():
            full = model(input_ids, past_key_values=DynamicCache(), use_cache=True).past_key_values
        ratios = [float(r) for r in args.ratios.split(",")]
        print(f"prompt {n} tokens; transformers {transformers.__version__}, torch "
              f"{torch.__version__}, kvpress {kvpress_version()}")
        print("| pair | ratio | budget | heads identical | differ at exact ties only | differ "
              "otherwise | mean Jaccard | worst head (layer, head, Jaccard) |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        kvpress_common.LAYERS["n"] = model.config.num_hidden_layers
        ratios_text = ",".join(str(r) for r in layer_ratios(model.config.num_hidden_layers))
        d = getattr(model.config, "head_dim", None) or (model.config.hidden_size //
                                                        model.config.num_attention_heads)
        qfilters = kvpress_common.write_qfilters(os.path.join(tmp, "qfilters.safetensors"),
                                                 model.config.num_hidden_layers,
                                                 model.config.num_key_value_heads, d)
        duo = kvpress_common.write_duo_patterns(os.path.join(tmp, "duo"),
                                                model.config.num_hidden_layers,
                                                model.config.num_key_value_heads)
        for name, make, policy, opts in [p for p in PAIRS if args.only in p[0]]:
            opts = [o.replace("{layer_ratios}", ratios_text).replace("{duo_patterns}", duo)
                    .replace("{qfilters}", qfilters) for o in opts]
            for ratio in ratios:
                budget = max(1, int(n * (1 - ratio)))  # kvpress's compute_n_kept
                kvpress_common.RUN["budget"] = budget
                decoding = any(o.startswith("decode_interval=") or o == "threshold_decode=true"
                               for o in opts)
                ours = kvbench_keep_sets(args, policy, opts, budget, prompt_file,
                                         os.path.join(tmp, "k.json"),
                                         args.decode_steps + 1 if decoding else 1,
                                         ratio if policy == "compactor" or any(
                                             o == "formula=kvpress" or o.startswith("chunk=")
                                             for o in opts) else None)
                if ours["prompt_ids"] != ids:
                    sys.exit(f"kvbench tokenized the prompt differently "
                             f"({len(ours['prompt_ids'])} ids)")
                press = make(ratio)
                # The scores that decide (a wrapper's own where it is a ScorerPress).
                # (BlockPress's and ChunkPress's scorer scores subsets: nothing to record per slot.)
                scores = {} if isinstance(press, (kvpress.BlockPress, kvpress.ChunkPress)) else record_scores(
                    press if hasattr(press, "score") else getattr(press, "press", press))
                masked = isinstance(press, (kvpress.AdaKVPress, kvpress.CriticalAdaKVPress,
                                            kvpress.DMSPress, kvpress.DuoAttentionPress))
                # ChunkKVPress, ChunkPress, BlockPress and DMSPress refuse attention weights
                # (eager returns them).
                need_sdpa = masked or isinstance(press, (kvpress.ChunkKVPress, kvpress.ChunkPress,
                                                         kvpress.BlockPress))
                if need_sdpa and sdpa is None:
                    sdpa = load_model(args.model, attn="sdpa")
                runner = sdpa if need_sdpa else model
                sketches = (kvpress_common.kvbench_sketches(model.config.num_hidden_layers)
                            if policy in ("leverage", "compactor") else contextlib.nullcontext())
                with torch.no_grad(), press(runner), sketches:
                    cache = runner(input_ids, past_key_values=DynamicCache(),
                                   use_cache=True).past_key_values
                    kept = masked_keep_sets(runner, n) if masked else None
                    if decoding:
                        kept = decode_keep_sets(runner, full, cache, n, ours["fed_ids"])
                        if masked:  # DMSPress(decoding=True) masks the rows leaving its window
                            kept = masked_keep_sets(runner, n + len(ours["fed_ids"]))
                compare(name, ratio, budget, ids + ours.get("fed_ids", []), full, cache, ours,
                        scores, kept)
        if args.only in "ThinK":
            compare_think(args, model, ids, full, ratios, prompt_file, tmp)
        if args.only in "KeyRerotation":
            compare_rerotate(args, model, ids, ratios, prompt_file, tmp)
        if args.only in "Finch":
            compare_finch(args, model, ids, full, ratios, prompt_file, tmp)
        if args.only in "KVzip":
            compare_kvzip(args, ids, full, ratios, prompt_file, tmp)
        compare_composed(args, model, ids, full, ratios, prompt_file, tmp)


# ComposedPress of two token presses (kvbench: the first policy with `then: second`): (first,
# second), each a kvbench policy whose PAIRS entry gives kvpress's press and kvbench's options.
# KeyDiff's score does not depend on the survivors' order; CUR's windows, LagKV's partitions and
# SnapKV's window do (see compare_composed).
COMPOSED = [("snapkv", "keydiff"), ("knorm", "keydiff"), ("expected_attention", "keydiff"),
            ("cur", "keydiff"), ("lagkv", "keydiff"), ("knorm", "cur"),
            ("expected_attention", "lagkv"), ("snapkv", "snapkv"), ("knorm", "snapkv")]
ORDER_FREE = {"keydiff", "qfilter"}


def survivors(press, reorder):
    """`press` (a ScorerPress, the first of a ComposedPress) recording, per layer, which prompt
    slot each survivor is (each kept row matched to the input row it was gathered from: exact
    copies) in press.kept[layer] ([kv_heads, kept]); with `reorder`, the survivors put back in
    position order. kvpress gathers them in torch.topk's order (its scores, highest first), which
    the second press reads as the sequence."""
    compress = press.compress
    press.kept = {}

    def wrapped(module, hidden_states, keys, values, attentions, kwargs):
        k, v = compress(module, hidden_states, keys, values, attentions, kwargs)
        idx = torch.cdist(k[0].double(), keys[0].double()).argmin(dim=-1)  # [kv_heads, kept]
        if reorder:
            order = idx.argsort(dim=-1)
            idx = idx.gather(-1, order)
            g = order[None, :, :, None].expand_as(k)
            k, v = k.gather(2, g).contiguous(), v.gather(2, g).contiguous()
        press.kept[module.layer_idx] = idx
        return k, v

    press.compress = wrapped
    return press


def compare_composed(args, model, ids, full, ratios, prompt_file, tmp):
    """ComposedPress([A(r), B(r)]) against kvbench's `A` with `then: B`, first_compression_ratio
    r: A keeps n1 = int(n(1 - r)) of the n prompt tokens, B keeps int(n1(1 - r)) of A's survivors
    (ScorerPress's n_kept over the compressed keys), kvbench's kv_budget. kvbench's B reads the
    survivors in position order; kvpress's in A's top-k order. Order-free B (KeyDiff) is compared
    with kvpress as it is; the others with A's survivors re-ordered by position in kvpress
    (survivors), labelled "(A in position order)". B's scores are recorded over the survivors and
    mapped to their prompt positions, so that exact ties in them are told apart."""
    n = len(ids)
    sdpa = None
    for first, second in COMPOSED:
        name_a, make_a, _, opts_a = kvpress_common.pair_of(first)
        name_b, make_b, _, opts_b = kvpress_common.pair_of(second)
        ordered = second not in ORDER_FREE
        name = f"ComposedPress([{name_a}, {name_b}])" + (
            " (A in position order)" if ordered else "")
        if args.only not in name:
            continue
        for ratio in ratios:
            kept_a = max(1, int(n * (1 - ratio)))
            budget = max(1, int(kept_a * (1 - ratio)))
            opts = opts_a + ["then=" + second, f"first_compression_ratio={ratio}"] + [
                "then." + o for o in opts_b]
            ours = kvbench_keep_sets(args, first, opts, budget, prompt_file,
                                     os.path.join(tmp, "k.json"))
            press_a = survivors(make_a(ratio), ordered)
            press_b = make_b(ratio)
            recorded = record_scores(press_b)
            press = kvpress.ComposedPress([press_a, press_b])
            # SnapKVPress reads eager attention's weights when the layer returns them, which
            # describe the whole prompt: as a second press it needs sdpa (its own window
            # attention over the compressed keys).
            runner = model
            if second == "snapkv":
                sdpa = sdpa or load_model(args.model, attn="sdpa")
                runner = sdpa
            with torch.no_grad(), press(runner):
                cache = runner(torch.tensor([ids]), past_key_values=DynamicCache(),
                               use_cache=True).past_key_values
            # B's scores by prompt position (NaN where A dropped the token), so that a differing
            # head is told apart as exact ties in B's own scores.
            scores = {}
            for layer, row in recorded.items():
                full_row = torch.full((row.shape[0], n), float("nan"), dtype=row.dtype)
                scores[layer] = full_row.scatter_(1, press_a.kept[layer], row)
            compare(name, ratio, budget, ids, full, cache, ours, scores)


def compare_kvzip(args, ids, full, ratios, prompt_file, tmp):
    """KVzipPress against kvbench's `kvzip`, per (layer, KV head) from the masks kvpress leaves
    (it refuses eager attention: an sdpa copy). kvpress reads the chat template's head and tail
    from the tokenizer; kvbench generate's one-text prompt has neither, so kvpress gets the
    tokenizer without its template (then its own choice: no head, tail "\\n"), as kvbench does.
    Whole-model allocation (kvpress's default), layerwise, and chunks of 512 (several passes)."""
    import kvpress.presses.kvzip_press as kvzip_module
    tok = kvpress_common.load_tokenizer(args.model)
    tok.chat_template = None

    class Tokenizers:
        @staticmethod
        def from_pretrained(*_args, **_kwargs):
            return tok

    original = kvzip_module.AutoTokenizer
    kvzip_module.AutoTokenizer = Tokenizers
    sdpa = load_model(args.model, attn="sdpa")
    n = len(ids)
    try:
        for name, kw, opts in [("KVzip", {}, []),
                               ("KVzip (layerwise)", {"layerwise": True}, ["layerwise=true"]),
                               ("KVzip (chunk_size 512)", {"chunk_size": 512},
                                ["chunk_size=512"])]:
            for ratio in ratios:
                budget = max(1, int(n * (1 - ratio)))
                ours = kvbench_keep_sets(args, "kvzip", opts, budget, prompt_file,
                                         os.path.join(tmp, "z.json"), ratio=ratio)
                press = kvpress.KVzipPress(compression_ratio=ratio, **kw)
                scores = {}
                post = press.compress_post

                def recorded(model, press=press, post=post, scores=scores):
                    for layer in range(press.score_val.shape[0]):
                        scores[layer] = press.score_val[layer][0].detach().double().cpu()
                    return post(model)

                press.compress_post = recorded
                with torch.no_grad(), press(sdpa):
                    sdpa(torch.tensor([ids]), past_key_values=DynamicCache(), use_cache=True)
                compare(name, ratio, budget, ids, full, full, ours, scores,
                        masked_keep_sets(sdpa, n))
    finally:
        kvzip_module.AutoTokenizer = original


def compare_finch(args, model, ids, full, ratios, prompt_file, tmp, window=48, steps=16):
    """FinchPress against kvbench's `finch`. kvpress finds its window by a delimiter token between
    the context and the question, which its embedding hook removes: the prompt's last `window`
    tokens are taken as the question (kvbench: window_size, as its runner gives a task's question
    length) and kvpress gets the ids with a delimiter before them (an id the prompt never uses, so
    the model sees the same tokens). Keep-sets with rerotate_keys=False (kvbench: positions=true),
    whole and by chunk_length 256, with and without normalize_scores; then the greedy continuation
    with both re-rotating (the default of both)."""
    n = len(ids)
    delim = next(t for t in range(model.config.vocab_size) if t not in set(ids))
    with_delim = torch.tensor([ids[: n - window] + [delim] + ids[n - window:]])
    variants = [("Finch (w=%d)" % window, {}, []),
                ("Finch (w=%d, chunk_length 256)" % window, {"chunk_length": 256},
                 ["chunk_length=256"]),
                ("Finch (w=%d, normalize_scores off)" % window, {"normalize_scores": False},
                 ["normalize_scores=false"])]
    for name, kw, opts in variants:
        for ratio in ratios:
            budget = max(1, int(n * (1 - ratio)))
            ours = kvbench_keep_sets(args, "finch", [f"window_size={window}", "positions=true"] +
                                     opts, budget, prompt_file, os.path.join(tmp, "f.json"),
                                     ratio=ratio if "chunk_length" in kw else None)
            press = kvpress.FinchPress(compression_ratio=ratio, rerotate_keys=False, **kw)
            press.delimiter_token_id = delim
            scores = record_scores(press)
            with torch.no_grad(), press(model):
                cache = model(with_delim, past_key_values=DynamicCache(),
                              use_cache=True).past_key_values
            compare(name, ratio, budget, ids, full, cache, ours, scores)
    print("\n| Finch pair (re-rotated) | ratio | greedy tokens equal |")
    print("|---|---:|---|")
    for ratio in ratios:
        budget = max(1, int(n * (1 - ratio)))
        moved = kvbench_keep_sets(args, "finch", [f"window_size={window}"], budget, prompt_file,
                                  os.path.join(tmp, "f1.json"), new_tokens=steps)
        press = kvpress.FinchPress(compression_ratio=ratio)
        press.delimiter_token_id = delim
        with torch.no_grad(), press(model):
            out = model(with_delim, past_key_values=DynamicCache(), use_cache=True)
        verdict = greedy_verdict(model, out, moved["fed_ids"], steps)
        print(f"| Finch (w={window}) | {ratio} | {verdict} |", flush=True)


def greedy_verdict(model, out, ours, steps):
    """kvpress's `steps` greedy tokens after a re-rotated prompt's output `out`, decoding at
    positions from cache.get_seq_length() on (its pipeline's context_length after re-rotation),
    against kvbench's `ours`: "k/k", or where they first differ."""
    cache = out.past_key_values
    start = cache.get_seq_length()
    tok = int(out.logits[0, -1].argmax())
    theirs = [tok]
    with torch.no_grad():
        for t in range(steps - 1):
            o = model(torch.tensor([[tok]]), past_key_values=cache, use_cache=True,
                      position_ids=torch.tensor([[start + t]]))
            cache = o.past_key_values
            tok = int(o.logits[0, -1].argmax())
            theirs.append(tok)
    k = len(ours)
    first = next((i for i in range(k) if ours[i] != theirs[i]), None)
    return f"{k}/{k}" if first is None else f"first {first} of {k} (then differ)"


def hf_channel(args, model):
    """kvbench's key row index -> the Hugging Face channel it holds: a llama GGUF's K rows rotate
    adjacent pairs (converted from HF's halves), so row j is channel j / 2 (even j) or
    head_dim / 2 + j // 2 (odd j); other files keep HF's order."""
    d = model.config.head_dim if getattr(model.config, "head_dim", None) else (
        model.config.hidden_size // model.config.num_attention_heads)
    if args.model.endswith(".gguf") and model.config.model_type == "llama":
        return lambda j: j // 2 if j % 2 == 0 else d // 2 + j // 2
    return lambda j: j


def compare_think(args, model, ids, full, ratios, prompt_file, tmp):
    """ThinKPress alone (kvbench `think`) and after SnapKV (ComposedPress([SnapKVPress(r),
    ThinKPress(r)]); kvbench `snapkv` with `think: r`): per (layer, KV head) the key channels
    each zeroes (kvpress: zero in every kept row; kvbench: its dump's key_channels, mapped to
    HF's channel order), and after SnapKV the kept tokens too (rows matched on the channels
    neither side zeroed)."""
    to_hf = hf_channel(args, model)
    n = len(ids)
    print("\n| ThinK pair | ratio | heads with identical channels | kept tokens identical "
          "| worst head (layer, head, channels in common) |")
    print("|---|---:|---:|---:|---|")
    for label, composed in (("ThinK (window 32)", False),
                            ("ComposedPress([SnapKV (w=64, avg pool 5), ThinK])", True)):
        for ratio in ratios:
            budget = max(1, int(n * (1 - ratio)))
            if composed:
                press = kvpress.ComposedPress([
                    kvpress.SnapKVPress(compression_ratio=ratio, window_size=64, kernel_size=5),
                    kvpress.ThinKPress(key_channel_compression_ratio=ratio)])
                ours = kvbench_keep_sets(args, "snapkv", ["window=64", "pool_kernel=5",
                                                          "pooling=avg", f"think={ratio}"],
                                         budget, prompt_file, os.path.join(tmp, "t.json"))
            else:
                press = kvpress.ThinKPress(key_channel_compression_ratio=ratio)
                ours = kvbench_keep_sets(args, "think", [f"key_channel_compression_ratio={ratio}"],
                                         0, prompt_file, os.path.join(tmp, "t.json"))
            with torch.no_grad(), press(model):
                cache = model(torch.tensor([ids]), past_key_values=DynamicCache(),
                              use_cache=True).past_key_values
            same = tokens_same = total = 0
            worst = (2.0, -1, -1)
            for layer in range(num_layers(cache)):
                keys = layer_keys(cache, layer)  # [heads, kept, d]
                ref = layer_keys(full, layer)
                for h in range(keys.shape[0]):
                    theirs = {int(c) for c in torch.nonzero(
                        (keys[h] == 0).all(dim=0)).flatten()}
                    mine = {to_hf(c) for c in ours["key_channels"][layer][h]}
                    total += 1
                    same += theirs == mine
                    j = len(theirs & mine) / max(1, len(theirs | mine))
                    worst = min(worst, (j, layer, h))
                    if theirs != mine:
                        print(f"  {label} @ {ratio}: layer {layer} head {h}: kvbench "
                              f"{sorted(mine - theirs)[:6]}, kvpress {sorted(theirs - mine)[:6]}",
                              file=sys.stderr)
                    # Tokens: each kept row matched to the full cache on the channels kept by both.
                    live = [c for c in range(keys.shape[2]) if c not in theirs | mine]
                    kept = []
                    for row in keys[h][:, live]:
                        err = (ref[h][:, live] - row).abs().max(dim=1).values
                        kept.append(int(torch.argmin(err)) if float(err.min()) < 1e-3 else -1)
                    tokens_same += set(kept) == set(ours["positions"][layer][h])
            print(f"| {label} | {ratio} | {same}/{total} | {tokens_same}/{total} | "
                  f"({worst[1]}, {worst[2]}, {worst[0]:.4f}) |", flush=True)


def compare_rerotate(args, model, ids, ratios, prompt_file, tmp, steps=16):
    """KeyRerotationPress(SnapKVPress(r)) against kvbench's `snapkv` with `positions: rerotate`:
    the kept tokens per (layer, KV head) (kvpress's, recorded as the press re-rotates them;
    kvbench's, from the same policy without rerotate: re-rotation moves keys, not the decision),
    and `steps` greedy tokens after the prompt, kvpress continuing at the compressed length as its
    pipeline does (context_length = cache.get_seq_length()) and kvbench at its longest head's."""
    n = len(ids)
    print("\n| KeyRerotation pair | ratio | kept tokens identical | greedy tokens equal |")
    print("|---|---:|---:|---|")
    snap = ["window=64", "pool_kernel=5", "pooling=avg"]
    for ratio in ratios:
        budget = max(1, int(n * (1 - ratio)))
        plain = kvbench_keep_sets(args, "snapkv", snap, budget, prompt_file,
                                  os.path.join(tmp, "r0.json"))
        moved = kvbench_keep_sets(args, "snapkv", snap + ["positions=rerotate"], budget,
                                  prompt_file, os.path.join(tmp, "r1.json"), new_tokens=steps)
        press = kvpress.KeyRerotationPress(
            kvpress.SnapKVPress(compression_ratio=ratio, window_size=64, kernel_size=5))
        recorded = []
        original = kvpress.KeyRerotationPress.rerotate_keys

        def recording(module, indices, keys):
            recorded.append(indices[0].tolist())
            return original(module, indices, keys)

        kvpress.KeyRerotationPress.rerotate_keys = staticmethod(recording)
        try:
            with torch.no_grad(), press(model):
                out = model(torch.tensor([ids]), past_key_values=DynamicCache(), use_cache=True)
        finally:
            kvpress.KeyRerotationPress.rerotate_keys = staticmethod(original)
        same = total = 0
        for layer, heads in enumerate(recorded):
            for h, kept in enumerate(heads):
                total += 1
                same += set(kept) == set(plain["positions"][layer][h])
        # Greedy decoding on the compressed cache at positions n_kept, n_kept + 1, ...
        verdict = greedy_verdict(model, out, moved["fed_ids"], steps)
        print(f"| KeyRerotation over SnapKV (w=64, avg pool 5) | {ratio} | {same}/{total} | "
              f"{verdict} |", flush=True)


def match_rows(ref, keys):
    """Per head, the row of ref ([heads, m, d]) equal (to 1e-3) to each row of keys ([heads, k,
    d]), or -1 for a row that matches none."""
    out = []
    for h in range(keys.shape[0]):
        if ref.shape[1] == 0:
            out.append([-1] * keys.shape[1])
            continue
        d = torch.cdist(keys[h].double(), ref[h].double())
        best = d.min(dim=1)
        out.append([int(i) if v < 1e-3 else -1 for v, i in zip(best.values.tolist(),
                                                                best.indices.tolist())])
    return out


def decode_keep_sets(model, full, cache, n, fed):
    """Feeds `fed` one token at a time at positions n, n+1, ... (kvpress's pipeline passes the
    positions: a compressed cache is shorter than the sequence) and follows each cache row's
    position: the prompt's rows by their keys in the uncompressed prefill, an appended row by its
    step, and after a decode compression (kvpress reorders the rows by score) each row by its key
    among the rows before, the one row that matches none being the new token's. Returns the
    positions per (layer, KV head)."""
    layers = num_layers(cache)
    pos = []
    for layer in range(layers):
        rows = match_rows(layer_keys(full, layer), layer_keys(cache, layer))
        assert all(r >= 0 for head in rows for r in head), "a prompt row matches no key"
        pos.append(rows)
    for i, tok in enumerate(fed):
        before = [layer_keys(cache, layer).clone() for layer in range(layers)]
        model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True,
              position_ids=torch.tensor([[n + i]]))
        for layer in range(layers):
            keys = layer_keys(cache, layer)
            if keys.shape[1] == before[layer].shape[1] + 1:  # appended, not compressed
                for head in pos[layer]:
                    head.append(n + i)
                continue
            rows = match_rows(before[layer], keys)
            for h, head_rows in enumerate(rows):
                assert head_rows.count(-1) <= 1, "two rows after a compression match none"
                pos[layer][h] = [n + i if r < 0 else pos[layer][h][r] for r in head_rows]
    return [[sorted(head) for head in layer] for layer in pos]


def masked_keep_sets(model, n):
    """AdaKVPress (and DMSPress) keeps every row and masks the pruned ones: per layer and KV head, the slots not
    in the attention module's masked_key_indices (set by the prefill's compression)."""
    kept = []
    for layer in model.model.layers:
        attn = layer.self_attn
        pruned = {}
        if attn.masked_key_indices is None:  # DMSPress: nothing below the threshold
            kept.append([list(range(n))] * model.config.num_key_value_heads)
            continue
        _, heads, seqs = attn.masked_key_indices
        for h, s in zip(heads.tolist(), seqs.tolist()):
            pruned.setdefault(h, set()).add(s)
        kv = model.config.num_key_value_heads
        kept.append([sorted(set(range(n)) - pruned.get(h, set())) for h in range(kv)])
    return kept


def record_scores(press):
    """Per layer, the scores a ScorerPress computed ([kv_heads, n], float64), so that a differing
    head can be told apart as an exact tie in kvpress's own scores."""
    scores = {}
    if hasattr(press, "score"):
        score = press.score

        def recorded(module, *args, **kwargs):
            out = score(module, *args, **kwargs)
            scores[module.layer_idx] = out[0].detach().double().cpu()
            return out

        press.score = recorded
    return scores


def compare(name, ratio, budget, ids, full, cache, ours, scores, kept=None):
    same, total, jac_sum, worst = 0, 0, 0.0, (2.0, -1, -1)
    ties, other = 0, 0
    differing = []
    for layer in range(num_layers(cache)):
        theirs = kept[layer] if kept else kept_indices(layer_keys(full, layer),
                                                       layer_keys(cache, layer))
        for h, t in enumerate(theirs):
            o = set(ours["positions"][layer][h])
            t = set(t)
            jac = len(o & t) / max(1, len(o | t))
            same += o == t
            total += 1
            jac_sum += jac
            worst = min(worst, (jac, layer, h))
            if o != t:
                # Same token at layer 0 means the same pre-RoPE key: an exact tie that kvbench
                # breaks towards the recent token and kvpress by float noise.
                only_o = sorted(o - t)
                only_t = sorted(t - o)
                tied = layer == 0 and sorted(ids[p] for p in only_o) == sorted(
                    ids[p] for p in only_t)
                why = ", all same-token ties" if tied else ""
                if o < t and len(t) > budget:  # ChunkKVPress's whole chunks past the budget
                    why += f", kvbench's a subset: kvpress keeps {len(t)} > the budget {budget}"
                exact = tied
                if layer in scores:
                    row = scores[layer][h]
                    swapped = {float(row[p]) for p in only_o + only_t}
                    if len(swapped) == 1:
                        why += ", all exact ties in kvpress's scores"
                        exact = True
                    else:
                        gap = max(swapped) - min(swapped)
                        why += f", kvpress's scores of the swapped tokens within {gap:.3g}"
                ties += exact
                other += not exact
                differing.append((exact, f"layer {layer} head {h}: {len(only_o)} swapped (kvbench "
                                  f"{only_o[:4]}, kvpress {only_t[:4]}){why}"))
    print(f"| {name} | {ratio} | {budget} | {same}/{total} | {ties} | {other} | "
          f"{jac_sum / total:.4f} | ({worst[1]}, {worst[2]}, {worst[0]:.4f}) |", flush=True)
    # Every head that differs otherwise, and the first few tied ones.
    shown = [d for exact, d in differing if not exact] + [d for exact, d in differing if exact][:3]
    for d in shown:
        print(f"  {name} @ {ratio}: {d}", file=sys.stderr)

if __name__ == "__main__":
    main()
