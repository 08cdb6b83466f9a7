"""CPU model of csrc/fused_convt_pool_reduce.cu (draft): the kernel's block / class / tile / row / column index math and
masks in float64, checked against conv_transpose3d + max_pool3d + channel reduction on the probe's cases (runs in
minutes on CPU; all cases agree to 1e-12 as of this commit)."""
import itertools, math, sys
import torch, torch.nn.functional as F
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parent))
import probe_fused_b as pb

def fdiv(a, b): return a // b  # python floor
def emulate(x, w, b, T, s, p, op, win, act, red):
    N, C, D, H, W = x.shape; K = w.shape[1]
    I = (D, H, W)
    P = [((I[a]-1)*s[a] - 2*p[a] + T[a] + op[a]) // win[a] for a in range(3)]
    Mmax = [(T[a]+s[a]-1)//s[a] for a in range(3)]
    ext = []
    for a in range(2):
        e = 0
        for q in range(min(s[a], P[a])):
            X = q*win[a] + p[a]; e = max(e, (X + win[a] - 1)//s[a] - X//s[a] + Mmax[a])
        ext.append(e)
    nd, nh = ext
    qw_lo = p[2]//s[2]; qw_hi = (P[2]*win[2]-1+p[2])//s[2]
    ilo_w = qw_lo - (Mmax[2]-1); nw = qw_hi - ilo_w + 1
    out = torch.full((N, P[0], P[1], P[2]), float('nan'), dtype=torch.float64)
    global need; need = []
    for n, Pd, Ph in itertools.product(range(N), range(P[0]), range(P[1])):
        od0, oh0 = Pd*win[0], Ph*win[1]
        id_lo = (od0+p[0])//s[0] - (Mmax[0]-1); ih_lo = (oh0+p[1])//s[1] - (Mmax[1]-1)
        tile = torch.zeros(nd, nh, nw + 64, C, dtype=torch.float64)   # slack beyond nw: zeros here (garbage on GPU)
        for r_ in range(nd*nh):
            d = id_lo + r_//nh; h = ih_lo + r_ % nh
            for col in range(nw):
                ww = ilo_w + col
                if 0 <= d < D and 0 <= h < H and 0 <= ww < W:
                    tile[r_//nh, r_ % nh, col] = x[n, :, d, h, ww]
        winmax = torch.full((P[2], K), -math.inf, dtype=torch.float64)
        for c in range(s[0]*s[1]*s[2]):
            r = (c//(s[1]*s[2]), (c//s[2]) % s[1], c % s[2])
            M = [(T[a]-r[a]+s[a]-1)//s[a] if r[a] < T[a] else 0 for a in range(3)]
            if 0 in M: continue
            qd0 = fdiv(od0+p[0]-r[0]+s[0]-1, s[0]); qd1 = fdiv(od0+win[0]-1+p[0]-r[0], s[0])
            qh0 = fdiv(oh0+p[1]-r[1]+s[1]-1, s[1]); qh1 = fdiv(oh0+win[1]-1+p[1]-r[1], s[1])
            qw0 = fdiv(p[2]-r[2]+s[2]-1, s[2]); qw1 = fdiv(P[2]*win[2]-1+p[2]-r[2], s[2])
            nqd, nqh, nch = qd1-qd0+1, qh1-qh0+1, (qw1-qw0+32)//32
            if nqd <= 0 or nqh <= 0 or nch <= 0: continue
            ntiles = nqd*nqh*nch
            for t0 in range(0, ntiles, 9):
                for j in range(9):
                    tj = t0+j if t0+j < ntiles else t0
                    ch = tj % nch; rr = tj // nch
                    qd = qd0 + rr//nqh; qh = qh0 + rr % nqh; qwc = qw0 + 32*ch
                    acc = torch.zeros(K, 32, dtype=torch.float64)
                    for md, mh, mw in itertools.product(*[range(m) for m in M]):
                        row_d = qd - md - id_lo; row_h = qh - mh - ih_lo
                        assert 0 <= row_d < nd and 0 <= row_h < nh, (row_d, row_h, nd, nh)
                        col = qwc - mw - ilo_w
                        assert col >= 0, (col, nw)
                        need.append(4 + col + 32)
                        B = tile[row_d, row_h, col:col+32]          # (32, C)
                        Wt = w[:, :, r[0]+s[0]*md, r[1]+s[1]*mh, r[2]+s[2]*mw]   # (C, K)
                        acc += (B @ Wt).t()
                    if t0 + j >= ntiles: continue
                    for k in range(K):
                        for nn in range(32):
                            q = qwc + nn; ow = s[2]*q + r[2] - p[2]
                            if q > qw1 or ow < 0 or ow >= P[2]*win[2]: continue
                            v = acc[k, nn].item()
                            if act != 'none':
                                v = v + (b[k].item() if b is not None else 0.0)
                                v = max(v, 0.0) if act == 'relu' else F.gelu(torch.tensor(v, dtype=torch.float64)).item()
                            winmax[ow // win[2], k] = max(winmax[ow // win[2], k].item(), v)
        def holds(a, o0, ln):
            return T[a] < s[a] and any((o + p[a]) % s[a] >= T[a] for o in range(o0, o0 + ln))
        for pw in range(P[2]):
            v = winmax[pw].clone()
            if holds(0, od0, win[0]) or holds(1, oh0, win[1]) or holds(2, pw * win[2], win[2]):
                z = torch.zeros(K, dtype=torch.float64) if act == 'none' else (b.double() if b is not None else torch.zeros(K, dtype=torch.float64))
                if act == 'relu': z = z.clamp(min=0)
                elif act == 'gelu_erf': z = F.gelu(z)
                v = torch.maximum(v, z)
            if act == 'none' and b is not None: v = v + b.double()
            out[n, Pd, Ph, pw] = {'sum': v.sum(), 'mean': v.mean(), 'max': v.max()}[red]
    return out

torch.manual_seed(0)
for name, shape, K, T, s, p, op, win, act, red, has_bias in pb.CASES:
    x = torch.randn(shape, dtype=torch.float64); w = torch.randn(shape[1], K, *T, dtype=torch.float64)
    b = torch.randn(K, dtype=torch.float64) if has_bias else None
    ref = pb.reference(x, w, b, s, p, op, win, act, red)
    got = emulate(x, w, b, T, s, p, op, win, act, red)
    print('max read position', max(need) if need else None)
    print(name, 'maxdiff', (got - ref).abs().max().item(), 'shape', tuple(got.shape), tuple(ref.shape))
