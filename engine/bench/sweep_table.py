#!/usr/bin/env python3
"""The table of a layout sweep (gpu_run_engine.sh sweep): one row per (workload, layout, rate)
from tandem-loadgen's -sweep.json files, then each layout's best goodput per workload.

    sweep_table.py --goodput "ttft:500 tpot:25" --workloads "prefill:2048:128:80:4,8 ..." \\
        RES/qwen3-8b-mixed-prefill-sweep.json ...

A file is named PRESET-LAYOUT-WORKLOAD-sweep.json; its points carry the layout as `label` and
the workload in `workload` (--metadata)."""
import argparse
import json
import os
import sys


def num(p, key, fmt="{:.1f}"):
    v = p.get(key)
    return "-" if v is None else fmt.format(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--goodput", required=True, help="the SLOs the sweeps ran with")
    ap.add_argument("--workloads", required=True, help="SWEEP_WORKLOADS")
    ap.add_argument("sweeps", nargs="*")
    a = ap.parse_args()
    order = [w.split(":")[0] for w in a.workloads.split()]
    shapes = {w.split(":")[0]: w.split(":") for w in a.workloads.split()}
    series = {}  # workload -> [(layout, points)]
    for path in a.sweeps:
        if not os.path.exists(path):  # an unmatched glob: nothing ran
            continue
        with open(path) as f:
            s = json.load(f)
        stem = os.path.basename(path)[: -len("-sweep.json")]
        workload = next((w for w in order if stem.endswith("-" + w)), None)
        if workload is None:
            print(f"{path}: workload not in SWEEP_WORKLOADS", file=sys.stderr)
            continue
        series.setdefault(workload, []).append((s.get("label", stem), s.get("points", [])))
    print(f"sweep: goodput SLOs (ms) {a.goodput}; TTFT / TPOT in ms, p50 / p99")
    if not series:
        print("sweep: no results")
        return 1
    for w in order:
        if w not in series:
            print(f"\n{w}: no results")
            continue
        _, inp, out, n, _ = shapes[w]
        print(f"\n{w} ({inp} in / {out} out, {n} prompts a point)")
        print("| layout | rate | done | failed | req/s | goodput | out tok/s | TTFT p50 / p99 "
              "| TPOT p50 / p99 | KV transfer (server mean) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        best = []
        for layout, points in series[w]:
            top = None
            for p in points:
                kv = (p.get("server_timing") or {}).get("mean_kv_transfer_ms")
                print(f"| {layout} | {num(p, 'sweep_value', '{:g}')} | {p.get('completed', '-')} "
                      f"| {p.get('failed', '-')} | {num(p, 'request_throughput', '{:.2f}')} "
                      f"| {num(p, 'request_goodput', '{:.2f}')} "
                      f"| {num(p, 'output_throughput', '{:.0f}')} "
                      f"| {num(p, 'median_ttft_ms')} / {num(p, 'p99_ttft_ms')} "
                      f"| {num(p, 'median_tpot_ms', '{:.2f}')} / {num(p, 'p99_tpot_ms', '{:.2f}')} "
                      f"| {'-' if kv is None else f'{kv:.2f} ms'} |")
                g = p.get("request_goodput")
                if g is not None and (top is None or g > top[0]):
                    top = (g, p.get("sweep_value"))
                if p.get("interrupted"):
                    print(f"| {layout} | (cut short: the points after this one did not run) |"
                          " | | | | | | | |")
            best.append((layout, top))
        for layout, top in best:
            if top is None:
                print(f"{w}: {layout}: no goodput measured")
            else:
                print(f"{w}: {layout}: best goodput {top[0]:.2f} req/s (at rate {top[1]:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
