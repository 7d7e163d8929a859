"""knorm in Python: keep the tokens whose keys have the lowest L2 norm.

KnormPress (Devoto et al. 2024, "A simple and effective L2 norm-based strategy for KV cache
compression"); kvbench's native `knorm` is the same rule. Run it with

    kvbench generate --model M --prompt-file P --policy python \
        --policy-opt file=examples/policies/knorm.py --kv-budget 128

The native policy takes the norms of the keys before RoPE, in float64; ctx.keys are after RoPE
(a rotation: the same norm up to float32 rounding), so near-equal norms may rank differently.
"""
import numpy as np


def score(ctx):
    # ctx.keys: float32 [kv_heads, n, head_dim]; a higher score keeps the token.
    return -np.linalg.norm(ctx.keys, axis=-1)
