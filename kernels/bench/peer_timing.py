"""Timing helpers shared by the kb_bench PyTorch peers (peer_kb.py, peer_sampling.py): CUDA-event
medians after warm-up, and how many input copies keep the working set beyond the 60 MB L2."""
import torch

L2 = 60 * 2**20


def median_us(fn, iters=30, warmup=5):
    """Median microseconds of fn(i) over `iters` calls after `warmup`, events around each call."""
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
    """Input copies to rotate so that they span at least 3x L2."""
    return max(1, -(-3 * L2 // nbytes))
