"""PyTorch peer for kernels/bench/attention_bench: the same shapes through torch SDPA.

Decode: q [B, 32, 1, 128] against contiguous K/V [B, 8, L, 128] (enable_gqa), rotating over
several K/V copies (>= 256 MB) so L2 does not serve them. Prefill: causal, 32 heads (K/V
expanded to 32 heads), flash and cuDNN backends. Prints "PEER key=value ..." lines.
`attention_peer.py decode_tc`: decode only, at attention_bench decode_tc's shapes ([decode-tc]:
GQA group 4, and group 8 = 64 query heads), lines with group=.
Runs on the GPU machine with its own python3 (torch there); not part of the test suite.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

NQ, NKV, D = 32, 8, 128
DECODE = [(1, 1024), (1, 8192), (1, 32768), (8, 4096), (32, 4096), (32, 16384), (64, 4096),
          (64, 16384), (128, 4096), (256, 2048), (256, 1024)]
# attention_bench decode_tc's shapes: (batch, keys, GQA group).
DECODE_TC = [(1, 8192, 4), (8, 4096, 4), (32, 4096, 4), (64, 4096, 4), (128, 4096, 4),
             (64, 16384, 4), (256, 2048, 4), (256, 1024, 4), (256, 640, 4), (32, 4096, 8),
             (128, 4096, 8)]


def median_us(fn, inner, reps=15):
    for i in range(inner):
        fn(i)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        for i in range(inner):
            fn(i)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / inner)
    times.sort()
    return times[len(times) // 2]


def rand(*shape):
    return torch.rand(*shape, device="cuda", dtype=torch.bfloat16) * 2 - 1


def decode(batch, length, group=None):
    set_bytes = batch * length * NKV * D * 2 * 2
    sets = max(1, min(8, (256 << 20) // set_bytes + 1))
    ks = [rand(batch, NKV, length, D) for _ in range(sets)]
    vs = [rand(batch, NKV, length, D) for _ in range(sets)]
    q = rand(batch, NKV * group if group else NQ, 1, D)
    us = median_us(lambda i: F.scaled_dot_product_attention(q, ks[i % sets], vs[i % sets],
                                                            enable_gqa=True), max(sets, 10))
    label = f" group={group}" if group else ""
    print(f"PEER kernel=decode B={batch} L={length}{label} us={us:.2f} "
          f"TBps={set_bytes / us * 1e-6:.3f}", flush=True)
    del ks, vs


def prefill(length):
    q, k, v = rand(1, NQ, length, D), rand(1, NQ, length, D), rand(1, NQ, length, D)
    flops = 4.0 * length * length * D * NQ / 2
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                us = median_us(lambda i: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               3, 7)
            print(f"PEER kernel=prefill L={length} backend={name} us={us:.1f} "
                  f"TFLOPs={flops / us * 1e-6:.1f}", flush=True)
        except RuntimeError as e:  # a backend may be unavailable for this build
            print(f"PEER kernel=prefill L={length} backend={name} error={str(e)[:60]!r}")


def main():
    if sys.argv[1:] == ["decode_tc"]:  # gpu_run_fipeer.sh: [decode-tc]'s decode shapes only
        for batch, length, group in DECODE_TC:
            decode(batch, length, group)
        return
    if sys.argv[1:] == ["prefill"]:  # gpu_run_prefill.sh: the prefill shapes only
        for length in (4096, 16384):
            prefill(length)
        return
    for batch, length in DECODE:
        decode(batch, length)
    for length in (4096, 16384):
        prefill(length)


if __name__ == "__main__":
    main()
