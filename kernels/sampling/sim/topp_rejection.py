"""Top-p rows drawn by rejection (sampling.h, step 5; the row-pipelined kernel's TopPDrawAttempts):
how often a draw needs the exact threshold, i.e. a second read of the row.

A draw from the whole distribution is kept when the histogram of pass 1 (32 bins per octave of
weight) puts it above the top-p bin, dropped below it; in that bin it is decided only when the
bin's other logits cannot move the mass above it across top_p * z (TopPResolveInBand: the bin
holds little besides it). Per row kind and (T, p), over 24 rows: the share of the mass in the
top-p bin, the probability that a draw is undecided, the expected draws per row, the probability
that a row needs pass 2 (an undecided draw before a kept one, or kTopPAttempts = 32 dropped ones)
and that a batch of 256 such rows has at least one (the kernel then waits for that row's second
read). The kernel's margin (2.5e-4 p (1 - p) + 1e-6 of z) is applied as it is there.
Usage: python3 topp_rejection.py"""
import numpy as np

from rows import normal, peaked

BINS_PER_OCTAVE = 32
ATTEMPTS = 32
BATCH = 256


def row_stats(x, t, p):
    w = np.exp2((x - x.max()) * (1.4426950408889634 / t)).astype(np.float32).astype(np.float64)
    z = w.sum()
    order = np.argsort(-w, kind="stable")
    cum = np.cumsum(w[order])
    target = p * z
    tau = w[order][np.searchsorted(cum, target)]
    kept = w >= tau
    p_kept = w[kept].sum() / z
    bins = np.floor(-np.log2(np.maximum(w, 1e-300)) * BINS_PER_OCTAVE)
    b_star = np.floor(-np.log2(tau) * BINS_PER_OCTAVE)
    in_bin = bins == b_star
    above = w[bins < b_star].sum()
    bin_mass = w[in_bin].sum()
    margin = (2.5e-4 * p * (1 - p) + 1e-6) * z
    wj = w[in_bin]
    decided = (above + (bin_mass - wj) < target - margin) | (above >= target + margin)
    p_undecided = wj[~decided].sum() / z
    p_in_bin = bin_mass / z
    p_out = 1.0 - p_kept - (p_undecided - wj[~decided & kept[in_bin]].sum() / z)
    # draws end at the first decided-kept one; an undecided one before it sends the row to pass 2
    p_sure_kept = p_kept - wj[~decided & kept[in_bin]].sum() / z
    p_row_pass2 = p_undecided / max(p_undecided + p_sure_kept, 1e-300) * (1 - p_out**ATTEMPTS)
    p_row_pass2 += p_out**ATTEMPTS
    draws = (1 - p_out**ATTEMPTS) / max(1 - p_out, 1e-300)
    return p_in_bin, p_undecided, draws, p_row_pass2


def main():
    rng = np.random.default_rng(13)
    print("| rows | T | p | top-p bin's mass | undecided per draw | draws per row | row needs pass 2 "
          "| batch of 256 with one |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind, gen in (("N(0, 3^2)", normal), ("LLM-like", peaked)):
        for t, p in ((1.0, 0.95), (1.0, 0.99), (1.0, 0.999), (0.7, 0.9), (1.0, 0.5), (1.5, 0.95)):
            s = np.array([row_stats(gen(rng), t, p) for _ in range(24)])
            row = s[:, 3].mean()
            batch = 1 - (1 - row)**BATCH
            print(f"| {kind} | {t} | {p} | {s[:, 0].mean():.2e} | {s[:, 1].mean():.2e} | "
                  f"{s[:, 2].mean():.2f} | {row:.2e} | {batch:.1%} |")


if __name__ == "__main__":
    main()
