# The row-pipelined kernel's two-pass top-p rows (sampling_rowpipe.cu, WORKLOG.md session 8), on
# the CPU: how often a row falls back to the resident kernel, and how many candidates the band
# holds. Pass 1 as the kernel: w = 2^(x * scale - rbase * scale) in float32 (rbase: the first
# chunk's max), bin = top - (bits(w) >> 18) (32 bins per octave), the bin's increment the
# mantissa >> 10; the band is the bins whose cumulative mass from the top reaches top_p of the
# total minus / plus 1e-4 of it. Then the exact check of pass 2 (float64 weights from the max):
# mass above the band < need <= mass above + candidates, need = top_p * z. A row falls back when
# that fails, when the band holds more than 4096 candidates, or when a logit is 64 octaves heavier
# than rbase. numpy's exp2 stands in for MUFU.EX2 (not bit-exact: the statistics, not the bins of
# a given row, are the point).
# A second table uses the kernel's band margin since session 9, (2.5e-4 p (1 - p) + 1e-6) of the
# total, instead of session 8's 1e-4 (the histogram's error on the share of the mass above a bin
# shrinks with that share's distance from 0 and 1).
# Usage: .venv/bin/python kernels/sampling/sim/topp_two_pass.py
import numpy as np

from rows import V, normal, peaked

CHUNK = 4096
ROWS = 24
CAND_CAP = 4096
KEY_OF_ONE = 127 << 5
TOP = KEY_OF_ONE + 32 * 64
BINS = 4096
rng = np.random.default_rng(2)


def row_logits(kind):
    if kind not in ("normal", "peaked"):
        raise ValueError(kind)
    return (normal if kind == "normal" else peaked)(rng).astype(np.float32)


def one_row(x, T, p, margin_pq=False):
    """Returns (falls back, candidates in the band)."""
    scale = np.float32(np.log2(np.e) / T)
    rbase = x[:CHUNK].max()
    c0 = np.float32(-rbase * scale)
    w = np.exp2((x * scale + c0).astype(np.float32)).astype(np.float32)
    bits = w.view(np.uint32)
    b = TOP - (bits >> 18).astype(np.int64)
    if (b < 0).any():
        return True, 0
    binned = b < BINS - 1
    inc = ((bits & 0x7FFFFF) | 0x800000) >> 10
    hist = np.bincount(b[binned], weights=inc[binned], minlength=BINS).astype(np.uint64)
    max_octave = (TOP - int(b.min())) >> 5
    octave = (TOP - np.arange(BINS)) >> 5
    down = np.maximum(max_octave - octave, 0)
    mass = np.where(down < 48, (hist << 16) >> np.minimum(down, 47).astype(np.uint64), 0)
    cum = np.cumsum(mass.astype(np.float64))
    total = cum[-1]
    margin = (2.5e-4 * p * (1 - p) + 1e-6) * total if margin_pq else 1e-4 * total
    lo = max(p * total - margin, 1.0)
    hi = min(np.ceil(p * total + margin), total)
    b_lo = int(np.searchsorted(cum, lo))
    b_hi = int(np.searchsorted(cum, hi))
    if b_hi >= BINS - 1:
        return True, 0
    # pass 2, exact (float64 weights relative to the max)
    wm = np.exp2((x.astype(np.float64) - x.max()) * (np.log2(np.e) / T))
    z = wm.sum()
    need = p * z
    above = wm[b < b_lo].sum()
    in_band = (b >= b_lo) & (b <= b_hi)
    n = int(in_band.sum())
    if n > CAND_CAP:
        return True, n
    return not (above < need <= above + wm[in_band].sum()), n


def main():
    for margin_pq in (False, True):
        print("band margin:", "(2.5e-4 p (1 - p) + 1e-6) of the total" if margin_pq
              else "1e-4 of the total")
        print("rows  T     p      fallbacks  candidates mean / max")
        for kind in ("normal", "peaked"):
            for T in (0.3, 0.7, 1.0, 1.5, 3.0, 5.0):
                for p in (0.5, 0.9, 0.95, 0.99, 0.999):
                    falls, cands = 0, []
                    for _ in range(ROWS):
                        f, n = one_row(row_logits(kind), T, p, margin_pq)
                        falls += f
                        cands.append(n)
                    print(f"{kind:6s} {T:4.1f} {p:6.3f} {falls:3d}/{ROWS}  "
                          f"{np.mean(cands):8.0f} / {max(cands)}")


if __name__ == "__main__":
    main()
