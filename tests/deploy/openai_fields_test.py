#!/usr/bin/env python3
"""The official OpenAI Python client against `tandem serve` (router + 1 prefill + 1 decode
worker, real engines on the CPU): every request field tandem implements, streamed and not, and
the 400 / 404 error envelope for what it rejects.

The served model is make-model's tiny-llama3 preset at seed 1234, the checkpoint whose
transformers outputs are committed in tests/engine/model/testdata/hf_golden.json (float32 logits
of the prompt's last position and the greedy continuation). Logprobs are checked against the
log-softmax of those transformers logits, within LOGPROB_TOL.

Exits 77 (skipped) where the `openai` package is not installed.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

try:
    import openai
except ImportError:
    print("openai is not installed; skipping")
    sys.exit(77)

# tandem's CPU forward vs transformers (fp32): hf_parity_test holds logits to 1e-4; a
# log-softmax moves by at most twice that.
LOGPROB_TOL = 1e-3


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    print("ok:", what)


def expect_error(status, fn, what, param=None, message=None):
    try:
        fn()
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        body = body.get("error", body)
        check(e.status_code == status and body.get("code") == status and "message" in body and
              (param is None or body.get("param") == param) and
              (message is None or message in body.get("message", "")),
              f"{what} -> {status} ({body.get('message')})")
        return
    raise AssertionError(f"{what}: accepted")


def log_softmax(logits):
    m = max(logits)
    s = math.log(sum(math.exp(x - m) for x in logits))
    return [x - m - s for x in logits]


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def start_serve(tandem, model_dir, work):
    out_path = os.path.join(work, "serve.out")
    out = open(out_path, "w")
    proc = subprocess.Popen([tandem, "serve", "--model", model_dir, "--port", "0", "--log-dir",
                             os.path.join(work, "logs"), "--drain-timeout-s", "5"],
                            stdout=out, stderr=subprocess.STDOUT)
    deadline = time.time() + 90
    while time.time() < deadline and proc.poll() is None:
        m = re.search(r"ready at http://([0-9.]+:[0-9]+)", open(out_path).read())
        if m:
            return proc, "http://" + m.group(1)
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("tandem serve never became ready:\n" + open(out_path).read())


def run_checks(client, base, model, golden):
    case = golden["cases"][1]  # a 13-token prompt
    prompt, greedy = case["prompt"], case["greedy_tokens"]
    want = log_softmax(case["last_logits"])
    want_sorted = sorted(want, reverse=True)

    # --- models ---
    check([m.id for m in client.models.list().data] == [model], "models.list")
    check(client.models.retrieve(model).id == model, "models.retrieve")
    expect_error(404, lambda: client.models.retrieve("no-such-model"), "models.retrieve unknown")

    # --- logprobs: completions ---
    c = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0,
                                  logprobs=5, extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    check(len(lp.tokens) == 4 and len(lp.token_logprobs) == 4 and len(lp.top_logprobs) == 4 and
          len(lp.text_offset) == 4, "completions logprobs: one entry per token")
    check(abs(lp.token_logprobs[0] - want[greedy[0]]) < LOGPROB_TOL,
          f"first token logprob {lp.token_logprobs[0]:.6f} = transformers "
          f"{want[greedy[0]]:.6f} (greedy token {greedy[0]})")
    top = sorted(lp.top_logprobs[0].values(), reverse=True)
    check(len(top) >= 5 and all(abs(a - b) < LOGPROB_TOL for a, b in zip(top, want_sorted[:5])),
          "top-5 logprobs of the first token = transformers' log-softmax")
    check(lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0,
          "text_offset starts at 0 and grows")
    streamed = list(client.completions.create(model=model, prompt=prompt, max_tokens=4,
                                              temperature=0, logprobs=5, stream=True,
                                              extra_body={"ignore_eos": True}))
    s_lp = [x for ch in streamed if ch.choices and ch.choices[0].logprobs
            for x in ch.choices[0].logprobs.token_logprobs]
    check(len(s_lp) == 4 and all(abs(a - b) < 1e-6 for a, b in zip(s_lp, lp.token_logprobs)),
          "streamed completions logprobs = non-streamed")
    expect_error(400, lambda: client.completions.create(model=model, prompt="x", logprobs=21),
                 "logprobs 21", "logprobs")

    # --- logprobs: chat (same token ids as a completion: the same values) ---
    messages = [{"role": "user", "content": "hello there"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    check(len(content) == chat.usage.completion_tokens and
          all(len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode()) for t in content),
          "chat logprobs: token, bytes and 3 top_logprobs per token")
    ids = post(base, "/tokenize", {"model": model, "messages": messages})["tokens"]
    same = client.completions.create(model=model, prompt=ids, max_tokens=3, temperature=0,
                                     logprobs=3)
    check(all(abs(a.logprob - b) < 1e-6 for a, b in
              zip(content, same.choices[0].logprobs.token_logprobs)),
          "chat logprobs = completions logprobs for the same prompt tokens")
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=3,
                                                 temperature=0, logprobs=True, top_logprobs=2,
                                                 stream=True))
    s_content = [t for ch in chunks if ch.choices and ch.choices[0].logprobs
                 for t in ch.choices[0].logprobs.content]
    check([t.logprob for t in s_content] == [t.logprob for t in content] and
          all(len(t.top_logprobs) == 2 for t in s_content), "streamed chat logprobs")
    expect_error(400, lambda: client.chat.completions.create(
        model=model, messages=messages, logprobs=True, top_logprobs=21), "top_logprobs 21",
        "top_logprobs")

    # --- sampling fields ---
    plain = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True})
    forced = greedy[1]
    forced_text = post(base, "/detokenize", {"model": model, "tokens": [forced] * 6})["prompt"]
    c = client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0,
                                  logit_bias={str(forced): 100}, extra_body={"ignore_eos": True})
    check(c.choices[0].text == forced_text, "logit_bias +100 forces the token")
    c = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0,
                                  extra_body={"stop_token_ids": [greedy[0]]})
    check(c.choices[0].finish_reason == "stop" and c.usage.completion_tokens == 1 and
          c.choices[0].model_extra.get("stop_reason") == greedy[0],
          "stop token ends the request at once; stop_reason is its id")
    c = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0,
                                  extra_body={"stop_token_ids": [greedy[0]], "min_tokens": 5})
    check(c.usage.completion_tokens >= 5, "min_tokens holds the stop token off")
    pen = dict(presence_penalty=1.5, frequency_penalty=1.5,
               extra_body={"repetition_penalty": 1.5, "ignore_eos": True})
    p1 = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0, **pen)
    p2 = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0, **pen)
    check(p1.choices[0].text == p2.choices[0].text != plain.choices[0].text,
          "penalties change the greedy output, deterministically")
    s1 = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=1.0,
                                   seed=7, extra_body={"min_p": 0.01, "top_k": 50})
    s2 = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=1.0,
                                   seed=7, extra_body={"min_p": 0.01, "top_k": 50})
    check(s1.choices[0].text == s2.choices[0].text, "seed: same seed, same sample")
    text = plain.choices[0].text
    check(len(text) >= 4, "the greedy text is long enough to stop in")
    stop = text[2:4]
    cut = text[:text.find(stop)]
    c = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0,
                                  stop=[stop], extra_body={"ignore_eos": True})
    check(c.choices[0].text == cut and c.choices[0].model_extra.get("stop_reason") == stop,
          "stop string: text cut before it, stop_reason names it")
    c = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0,
                                  stop=[stop], extra_body={"ignore_eos": True,
                                                           "include_stop_str_in_output": True})
    check(c.choices[0].text == cut + stop, "include_stop_str_in_output keeps it")

    # --- echo, batched prompts, n, best_of ---
    c = client.completions.create(model=model, prompt="Hello world", max_tokens=3, temperature=0,
                                  echo=True)
    one = client.completions.create(model=model, prompt="Hello world", max_tokens=3,
                                    temperature=0)
    check(c.choices[0].text == "Hello world" + one.choices[0].text, "echo prepends the prompt")
    echoed = "".join(ch.choices[0].text for ch in client.completions.create(
        model=model, prompt="Hello world", max_tokens=3, temperature=0, echo=True, stream=True)
        if ch.choices)
    check(echoed == c.choices[0].text, "streamed echo")
    expect_error(400, lambda: client.completions.create(model=model, prompt="x", echo=True,
                                                        logprobs=1), "echo + logprobs", "echo",
                 "logprobs are computed for sampled tokens only")
    # Prompt logprobs are not computed: a 400 naming the field, never a 200 without them.
    expect_error(400, lambda: client.completions.create(
        model=model, prompt="x", max_tokens=2, extra_body={"prompt_logprobs": 1}),
        "completions prompt_logprobs", "prompt_logprobs", "not for prompt positions")
    expect_error(400, lambda: client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        extra_body={"prompt_logprobs": 0}), "chat prompt_logprobs", "prompt_logprobs",
        "not for prompt positions")
    expect_error(400, lambda: client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        extra_body={"echo": True}), "chat echo", "echo", "not supported on /v1/chat/completions")
    batch = client.completions.create(model=model, prompt=["Hello world", prompt], max_tokens=3,
                                      temperature=0)
    check([ch.index for ch in batch.choices] == [0, 1] and
          batch.choices[0].text == one.choices[0].text and
          batch.choices[1].text == plain.choices[0].text[:len(batch.choices[1].text)],
          "batched prompts: one choice each, as sent alone")
    check(batch.usage.prompt_tokens == one.usage.prompt_tokens + len(prompt),
          "batched prompts: usage sums the prompts")
    n3 = client.completions.create(model=model, prompt="Hello", max_tokens=6, temperature=1.0,
                                   n=3, seed=11)
    check(sorted(ch.index for ch in n3.choices) == [0, 1, 2] and
          len({ch.text for ch in n3.choices}) > 1 and n3.usage.completion_tokens > 6,
          "n=3: three different samples")
    indices = {ch.choices[0].index for ch in client.chat.completions.create(
        model=model, messages=messages, max_tokens=3, n=2, stream=True) if ch.choices}
    check(indices == {0, 1}, "streamed chat n=2: chunks of both choices")
    best = client.completions.create(model=model, prompt="Hello", max_tokens=4, temperature=1.0,
                                     n=1, best_of=3, seed=3)
    check(len(best.choices) == 1 and best.choices[0].logprobs is None and
          best.usage.completion_tokens > 4, "best_of=3, n=1: one choice (of three generated)")
    expect_error(400, lambda: client.completions.create(model=model, prompt="x", n=1, best_of=2,
                                                        stream=True), "best_of streamed",
                 "best_of")

    # --- usage ---
    chunks = list(client.completions.create(
        model=model, prompt="Hello", max_tokens=4, temperature=0, stream=True, extra_body={
            "ignore_eos": True, "stream_options": {"include_usage": True,
                                                   "continuous_usage_stats": True}}))
    check(all(ch.usage is not None for ch in chunks), "continuous_usage_stats: usage on every chunk")
    counts = [ch.usage.completion_tokens for ch in chunks]
    check(counts == sorted(counts) and counts[-1] == 4, "continuous usage grows to the total")
    details = chunks[-1].usage.prompt_tokens_details
    check(details is not None and details.cached_tokens == 0,
          "usage.prompt_tokens_details.cached_tokens (0: no prefix cache)")

    # --- rejected fields ---
    for what, kwargs, param in [
            ("response_format json", {"response_format": {"type": "json_object"}},
             "response_format"),
            ("tools", {"tools": [{"type": "function", "function": {"name": "f",
                                                                     "parameters": {}}}]},
             "tools"),
            ("tool_choice", {"tool_choice": "auto"}, "tool_choice"),
            ("logit_bias 101", {"logit_bias": {"5": 101}}, "logit_bias"),
            ("logit_bias id", {"logit_bias": {"99999999": 1}}, "logit_bias"),
            ("presence_penalty 3", {"presence_penalty": 3}, "presence_penalty"),
            ("min_p", {"extra_body": {"min_p": 2}}, "min_p"),
            ("min_tokens > max_tokens", {"max_tokens": 2, "extra_body": {"min_tokens": 3}},
             "min_tokens")]:
        expect_error(400, lambda kw=kwargs: client.chat.completions.create(
            model=model, messages=messages, **kw), what, param)
    expect_error(400, lambda: client.completions.create(model=model, prompt="x", suffix="y"),
                 "suffix", "suffix")
    ok = client.chat.completions.create(model=model, messages=messages, max_tokens=2,
                                        response_format={"type": "text"}, user="someone")
    check(ok.choices[0].finish_reason is not None, "response_format text and user are accepted")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--golden", required=True)
    args = ap.parse_args()
    golden = next(m for m in json.load(open(args.golden))["models"]
                  if m["preset"] == "tiny-llama3")
    work = tempfile.mkdtemp(prefix="tandem-openai-fields-")
    model_dir = os.path.join(work, "model")
    subprocess.run([args.tandem, "make-model", "--preset", "tiny-llama3", "--seed",
                    str(golden["seed"]), "--out", model_dir], check=True,
                   stdout=subprocess.DEVNULL)
    # transformers ran the golden in float32: served as float32 too (the engine then keeps its
    # KV cache in fp32 rather than bf16), so the logprobs differ by summation order only.
    config_path = os.path.join(model_dir, "config.json")
    config = json.load(open(config_path))
    config["torch_dtype"] = "float32"
    json.dump(config, open(config_path, "w"))
    proc, base = start_serve(args.tandem, model_dir, work)
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                               timeout=30)
        model = client.models.list().data[0].id
        run_checks(client, base, model, golden)
    except Exception:
        print(open(os.path.join(work, "serve.out")).read())
        raise
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print("all checks passed")


if __name__ == "__main__":
    main()
