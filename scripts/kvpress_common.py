"""What scripts/compare_kvpress.py (keep-sets) and scripts/compare_kvpress_sweep.py (the
quickstart's study end to end) share: the press/policy pairs, loading the model into transformers
as kvbench loads it, and kvpress's version. Imported, not run."""
import os
from importlib.metadata import version

import torch
import transformers

import kvpress

# The model's layer count, set by compare_kvpress.py before it builds a press (the per-layer
# ratios below need it).
LAYERS = {"n": 0}
# The run's budget (kvpress's kept count), set by compare_kvpress.py before it builds a press:
# DecodingPress's target_size.
RUN = {"budget": 0}
DECODE_INTERVAL = 8  # DecodingPress's compression_interval in the comparison


DUO = {"sink": 16, "recent": 64}  # the made-up DuoAttention patterns' sizes


def write_duo_patterns(folder, n_layers, kv_heads):
    """A DuoAttention pattern folder in the authors' format (full_attention_heads.tsv, one row per
    layer and a column per KV head; config.json) with scores drawn from a seeded generator, and
    kvpress's DuoAttentionPress pointed at the same scores (it would download the authors' files
    for the models they published; kvbench reads a folder and never downloads). Returns the
    folder."""
    import json
    import numpy as np
    rng = np.random.default_rng(0)
    scores = rng.random((n_layers, kv_heads))
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "full_attention_heads.tsv"), "w") as f:
        for row in scores:
            f.write("\t".join(repr(float(x)) for x in row) + "\n")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"sink_size": DUO["sink"], "recent_size": DUO["recent"]}, f)
    loaded = np.loadtxt(os.path.join(folder, "full_attention_heads.tsv"), dtype=float,
                        delimiter="\t").reshape(n_layers, kv_heads)
    kvpress.presses.duo_attention_press.DuoAttentionPress.load_attention_pattern = staticmethod(
        lambda model: (DUO["sink"], DUO["recent"], np.clip(loaded, 0, 1)))
    return folder


def write_qfilters(path, n_layers, kv_heads, head_dim):
    """A Q-Filters file in the authors' format (model.safetensors, tensor q_filters [layers, KV
    heads, head_dim], Hugging Face's channel order) of filters drawn from a seeded generator, and
    kvpress's QFilterPress pointed at the same filters (it would download the authors' files from
    the Hub; kvbench reads a file and never downloads). Returns the path."""
    from safetensors.torch import save_file
    gen = torch.Generator().manual_seed(7)
    filters = torch.randn(n_layers, kv_heads, head_dim, generator=gen, dtype=torch.float32)
    save_file({"q_filters": filters.contiguous()}, path)
    kvpress.QFilterPress.load_q_filters = staticmethod(lambda model_name: filters.clone())
    return path


# kernels/cpu/sketch.h's Gaussian sketch, drawn in Python: kvbench's `leverage` draws its sketch
# from a counter (the unit's seed, layer and KV head), kvpress's LeverageScorePress from
# torch.randn. kvbench_sketches() hands kvpress kvbench's values in place of torch.randn's, so
# that the keep-sets compare the method, not two random draws.
SKETCH_STEP = 0x736B65746368
MASK64 = (1 << 64) - 1


def mix64(x):
    """subgen_counter.h's mix64 (splitmix64's finalizer)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def counter_uniform(seed, layer, head, step, slot):
    """subgen_counter.h's counter_uniform: a double in [0, 1) from the counter."""
    h = mix64(seed)
    h = mix64(h ^ ((layer << 32) | head))
    h = mix64(h ^ step)
    h = mix64(h ^ slot)
    return float(h >> 11) * 2.0 ** -53


_SKETCHES = {}


def gaussian_sketch(seed, layer, head, rows, cols):
    """sketch.h's gaussian_sketch (Box-Muller with the C library's log, cos and sqrt: Python's
    math module calls them), as doubles; the caller rounds to float32."""
    key = (seed, layer, head, rows, cols)
    if key not in _SKETCHES:
        import math
        out = []
        for e in range(rows * cols):
            u = counter_uniform(seed, layer, head, SKETCH_STEP, 2 * e)
            v = counter_uniform(seed, layer, head, SKETCH_STEP, 2 * e + 1)
            out.append(math.sqrt(-2.0 * math.log(1.0 - u)) * math.cos(2.0 * math.pi * v))
        _SKETCHES[key] = out
    return _SKETCHES[key]


