"""Lane-level model of kernels/cuda/attention_decode_mma.cu, for checking its index math without a GPU.

The kernel's plan (split_grid with four tiles a chunk at least), the blocks (KV head, chunk), the
query tile in shared memory (the group's heads as rows, zeros past the group), each warp's tiles
(w, w + 4, ...) copied into its stages by the lane loop of issue() (which/row/piece from the
element index, zero-fill past the chunk), the score and P x V fragments read from the padded
shared rows, mma.sync.m16n8k16 emulated from the PTX ISA's fragment layouts (in float64), the
tail mask, the online softmax, P rounded to bf16, the quad sums, the warps' merge through shared
memory, and decode_combine_kernel's merge of the chunks are transcribed line by line. Each case
compares with a float64 reference on the same bf16 operands (the query rounded to bf16): outputs
within 2^-8 max|v| (the P rounding: bf16's unit roundoff). A transcription can drift from the kernel: it is evidence
for the index math, not a substitute for the decode cases of tests/cuda/parity_prefill_mma.h on
a GPU.

Run: /work/.venv-g3/bin/python scripts/model_decode_mma.py  (numpy 1.26; about a minute)
"""

import numpy as np

np.random.seed(3)
LANES = np.arange(32)
GID = LANES // 4
TIG = LANES % 4
WARPS, ROWS, STAGES, MIN_TILES = 4, 16, 3, 4


def bf16(x):
    x = np.atleast_1d(np.asarray(x, np.float32))
    b = x.view(np.uint32).astype(np.uint64)
    b = (b + np.uint64(0x7fff) + ((b >> np.uint64(16)) & np.uint64(1))) & np.uint64(0xffff0000)
    return b.astype(np.uint32).view(np.float32)


