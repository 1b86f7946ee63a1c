"""Joins attention_bench RESULT lines with the peers' PEER lines into one short table.

Usage: attention_table.py LOG [LOG...] (lines from all logs are read together). Peers: the PyTorch
SDPA lines of attention_peer.py, and FlashInfer's two decode paths from
kernels/bench/peers/flashinfer_peer (impl=flashinfer_tc|flashinfer_cc, keyed by B, L, page and
GQA group like tandem's decode rows; SDPA's by B, L and group, 4 when not given). With FlashInfer
lines present, a last table compares each decode shape at each implementation's best page size
([decode-tc]).
"""
import sys

FLASHINFER = ("flashinfer_tc", "flashinfer_cc")


def parse(line):
    return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)


def read(paths):
    ours, peers, fi = [], {}, {}
    for path in paths:
        for line in open(path):
            if line.startswith("RESULT"):
                ours.append(parse(line))
            elif line.startswith("PEER"):
                p = parse(line)
                if p.get("impl") in FLASHINFER:
                    fi[(p["impl"], p["B"], p["L"], p["page"], p["group"])] = p
                elif p["kernel"] == "decode":  # SDPA; lines without group= are group 4
                    peers[("decode", p.get("B"), p.get("L"), p.get("group", "4"))] = p
                else:
                    peers[(p["kernel"], p.get("B"), p.get("L"), p.get("backend", ""))] = p
    return ours, peers, fi


def fi_cell(p):
    if p is None:
        return "-"
    if "error" in p:
        return f"error={p['error']}"
    if p.get("check") != "ok":
        return f"check={p.get('check', '-')}"
    return f"{p.get('us', '-')} us (graph {p.get('graph_us', '-')})"


def decode_row(r, peers, fi):
    group = r.get("group", "4")
    p = peers.get(("decode", r["B"], r["L"], group), {})
    key = (r["B"], r["L"], r["page"], group)
    line = (f"decode  B={r['B']:>3} L={r['L']:>5} page={r['page']:>3} group={group} "
            f"ips={r.get('ips')}: {r['us']:>8} us "
            f"{r['TBps']} TB/s ({r['frac_copy']} of copy); graph {r.get('graph_us', '-')} us "
            f"(plain {r.get('graph_plain_us', '-')}); rope+attn {r.get('rope_pair_us', '-')} "
            f"(plain {r.get('rope_pair_plain_us', '-')}) | SDPA {p.get('us', '-')} us")
    if any((impl,) + key in fi for impl in FLASHINFER):
        line += (f" | FlashInfer TC {fi_cell(fi.get(('flashinfer_tc',) + key))}"
                 f" CC {fi_cell(fi.get(('flashinfer_cc',) + key))}")
    return line


def best(rows, field):
    """(value, page) of the smallest `field` among rows, or None."""
    vals = [(float(r[field]), r["page"]) for r in rows
            if field in r and r.get("check", "ok") == "ok" and float(r[field]) > 0]
    return min(vals) if vals else None


def comparison(ours, peers, fi):
    """Markdown table: per (B, L, group), each implementation at its best page size (back-to-back
    launches / graph replay; the ratio compares back-to-back launches)."""
    tandem = {}
    for r in ours:
        if r["kernel"] == "decode" and r.get("kv", "bf16") == "bf16":
            tandem.setdefault((r["B"], r["L"], r.get("group", "4")), []).append(r)
    shapes = sorted({k[1:3] + (k[4],) for k in fi}, key=lambda s: (int(s[2]), int(s[0]), int(s[1])))
    print("\n| B x L (group) | tandem us / graph us (page) | FlashInfer TC | FlashInfer CC | "
          "SDPA us | tandem / best peer |")
    print("| --- | --- | --- | --- | --- | --- |")
    for b, l, g in shapes:
        cells, peer_best = [], None
        t = tandem.get((b, l, g), [])
        tu, tg = best(t, "us"), best(t, "graph_us")
        cells.append(f"{tu[0]:.1f} / {tg[0]:.1f} ({tu[1]})" if tu and tg else "-")
        for impl in FLASHINFER:
            rows = [p for k, p in fi.items() if k[0] == impl and k[1:3] == (b, l) and k[4] == g]
            u, gr = best(rows, "us"), best(rows, "graph_us")
            cells.append(f"{u[0]:.1f} / {gr[0]:.1f} ({u[1]})" if u and gr else "-")
            if u:
                peer_best = u[0] if peer_best is None else min(peer_best, u[0])
        sdpa = peers.get(("decode", b, l, g), {}).get("us")
        cells.append(sdpa or "-")
        if sdpa:
            peer_best = float(sdpa) if peer_best is None else min(peer_best, float(sdpa))
        ratio = f"{tu[0] / peer_best:.3f}" if tu and peer_best else "-"
        print(f"| {b} x {l} ({g}) | " + " | ".join(cells) + f" | {ratio} |")


def main(paths):
    ours, peers, fi = read(paths)
    for r in ours:
        k = r["kernel"]
        if k == "ceiling":
            print(f"ceilings: copy {r['copy_TBps']} TB/s, cuBLAS bf16 GEMM {r['gemm_TFLOPs']} TFLOP/s")
        elif k == "decode":
            print(decode_row(r, peers, fi))
        elif k == "prefill":
            f = peers.get(("prefill", None, r["L"], "flash"), {})
            c = peers.get(("prefill", None, r["L"], "cudnn"), {})
            print(f"prefill L={r['L']:>5}: {r['us']} us {r['TFLOPs']} TFLOP/s "
                  f"({r['frac_gemm']} of GEMM) | flash {f.get('TFLOPs', '-')} "
                  f"cudnn {c.get('TFLOPs', '-')} TFLOP/s")
        elif k == "rope_kv_store":
            print(f"rope_kv_store T={r['T']} qk_norm={r['qk_norm']}: {r['us']} us "
                  f"{r['TBps']} TB/s ({r['frac_copy']} of copy)")
    if fi:
        comparison(ours, peers, fi)


if __name__ == "__main__":
    main(sys.argv[1:])
