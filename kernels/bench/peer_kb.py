"""PyTorch peer for kb_bench: the same shapes through torch (cuBLAS matmul, eager elementwise,
HF-style sampling), timed with CUDA events (median after warm-up, inputs rotated beyond L2).
Writes JSON lines {"kernel", "shape", "us"} to argv[1]. Runs on the GPU machine only."""
import json
import sys

import torch

L2 = 60 * 2**20
dev = "cuda"


def median_us(fn, iters=30, warmup=5):
    for i in range(warmup):
        fn(i)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(warmup + i)
        ends[i].record()
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return t[iters // 2] * 1e3


def copies(nbytes):
    return max(1, -(-3 * L2 // nbytes))


out = open(sys.argv[1], "w")


def emit(kernel, shape, us):
    out.write(json.dumps({"kernel": kernel, "shape": shape, "us": us}) + "\n")
    out.flush()
    print(f"peer {kernel:28s} {shape:34s} {us:10.2f} us")


for k, n in [(4096, 24576), (12288, 4096), (4096, 6144), (4096, 4096)]:
    ws = [torch.empty(n, k, device=dev, dtype=torch.bfloat16).uniform_(-0.05, 0.05)
          for _ in range(copies(n * k * 2))]
    for m in [1, 4, 8, 16, 32]:
        a = torch.empty(m, k, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
        emit("gemm", f"M={m} K={k} N={n}",
             median_us(lambda i: torch.matmul(a, ws[i % len(ws)].t()), iters=50))
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


def hf_sample(logits, temperature, top_k, top_p):
    """Hugging Face's warpers (temperature, top-k, top-p with a full sort) + multinomial."""
    if temperature == 0:
        return logits.argmax(-1)
    s = logits / temperature
    if top_k > 0:
        kth = torch.topk(s, top_k, dim=-1).values[..., -1, None]
        s = s.masked_fill(s < kth, -float("inf"))
    if top_p < 1:
        sorted_logits, idx = torch.sort(s, descending=False, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        remove = cum <= (1 - top_p)
        remove[..., -1:] = False
        s = s.masked_fill(remove.scatter(-1, idx, remove), -float("inf"))
    return torch.multinomial(s.softmax(-1), 1)


modes = [("greedy", 0, 0, 1.0), ("temp0.7", 0.7, 0, 1.0), ("topk50_topp0.9", 0.7, 50, 0.9),
         ("topp0.95", 1.0, 0, 0.95)]
for b in [1, 32, 256]:
    ls = [torch.randn(b, V, device=dev) * 3 for _ in range(copies(b * V * 4))]
    for name, t, k, p in modes:
        emit(f"sampling.{name}", f"B={b} V={V}",
             median_us(lambda i: hf_sample(ls[i % len(ls)], t, k, p)))
    del ls
