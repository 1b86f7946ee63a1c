#!/usr/bin/env python3
"""Compact per-instruction view of an ncu source page exported as CSV (--page source --csv
--print-source sass): for every executed SASS instruction its address, warp-level executions,
stall samples (share of the kernel's) and the three largest stall reasons, then the hottest 40.
Usage: ncu_sass_summary.py <sass.csv>  (prints to stdout)."""
import csv
import sys


def main(path):
    rows = list(csv.reader(open(path, errors="replace")))
    hdr_i = next((i for i, r in enumerate(rows) if any("Stall Sampling (All" in c for c in r)), None)
    if hdr_i is None:
        print("no stall-sampling header in", path)
        return
    hdr = rows[hdr_i]
    col = {name: i for i, name in enumerate(hdr)}
    samp = col["Warp Stall Sampling (All Samples)"]
    execd = col.get("Instructions Executed")
    src = col.get("Source", 1)
    addr = col.get("Address", 0)
    stalls = [i for i, c in enumerate(hdr) if c.startswith("stall_")]
    data = []
    for r in rows[hdr_i + 1:]:
        try:
            s = float(r[samp] or 0)
            e = float(r[execd] or 0) if execd is not None else 0.0
        except (ValueError, IndexError):
            continue
        st = []
        for i in stalls:
            try:
                v = float(r[i] or 0)
            except (ValueError, IndexError):
                v = 0.0
            if v > 0:
                st.append((v, hdr[i][6:]))
        st.sort(reverse=True)
        data.append((r[addr][-5:], e, s, st[:3], r[src].strip()))
    tot = sum(d[2] for d in data) or 1.0
    tot_e = sum(d[1] for d in data) or 1.0
    print(f"instructions {len(data)}, executed {tot_e:.0f}, samples {tot:.0f}")
    by_reason = {}
    for i in stalls:
        v = 0.0
        for r in rows[hdr_i + 1:]:
            try:
                v += float(r[i] or 0)
            except (ValueError, IndexError):
                pass
        by_reason[hdr[i][6:]] = v
    print("stall reasons:", ", ".join(f"{k} {100 * v / tot:.1f}%" for k, v in
                                       sorted(by_reason.items(), key=lambda kv: -kv[1])[:10]))
    print("== hottest 40")
    for a, e, s, st, text in sorted(data, key=lambda d: -d[2])[:40]:
        print(f"{a} {100 * s / tot:5.2f}% exec {e:9.0f} {text[:60]:60s} " +
              " ".join(f"{n}:{100 * v / tot:.1f}" for v, n in st))
    print("== all executed instructions (address, executions, sample %, top stalls, SASS)")
    for a, e, s, st, text in data:
        if e > 0 or s > 0:
            print(f"{a} {e:9.0f} {100 * s / tot:5.2f}% {text[:70]:70s} " +
                  " ".join(f"{n}:{100 * v / tot:.1f}" for v, n in st))


if __name__ == "__main__":
    main(sys.argv[1])
