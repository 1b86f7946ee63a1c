#!/usr/bin/env python3
"""Parsing for engine/bench/runs/gpu_run_multi.sh (standard library only: it runs on the GPU
machine's python3 and here).

  compare A.json B.json          two `tandem-loadgen --save-detailed` results of the same
                                 prompts: how many outputs are identical, the first that differ
  metrics FILE...                worker /metrics snapshots ("# worker NAME" headers) -> one JSON
                                 object per worker of the series the script reads
  pages FILE                     the pages every worker holds (reserved, owned) and the total
  kvdelta BEFORE AFTER           the prefill workers' KV transfer between two snapshots: count,
                                 bytes, span, exposed time, prefill time, the paths, failures
  opgap LOG...                   `op profile` tables (TANDEM_OP_PROFILE): per batch size, the
                                 median of (span - ops), the time of a profiled eager step that no
                                 op covers: on a TP group the all-reduces (and launch gaps)
  loadgen JSON                   completed / failed (by cause) of one loadgen result
"""
import json
import re
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def compare(a_path, b_path):
    a, b = load(a_path), load(b_path)
    ta, tb = a.get("generated_texts") or [], b.get("generated_texts") or []
    la, lb = a.get("output_lens") or [], b.get("output_lens") or []
    n = min(len(ta), len(tb))
    same = sum(1 for i in range(n) if ta[i] == tb[i] and (not la or not lb or la[i] == lb[i]))
    diff = [i for i in range(n) if ta[i] != tb[i]]
    # Where the first differing outputs part (characters in common).
    parts = []
    for i in diff[:4]:
        k = 0
        while k < min(len(ta[i]), len(tb[i])) and ta[i][k] == tb[i][k]:
            k += 1
        parts.append(f"#{i} after {k} chars")
    failed = (a.get("failed", 0), b.get("failed", 0))
    print(f"{same} of {n} outputs identical (of {len(ta)} / {len(tb)} sent; failed {failed[0]} / "
          f"{failed[1]}){'; differ: ' + ', '.join(parts) if parts else ''}")
    return 0 if n > 0 and same == n and failed == (0, 0) else 1


SERIES = re.compile(r'^(tandem[_:][a-z_:]+?)(?:\{([^}]*)\})? ([-+0-9.eE]+|NaN|[+-]Inf)$')


def parse_snapshots(paths):
    """{worker: {name or name{label=value}: value}} from files of `# worker NAME` + metrics."""
    out = {}
    for path in paths:
        worker = None
        for line in open(path):
            line = line.rstrip("\n")
            if line.startswith("# worker "):
                worker = line.split()[2]
                out.setdefault(worker, {})
                continue
            m = SERIES.match(line)
            if not m or worker is None:
                continue
            name, labels, value = m.group(1), m.group(2) or "", m.group(3)
            if name.endswith("_bucket"):
                continue
            keep = [kv for kv in labels.split(",") if kv.split("=")[0] in ("path", "reason", "le")]
            key = name + ("{" + ",".join(keep) + "}" if keep else "")
            out[worker][key] = out[worker].get(key, 0.0) + float(value)
    return out


def pages(path):
    snap = parse_snapshots([path])
    total = 0
    parts = []
    for w, s in sorted(snap.items()):
        r = int(s.get("tandem_worker_kv_pages_reserved", 0))
        o = int(s.get("tandem_worker_kv_pages_owned", 0))
        live = int(s.get("tandem_worker_live_requests", 0))
        total += r + o
        parts.append(f"{w} reserved {r} owned {o} live {live}")
    print(f"pages held {total}: " + "; ".join(parts) if parts else "pages held ?: no worker scraped")
    return 0 if parts and total == 0 else 1


def kvdelta(before, after):
    a, b = parse_snapshots([before]), parse_snapshots([after])
    for w in sorted(b):
        if not w.startswith("prefill"):
            continue
        d = {k: b[w][k] - a.get(w, {}).get(k, 0.0) for k in b[w]}
        n = d.get("tandem_worker_kv_send_seconds_count", 0)
        if n <= 0:
            print(f"{w}: no KV transfer between the snapshots")
            continue
        byts = d.get("tandem_worker_kv_send_bytes_sum", 0)
        span = d.get("tandem_worker_kv_send_seconds_sum", 0)
        exp_n = d.get("tandem_worker_kv_send_exposed_seconds_count", 0)
        exposed = d.get("tandem_worker_kv_send_exposed_seconds_sum", 0)
        pn = d.get("tandem_worker_prefill_time_seconds_count", 0)
        pre = d.get("tandem_worker_prefill_time_seconds_sum", 0)
        paths = {k.split('path="')[1].rstrip('"}'): int(v) for k, v in d.items()
                 if k.startswith("tandem_worker_kv_send_transfers_total{") and v > 0}
        fails = {k.split('reason="')[1].rstrip('"}'): int(v) for k, v in d.items()
                 if k.startswith("tandem_worker_kv_send_failures_total{") and v > 0}
        mean_pre = pre / pn if pn else 0
        mean_exp = exposed / exp_n if exp_n else 0
        print(f"{w}: {int(n)} transfers, {byts / n / 1e6:.1f} MB each, span {1e3 * span / n:.3f} ms"
              f" = {byts / span / 1e9 if span else 0:.3f} GB/s (first byte to ack), exposed "
              f"{1e3 * mean_exp:.3f} ms = {100 * mean_exp / mean_pre if mean_pre else 0:.2f}% of "
              f"the prefill ({1e3 * mean_pre:.2f} ms mean); paths {paths or '-'}; failures "
              f"{fails or 0}")
    return 0


def opgap(paths):
    head = re.compile(r"op profile of step \d+ \((\d+) sequences, eager\): ops ([0-9.]+) us of a "
                      r"([0-9.]+) us span")
    gaps = {}
    for path in paths:
        for line in open(path, errors="replace"):
            m = head.search(line)
            if m:
                gaps.setdefault(int(m.group(1)), []).append(float(m.group(3)) - float(m.group(2)))
    if not gaps:
        print("no op profile tables")
        return 1
    print("; ".join(f"B={b}: span - ops {statistics.median(v):.1f} us (median of {len(v)} tables)"
                    for b, v in sorted(gaps.items())))
    return 0


def loadgen(path):
    try:
        r = load(path)
    except (OSError, ValueError) as e:
        print(f"no result ({e.__class__.__name__})")
        return 1
    causes = r.get("failed_by_cause") or {}
    print(f"completed {r.get('completed', 0)} failed {r.get('failed', 0)}"
          f"{' ' + json.dumps(causes, separators=(',', ':')) if causes else ''}"
          f"{' interrupted' if r.get('interrupted') else ''}")
    return 0


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    cmd, args = argv[1], argv[2:]
    if cmd == "compare":
        return compare(*args)
    if cmd == "metrics":
        print(json.dumps(parse_snapshots(args), indent=1, sort_keys=True))
        return 0
    if cmd == "pages":
        return pages(*args)
    if cmd == "kvdelta":
        return kvdelta(*args)
    if cmd == "opgap":
        return opgap(args)
    if cmd == "loadgen":
        return loadgen(*args)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
