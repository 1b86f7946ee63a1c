#!/usr/bin/env python3
"""One decode step's kernels from an ncu CSV (gpu__time_duration.sum of every kernel node of
graph-replayed steps, engine/bench/gpu_run_engine.sh). A step starts with the Unpack kernel (its
inputs land on the device), so the kernels from one Unpack launch to the next are one step.
Prints the step's kernel count and summed duration, then per kernel and grid: launches, total
microseconds and share of the step, largest first.

When the capture holds a single Unpack, pass the step's kernel count (--step-kernels L): the
kernels after the Unpack are the step's first ones and the rest are taken from the end of the
previous step, which replayed the same graph (the same kernels in the same order).

  python3 engine/bench/ncu_step_table.py ncu.csv [--step-kernels L]
"""
import csv
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    name = re.sub(r"^void ", "", name)
    base = name.split("(")[0]
    return base.replace("tandem::", "")[:70]


def main():
    rows = []
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        ns = value * {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6}.get(unit, 1)
        rows.append((r["Kernel Name"], r.get("Grid Size", ""), ns))
    marks = [i for i, (n, _, _) in enumerate(rows) if "UnpackKernel" in n]
    length = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--step-kernels" else 0
    if len(marks) >= 2:
        step = rows[marks[0]:marks[1]]
    elif len(marks) == 1 and length:
        head = rows[marks[0]:marks[0] + length]
        missing = length - len(head)
        if missing > marks[0]:
            print(f"ncu: {len(rows)} kernels hold less than one step of {length}")
            return
        step = head + rows[marks[0] - missing:marks[0]]
    else:
        print(f"ncu: {len(rows)} kernels, {len(marks)} Unpack launches: no whole step "
              "(capture two steps, or pass --step-kernels)")
        return
    total = sum(ns for _, _, ns in step)
    print(f"ncu, one graph-replayed decode step: {len(step)} kernels, {total / 1e3:.1f} us "
          "summed (each kernel alone: no launch overlap)")
    groups = defaultdict(lambda: [0, 0.0])
    for name, grid, ns in step:
        g = groups[(short(name), grid)]
        g[0] += 1
        g[1] += ns
    for (name, grid), (count, ns) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:70s} {grid:>14s} {count:4d} x {ns / 1e3:9.1f} us {100 * ns / total:5.1f}%")


if __name__ == "__main__":
    main()
