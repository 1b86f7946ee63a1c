"""PyTorch peer for kb_bench's fp8 section (fp8_bench.cc): the same Llama-3-8B shapes and M
through torch._scaled_mm (cuBLASLt FP8 on Hopper) with the same scale layouts, under the same row
names so that report_kb.py puts them side by side:
  fp8.channel.gemm       _scaled_mm, rowwise scales: a [M, 1] per token, w [1, N] per channel;
  fp8.channel.act_quant  the per-token e4m3 quantization in eager torch (amax, divide, cast);
  fp8.channel.total      both;
  fp8.block.gemm         _scaled_mm with 1x128 activation and 128x128 weight block scales,
                         where this torch supports it (otherwise a line says why, no row);
  fp8.block.act_quant / fp8.block.total  likewise with per-token-group(128) quantization;
  fp8.bf16_cublaslt      torch.matmul in bf16 (cuBLAS).
Writes JSON lines {"kernel", "shape", "us"} to argv[1]. Runs on the GPU machine only."""
import json
import sys

import torch

from peer_timing import copies, median_us

dev = "cuda"
out = open(sys.argv[1], "w")
E4M3 = torch.float8_e4m3fn
FP8_MAX = 448.0


def emit(kernel, shape, us):
    out.write(json.dumps({"kernel": kernel, "shape": shape, "us": us}) + "\n")
    out.flush()
    print(f"peer {kernel:24s} {shape:28s} {us:10.2f} us")


def timed(kernel, shape, fn, iters):
    """emit(kernel, shape, median of fn); a call torch refuses is printed, not fatal."""
    try:
        emit(kernel, shape, median_us(fn, iters=iters))
    except RuntimeError as e:
        print(f"peer {kernel} {shape}: not timed: {str(e).splitlines()[0]}", file=sys.stderr)


def quant_rowwise(a):
    amax = a.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / FP8_MAX
    return (a.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(E4M3), scale


def quant_groupwise(a):
    m, k = a.shape
    g = a.float().view(m, k // 128, 128)
    scale = g.abs().amax(dim=2, keepdim=True).clamp(min=1e-12) / FP8_MAX
    q = (g / scale).clamp(-FP8_MAX, FP8_MAX).to(E4M3).view(m, k)
    # _scaled_mm's 1x128 layout: [M, K/128] with M contiguous (stride (1, M)).
    return q, scale.view(m, k // 128).t().contiguous().t()


SHAPES = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (4096, 128256)]  # + lm_head
MS = [1, 8, 32, 128, 512, 2048, 8192]
block_note = None
for k, n in SHAPES:
    nc = copies(n * k)
    ws = [torch.randn(n, k, device=dev).to(E4M3) for _ in range(nc)]
    sw = torch.rand(1, n, device=dev) * 0.01 + 0.001
    # 128x128 weight blocks: scale_b (K/128, N/128) with stride (1, K/128).
    sb = (torch.rand(n // 128, k // 128, device=dev) * 0.01 + 0.001).t()
    nb = copies(n * k * 2)
    wbf = [torch.empty(n, k, device=dev, dtype=torch.bfloat16).uniform_(-0.05, 0.05)
           for _ in range(nb)]
    for m in MS:
        shape = f"M={m} K={k} N={n}"
        iters = 20 if m >= 2048 else 50
        a = torch.empty(m, k, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
        timed("fp8.bf16_cublaslt", shape, lambda i: torch.matmul(a, wbf[i % nb].t()), iters)
        qa, sa = quant_rowwise(a)
        timed("fp8.channel.act_quant", shape, lambda i: quant_rowwise(a), iters)
        timed("fp8.channel.gemm", shape,
              lambda i: torch._scaled_mm(qa, ws[i % nc].t(), scale_a=sa, scale_b=sw,
                                         out_dtype=torch.bfloat16), iters)

        def channel_total(i):
            q, s = quant_rowwise(a)
            return torch._scaled_mm(q, ws[i % nc].t(), scale_a=s, scale_b=sw,
                                    out_dtype=torch.bfloat16)

        timed("fp8.channel.total", shape, channel_total, iters)
        qg, sg = quant_groupwise(a)
        timed("fp8.block.act_quant", shape, lambda i: quant_groupwise(a), iters)
        if block_note is None:
            try:
                torch._scaled_mm(qg, ws[0].t(), scale_a=sg, scale_b=sb, out_dtype=torch.bfloat16)
                torch.cuda.synchronize()
            except (RuntimeError, TypeError) as e:
                block_note = f"torch {torch.__version__}: no 128x128 block _scaled_mm: {e}"
                print(block_note.splitlines()[0], file=sys.stderr)
        if block_note is not None:
            continue
        timed("fp8.block.gemm", shape,
              lambda i: torch._scaled_mm(qg, ws[i % nc].t(), scale_a=sg, scale_b=sb,
                                         out_dtype=torch.bfloat16), iters)

        def block_total(i):
            q, s = quant_groupwise(a)
            return torch._scaled_mm(q, ws[i % nc].t(), scale_a=s, scale_b=sb,
                                    out_dtype=torch.bfloat16)

        timed("fp8.block.total", shape, block_total, iters)
    del ws, wbf
