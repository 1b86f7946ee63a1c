# Streamed top-p: how many candidates a count histogram's mass bounds leave (per row, 8 slices).
import numpy as np
rng = np.random.default_rng(0)
V = 152064
for T in (0.7, 1.0, 1.5):
    for p in (0.9, 0.95, 0.99):
        cands, nuc = [], []
        for row in range(8):
            x = rng.normal(0, 3, V)
            c = np.log2(np.e) / T
            y = x * c                      # log2 units
            M = y.max()
            w = np.exp2(y - M); Z = w.sum()
            s = np.sort(w)[::-1]; cs = np.cumsum(s)
            n = np.searchsorted(cs, p * Z) + 1
            xstar = s[n - 1]               # threshold weight
            nuc.append(n)
            for K in (32,):
                b = np.floor(y * K).astype(np.int64)        # absolute bins, K per log2 unit
                bins, cnt = np.unique(b, return_counts=True)
                order = np.argsort(-bins)
                lo = cnt[order] * np.exp2(bins[order] / K - M)   # each bin's mass lower bound
                cum = np.cumsum(lo)
                j = np.searchsorted(cum, p * Z)               # first bin where the bound reaches pZ
                L = bins[order][min(j, len(order) - 1)]
                cands.append(int((b >= L).sum()))
        print(f"T={T} p={p}: nucleus {int(np.mean(nuc))}, candidates (K=32 count bins) {int(np.mean(cands))} "
              f"= {np.mean(cands)/np.mean(nuc):.2f}x, per CTA {int(np.mean(cands)/8)}")
