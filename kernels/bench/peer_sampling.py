"""PyTorch peer for the sampling rows of kb_bench: Hugging Face's warpers (temperature, top-k via
torch.topk, top-p via a full torch.sort + cumsum) then torch.multinomial, timed with CUDA events
(median after warm-up, inputs rotated beyond L2). Used by peer_kb.py; run alone it times only
sampling: peer_sampling.py out.jsonl (JSON lines {"kernel", "shape", "us"})."""
import json
import sys

import torch

import peer_timing

MODES = [("greedy", 0, 0, 1.0), ("temp0.7", 0.7, 0, 1.0), ("topk50_topp0.9", 0.7, 50, 0.9),
         ("topp0.95", 1.0, 0, 0.95)]
PEAKED_MODES = [("topp0.95_peaked", 1.0, 0, 0.95)]


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


def run(emit, median_us, copies, vocab=152064, batches=(1, 32, 256)):
    for b in batches:
        ls = [torch.randn(b, vocab, device="cuda") * 3 for _ in range(copies(b * vocab * 4))]
        for name, t, k, p in MODES:
            emit(f"sampling.{name}", f"B={b} V={vocab}",
                 median_us(lambda i: hf_sample(ls[i % len(ls)], t, k, p)))
        for x in ls:  # kb_bench's LLM-like rows: N(0, 2^2), 40 logits per row raised by 8 to 16
            x *= 2 / 3
            x.scatter_add_(1, torch.randint(0, vocab, (b, 40), device="cuda"),
                           8 + 8 * torch.rand(b, 40, device="cuda"))
        for name, t, k, p in PEAKED_MODES:
            emit(f"sampling.{name}", f"B={b} V={vocab}",
                 median_us(lambda i: hf_sample(ls[i % len(ls)], t, k, p)))
        del ls


if __name__ == "__main__":
    out = open(sys.argv[1], "w")

    def emit(kernel, shape, us):
        out.write(json.dumps({"kernel": kernel, "shape": shape, "us": us}) + "\n")
        out.flush()
        print(f"peer {kernel:28s} {shape:34s} {us:10.2f} us")

    run(emit, peer_timing.median_us, peer_timing.copies)
