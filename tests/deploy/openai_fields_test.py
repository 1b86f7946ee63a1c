#!/usr/bin/env python3
"""The official OpenAI Python client against `tandem serve` (router + 1 prefill + 1 decode
worker, real engines on the CPU): every request field tandem implements, streamed and not, and
the 400 / 404 error envelope for what it rejects.

The served model is make-model's tiny-llama3 preset at seed 1234, the checkpoint whose
transformers outputs are committed in tests/engine/model/testdata/hf_golden.json (float32 logits
of the prompt's last position and the greedy continuation). Logprobs are checked against the
log-softmax of those transformers logits, within LOGPROB_TOL. Prompt logprobs (vLLM's
`prompt_logprobs`, and echo + logprobs) run on two more `tandem serve`s, 1P1D and mixed, whose
step budget is below the prompt (chunked prefill): prompt_logprob_checks.

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


def start_serve(tandem, model_dir, work, layout=None):
    out_path = os.path.join(work, "serve.out")
    out = open(out_path, "w")
    extra = []
    if layout is not None:
        path = os.path.join(work, "layout.yaml")
        open(path, "w").write(layout)
        extra = ["--layout", path]
    proc = subprocess.Popen([tandem, "serve", "--model", model_dir, "--port", "0", "--log-dir",
                             os.path.join(work, "logs"), "--drain-timeout-s", "5"] + extra,
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
    # echo + logprobs and prompt_logprobs: prompt_logprob_checks (several layouts).
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


def prompt_logprobs_of(choice_or_response):
    # vLLM's extension field: the client keeps it as an extra attribute.
    return (choice_or_response.model_extra or {}).get("prompt_logprobs")


def prompt_logprob_checks(client, model, golden, layout):
    """Prompt logprobs (vLLM's `prompt_logprobs`, and echo + logprobs) on one layout, whose
    step budget is below the prompts' lengths (chunked prefill). References: transformers'
    log-softmax (the golden's last prompt position) and the engine's own decode-time logprobs of
    the greedy continuation, fed back as a prompt."""
    case = golden["cases"][1]
    prompt, greedy = case["prompt"], case["greedy_tokens"]
    want = log_softmax(case["last_logits"])
    want_sorted = sorted(want, reverse=True)
    k = 20
    gen = client.completions.create(model=model, prompt=prompt, max_tokens=k, temperature=0,
                                    logprobs=5, extra_body={"ignore_eos": True})
    gen_lp = gen.choices[0].logprobs.token_logprobs
    full = prompt + greedy[:k]
    c = client.completions.create(model=model, prompt=full, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 5})
    plp = prompt_logprobs_of(c.choices[0])
    check(isinstance(plp, list) and len(plp) == len(full) and plp[0] is None and
          all(isinstance(e, dict) and str(full[i]) in e for i, e in enumerate(plp) if i > 0),
          f"{layout}: prompt_logprobs: null, then one entry per prompt token, keyed by its id")
    at = plp[len(prompt)]
    check(abs(at[str(greedy[0])]["logprob"] - want[greedy[0]]) < LOGPROB_TOL and
          at[str(greedy[0])]["rank"] == 1,
          f"{layout}: prompt logprob after the {len(prompt)}-token prefix = transformers' "
          f"log-softmax ({at[str(greedy[0])]['logprob']:.6f} vs {want[greedy[0]]:.6f}), rank 1")
    top5 = sorted((v["logprob"] for v in at.values()), reverse=True)[:5]
    check(len(at) == 5 and all(abs(a - b) < LOGPROB_TOL for a, b in zip(top5, want_sorted)),
          f"{layout}: its 5 alternatives = transformers' top 5")
    check(all(abs(plp[len(prompt) + i][str(greedy[i])]["logprob"] - gen_lp[i]) < 1e-4
              for i in range(k)),
          f"{layout}: prompt logprobs of a greedy continuation = its logprobs when generated "
          f"({k} positions)")
    check(all(1 <= len(e) <= 6 and all(v["logprob"] <= 0 and isinstance(v["decoded_token"], str)
                                       for v in e.values()) and
              sorted(v["rank"] for v in e.values() if v["rank"] is not None)[:5] == [1, 2, 3, 4, 5]
              for e in plp[1:]),
          f"{layout}: every entry: the prompt token and ranks 1-5, logprobs <= 0")
    # No prefix-cache reuse for a request that asks for prompt logprobs: same values again,
    # though the cache holds the prompt (two plain requests put it there and hit it).
    client.completions.create(model=model, prompt=full, max_tokens=1)
    warm = client.completions.create(model=model, prompt=full, max_tokens=1)
    check(warm.usage.prompt_tokens_details.cached_tokens > 0,
          f"{layout}: the prefix cache holds the prompt "
          f"({warm.usage.prompt_tokens_details.cached_tokens} cached tokens)")
    again = client.completions.create(model=model, prompt=full, max_tokens=1, temperature=0,
                                      extra_body={"prompt_logprobs": 5})
    check(prompt_logprobs_of(again.choices[0]) == plp and
          again.usage.prompt_tokens_details.cached_tokens == 0,
          f"{layout}: a repeated prompt is computed again (0 cached tokens), same logprobs")
    two = client.completions.create(model=model, prompt=full, max_tokens=2, temperature=1.0,
                                    n=2, seed=5, extra_body={"prompt_logprobs": 5})
    check(len(two.choices) == 2 and all(prompt_logprobs_of(ch) == plp for ch in two.choices),
          f"{layout}: n=2: both choices carry the prompt logprobs")
    zero = client.completions.create(model=model, prompt=full, max_tokens=1,
                                     extra_body={"prompt_logprobs": 0})
    check(all(list(e) == [str(full[i + 1])] for i, e in enumerate(prompt_logprobs_of(
        zero.choices[0])[1:])), f"{layout}: prompt_logprobs 0: the prompt token only")
    # echo + logprobs (OpenAI's legacy format): the prompt's tokens lead the logprobs.
    e = client.completions.create(model=model, prompt=prompt, max_tokens=3, temperature=0,
                                  echo=True, logprobs=2, extra_body={"ignore_eos": True})
    lp = e.choices[0].logprobs
    n = len(prompt)
    check(len(lp.tokens) == n + 3 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
          and all(abs(lp.token_logprobs[i] - plp[i][str(full[i])]["logprob"]) < 1e-4
                  for i in range(1, n))
          and all(abs(lp.token_logprobs[n + i] - gen_lp[i]) < 1e-4 for i in range(3))
          and all(len(t) <= 3 for t in lp.top_logprobs[1:])
          and lp.text_offset == sorted(lp.text_offset),
          f"{layout}: echo + logprobs: {n} prompt tokens (the first with null) then 3 generated")
    streamed = [ch.choices[0].logprobs for ch in client.completions.create(
        model=model, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=2,
        stream=True, extra_body={"ignore_eos": True}) if ch.choices and ch.choices[0].logprobs]
    s_lp = [x for l in streamed for x in l.token_logprobs]
    check(len(s_lp) == n + 3 and s_lp[0] is None and
          all(abs(a - b) < 1e-6 for a, b in zip(s_lp[1:], lp.token_logprobs[1:])),
          f"{layout}: streamed echo + logprobs = non-streamed")
    messages = [{"role": "user", "content": "Say hi"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=2,
                                          extra_body={"prompt_logprobs": 1})
    cp = prompt_logprobs_of(chat)
    check(isinstance(cp, list) and len(cp) == chat.usage.prompt_tokens and cp[0] is None and
          all(1 <= len(x) <= 2 for x in cp[1:]),
          f"{layout}: chat: prompt_logprobs on the response, one per prompt token")
    for bad, says in ((-1, "prompt_logprobs must be in [0, 20], got -1"),
                      (21, "prompt_logprobs must be in [0, 20], got 21"),
                      ("3", "prompt_logprobs")):
        expect_error(400, lambda: client.completions.create(
            model=model, prompt="x", max_tokens=2, extra_body={"prompt_logprobs": bad}),
            f"{layout}: prompt_logprobs {bad!r}", "prompt_logprobs", says)
    expect_error(400, lambda: client.completions.create(
        model=model, prompt="x", max_tokens=2, stream=True, extra_body={"prompt_logprobs": 1}),
        f"{layout}: prompt_logprobs streamed", "prompt_logprobs", "not available when stream")
    expect_error(400, lambda: client.chat.completions.create(
        model=model, messages=messages, max_tokens=2, extra_body={"prompt_logprobs": 99}),
        f"{layout}: chat prompt_logprobs 99", "prompt_logprobs", "must be in [0, 20]")


# Layouts for the prompt-logprob checks: a step budget of 16 tokens against prompts of 13 + 20
# tokens (chunked prefill), prefill on its own worker (the logprobs come with the first token)
# and on a mixed one.
PROMPT_LOGPROB_LAYOUTS = {
    "1P1D": "engine: {max_num_batched_tokens: 16}\n"
            "groups: [{role: prefill}, {role: decode}]\n",
    "mixed": "engine: {max_num_batched_tokens: 16}\ngroups: [{role: mixed}]\n",
}


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
    runs = [(None, None)] + list(PROMPT_LOGPROB_LAYOUTS.items())
    for name, layout in runs:
        run_dir = os.path.join(work, name or "default")
        os.makedirs(run_dir)
        proc, base = start_serve(args.tandem, model_dir, run_dir, layout)
        try:
            client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                                   timeout=30)
            model = client.models.list().data[0].id
            if name is None:
                run_checks(client, base, model, golden)
            else:
                prompt_logprob_checks(client, model, golden, name)
        except Exception:
            print(open(os.path.join(run_dir, "serve.out")).read())
            raise
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print("all checks passed")


if __name__ == "__main__":
    main()
