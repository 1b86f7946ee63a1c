"""Model of one row of logprobs.cu, for checking its logic without a GPU.

Follows the kernel step by step: 8 parts x 8 warps, groups of 512 logits per warp (lane l holds
ids pos + i * 128 + 4 * l + k), the warp candidate buffers of logprobs_topn.cuh (float threshold in
the hot loop, pair threshold in WarpCompact, Finish's ranks), MergeRegions for the warps and the
parts, and the online (max, sum) per lane with four fp32 sums, combined lane -> warp -> CTA ->
parts as Combine() does. exp is float32 numpy exp, optionally perturbed by the documented __expf
error bound (2 + 1.16 |x| ulp, sign chosen at random) to see the worst case.

Prints, per row kind: whether the top-20 ids equal the exact ones, the largest buffer occupancy
(must stay <= 576), compaction rounds (all 64 warps), and the max |logprob error| against long
double over the top 20 and 2000 random tokens.
Usage: python3 logprobs_sim.py [vocab] [rows_per_kind]
"""
import sys

import numpy as np

PARTS, WARPS, VECS = 8, 8, 4
GROUP = 32 * 4 * VECS
COMPACT_ABOVE = 64
CAP = COMPACT_ABOVE + GROUP
TOP = 20
F32 = np.float32


def keys(x):
    b = x.astype(np.float32).view(np.uint32).copy()
    b[b == 0x80000000] = 0
    neg = (b & 0x80000000) != 0
    return np.where(neg, ~b, b | 0x80000000).astype(np.uint64)


def pairs(x, ids):
    return (keys(x) << np.uint64(32)) | (~ids.astype(np.uint64) & np.uint64(0xFFFFFFFF))


def pair_logit(p):
    k = np.uint32(int(p) >> 32)
    b = k ^ np.uint32(0x80000000) if k & 0x80000000 else ~k
    return np.array([b], dtype=np.uint32).view(np.float32)[0]


def jth_largest(lane_max, j):
    """WarpJthLargest: j-th largest of 32 lane pairs, 0 if fewer than j are non-zero."""
    srt = sorted((int(v) for v in lane_max), reverse=True)
    return srt[j - 1] if srt[j - 1] != 0 else 0


class WarpTop:
    def __init__(self):
        self.buf = []  # pairs, in slot order
        self.thr_logit = np.float32(np.nan)
        self.max_count = 0
        self.rounds = 0

    def compact(self, n):
        while len(self.buf) > COMPACT_ABOVE:
            self.rounds += 1
            lane_max = [0] * 32
            for i, p in enumerate(self.buf):
                lane_max[i % 32] = max(lane_max[i % 32], p)
            t = jth_largest(lane_max, n)
            assert t != 0
            self.buf = [p for p in self.buf if p >= t]
            self.thr_logit = pair_logit(t)

    def finish(self, n):
        self.compact(n)
        return sorted(self.buf, reverse=True)[:n]


def exp32(x, rng, worst):
    e = np.exp(x.astype(np.float32)).astype(np.float32)
    if worst:
        xd = x.astype(np.float64)
        ulps = np.where(np.isfinite(xd), 2.0 + 1.16 * np.abs(np.where(np.isfinite(xd), xd, 0)), 0)
        sign = rng.choice([-1.0, 1.0], size=x.shape)
        e = (e.astype(np.float64) * (1.0 + sign * ulps * 2.0 ** -24)).astype(np.float32)
    return e


def combine(m, s, m2, s2, rng, worst):
    mx = max(m, m2)
    ref = F32(0) if mx == -np.inf else F32(mx)
    a = exp32(np.array([F32(m) - ref]), rng, worst)[0]
    b = exp32(np.array([F32(m2) - ref]), rng, worst)[0]
    return mx, F32(F32(F32(s) * a) + F32(F32(s2) * b))


def stream_warp(x, begin, end, n, rng, worst):
    """One warp: per-lane (m, s) and its WarpTop."""
    m = np.full(32, -np.inf, dtype=np.float32)
    s = np.zeros((32, VECS), dtype=np.float32)
    top = WarpTop()
    lane = np.arange(32)
    for pos in range(begin, end, GROUP):
        ids = pos + np.arange(VECS)[None, :, None] * 128 + 4 * lane[:, None, None] + np.arange(4)
        ok = ids < end
        v = np.where(ok, x[np.minimum(ids, len(x) - 1)], -np.inf).astype(np.float32)
        gmax = v.reshape(32, -1).max(axis=1)
        up = gmax > m
        scale = exp32(np.where(up, m - np.where(up, gmax, 0), 0), rng, worst)
        s = np.where(up[:, None], (s * scale[:, None]).astype(np.float32), s)
        m = np.where(up, gmax, m)
        ref = np.where(m == -np.inf, 0, m).astype(np.float32)
        e = exp32(v - ref[:, None, None], rng, worst)
        s = (s + ((e[:, :, 0] + e[:, :, 1]) + (e[:, :, 2] + e[:, :, 3]))).astype(np.float32)
        if n > 0:
            want = ok & ~(v <= top.thr_logit)
            if want.any():
                # Append order: element (i, k) outer, lanes inner (the ballots).
                for i in range(VECS):
                    for k in range(4):
                        for l in range(32):
                            if want[l, i, k]:
                                top.buf.append(int(pairs(v[l, i, k:k + 1], ids[l, i, k:k + 1])[0]))
                top.max_count = max(top.max_count, len(top.buf))
                top.compact(n)
    s_lane = ((s[:, 0] + s[:, 1]) + (s[:, 2] + s[:, 3])).astype(np.float32)
    return m, s_lane, top


