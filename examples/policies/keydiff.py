"""KeyDiff in Python: keep the keys least similar to the layer's mean key direction.

KeyDiff (Park et al. 2025, "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM
Inference in Resource-Constrained Environments"); kvpress KeyDiffPress: the anchor is the mean of
the head's L2-normalised keys, and a token's score is minus the cosine similarity of its key to
that anchor (distinct keys keep).
"""
import numpy as np


def score(ctx):
    keys, lengths = ctx.keys, ctx.lengths  # [kv_heads, n, head_dim] after RoPE; [kv_heads]
    out = np.zeros(keys.shape[:2], np.float32)
    for h in range(keys.shape[0]):
        k = keys[h, :lengths[h]]
        norms = np.linalg.norm(k, axis=-1)
        anchor = (k / np.maximum(norms, 1e-12)[:, None]).mean(axis=0)
        cosine = (k @ anchor) / np.maximum(norms * np.linalg.norm(anchor), 1e-8)
        out[h, :lengths[h]] = -cosine
    return out
