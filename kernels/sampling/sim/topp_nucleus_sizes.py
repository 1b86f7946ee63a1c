# How large the top-p nucleus is, and how far below the max its threshold lies, for the bench's
# N(0, 3^2) rows and for LLM-like rows (a N(0, 2^2) background with 40 strong tokens, 8-16 logits
# above it: the "peaked" rows of topp_two_pass.py), WORKLOG.md session 10. Exact, in float64.
# Usage: .venv/bin/python kernels/sampling/sim/topp_nucleus_sizes.py
import numpy as np

from rows import normal, peaked


def main():
    rng = np.random.default_rng(3)
    for name, gen in (("N(0, 3^2)", normal), ("peaked", peaked)):
        for T in (0.7, 1.0):
            for p in (0.5, 0.9, 0.95, 0.99):
                sizes, depths = [], []
                for _ in range(20):
                    t = np.sort((gen(rng) / T) * np.log2(np.e))[::-1]  # log2 weights, descending
                    t -= t[0]
                    cum = np.cumsum(np.exp2(t))
                    last = int(np.searchsorted(cum, p * cum[-1]))
                    sizes.append(last + 1)
                    depths.append(-t[last])
                print(f"{name} T={T} p={p}: nucleus median {int(np.median(sizes))}, max {max(sizes)}; "
                      f"threshold {np.median(depths):.1f} octaves below the max (max "
                      f"{max(depths):.1f})")


if __name__ == "__main__":
    main()
