"""Lane-level model of kernels/cuda/attention_prefill_mma.cu, for checking its index math without a GPU.

Each warp's 32 lanes (gid = lane / 4, tig = lane % 4) hold the register fragments the kernel
builds; mma.sync.m16n8k16 is emulated from the PTX ISA's fragment layouts (A 16x16 row-major,
B 16x8 column-major, C/D 16x8), in float64. The tiling, causal/window masks, mask skipping,
online softmax, P rounding to bf16, the statistics pass (row (max, sum), column sums through the
butterfly and the warps, last_probs) are transcribed line by line. Every case compares with a
float64 reference on the same bf16 operands: outputs within 2^-9 max|v| (the P rounding), stats
within float rounding. A transcription can drift from the kernel: it is evidence for the index
math, not a substitute for tests/cuda/parity_prefill_mma.h on a GPU.

Run: /work/.venv-g3/bin/python scripts/model_prefill_mma.py  (numpy; about a minute)
"""


import numpy as np
np.random.seed(1)
def bf16(x):
    x = np.asarray(x, np.float32); b = x.view(np.uint32).astype(np.uint64)
    b = (b + 0x7fff + ((b >> 16) & 1)) & 0xffff0000
    return b.astype(np.uint32).view(np.float32)
LANES = np.arange(32); GID = LANES // 4; TIG = LANES % 4
def mma(d, a, b):  # d: [32,4], a: [32,4,2] (pairs of values), b: [32,2,2]
    A = np.zeros((16,16), np.float32); B = np.zeros((16,8), np.float32)
    for l in range(32):
        g, t = GID[l], TIG[l]
        A[g, 2*t:2*t+2] = a[l,0]; A[g+8, 2*t:2*t+2] = a[l,1]
        A[g, 2*t+8:2*t+10] = a[l,2]; A[g+8, 2*t+8:2*t+10] = a[l,3]
        B[2*t:2*t+2, g] = b[l,0]; B[2*t+8:2*t+10, g] = b[l,1]
    Dm = A.astype(np.float64) @ B.astype(np.float64)
    for l in range(32):
        g, t = GID[l], TIG[l]
        d[l,0] += Dm[g,2*t]; d[l,1] += Dm[g,2*t+1]; d[l,2] += Dm[g+8,2*t]; d[l,3] += Dm[g+8,2*t+1]