class kvbench_sketches:
    """While active, torch.randn of a [1, heads, d, k] shape (LeverageScorePress's sketch; one call
    per layer, in layer order) returns kvbench's sketches for seed 0 (`kvbench generate`'s
    default) and the next layer; other shapes go to torch.randn."""

    def __init__(self, num_layers, seed=0):
        self.num_layers, self.seed, self.calls = num_layers, seed, 0

    def __enter__(self):
        self.real = torch.randn

        def randn(*size, **kw):
            shape = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else size
            if len(shape) != 4 or shape[0] != 1:
                return self.real(*size, **kw)
            _, heads, d, k = shape
            layer = self.calls % self.num_layers
            self.calls += 1
            vals = [gaussian_sketch(self.seed, layer, h, d, k) for h in range(heads)]
            t = torch.tensor(vals, dtype=torch.float32).view(1, heads, d, k)
            return t.to(dtype=kw.get("dtype") or torch.float32, device=kw.get("device"))

        torch.randn = randn
        return self

    def __exit__(self, *exc):
        torch.randn = self.real
        return False


def layer_ratios(n_layers):
    """PerLayerCompressionPress's ratios in the comparison: 0.25, 0.5, 0.75 by layer, in turn."""
    return [(0.25, 0.5, 0.75)[layer % 3] for layer in range(n_layers)]


def prefill_decoding(scorer, ratio):
    """kvpress's PrefillDecodingPress: `scorer` compresses the prompt at `ratio`, then DecodingPress
    with another `scorer` every DECODE_INTERVAL steps back to the run's budget."""
    return kvpress.PrefillDecodingPress(
        prefilling_press=scorer(compression_ratio=ratio),
        decoding_press=kvpress.DecodingPress(scorer(), compression_interval=DECODE_INTERVAL,
                                             target_size=RUN["budget"]))