def mma(d, a, b):
    """d [32, 4] += A x B from per-lane fragments: a [32, 4, 2] value pairs, b [32, 2, 2]."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for l in range(32):
        g, t = GID[l], TIG[l]
        A[g, 2 * t:2 * t + 2] = a[l, 0]
        A[g + 8, 2 * t:2 * t + 2] = a[l, 1]
        A[g, 2 * t + 8:2 * t + 10] = a[l, 2]
        A[g + 8, 2 * t + 8:2 * t + 10] = a[l, 3]
        B[2 * t:2 * t + 2, g] = b[l, 0]
        B[2 * t + 8:2 * t + 10, g] = b[l, 1]
    Dm = A @ B
    d[:, 0] += Dm[GID, 2 * TIG]
    d[:, 1] += Dm[GID, 2 * TIG + 1]
    d[:, 2] += Dm[GID + 8, 2 * TIG]
    d[:, 3] += Dm[GID + 8, 2 * TIG + 1]


def split_grid(target, kvh, max_len, tile, min_tiles):
    by_blocks = max(1, target // kvh)
    tiles = (max_len + tile - 1) // tile
    splits = min(by_blocks, max(1, tiles // max(min_tiles, 1)))
    chunk = (tiles + splits - 1) // splits * tile
    return (max_len + chunk - 1) // chunk, chunk


def run(lens, group, D, window, target):
    kvh = len(lens)
    nh = kvh * group
    K = [bf16(np.random.uniform(-2, 2, (L, D))) for L in lens]
    V = [bf16(np.random.uniform(-1, 1, (L, D))) for L in lens]
    q = np.random.uniform(-2, 2, (nh, D)).astype(np.float32)
    scale = np.float32(1 / np.sqrt(D))
    kKeys = 16 if D >= 256 else 32
    kS = D + 8
    kChunks = D // 8
    splits, chunk = split_grid(target, kvh, max(lens), kKeys, MIN_TILES)
    part_ml = np.full((nh, splits, 2), np.nan)
    part_acc = np.full((nh, splits, D), np.nan)
    for kv in range(kvh):
        # The layer's flat rows: this head's slots at some offset (other heads' rows around).
        base = 7
        flatK = np.full((base + lens[kv] + 5, D), np.nan, np.float32)
        flatV = flatK.copy()
        flatK[base:base + lens[kv]] = K[kv]
        flatV[base:base + lens[kv]] = V[kv]
        for split in range(splits):
            h0 = kv * group
            L = lens[kv]
            lo = max(0, L - window) if window > 0 else 0
            c0 = max(split * chunk, lo)
            c1 = min(L, split * chunk + chunk)
            if c0 >= c1:
                for g in range(group):
                    part_ml[h0 + g, split] = (-np.inf, 0)
                continue
            qs = np.zeros((ROWS, kS), np.float32)  # bf16 values; the pad columns never read
            for e in range(ROWS * D):
                r, x = e // D, e % D
                qs[r, x] = bf16(q[h0 + r, x])[0] if r < group else 0
            tiles = (c1 - c0 + kKeys - 1) // kKeys
            wml = np.zeros((WARPS, ROWS, 2))
            wo = np.zeros((WARPS, ROWS, D))
            for warp in range(WARPS):
                mine = (tiles - warp + WARPS - 1) // WARPS if tiles > warp else 0
                stages = np.full((STAGES, 2 * kKeys, kS), np.nan, np.float32)

                def issue(i):
                    st = stages[i % STAGES]
                    k0 = c0 + (warp + i * WARPS) * kKeys
                    for lane in range(32):
                        for e in range(lane, 2 * kKeys * kChunks, 32):
                            which = e // (kKeys * kChunks)
                            r, c = (e // kChunks) % kKeys, e % kChunks
                            valid = k0 + r < c1
                            row = base + (k0 + r if valid else c0)
                            src = (flatV if which else flatK)[row, c * 8:c * 8 + 8]
                            st[which * kKeys + r, c * 8:c * 8 + 8] = src if valid else 0

                for i in range(min(STAGES - 1, mine)):
                    issue(i)
                o = np.zeros((D // 8, 32, 4))
                m_a = np.full(32, -np.inf)
                m_b = m_a.copy()
                l_a = np.zeros(32)
                l_b = np.zeros(32)
                for i in range(mine):
                    if i + STAGES - 1 < mine:
                        issue(i + STAGES - 1)
                    ks = stages[i % STAGES][:kKeys]
                    vs = stages[i % STAGES][kKeys:]
                    k0 = c0 + (warp + i * WARPS) * kKeys
                    s = np.zeros((kKeys // 8, 32, 4))
                    for kc in range(D // 16):
                        a = np.zeros((32, 4, 2))
                        for l in range(32):
                            g, t = GID[l], TIG[l]
                            c = kc * 16 + 2 * t
                            a[l, 0] = qs[g, c:c + 2]
                            a[l, 1] = qs[g + 8, c:c + 2]
                            a[l, 2] = qs[g, c + 8:c + 10]
                            a[l, 3] = qs[g + 8, c + 8:c + 10]
                        for j in range(kKeys // 8):
                            b = np.zeros((32, 2, 2))
                            for l in range(32):
                                g, t = GID[l], TIG[l]
                                c = kc * 16 + 2 * t
                                b[l, 0] = ks[8 * j + g, c:c + 2]
                                b[l, 1] = ks[8 * j + g, c + 8:c + 10]
                            mma(s[j], a, b)
                    tail = k0 + kKeys > c1
                    for j in range(kKeys // 8):
                        for e in range(4):
                            key = k0 + 8 * j + 2 * TIG + (e & 1)
                            scaled = (s[j][:, e].astype(np.float32) * scale).astype(np.float64)
                            s[j][:, e] = np.where(tail & (key >= c1), -np.inf, scaled)
                    assert not np.isnan(s).any(), "a score read an unwritten shared row"
                    mx_a = np.max([np.maximum(s[j][:, 0], s[j][:, 1]) for j in range(kKeys // 8)], 0)
                    mx_b = np.max([np.maximum(s[j][:, 2], s[j][:, 3]) for j in range(kKeys // 8)], 0)
                    qm = lambda v: v.reshape(8, 4).max(1).repeat(4)
                    new_a = np.maximum(m_a, qm(mx_a))
                    new_b = np.maximum(m_b, qm(mx_b))
                    assert np.isfinite(new_a).all() and np.isfinite(new_b).all()
                    corr_a = np.exp(m_a - new_a)
                    corr_b = np.exp(m_b - new_b)
                    m_a, m_b = new_a, new_b
                    for j in range(kKeys // 8):
                        s[j][:, 0:2] = np.exp(s[j][:, 0:2] - new_a[:, None])
                        s[j][:, 2:4] = np.exp(s[j][:, 2:4] - new_b[:, None])
                    l_a = l_a * corr_a + sum(s[j][:, 0] + s[j][:, 1] for j in range(kKeys // 8))
                    l_b = l_b * corr_b + sum(s[j][:, 2] + s[j][:, 3] for j in range(kKeys // 8))
                    o[:, :, 0:2] *= corr_a[None, :, None]
                    o[:, :, 2:4] *= corr_b[None, :, None]
                    for kk in range(kKeys // 16):
                        a = np.zeros((32, 4, 2))
                        a[:, 0] = bf16(s[2 * kk][:, 0:2])
                        a[:, 1] = bf16(s[2 * kk][:, 2:4])
                        a[:, 2] = bf16(s[2 * kk + 1][:, 0:2])
                        a[:, 3] = bf16(s[2 * kk + 1][:, 2:4])
                        for dn in range(D // 8):
                            b = np.zeros((32, 2, 2))
                            for l in range(32):
                                g, t = GID[l], TIG[l]
                                r0, col = 16 * kk + 2 * t, 8 * dn + g
                                b[l, 0] = [vs[r0, col], vs[r0 + 1, col]]
                                b[l, 1] = [vs[r0 + 8, col], vs[r0 + 9, col]]
                            mma(o[dn], a, b)
                    assert not np.isnan(o).any(), "P x V read an unwritten shared row"
                quad = lambda v: v.reshape(8, 4).sum(1).repeat(4)
                l_a = quad(l_a)
                l_b = quad(l_b)
                for l in range(32):
                    g, t = GID[l], TIG[l]
                    for dn in range(D // 8):
                        x = 8 * dn + 2 * t
                        if g < group:
                            wo[warp, g, x:x + 2] = o[dn][l, 0:2]
                        if g + 8 < group:
                            wo[warp, g + 8, x:x + 2] = o[dn][l, 2:4]
                    if t == 0:
                        if g < group:
                            wml[warp, g] = (m_a[l], l_a[l])
                        if g + 8 < group:
                            wml[warp, g + 8] = (m_b[l], l_b[l])
            for e in range(group * D):
                g, x = e // D, e % D
                mb = wml[:, g, 0].max()
                acc = lb = 0.0
                for w in range(WARPS):
                    if wml[w, g, 0] == -np.inf:
                        continue
                    f = np.exp(wml[w, g, 0] - mb)
                    acc += wo[w, g, x] * f
                    lb += wml[w, g, 1] * f
                part_acc[h0 + g, split, x] = acc
                if x == 0:
                    part_ml[h0 + g, split] = (mb, lb)
    # decode_combine_kernel
    out = np.full((nh, D), np.nan)
    for h in range(nh):
        ml = part_ml[h]
        assert not np.isnan(ml).any(), "a chunk state left unwritten"
        mx = ml[:, 0].max()
        live = ml[:, 0] != -np.inf
        f = np.where(live, np.exp(np.where(live, ml[:, 0] - mx, 0)), 0)
        out[h] = (part_acc[h][live] * f[live, None]).sum(0) / (ml[live, 1] * f[live]).sum()
    err = 0
    for h in range(nh):
        kv = h // group
        L = lens[kv]
        lo = max(0, L - window) if window > 0 else 0
        qq = bf16(q[h]).astype(np.float64)
        sc = K[kv][lo:L].astype(np.float64) @ qq * float(scale)
        p = np.exp(sc - sc.max())
        p /= p.sum()
        err = max(err, np.abs(p @ V[kv][lo:L] - out[h]).max())
    return err, splits, chunk


bad = 0
# (lengths per KV head, group, head_dim, window, target blocks)
for lens, g, d, w, target in [([1, 3, 67, 300], 4, 32, 0, 8),      # short heads, empty chunks
                              ([300, 1], 1, 64, 0, 4),             # group 1, a one-slot head
                              ([129, 700], 8, 32, 0, 6),           # group 8: rows gid only
                              ([200, 90], 16, 32, 0, 4),           # group 16: rows gid + 8 too
                              ([200, 40], 12, 64, 0, 4),           # group 12: some gid + 8 rows
                              ([250], 3, 96, 0, 1),                # d 96, one block, 8 tiles
                              ([600, 40], 7, 32, 33, 8),           # window mid-tile
                              ([100], 2, 256, 0, 2),               # d 256: 16-key tiles
                              ([1000, 999], 4, 32, 0, 3),          # many tiles a warp
                              ([1000, 999], 4, 32, 0, 16)]:        # a tile a warp, 8 splits
    err, splits, chunk = run(lens, g, d, w, target)
    ok = err <= 2.0**-8
    bad += not ok
    print("%s lens=%s group=%d d=%d window=%d splits=%d chunk=%d  max err %.3g" %
          ("ok " if ok else "BAD", lens, g, d, w, splits, chunk, err))
raise SystemExit(1 if bad else 0)
