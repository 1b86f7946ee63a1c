# How many entries (128 logits) and chunks (4096) of a row may hold a logit that top-p keeps or
# that falls in the band (weight at least the threshold's bin less a margin of 2/32 octave): what
# the row-pipelined kernel's short pass 2 reads (TopPPlanPass2, WORKLOG.md session 12), for the
# bench's N(0, 3^2) rows and for LLM-like rows (N(0, 2^2) and 40 strong tokens 8-16 above it).
# Exact, in float64. Usage: .venv/bin/python kernels/sampling/sim/topp_short_pass2.py
import numpy as np

from rows import normal, peaked

rng = np.random.default_rng(5)
for name, gen in (("N(0, 3^2)", normal), ("peaked", peaked)):
    for T in (0.7, 1.0):
        for p in (0.9, 0.95, 0.99):
            ents, chs = [], []
            for _ in range(10):
                t = gen(rng) / T * np.log2(np.e)  # log2 weights
                t -= t.max()
                o = np.sort(t)[::-1]
                cum = np.cumsum(np.exp2(o))
                last = int(np.searchsorted(cum, p * cum[-1]))
                rel = np.nonzero(t >= o[last] - 2 / 32)[0]
                ents.append(len(np.unique(rel // 128)))
                chs.append(len(np.unique(rel // 4096)))
            print(f"{name} T={T} p={p}: entries median {int(np.median(ents))}, max {max(ents)} "
                  f"of 1188; chunks median {int(np.median(chs))}, max {max(chs)} of 38")