# (name, kvpress press factory(ratio), kvbench policy, kvbench policy options): kvbench's options
# set to kvpress's defaults, so that both keep the same tokens per (layer, KV head). An option
# value "{layer_ratios}" is replaced by layer_ratios(the model's layer count), comma-separated.
PAIRS = [
    ("SnapKV (w=64, avg pool 5)",
     lambda r: kvpress.SnapKVPress(compression_ratio=r, window_size=64, kernel_size=5),
     "snapkv", ["window=64", "pool_kernel=5", "pooling=avg"]),
    # PyramidKVPress's own per-layer budgets (kvbench: `formula: kvpress`, run at the compression
    # ratio itself). With beta 20 its smallest layer would hold less than the window here, so
    # kvpress keeps round(n x (1 - r)) in every layer; beta 2 makes the pyramid.
    ("PyramidKV (kvpress formula, w=64, avg pool 5, beta 20)",
     lambda r: kvpress.PyramidKVPress(compression_ratio=r, window_size=64, kernel_size=5),
     "pyramidkv", ["window=64", "pool_kernel=5", "pooling=avg", "formula=kvpress"]),
    ("PyramidKV (kvpress formula, w=64, avg pool 5, beta 2)",
     lambda r: kvpress.PyramidKVPress(compression_ratio=r, window_size=64, kernel_size=5, beta=2),
     "pyramidkv", ["window=64", "pool_kernel=5", "pooling=avg", "formula=kvpress", "beta=2"]),
    ("StreamingLLM (4 sinks)",
     lambda r: kvpress.StreamingLLMPress(compression_ratio=r, n_sink=4),
     "streaming_llm", ["sinks=4"]),
    ("Knorm", lambda r: kvpress.KnormPress(compression_ratio=r), "knorm", []),
    ("TOVA (layer mean, keep_last)", lambda r: kvpress.TOVAPress(compression_ratio=r), "tova",
     ["tova_reduce=layer", "keep_last=true"]),
    ("KeyDiff", lambda r: kvpress.KeyDiffPress(compression_ratio=r), "keydiff", []),
    ("ObservedAttention", lambda r: kvpress.ObservedAttentionPress(compression_ratio=r),
     "observed_attention", []),
    ("CUR (kv_product, window 16, 4 sinks)", lambda r: kvpress.CURPress(compression_ratio=r),
     "cur", []),
    ("LagKV (lag 128, 4 sinks)", lambda r: kvpress.LagKVPress(compression_ratio=r), "lagkv", []),
    ("ExpectedAttention (512 future positions, 4 sinks, covariance, value norms)",
     lambda r: kvpress.ExpectedAttentionPress(compression_ratio=r), "expected_attention", []),
    ("ExpectedAttention (mean only, no value norms)",
     lambda r: kvpress.ExpectedAttentionPress(compression_ratio=r, use_covariance=False,
                                              use_vnorm=False),
     "expected_attention", ["use_covariance=false", "use_vnorm=false"]),
    # NonCausalAttnPress (Compactor's attention half): a WikiText prompt of ~1K tokens ends in a
    # short chunk, so kvpress's padding of the last chunk is compared too.
    ("NonCausalAttn (chunks of 256)",
     lambda r: kvpress.NonCausalAttnPress(compression_ratio=r), "noncausal_attn", []),
    ("NonCausalAttn (chunks of 100)",
     lambda r: kvpress.NonCausalAttnPress(compression_ratio=r, chunk_size=100), "noncausal_attn",
     ["chunk_size=100"]),
    # LeverageScorePress with kvbench's sketch in place of torch.randn's (kvbench_sketches).
    ("LeverageScore (sketch 48, kvbench's sketch)",
     lambda r: kvpress.LeverageScorePress(compression_ratio=r), "leverage", []),
    ("LeverageScore (sketch 16, kvbench's sketch)",
     lambda r: kvpress.LeverageScorePress(compression_ratio=r, sketch_dimension=16), "leverage",
     ["sketch_dimension=16"]),
    # CompactorPress: both halves over the prompt less 8 + 4 protected tokens, blended by the
    # compression ratio (kvbench runs at the ratio itself); kvbench's sketch again.
    ("Compactor (sinks 8 + 4, chunks of 256, sketch 48, blending = ratio)",
     lambda r: kvpress.CompactorPress(compression_ratio=r), "compactor", []),
    ("Compactor (blending 0.35, chunks of 100, sketch 16)",
     lambda r: kvpress.CompactorPress(compression_ratio=r, blending=0.35, chunk_size=100,
                                      sketch_dimension=16), "compactor",
     ["blending=0.35", "chunk_size=100", "sketch_dimension=16"]),
    # BlockPress over a scorer whose score reads the cache alone (kvbench: `block: N`).
    ("BlockPress over KeyDiff (blocks of 128)",
     lambda r: kvpress.BlockPress(kvpress.KeyDiffPress(compression_ratio=r), block_size=128),
     "keydiff", ["block=128"]),
    ("BlockPress over CUR (blocks of 100)",
     lambda r: kvpress.BlockPress(kvpress.CURPress(compression_ratio=r), block_size=100),
     "cur", ["block=100"]),
    ("BlockPress over LagKV (blocks of 128)",
     lambda r: kvpress.BlockPress(kvpress.LagKVPress(compression_ratio=r), block_size=128),
     "lagkv", ["block=128"]),
    # SimLayerKVPress decides per layer by a threshold, not by the ratio (the same at every ratio).
    ("SimLayerKV (threshold 0.5, 4 initial, 256 recent, 1 last)",
     lambda r: kvpress.SimLayerKVPress(lazy_threshold=0.5, n_recent=256), "simlayerkv",
     ["lazy_threshold=0.5", "n_recent=256"]),
    ("SimLayerKV (threshold 0.8, 4 initial, 128 recent, 2 last)",
     lambda r: kvpress.SimLayerKVPress(lazy_threshold=0.8, n_recent=128, n_last=2),
     "simlayerkv", ["lazy_threshold=0.8", "n_recent=128", "n_last=2"]),
    # AdaKVPress over a scorer (kvbench: the scorer's `ada: true`). kvpress masks the pruned slots
    # in attention (sdpa only) instead of evicting them; compare_kvpress.py reads the mask.
    ("AdaKV over ExpectedAttention (alpha_safeguard 0.2)",
     lambda r: kvpress.AdaKVPress(kvpress.ExpectedAttentionPress(compression_ratio=r)),
     "expected_attention", ["ada=true"]),
    ("AdaKV over NonCausalAttn (alpha_safeguard 0.2)",
     lambda r: kvpress.AdaKVPress(kvpress.NonCausalAttnPress(compression_ratio=r)),
     "noncausal_attn", ["ada=true"]),
    ("AdaKV over LeverageScore (alpha_safeguard 0.2, kvbench's sketch)",
     lambda r: kvpress.AdaKVPress(kvpress.LeverageScorePress(compression_ratio=r)), "leverage",
     ["ada=true"]),
    ("AdaKV over KeyDiff (alpha_safeguard 0.2)",
     lambda r: kvpress.AdaKVPress(kvpress.KeyDiffPress(compression_ratio=r)), "keydiff",
     ["ada=true"]),
    ("AdaKV over CUR (alpha_safeguard 0.2)",
     lambda r: kvpress.AdaKVPress(kvpress.CURPress(compression_ratio=r)), "cur", ["ada=true"]),
    ("AdaKV over LagKV (alpha_safeguard 0.5)",
     lambda r: kvpress.AdaKVPress(kvpress.LagKVPress(compression_ratio=r), alpha_safeguard=0.5),
     "lagkv", ["ada=true", "alpha_safeguard=0.5"]),
    # CriticalKVPress (kvbench: `critical: true`) and CriticalAdaKVPress (`critical` and `ada`).
    ("CriticalKV over ExpectedAttention (no value norms)",
     lambda r: kvpress.CriticalKVPress(
         kvpress.ExpectedAttentionPress(compression_ratio=r, use_vnorm=False)),
     "expected_attention", ["critical=true", "use_vnorm=false"]),
    ("CriticalKV over KeyDiff",
     lambda r: kvpress.CriticalKVPress(kvpress.KeyDiffPress(compression_ratio=r)), "keydiff",
     ["critical=true"]),
    ("CriticalAdaKV over ExpectedAttention (no value norms)",
     lambda r: kvpress.CriticalAdaKVPress(
         kvpress.ExpectedAttentionPress(compression_ratio=r, use_vnorm=False)),
     "expected_attention", ["critical=true", "ada=true", "use_vnorm=false"]),
    ("CriticalAdaKV over CUR",
     lambda r: kvpress.CriticalAdaKVPress(kvpress.CURPress(compression_ratio=r)), "cur",
     ["critical=true", "ada=true"]),
    # PrefillDecodingPress: the scorer on the prompt, then DecodingPress every DECODE_INTERVAL
    # steps back to the run's budget (kvbench: `decode_interval`). compare_kvpress.py feeds both
    # the tokens kvbench generated (--decode-steps of them).
    ("PrefillDecoding with KeyDiff (every 8 steps back to the budget)",
     lambda r: prefill_decoding(kvpress.KeyDiffPress, r), "keydiff",
     [f"decode_interval={DECODE_INTERVAL}"]),
    ("PrefillDecoding with CUR (every 8 steps back to the budget)",
     lambda r: prefill_decoding(kvpress.CURPress, r), "cur",
     [f"decode_interval={DECODE_INTERVAL}"]),
    # ChunkKVPress over a scorer (kvbench: the scorer's `chunkkv: N`): whole chunks of 20 tokens,
    # the same in every head.
    ("ChunkKV over SnapKV (chunks of 20; w=64, avg pool 5)",
     lambda r: kvpress.ChunkKVPress(kvpress.SnapKVPress(compression_ratio=r, window_size=64,
                                                        kernel_size=5), chunk_length=20),
     "snapkv", ["chunkkv=20", "window=64", "pool_kernel=5", "pooling=avg"]),
    ("ChunkKV over KeyDiff (chunks of 20)",
     lambda r: kvpress.ChunkKVPress(kvpress.KeyDiffPress(compression_ratio=r), chunk_length=20),
     "keydiff", ["chunkkv=20"]),
    ("ChunkKV over ExpectedAttention (chunks of 20)",
     lambda r: kvpress.ChunkKVPress(kvpress.ExpectedAttentionPress(compression_ratio=r),
                                    chunk_length=20),
     "expected_attention", ["chunkkv=20"]),
    ("ChunkKV over CUR (chunks of 7)",
     lambda r: kvpress.ChunkKVPress(kvpress.CURPress(compression_ratio=r), chunk_length=7),
     "cur", ["chunkkv=7"]),
    # ChunkPress over KeyDiff (kvbench: keydiff's `chunk: N`, run at the compression ratio
    # itself: each chunk keeps int(len x (1 - r))).
    ("ChunkPress over KeyDiff (chunks of 256)",
     lambda r: kvpress.ChunkPress(kvpress.KeyDiffPress(compression_ratio=r), chunk_length=256),
     "keydiff", ["chunk=256"]),
    ("ChunkPress over KeyDiff (chunks of 1024, kvpress's default)",
     lambda r: kvpress.ChunkPress(kvpress.KeyDiffPress(compression_ratio=r)), "keydiff",
     ["chunk=1024"]),
    ("ChunkPress over CUR (chunks of 256: each its own 4 sinks and windows)",
     lambda r: kvpress.ChunkPress(kvpress.CURPress(compression_ratio=r), chunk_length=256),
     "cur", ["chunk=256"]),
    ("ChunkPress over LagKV (chunks of 512: each its own sinks and partitions)",
     lambda r: kvpress.ChunkPress(kvpress.LagKVPress(compression_ratio=r), chunk_length=512),
     "lagkv", ["chunk=512"]),
    ("ChunkPress over ExpectedAttention (chunks of 512: each its own queries and sinks)",
     lambda r: kvpress.ChunkPress(kvpress.ExpectedAttentionPress(compression_ratio=r),
                                  chunk_length=512),
     "expected_attention", ["chunk=512"]),
    # DMSPress over a scorer, its dense prefill (kvbench: the scorer's `threshold: t`): the
    # threshold decides, not the ratio (the same at every ratio). kvpress masks the slots.
    ("DMS over KeyDiff (threshold -0.5, window 128)",
     lambda r: kvpress.DMSPress(kvpress.KeyDiffPress(), threshold=-0.5), "keydiff",
     ["threshold=-0.5"]),
    ("DMS over KeyDiff (threshold -0.2, window 64)",
     lambda r: kvpress.DMSPress(kvpress.KeyDiffPress(), threshold=-0.2, sliding_window_size=64),
     "keydiff", ["threshold=-0.2", "threshold_window=64"]),
    ("DMS over KeyDiff, decoding too (threshold -0.5, window 16)",
     lambda r: kvpress.DMSPress(kvpress.KeyDiffPress(), threshold=-0.5, sliding_window_size=16,
                                decoding=True), "keydiff",
     ["threshold=-0.5", "threshold_window=16", "threshold_decode=true"]),
    ("DMS over CUR, decoding too (threshold 0.0005, window 16)",
     lambda r: kvpress.DMSPress(kvpress.CURPress(), threshold=0.0005, sliding_window_size=16,
                                decoding=True), "cur",
     ["threshold=0.0005", "threshold_window=16", "threshold_decode=true"]),
    ("DMS over ExpectedAttention (threshold 0.001, window 128)",
     lambda r: kvpress.DMSPress(kvpress.ExpectedAttentionPress(), threshold=0.001),
     "expected_attention", ["threshold=0.001"]),
    ("DMS over NonCausalAttn (threshold 0.5 on its z-scores, window 128)",
     lambda r: kvpress.DMSPress(kvpress.NonCausalAttnPress(), threshold=0.5), "noncausal_attn",
     ["threshold=0.5"]),
    ("DMS over CUR (threshold 0.0005, window 128)",
     lambda r: kvpress.DMSPress(kvpress.CURPress(), threshold=0.0005), "cur",
     ["threshold=0.0005"]),
    # DuoAttentionPress (kvbench: `duo_attention` with the same made-up head scores,
    # write_duo_patterns); the head ratio decides, not the run's ratio. kvpress masks the slots.
    ("DuoAttention (made-up scores, sink 16, recent 64, half the heads)",
     lambda r: kvpress.DuoAttentionPress(head_compression_ratio=0.5), "duo_attention",
     ["patterns={duo_patterns}", "head_compression_ratio=0.5"]),
    ("DuoAttention (made-up scores, sink 16, recent 64, a quarter of the heads)",
     lambda r: kvpress.DuoAttentionPress(head_compression_ratio=0.25), "duo_attention",
     ["patterns={duo_patterns}", "head_compression_ratio=0.25"]),
    # QFilterPress (kvbench: `qfilter` with the same made-up filters, write_qfilters), and AdaKV
    # over it.
    ("QFilter (made-up filters)", lambda r: kvpress.QFilterPress(compression_ratio=r), "qfilter",
     ["filters={qfilters}"]),
    ("AdaKV over QFilter (the same filters)",
     lambda r: kvpress.AdaKVPress(kvpress.QFilterPress(compression_ratio=r)), "qfilter",
     ["filters={qfilters}", "ada=true"]),
    ("BlockPress over QFilter (block 128, the same filters)",
     lambda r: kvpress.BlockPress(kvpress.QFilterPress(compression_ratio=r), block_size=128),
     "qfilter", ["filters={qfilters}", "block=128"]),
    ("ChunkPress over QFilter (chunk 256, the same filters)",
     lambda r: kvpress.ChunkPress(kvpress.QFilterPress(compression_ratio=r), chunk_length=256),
     "qfilter", ["filters={qfilters}", "chunk=256"]),
    # PerLayerCompressionPress (kvbench: `layer_ratios`); the ratio of the run is not used.
    ("PerLayerCompression over KeyDiff (0.25, 0.5, 0.75 by layer)",
     lambda r: kvpress.PerLayerCompressionPress(kvpress.KeyDiffPress(),
                                                compression_ratios=layer_ratios(LAYERS["n"])),
     "keydiff", ["layer_ratios={layer_ratios}"]),
    ("PerLayerCompression over ExpectedAttention (0.25, 0.5, 0.75 by layer)",
     lambda r: kvpress.PerLayerCompressionPress(kvpress.ExpectedAttentionPress(),
                                                compression_ratios=layer_ratios(LAYERS["n"])),
     "expected_attention", ["layer_ratios={layer_ratios}"]),
]


def pair_of(policy):
    """The PAIRS entry of kvbench policy `policy`."""
    for p in PAIRS:
        if p[2] == policy:
            return p
    raise KeyError(f"no kvpress pair for kvbench policy {policy!r}")


def load_model(path, attn="eager"):
    """The model in float32 on the CPU: a Hugging Face folder as it is, a GGUF file dequantized by
    transformers (gguf_file=) with the output layer tied to the embeddings, as llama.cpp and
    kvbench run it."""
    if os.path.isdir(path):  # a Hugging Face folder (kvbench reads the same files)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation=attn)
    else:
        mdir, mfile = os.path.split(os.path.abspath(path))
        model = transformers.AutoModelForCausalLM.from_pretrained(
            mdir, gguf_file=mfile, dtype=torch.float32, attn_implementation=attn)
        model.lm_head.weight = model.model.embed_tokens.weight  # tied, as llama.cpp does
    model.eval()
    return model


def load_tokenizer(path):
    if os.path.isdir(path):
        return transformers.AutoTokenizer.from_pretrained(path)
    mdir, mfile = os.path.split(os.path.abspath(path))
    return transformers.AutoTokenizer.from_pretrained(mdir, gguf_file=mfile)


def kvpress_version():
    return version("kvpress")