def butterfly(m, s, rng, worst):
    m, s = list(m), list(s)
    off = 16
    while off:
        nm, ns = m[:], s[:]
        for l in range(32):
            nm[l], ns[l] = combine(m[l], s[l], m[l ^ off], s[l ^ off], rng, worst)
        m, s = nm, ns
        off //= 2
    return m[0], s[0]


def simulate_row(x, n, rng, worst=False):
    vocab = len(x)
    part_len = ((vocab + PARTS - 1) // PARTS + 3) // 4 * 4
    warp_len = ((part_len + WARPS - 1) // WARPS + 3) // 4 * 4
    part_ms, part_tops, stats = [], [], [0, 0]
    for p in range(PARTS):
        pb = min(p * part_len, vocab)
        pe = min(pb + part_len, vocab)
        warp_ms, warp_tops = [], []
        for w in range(WARPS):
            b = min(pb + w * warp_len, pe)
            e = min(b + warp_len, pe)
            m, s, top = stream_warp(x, b, e, n, rng, worst)
            warp_ms.append(butterfly(m, s, rng, worst))
            stats[0] = max(stats[0], top.max_count)
            stats[1] += top.rounds
            if n > 0:
                warp_tops.append(top.finish(n))
        cm, cs = warp_ms[0]
        for wm, ws in warp_ms[1:]:
            cm, cs = combine(cm, cs, wm, ws, rng, worst)
        part_ms.append((cm, cs))
        if n > 0:
            part_tops.append(sorted(sum(warp_tops, []), reverse=True)[:n])
    m, s = part_ms[0]
    for pm, ps in part_ms[1:]:
        m, s = combine(m, s, pm, ps, rng, worst)
    row_top = sorted(sum(part_tops, []), reverse=True)[:n] if n > 0 else []
    ids = [int(~np.uint32(p & 0xFFFFFFFF)) for p in row_top]
    def logprob(v):
        return float(np.float32((np.float64(v) - np.float64(m)) - np.log(np.float64(s))))

    return ids, [logprob(pair_logit(p)) for p in row_top], logprob, stats


def exact_top(x, n):
    order = sorted(range(len(x)), key=lambda i: (-float(x[i]), i))
    xl = x.astype(np.longdouble)
    mx = xl.max()
    lse = mx + np.log(np.exp(xl - mx).sum())
    return order[:n], [float(xl[i] - lse) for i in order[:n]], lse


def make_row(kind, vocab, rng):
    i = np.arange(vocab)
    rows = {
        "normal3": lambda: rng.normal(0, 3, vocab),
        "uniform30": lambda: rng.uniform(-30, 30, vocab),
        "ties5": lambda: rng.integers(0, 5, vocab).astype(np.float64),
        "ascending": lambda: i * 1e-3,
        "descending": lambda: -i.astype(np.float64),
        "masked": lambda: np.where(i % 3 == 0, rng.normal(0, 3, vocab), -np.inf),
        "one_finite": lambda: np.where(i == vocab // 2, 1.5, -np.inf),
        "large": lambda: rng.uniform(-1e4, 1e4, vocab),
    }
    return rows[kind]().astype(np.float32)


def main():
    vocab = int(sys.argv[1]) if len(sys.argv) > 1 else 152064
    per_kind = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    rng = np.random.default_rng(1)
    for kind in ["normal3", "uniform30", "ties5", "ascending", "descending", "masked",
                 "one_finite", "large"]:
        for _ in range(per_kind):
            x = make_row(kind, vocab, rng)
            want_ids, want_lp, lse = exact_top(x, TOP)
            probe = rng.integers(0, vocab, 2000)  # sampled tokens: anywhere in the row
            for worst in (False, True):
                ids, lp, logprob, (max_count, rounds) = simulate_row(x, TOP, rng, worst)
                err = max((abs(a - b) for a, b in zip(lp, want_lp) if np.isfinite(b)), default=0)
                for t in probe:
                    if np.isfinite(x[t]):
                        err = max(err, abs(logprob(x[t]) - float(np.longdouble(x[t]) - lse)))
                print(f"{kind:10s} vocab {vocab} expf {'worst' if worst else 'f32  '}: top ids "
                      f"{'ok' if ids == want_ids else 'WRONG'}, max buffer {max_count} (cap {CAP})"
                      f", compaction rounds {rounds}, max |logprob err| {err:.3g}")
                assert ids == want_ids and max_count <= CAP


if __name__ == "__main__":
    main()
