# A one-pass top-p by an exponential race (vLLM's draw: the winner is argmin over the kept tokens
# of E_i / w_i, E_i ~ Exp(1) from a per-token hash), WORKLOG.md session 10. Whatever the threshold
# turns out to be, the winner among the surely kept tokens lies on the Pareto frontier of
# (weight high, ratio r = E / w low) that each thread can keep over its own logits in one pass.
# This counts, per logit, how often a thread's cheap prefilter lets a logit through (a new maximum
# weight; a ratio below the frontier's best; a weight between the frontier's extremes with a ratio
# below its heaviest entry's) and how often it really enters the frontier (every such event is a
# divergent branch in the kernel), and the largest frontier a thread holds.
# Rows: N(0, sigma^2) logits at T = 1, the row-pipelined kernel's layout (thread t holds logits
# 4 (t + 256 j) .. + 3: 594 logits of a 152064-logit row).
# Usage: .venv/bin/python kernels/sampling/sim/topp_race_frontier.py
import numpy as np

V = 152064
THREADS = 256
rng = np.random.default_rng(1)


def one_row(sigma, stats):
    x = rng.normal(0, sigma, V)
    w = np.exp(x - x.max())
    e = rng.exponential(size=V)
    owner = (np.arange(V) // 4) % THREADS
    for t in range(THREADS):
        frontier = []  # (w, r), by weight descending (ratios descending too)
        for i in np.nonzero(owner == t)[0]:
            wi, ri = w[i], e[i] / w[i]
            stats["logits"] += 1
            if frontier:
                w_top, r_top = frontier[0]
                w_low, r_low = frontier[-1]
                if wi > w_top:
                    stats["new max"] += 1
                elif ri < r_low:
                    stats["beats best ratio"] += 1
                elif wi > w_low and ri < r_top:
                    stats["between"] += 1
                else:
                    continue  # dominated: no branch taken
            if any(wj >= wi and rj <= ri for wj, rj in frontier):
                continue
            stats["inserted"] += 1
            frontier = [(wj, rj) for wj, rj in frontier if not (wj <= wi and rj >= ri)]
            frontier.append((wi, ri))
            frontier.sort(key=lambda f: -f[0])
            stats["largest frontier"] = max(stats["largest frontier"], len(frontier))


for sigma in (1.0, 3.0, 6.0):
    stats = dict.fromkeys(
        ["logits", "new max", "beats best ratio", "between", "inserted", "largest frontier"], 0)
    for _ in range(2):
        one_row(sigma, stats)
    n = stats.pop("logits")
    largest = stats.pop("largest frontier")
    print(f"N(0, {sigma:g}^2): " + ", ".join(f"{k} {100 * v / n:.2f}%" for k, v in stats.items()) +
          f" of logits; largest frontier {largest}")
