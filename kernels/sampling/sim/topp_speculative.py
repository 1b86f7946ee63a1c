# Top-p rows in one streaming pass (the row-pipelined kernel's next step, WORKLOG.md session 7):
# after the first chunk(s) of a row, take the top-p threshold of that sample, lower it by a margin
# (delta, in log2 units of weight), and keep every later logit above it as a candidate. At the end
# the exact check "mass of the candidates >= p * Z" (Z from the entry sums) says whether every
# nucleus token was kept; if not, the row falls back (a second pass, or the resident kernel).
# Reports, per setting, the candidates per row (what must be stored: shared memory holds ~5k,
# more needs a global workspace) and how often the check fails.
# Usage: .venv/bin/python kernels/sampling/sim/topp_speculative.py
import numpy as np

from rows import V, normal, peaked

CHUNK = 4096
ROWS = 48
rng = np.random.default_rng(1)


def threshold_log2(y, p):
    """Top-p threshold of log2-weights y (HF: smallest set by descending weight reaching p)."""
    w = np.exp2(y - y.max())
    s = np.sort(w)[::-1]
    n = np.searchsorted(np.cumsum(s), p * s.sum()) + 1
    return np.log2(s[min(n, len(s)) - 1]) + y.max()


def row_logits(kind):
    if kind not in ("normal", "peaked"):
        raise ValueError(kind)
    return (normal if kind == "normal" else peaked)(rng)


def simulate(kind, T, p, sample_chunks, delta):
    cands, fails = [], 0
    for _ in range(ROWS):
        y = row_logits(kind) * (np.log2(np.e) / T)  # log2 units of weight
        tau = threshold_log2(y, p)
        sample = y[: sample_chunks * CHUNK]
        bound = threshold_log2(sample, p) - delta
        fails += bound > tau  # a nucleus token below the bound: the check fails
        cands.append(int((y >= bound).sum()))
    return np.mean(cands), np.max(cands), fails


print(f"{'rows':8} {'T':>4} {'p':>5} {'sample':>7} {'delta':>5} {'cand mean':>10} {'max':>7} "
      f"{'fail':>5} (of {ROWS})")
for kind in ("normal", "peaked"):
    for T in (0.7, 1.0, 1.5):
        for p in (0.9, 0.95, 0.99):
            for sample_chunks in (1, 2):
                for delta in (0.25, 0.5, 1.0):
                    mean, mx, fails = simulate(kind, T, p, sample_chunks, delta)
                    print(f"{kind:8} {T:4} {p:5} {sample_chunks * CHUNK:7} {delta:5} "
                          f"{mean:10.0f} {mx:7d} {fails:5d}")
