#!/usr/bin/env python3
"""The engine benchmark's peer: Hugging Face transformers with a static KV cache under
torch.compile (mode "reduce-overhead", i.e. CUDA graphs), on the same random-weight checkpoint
`tandem bench` runs, in bf16 on one GPU.

For each batch size: random prompts of --input-len tokens, greedy generation of --new-tokens
(min_new_tokens = max_new_tokens, so EOS never stops it early). Decode tokens/s is measured as
batch * (N - 1) / (t(N) - t(1)): the generate() time of N new tokens minus that of one new token,
so prefill and the compile warm-up are excluded. Prints one JSON line per batch size.

  python3 engine/bench/peer_hf_compile.py --model DIR --batch-sizes 1,64 --input-len 128 \
      --new-tokens 256
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def timed_generate(model, ids, new_tokens):
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                   min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch-sizes", default="1,64")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--eager", action="store_true", help="no torch.compile (plain transformers)")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to("cuda")
    model.eval()
    model.generation_config.cache_implementation = "static"
    if not args.eager:
        compiled = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

        # Each forward replays a CUDA graph; generate() reads a step's outputs before the next
        # call, so every call may start a new graph step (else torch refuses the static cache's
        # in-place update as a write over the previous replay's outputs).
        def forward(*a, **kw):
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(*a, **kw)

        model.forward = forward
    vocab = model.config.vocab_size
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        ids = torch.randint(0, vocab, (batch, args.input_len), device="cuda")
        compile_start = time.perf_counter()
        for _ in range(2):  # compile and capture for this shape (prefill and decode)
            timed_generate(model, ids, 8)
        warm = time.perf_counter() - compile_start
        one = min(timed_generate(model, ids, 1) for _ in range(3))
        full = min(timed_generate(model, ids, args.new_tokens) for _ in range(2))
        tps = batch * (args.new_tokens - 1) / (full - one)
        print(json.dumps({"peer": "transformers+static-cache" + ("" if args.eager else
                                                                 "+torch.compile"),
                          "model": args.model, "batch": batch, "input_len": args.input_len,
                          "new_tokens": args.new_tokens, "decode_tokens_per_s": round(tps, 1),
                          "ms_per_step": round(1e3 * (full - one) / (args.new_tokens - 1), 3),
                          "warmup_s": round(warm, 1), "torch": torch.__version__,
                          "transformers": __import__("transformers").__version__}), flush=True)


if __name__ == "__main__":
    main()
