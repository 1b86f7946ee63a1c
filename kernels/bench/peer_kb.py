"""PyTorch peer for kb_bench: the same shapes through torch (cuBLAS matmul, eager elementwise,
HF-style sampling), timed with CUDA events (median after warm-up, inputs rotated beyond L2).
Writes JSON lines {"kernel", "shape", "us"} to argv[1]. Runs on the GPU machine only."""
import json
import sys

import torch

import peer_sampling  # the sampling rows (HF warpers)
from peer_timing import copies, median_us

dev = "cuda"
out = open(sys.argv[1], "w")


def emit(kernel, shape, us):
    out.write(json.dumps({"kernel": kernel, "shape": shape, "us": us}) + "\n")
    out.flush()
    print(f"peer {kernel:28s} {shape:34s} {us:10.2f} us")


CHAIN = 32  # GEMMs per graph, as kb_bench's kChainLength


def chain_us(fn):
    """Time per call of fn(0..CHAIN-1) captured once into a torch.cuda.CUDAGraph and replayed
    (median over replays / CHAIN), as kb_bench's gemm.chain rows."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside capture (cuBLAS handle and workspace)
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(CHAIN):
            fn(i)
    return median_us(lambda i: g.replay()) / CHAIN


for k, n in [(4096, 24576), (12288, 4096), (4096, 6144), (4096, 4096)]:
    # The per-call rows rotate nc copies (>= 3x L2); the chain at least two, so that it never
    # reads the same weights twice in a row.
    nc = copies(n * k * 2)
    ws = [torch.empty(n, k, device=dev, dtype=torch.bfloat16).uniform_(-0.05, 0.05)
          for _ in range(max(2, nc))]
    for m in [1, 4, 8, 16, 32]:
        a = torch.empty(m, k, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
        emit("gemm", f"M={m} K={k} N={n}",
             median_us(lambda i: torch.matmul(a, ws[i % nc].t()), iters=50))
    a = torch.empty(1, k, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
    try:  # a failed capture must not cost the peer rows after it
        emit("gemm.chain", f"M=1 K={k} N={n}",
             chain_us(lambda i: torch.matmul(a, ws[i % len(ws)].t())))
    except RuntimeError as e:
        print(f"peer gemm.chain M=1 K={k} N={n}: not timed: {e}", file=sys.stderr)
    del ws

H, I, V = 4096, 12288, 152064
for t in [1, 32, 16384]:
    x = torch.empty(t, H, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
    res = torch.empty_like(x).uniform_(-1, 1)
    w = torch.empty(H, device=dev, dtype=torch.bfloat16).uniform_(0.5, 1.5)

    def hf_add_rmsnorm(i):  # Hugging Face eager: add, then LlamaRMSNorm
        h = x + res
        hf = h.float()
        var = hf.pow(2).mean(-1, keepdim=True)
        return w * (hf * torch.rsqrt(var + 1e-6)).to(torch.bfloat16)

    emit("rmsnorm.fused_residual", f"T={t} H={H}", median_us(hf_add_rmsnorm))
    emit("rmsnorm.torch_rms_norm", f"T={t} H={H}",
         median_us(lambda i: torch.nn.functional.rms_norm(x + res, (H,), w, 1e-6)))
    gu = torch.empty(t, 2 * I, device=dev, dtype=torch.bfloat16).uniform_(-4, 4)
    emit("silu_mul", f"T={t} I={I}",
         median_us(lambda i: torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]))
    table = torch.empty(V, H, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
    ids = (torch.arange(t, device=dev) * 7919) % V
    emit("embedding", f"T={t} H={H}",
         median_us(lambda i: torch.nn.functional.embedding(ids, table)))
    del table, gu, x, res


peer_sampling.run(emit, median_us, copies, V)
