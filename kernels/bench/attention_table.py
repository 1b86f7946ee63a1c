"""Joins attention_bench RESULT lines with attention_peer PEER lines into one short table."""
import sys


def parse(line):
    return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)


def main(path):
    ours, peers = [], {}
    for line in open(path):
        if line.startswith("RESULT"):
            ours.append(parse(line))
        elif line.startswith("PEER"):
            p = parse(line)
            key = (p["kernel"], p.get("B"), p.get("L"), p.get("backend", ""))
            peers[key] = p
    for r in ours:
        k = r["kernel"]
        if k == "ceiling":
            print(f"ceilings: copy {r['copy_TBps']} TB/s, cuBLAS bf16 GEMM {r['gemm_TFLOPs']} TFLOP/s")
        elif k == "decode":
            p = peers.get(("decode", r["B"], r["L"], ""), {})
            print(f"decode  B={r['B']:>3} L={r['L']:>5} page={r['page']:>3} ips={r.get('ips')}: {r['us']:>8} us "
                  f"{r['TBps']} TB/s ({r['frac_copy']} of copy); graph {r.get('graph_us', '-')} us "
                  f"(plain {r.get('graph_plain_us', '-')}); rope+attn {r.get('rope_pair_us', '-')} "
                  f"(plain {r.get('rope_pair_plain_us', '-')}) | SDPA {p.get('us', '-')} us")
        elif k == "prefill":
            f = peers.get(("prefill", None, r["L"], "flash"), {})
            c = peers.get(("prefill", None, r["L"], "cudnn"), {})
            print(f"prefill L={r['L']:>5}: {r['us']} us {r['TFLOPs']} TFLOP/s "
                  f"({r['frac_gemm']} of GEMM) | flash {f.get('TFLOPs', '-')} "
                  f"cudnn {c.get('TFLOPs', '-')} TFLOP/s")
        elif k == "rope_kv_store":
            print(f"rope_kv_store T={r['T']} qk_norm={r['qk_norm']}: {r['us']} us "
                  f"{r['TBps']} TB/s ({r['frac_copy']} of copy)")


if __name__ == "__main__":
    main(sys.argv[1])
