#!/usr/bin/env python3
"""Per-kernel timeline of decode steps from a kernel_trace CSV (tools/gpu/kernel_trace).

A step starts at each launch of the kernel named by --step-kernel (the engine's first kernel of a
step: the unpack of the step's inputs, launched before the graph). Only steps replayed from a
CUDA graph (every kernel after the unpack has a graph id) are used, the last --steps of them. Kernels are grouped by (name, grid); for each group
the table gives, per step: how many launches, their summed duration, and the time they add to the
step's critical path, max(0, end_i - max over earlier kernels of end): a kernel that runs
entirely under its predecessor's tail adds nothing, and the idle time before a kernel (no kernel
running: launch latency) is charged to it and also shown on its own. The step's span is first start to last end; the gap between
steps (the host's part that is not hidden) is listed on its own.

  python3 tools/gpu/kernel_trace/step_timeline.py trace.csv [--steps 40] [--json out.json]
"""
import argparse
import csv
import json
import re
import statistics
import sys


def short_name(name):
    """The kernel's function name without namespaces or arguments, with its template arguments
    (which name the tile) shortened."""
    s = name.replace("(anonymous namespace)::", "")
    s = re.sub(r"\((?:unsigned )?(?:int|bool|long|char|short|[\w:]+::\w+)\)(?=[-\w])", "", s)
    s = re.sub(r"^void ", "", s)
    s = s.split("(", 1)[0]
    fn, _, tmpl = s.partition("<")
    fn = fn.split("::")[-1]
    tmpl = ("<" + tmpl) if tmpl else ""
    tmpl = re.sub(r"\b\w+::", "", tmpl)
    return fn + (tmpl if len(tmpl) <= 40 else tmpl[:37] + "...>")


def load(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["start"] = int(r["start_ns"])
        r["end"] = int(r["end_ns"])
        r["graph"] = int(r["graph_id"])
        r["short"] = short_name(r["name"])
    return rows


def split_steps(rows, step_kernel):
    steps, cur = [], None
    for r in rows:
        if step_kernel in r["name"]:
            if cur:
                steps.append(cur)
            cur = [r]
        elif cur is not None:
            cur.append(r)
    if cur:
        steps.append(cur)
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--step-kernel", default="UnpackKernel")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = load(args.trace)
    all_steps = split_steps(rows, args.step_kernel)
    # The delimiter itself (the unpack of the step's inputs) runs before the graph is replayed.
    graphed = [s for s in all_steps if len(s) > 1 and all(k["graph"] != 0 for k in s[1:])]
    # The last step of a run may be cut off by the process exit: drop steps shorter than most.
    if not graphed:
        sys.exit(f"no graph-replayed steps delimited by {args.step_kernel!r} in {args.trace}")
    # One graph (batch-size bucket) per table: the one replayed most often.
    g_mode = statistics.mode(s[1]["graph"] for s in graphed)
    graphed = [s for s in graphed if s[1]["graph"] == g_mode]
    n_mode = statistics.mode(len(s) for s in graphed)
    steps = [s for s in graphed if len(s) == n_mode][-args.steps:]
    spans, gaps_between, groups = [], [], {}
    for i, s in enumerate(steps):
        spans.append(s[-1]["end"] - s[0]["start"])
        nxt = all_steps.index(s) + 1
        if nxt < len(all_steps):
            gaps_between.append(all_steps[nxt][0]["start"] - s[-1]["end"])
        prev_end = None
        per_step = {}
        for k in s:
            key = (k["short"], int(k["grid"]))
            dur = k["end"] - k["start"]
            added = dur if prev_end is None else max(0, k["end"] - prev_end)
            idle = 0 if prev_end is None else max(0, k["start"] - prev_end)
            prev_end = k["end"] if prev_end is None else max(prev_end, k["end"])
            g = per_step.setdefault(key, [0, 0, 0, 0])
            g[0] += 1
            g[1] += dur
            g[2] += added
            g[3] += idle
        for key, vals in per_step.items():
            groups.setdefault(key, []).append(tuple(vals))
    span = statistics.median(spans)
    gap = statistics.median(gaps_between) if gaps_between else 0
    table = []
    for (name, grid), vals in groups.items():
        table.append({"kernel": name, "grid": grid, "launches": vals[0][0],
                      "us_sum": statistics.median(v[1] for v in vals) / 1e3,
                      "us_added": statistics.median(v[2] for v in vals) / 1e3,
                      "us_idle_before": statistics.median(v[3] for v in vals) / 1e3})
    table.sort(key=lambda t: -t["us_added"])
    print(f"{len(steps)} replays of graph {g_mode}, {n_mode} kernels each; span median {span / 1e3:.1f} us, "
          f"gap to the next step median {gap / 1e3:.1f} us, step period {(span + gap) / 1e3:.1f} us")
    print(f"{'kernel':<52} {'grid':>7} {'n':>4} {'us sum':>9} {'us added':>9} {'share':>6} "
          f"{'idle before':>11}")
    for t in table:
        print(f"{t['kernel']:<52} {t['grid']:>7} {t['launches']:>4} {t['us_sum']:>9.1f} "
              f"{t['us_added']:>9.1f} {100 * t['us_added'] * 1e3 / span:>5.1f}% "
              f"{t['us_idle_before']:>11.1f}")
    total_dur = sum(t["us_sum"] for t in table)
    print(f"sum of kernel durations {total_dur:.1f} us = {100 * total_dur * 1e3 / span:.1f}% of the "
          f"span (above 100%: kernels overlap)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": len(steps), "span_us": span / 1e3, "gap_us": gap / 1e3,
                       "kernels": table}, f, indent=1)


if __name__ == "__main__":
    main()
