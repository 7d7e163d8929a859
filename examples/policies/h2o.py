"""H2O in Python: heavy hitters by accumulated attention plus a recent window.

Heavy-Hitter Oracle (Zhang et al. 2023), with the defaults of kvbench's native `h2o`: a token's
score is the attention it has received from every query since it entered the cache (per KV head:
the mean over its query heads), the budget splits into floor(B * heavy_fraction) heavy hitters
and the rest for the most recent tokens, and decode evicts the lowest-scored token outside the
recent window after each step. Its keep-sets and tokens equal the native policy's.

    kvbench generate ... --policy python --policy-opt file=examples/policies/h2o.py \
        --policy-opt heavy_fraction=0.5 --kv-budget 128
"""
import math

import numpy as np

NEEDS_ATTENTION_SUM = True           # ctx.attn_sum: [q_heads, n], column sums of the block's queries
OPTIONS = {"heavy_fraction": 0.5}    # --policy-opt heavy_fraction=... arrives as a float


def _gqa_mean(attn_sum, kv_heads):
    # The native reduction's order: the group's rows summed in turn, then divided (float32).
    q_heads, n = attn_sum.shape
    group = q_heads // kv_heads
    rows = attn_sum.reshape(kv_heads, group, n)
    total = rows[:, 0, :].copy()
    for g in range(1, group):
        total += rows[:, g, :]
    return total / np.float32(group)


def _scores(ctx):
    # Accumulated attention per (head, position): positions survive eviction, slots do not.
    kv_heads, n = ctx.positions.shape
    lengths, positions = ctx.lengths, ctx.positions
    acc = ctx.state.get(ctx.layer)
    need = int(max(positions[h, :lengths[h]].max() for h in range(kv_heads) if lengths[h])) + 1
    if acc is None or acc.shape[1] < need:
        grown = np.zeros((kv_heads, max(need, 2 * (0 if acc is None else acc.shape[1]))), np.float32)
        if acc is not None:
            grown[:, :acc.shape[1]] = acc
        acc = ctx.state[ctx.layer] = grown
    add = _gqa_mean(ctx.attn_sum, kv_heads)
    scores = np.zeros((kv_heads, n), np.float32)
    recent = ctx.budget - math.floor(ctx.budget * ctx.options["heavy_fraction"])
    for h in range(kv_heads):
        length = lengths[h]
        p = positions[h, :length]
        acc[h, p] += add[h, :length]
        scores[h, :length] = acc[h, p]
        scores[h, max(0, length - recent):length] = np.inf  # the recent window stays
    return scores


def score(ctx):
    return _scores(ctx)


def decode_score(ctx):
    return _scores(ctx)
