#!/usr/bin/env python3
"""Golden outputs of Hugging Face transformers for tandem's tiny make-model presets.

For each preset: `tandem make-model --preset P --seed S` writes a random checkpoint; transformers
loads it in float32 (the load must report no missing, unexpected or mismatched keys: the
checkpoint format check) and, for a few prompts of token ids, records the last-position logits of
the prompt and a greedy continuation (argmax, KV-cached decode) with the chosen token's logit at
every step. hf_parity_test.cc re-creates the same checkpoint (make-model is deterministic from the
seed) and compares tandem's CPU forward pass against this file.

Regenerate the committed file (needs torch + transformers, e.g. /opt/tandem-ref/bin/python):
  cmake --build build --target tandem
  python tests/engine/model/make_golden.py --tandem build/bin/tandem \
      --out tests/engine/model/testdata/hf_golden.json

On a GPU machine, `--device cuda --dtype bfloat16 --presets small-llama3,...,llama3-8b` gives
the reference of the CUDA engine's test (tests/engine/engine_cuda_test.cc, MatchesTransformersInBf16).
"""
import argparse
import json
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM

PRESETS = [
    "tiny-llama3", "tiny-llama3-tied", "tiny-llama31", "tiny-llama2", "tiny-llama2-linear",
    "tiny-mistral", "tiny-qwen2", "tiny-qwen2-untied", "tiny-qwen3", "tiny-qwen3-untied",
]
PROMPT_LENGTHS = [1, 13, 45]  # single token; one page and a bit; several pages
NEW_TOKENS = 40


DEVICE = "cpu"
DTYPE = torch.float32


def load(model_dir):
    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=DTYPE, output_loading_info=True, attn_implementation="eager")
    bad = {k: sorted(v) for k, v in info.items() if k != "error_msgs" and v}
    if bad or info.get("error_msgs"):
        raise SystemExit(f"{model_dir}: transformers reports {bad} {info.get('error_msgs')}")
    model.eval()
    return model.to(DEVICE)


@torch.no_grad()
def run_prompt(model, prompt):
    ids = torch.tensor([prompt], device=DEVICE)
    out = model(ids, use_cache=True)
    logits = out.logits[0, -1].float()
    prompt_logits = logits.tolist()
    past = out.past_key_values
    tokens, token_logits, margins = [], [], []
    for _ in range(NEW_TOKENS):
        top2 = torch.topk(logits, 2)
        tok = int(torch.argmax(logits))
        tokens.append(tok)
        token_logits.append(float(logits[tok]))
        margins.append(float(top2.values[0] - top2.values[1]))
        out = model(torch.tensor([[tok]], device=DEVICE), past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
    return {"prompt": prompt, "last_logits": [round(x, 6) for x in prompt_logits],
            "greedy_tokens": tokens, "greedy_logits": [round(x, 6) for x in token_logits],
            "greedy_margins": [round(x, 6) for x in margins]}


def golden_for(tandem, preset, seed, model_dir=None):
    with tempfile.TemporaryDirectory() as d:
        if model_dir:  # an existing checkpoint of this preset (an 8B one is 16 GB to rewrite)
            d = model_dir
        else:
            subprocess.run([tandem, "make-model", "--preset", preset, "--out", d, "--seed",
                            str(seed)], check=True, stderr=subprocess.DEVNULL)
        model = load(d)
        vocab = model.config.vocab_size
        rng = np.random.default_rng(seed * 1000 + 7)
        cases = [run_prompt(model, [int(x) for x in rng.integers(0, vocab, n)])
                 for n in PROMPT_LENGTHS]
        del model
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return {"preset": preset, "seed": seed, "vocab_size": vocab, "cases": cases}


def check_sharded(tandem, preset, seed):
    """A sharded make-model checkpoint (index + 3 files) loads in transformers as the same model."""
    logits = []
    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as three:
        for d, shards in ((one, 0), (three, 3)):
            subprocess.run([tandem, "make-model", "--preset", preset, "--out", d, "--seed",
                            str(seed), "--shards", str(shards)], check=True,
                           stderr=subprocess.DEVNULL)
            with torch.no_grad():
                logits.append(load(d)(torch.tensor([[1, 2, 3, 4]], device=DEVICE)).logits)
    if not torch.equal(logits[0], logits[1]):
        raise SystemExit(f"{preset}: sharded checkpoint loads differently in transformers")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tandem", required=True, help="path to the tandem binary")
    ap.add_argument("--out", required=True, help="golden JSON file to write")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda")
    ap.add_argument("--dtype", default="float32", help="float32, or bfloat16")
    ap.add_argument("--skip-shard-check", action="store_true")
    ap.add_argument("--model-dir", help="use this checkpoint of the (single) preset as it is")
    args = ap.parse_args()
    global DEVICE, DTYPE
    DEVICE, DTYPE = args.device, getattr(torch, args.dtype)
    torch.manual_seed(0)
    presets = args.presets.split(",")
    if not args.skip_shard_check:
        check_sharded(args.tandem, presets[0], args.seed)
    if args.model_dir and len(presets) != 1:
        raise SystemExit("--model-dir needs exactly one preset")
    models = [golden_for(args.tandem, p, args.seed, args.model_dir) for p in presets]
    golden = {"generator": "tests/engine/model/make_golden.py", "device": DEVICE,
              "dtype": args.dtype,
              "transformers": __import__("transformers").__version__,
              "torch": torch.__version__, "new_tokens": NEW_TOKENS, "models": models}
    with open(args.out, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out}: {len(models)} presets", file=sys.stderr)


if __name__ == "__main__":
    main()
