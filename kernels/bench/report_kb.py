"""Merges kb_bench.jsonl and kb_peer.jsonl into the final table (printed last by gpu_run_kb.sh).
A row's peer is the peer row of the same kernel and shape, else that of its family, the kernel
name less its last dotted part (gemm.chain.skinny_pdl -> gemm.chain, gemm.skinny -> gemm)."""
import json
import sys

ours = [json.loads(l) for l in open(sys.argv[1])]
peer = {}
for l in open(sys.argv[2]):
    r = json.loads(l)
    peer[(r["kernel"], r["shape"])] = r["us"]
print(f"{'kernel':26s} {'shape':26s} {'us':>9s} {'achieved':>14s} {'of ceil':>8s} {'torch us':>9s}")
for r in ours:
    p = peer.get((r["kernel"], r["shape"]))
    if p is None and "." in r["kernel"]:
        p = peer.get((r["kernel"].rsplit(".", 1)[0], r["shape"]))
    ceil = f"{100 * r['achieved'] / r['ceiling']:7.1f}%" if r["ceiling"] < 1e100 else "       -"
    print(f"{r['kernel']:26s} {r['shape']:26s} {r['us']:9.2f} {r['achieved']:8.3f} "
          f"{r['unit']:6s}{ceil} {p if p is None else round(p, 2)!s:>9s}")
