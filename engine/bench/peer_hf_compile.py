#!/usr/bin/env python3
"""The engine benchmark's peer: Hugging Face transformers with a static KV cache under
torch.compile (mode "reduce-overhead", i.e. CUDA graphs), on the same random-weight checkpoint
`tandem bench` runs, in bf16 on one GPU.

transformers' own generate() with cache_implementation="static" crashed under reduce-overhead
(a mutated graph input, then a segfault), so this is the decode loop written out, as
gpt-fast does: one eager prefill of --input-len random tokens into a StaticCache, then a compiled
function (forward of one token per sequence at cache_position p + greedy argmax) called once per
step; the cache's tensors have static addresses, so the compiled step is a CUDA graph replay.
Decode tokens/s = batch * steps / time of --new-tokens steps after --warmup compiled steps, each
timing between torch.cuda.synchronize() calls; the median of --repeats runs. Prints one JSON line
per batch size.

  python3 engine/bench/peer_hf_compile.py --model DIR --batch-sizes 1,64 --input-len 128 \
      --new-tokens 128
"""
import argparse
import json
import statistics
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, StaticCache


def make_cache(model, batch, max_len):
    try:  # transformers 5.x: layers are sized lazily by the first update
        return StaticCache(config=model.config, max_cache_len=max_len)
    except TypeError:  # 4.x
        return StaticCache(config=model.config, max_batch_size=batch, max_cache_len=max_len,
                           device="cuda", dtype=torch.bfloat16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch-sizes", default="1,64")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eager", action="store_true", help="no torch.compile (plain transformers)")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to("cuda")
    model.eval()
    vocab = model.config.vocab_size

    def step(token, pos, cache):
        out = model(input_ids=token, cache_position=pos, past_key_values=cache, use_cache=True,
                    logits_to_keep=1)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    compiled = step if args.eager else torch.compile(step, mode="reduce-overhead",
                                                     fullgraph=True)
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        max_len = args.input_len + args.warmup + args.new_tokens * args.repeats + 8
        results, warm_s = [], None
        cache = make_cache(model, batch, max_len)
        ids = torch.randint(0, vocab, (batch, args.input_len), device="cuda")
        with torch.no_grad():
            out = model(input_ids=ids, cache_position=torch.arange(args.input_len, device="cuda"),
                        past_key_values=cache, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            pos = args.input_len
            start = time.perf_counter()
            for _ in range(args.warmup):  # compile and capture
                torch.compiler.cudagraph_mark_step_begin()
                token = compiled(token.clone(), torch.tensor([pos], device="cuda"), cache).clone()
                pos += 1
            torch.cuda.synchronize()
            warm_s = time.perf_counter() - start
            # The position lives on the device and is advanced there, so no step waits for a
            # host-to-device copy.
            pos_t = torch.tensor([pos], device="cuda")
            for _ in range(args.repeats):
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(args.new_tokens):
                    torch.compiler.cudagraph_mark_step_begin()
                    token = compiled(token, pos_t, cache).clone()
                    pos_t += 1
                torch.cuda.synchronize()
                results.append(time.perf_counter() - start)
        t = statistics.median(results)
        print(json.dumps({"peer": "transformers+StaticCache" + ("" if args.eager else
                                                                "+torch.compile(reduce-overhead)"),
                          "model": args.model, "batch": batch, "input_len": args.input_len,
                          "steps": args.new_tokens, "decode_tokens_per_s": round(
                              batch * args.new_tokens / t, 1),
                          "ms_per_step": round(1e3 * t / args.new_tokens, 3),
                          "ms_per_step_runs": [round(1e3 * r / args.new_tokens, 3)
                                               for r in results],
                          "warmup_s": round(warm_s, 1), "torch": torch.__version__,
                          "transformers": transformers.__version__}), flush=True)
        del cache
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