def run(n, before, group, D, window, stats, last_w):
    kvh = len(before); nh = kvh*group
    lens = [b+n for b in before]
    K = [bf16(np.random.uniform(-2,2,(L,D))) for L in lens]
    V = [bf16(np.random.uniform(-1,1,(L,D))) for L in lens]
    q = np.random.uniform(-2,2,(n,nh,D)).astype(np.float32)
    scale = np.float32(1/np.sqrt(D))
    kKeys = 32 if D >= 256 else 64
    out = np.full((n,nh,D), np.nan); rs = np.full((nh,n,2), np.nan)
    tiles = (n+15)//16*group; blocks = (tiles+3)//4
    for kv in range(kvh):
        L = lens[kv]; bef = L-n
        for block in range(blocks):
            last_tile = min(block*4+4, tiles)-1
            first_q = block*4//group*16
            last_q = min(n-1, last_tile//group*16+15)
            keys_end = bef+last_q+1
            keys_begin = max(0, bef+first_q+1-window)//kKeys*kKeys if window>0 else 0
            for warp in range(4):
                tile = block*4+warp
                if tile >= tiles: continue
                q0 = tile//group*16; head = kv*group+tile%group
                Qs = np.zeros((16,D), np.float32)
                for r in range(16):
                    if q0+r < n: Qs[r] = bf16(q[q0+r, head])
                vis_a = bef+np.minimum(q0+GID, n-1)+1; vis_b = bef+np.minimum(q0+GID+8, n-1)+1
                lo_a = np.maximum(0, vis_a-window) if window>0 else np.zeros(32,int)
                lo_b = np.maximum(0, vis_b-window) if window>0 else np.zeros(32,int)
                warp_end = bef+min(q0+16, n); warp_lo = max(0, bef+q0+1-window) if window>0 else 0
                o = np.zeros((D//8,32,4)); m_a = np.full(32,-np.inf); m_b = m_a.copy(); l_a=np.zeros(32); l_b=np.zeros(32)
                t0 = keys_begin
                while t0 < keys_end:
                    cnt = min(kKeys, keys_end-t0)
                    Ks = np.zeros((kKeys,D),np.float32); Vs = np.zeros((kKeys,D),np.float32)
                    Ks[:cnt] = K[kv][t0:t0+cnt]; Vs[:cnt] = V[kv][t0:t0+cnt]
                    if not (t0 >= warp_end or t0+kKeys <= warp_lo):
                        s = np.zeros((kKeys//8,32,4))
                        for kc in range(D//16):
                            a = np.zeros((32,4,2))
                            for l in range(32):
                                g,t = GID[l],TIG[l]; c = kc*16+2*t
                                a[l,0]=Qs[g,c:c+2]; a[l,1]=Qs[g+8,c:c+2]; a[l,2]=Qs[g,c+8:c+10]; a[l,3]=Qs[g+8,c+8:c+10]
                            for j in range(kKeys//8):
                                b = np.zeros((32,2,2))
                                for l in range(32):
                                    g,t = GID[l],TIG[l]; c = kc*16+2*t
                                    b[l,0]=Ks[8*j+g,c:c+2]; b[l,1]=Ks[8*j+g,c+8:c+10]
                                mma(s[j], a, b)
                        s = (s.astype(np.float32)*scale).astype(np.float64)
                        mx_a = np.full(32,-np.inf); mx_b = mx_a.copy()
                        all_vis = bef+q0+1; all_lo = max(0, warp_end-window) if window>0 else 0
                        need = (t0+kKeys > all_vis) or (t0 < all_lo)
                        for j in range(kKeys//8):
                            for e in range(4):
                                if not need:
                                    if e>=2: mx_b = np.maximum(mx_b, s[j][:,e])
                                    else: mx_a = np.maximum(mx_a, s[j][:,e])
                                    continue
                                key = t0+8*j+2*TIG+(e&1)
                                bb = e>=2
                                seen = (key < (vis_b if bb else vis_a)) & (key >= (lo_b if bb else lo_a))
                                s[j][:,e] = np.where(seen, s[j][:,e], -np.inf)
                                if bb: mx_b = np.maximum(mx_b, s[j][:,e])
                                else: mx_a = np.maximum(mx_a, s[j][:,e])
                        qm = lambda v: np.array([v[(l//4)*4:(l//4)*4+4].max() for l in range(32)])
                        new_a = np.maximum(m_a, qm(mx_a)); new_b = np.maximum(m_b, qm(mx_b))
                        use_a = np.where(new_a==-np.inf, 0, new_a); use_b = np.where(new_b==-np.inf,0,new_b)
                        with np.errstate(invalid='ignore'):
                            corr_a = np.exp(m_a-use_a); corr_b = np.exp(m_b-use_b)
                        m_a, m_b = new_a, new_b
                        for j in range(kKeys//8):
                            s[j][:,0]=np.exp(s[j][:,0]-use_a); s[j][:,1]=np.exp(s[j][:,1]-use_a)
                            s[j][:,2]=np.exp(s[j][:,2]-use_b); s[j][:,3]=np.exp(s[j][:,3]-use_b)
                        l_a = l_a*corr_a + sum(s[j][:,0]+s[j][:,1] for j in range(kKeys//8))
                        l_b = l_b*corr_b + sum(s[j][:,2]+s[j][:,3] for j in range(kKeys//8))
                        o[:,:,0:2] *= corr_a[None,:,None]; o[:,:,2:4] *= corr_b[None,:,None]
                        for kk in range(kKeys//16):
                            a = np.zeros((32,4,2))
                            a[:,0]=bf16(s[2*kk][:,0:2]); a[:,1]=bf16(s[2*kk][:,2:4]); a[:,2]=bf16(s[2*kk+1][:,0:2]); a[:,3]=bf16(s[2*kk+1][:,2:4])
                            for dn in range(D//8):
                                b = np.zeros((32,2,2))
                                for l in range(32):
                                    g,t = GID[l],TIG[l]; r0 = 16*kk+2*t; col = 8*dn+g
                                    b[l,0] = [Vs[r0,col], Vs[r0+1,col]]; b[l,1] = [Vs[r0+8,col], Vs[r0+9,col]]
                                mma(o[dn], a, b)
                    t0 += kKeys
                qs_ = lambda v: np.array([v[(l//4)*4:(l//4)*4+4].sum() for l in range(32)])
                l_a = qs_(l_a); l_b = qs_(l_b)
                for l in range(32):
                    g,t = GID[l],TIG[l]
                    for dn in range(D//8):
                        x = 8*dn+2*t
                        if q0+g < n: out[q0+g, head, x:x+2] = o[dn][l,0:2]/l_a[l]
                        if q0+g+8 < n: out[q0+g+8, head, x:x+2] = o[dn][l,2:4]/l_b[l]
                    if t == 0:
                        if q0+g < n: rs[head, q0+g] = (m_a[l], l_a[l])
                        if q0+g+8 < n: rs[head, q0+g+8] = (m_b[l], l_b[l])
    assert not np.isnan(out).any(), 'unwritten output'
    # reference
    err = 0; perr = 0
    for h in range(nh):
        kv = h//group; bef = lens[kv]-n
        for i in range(n):
            vis = bef+i+1; lo = max(0, vis-window) if window>0 else 0
            qq = bf16(q[i,h]).astype(np.float64)
            sc = K[kv][lo:vis].astype(np.float64) @ qq * float(scale)
            p = np.exp(sc-sc.max()); p /= p.sum()
            ref = p @ V[kv][lo:vis]
            err = max(err, np.abs(ref-out[i,h]).max())
            # stats model check: p from (m,l) of row stats
            if window == 0:
                m, l = rs[h,i]
                perr = max(perr, np.abs(np.exp(sc - m)/l - p).max())

    if stats:
        col = np.zeros((nh, max(lens)+3)); lp = np.zeros((nh, last_w, max(lens)+3))
        for h in range(nh):
            kv = h//group; L = lens[kv]; bef = L-n
            for bx in range((max(lens)+kKeys-1)//kKeys):
                t0 = bx*kKeys
                if t0 >= L: continue
                cnt = min(kKeys, L-t0)
                Ks = np.zeros((kKeys,D),np.float32); Ks[:cnt] = K[kv][t0:t0+cnt]
                part = np.zeros((4,kKeys))
                for warp in range(4):
                    cs = np.zeros((kKeys//8,32,2))
                    first = 0
                    q0 = (first//16+warp)*16
                    while q0 < n:
                        if not (bef+min(q0+16,n) <= t0):
                            Qs = np.zeros((16,D),np.float32)
                            for r in range(16):
                                if q0+r < n: Qs[r] = bf16(q[q0+r,h])
                            sc = np.zeros((kKeys//8,32,4))
                            for kc in range(D//16):
                                a = np.zeros((32,4,2))
                                for l in range(32):
                                    g,t = GID[l],TIG[l]; c = kc*16+2*t
                                    a[l,0]=Qs[g,c:c+2]; a[l,1]=Qs[g+8,c:c+2]; a[l,2]=Qs[g,c+8:c+10]; a[l,3]=Qs[g+8,c+8:c+10]
                                for j in range(kKeys//8):
                                    b = np.zeros((32,2,2))
                                    for l in range(32):
                                        g,t = GID[l],TIG[l]; c = kc*16+2*t
                                        b[l,0]=Ks[8*j+g,c:c+2]; b[l,1]=Ks[8*j+g,c+8:c+10]
                                    mma(sc[j], a, b)
                            sc = (sc.astype(np.float32)*scale).astype(np.float64)
                            for half in range(2):
                                for l in range(32):
                                    row = q0+GID[l]+8*half
                                    if row >= n: continue
                                    vis = bef+row+1; m_, l_ = rs[h,row]; w = row-(n-last_w)
                                    for j in range(kKeys//8):
                                        for e in range(2):
                                            key = t0+8*j+2*TIG[l]+e
                                            if key >= vis: continue
                                            pr = np.exp(sc[j][l,2*half+e]-m_)/l_
                                            cs[j][l,e] += pr
                                            if w >= 0: lp[h,w,key] = pr
                        q0 += 64
                    for j in range(kKeys//8):
                        for e in range(2):
                            for l in range(32):
                                if GID[l] == 0:
                                    part[warp, 8*j+2*TIG[l]+e] = sum(cs[j][l2,e] for l2 in range(32) if TIG[l2]==TIG[l])
                for c in range(kKeys):
                    if t0+c >= L: break
                    col[h, t0+c] = part[:,c].sum()
        cerr = 0; lerr = 0
        for h in range(nh):
            kv = h//group; L = lens[kv]; bef = L-n; ref = np.zeros(max(lens)+3); reflp = np.zeros((last_w, max(lens)+3))
            for i in range(n):
                vis = bef+i+1
                qq = bf16(q[i,h]).astype(np.float64)
                sc = K[kv][:vis].astype(np.float64) @ qq * float(scale)
                p = np.exp(sc-sc.max()); p /= p.sum(); ref[:vis] += p
                if i-(n-last_w) >= 0: reflp[i-(n-last_w), :vis] = p
            cerr = max(cerr, np.abs(ref-col[h]).max()); lerr = max(lerr, np.abs(reflp-lp[h]).max())
        return err, perr, cerr, lerr
    return err, perr

bad = 0
def report(name, res):
    global bad
    ok = res[0] <= 2.0**-9 and all(r <= 1e-6 for r in res[1:])
    bad += not ok
    print(("ok  " if ok else "BAD ") + name, " ".join("%.3g" % r for r in res))

# (n, before per KV head, group, head_dim, window)
report("stats n=20 before={3,70} g2 d32 last_w=18", run(20, [3, 70], 2, 32, 0, True, 18))
report("stats n=33 before={0} g4 d32 last_w=5", run(33, [0], 4, 32, 0, True, 5))
for n, b, g, d, w in [(2, [0, 5], 1, 64, 0), (17, [33, 0, 70], 4, 32, 0), (40, [3, 10], 7, 32, 0),
                      (37, [50, 0], 4, 32, 33), (20, [10, 90], 2, 32, 8), (70, [7, 0], 1, 32, 0),
                      (150, [100, 3], 1, 32, 0), (130, [0], 2, 32, 40), (9, [4], 2, 256, 0)]:
    report("n=%d before=%s g%d d%d window=%d" % (n, b, g, d, w), run(n, b, g, d, w, False, 0))
raise SystemExit(1 if bad else 0)
