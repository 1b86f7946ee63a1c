#!/usr/bin/env python3
"""NVIDIA's `aiperf` load generator against `tandem serve` (tiny random-weight model on the CPU
backend, 1 prefill + 1 decode worker), with its server-metrics scraping on for the router and
both workers: a short streamed completions run must end with every request answered and no
error, aiperf's client-side counts must agree with the server's (prompt and output tokens, with
ignore_eos so that each request generates exactly max_tokens), and the Prometheus series aiperf
scraped must count the same requests and tokens over the run.

    aiperf_test.py --tandem BUILD/bin/tandem [--aiperf PATH]
Exits 77 (skipped) where aiperf is not installed (deploy/requirements-test.txt).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

LAYOUT = """
model: ""
backend: cpu
host: 127.0.0.1
router: {port: 0, grpc_port: 0}
engine: {page_size: 16, num_pages: 1024, max_num_seqs: 64, max_num_batched_tokens: 1024}
groups:
  - {role: prefill, count: 1}
  - {role: decode, count: 1}
"""
REQUESTS = 12
CONCURRENCY = 3
INPUT_TOKENS = 24
OUTPUT_TOKENS = 8

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def wait_for(what, predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def series_total(metrics, name, **labels):
    """Sum over the series of `name` whose labels include `labels`: aiperf's delta over the run."""
    family = metrics.get(name)
    if family is None:
        return None
    return sum(s["stats"]["total"] for s in family["series"]
               if all(s["labels"].get(k) == v for k, v in labels.items()))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tandem", required=True)
    p.add_argument("--aiperf", default=shutil.which("aiperf"))
    a = p.parse_args()
    if not a.aiperf:
        print("aiperf is not installed (deploy/requirements-test.txt); skipping")
        return 77
    tmp = tempfile.mkdtemp(prefix="tandem-aiperf-test-")
    serve = None
    try:
        with open(os.path.join(tmp, "layout.yaml"), "w") as f:
            f.write(LAYOUT)
        out_path = os.path.join(tmp, "serve.out")
        cache = os.path.join(tmp, "cache")
        env = dict(os.environ, TANDEM_CACHE_DIR=cache)
        serve = subprocess.Popen(
            [a.tandem, "serve", "--layout", os.path.join(tmp, "layout.yaml"), "--port", "0",
             "--log-dir", os.path.join(tmp, "logs"), "--drain-timeout-s", "5"],
            stdout=open(out_path, "w"), stderr=subprocess.STDOUT, env=env)
        read_out = lambda: open(out_path).read()
        ready = wait_for("tandem serve to be ready",
                         lambda: re.search(r"ready at http://([0-9.]+:[0-9]+)", read_out()), 90)
        router = "http://" + ready.group(1)
        metrics = ["http://" + m for m in
                   re.findall(r"http://([0-9.]+:[0-9]+)/metrics", read_out())]
        assert len(metrics) == 3, read_out()  # the router and two workers
        workers = [m + "/metrics" for m in metrics if m != router]
        artifacts = os.path.join(tmp, "artifacts")
        cmd = [a.aiperf, "profile", "--model", "tiny", "--url", router,
               "--endpoint-type", "completions", "--streaming",
               "--tokenizer", os.path.join(cache, "models", "tiny"),
               "--request-count", str(REQUESTS), "--concurrency", str(CONCURRENCY),
               "--synthetic-input-tokens-mean", str(INPUT_TOKENS),
               "--synthetic-input-tokens-stddev", "0",
               "--output-tokens-mean", str(OUTPUT_TOKENS), "--output-tokens-stddev", "0",
               "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
               "--artifact-dir", artifacts, "--ui", "none",
               "--server-metrics", *workers]
        print(" ".join(cmd))
        run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=240, env=dict(os.environ, NO_COLOR="1"))
        check(run.returncode == 0, f"aiperf exit code {run.returncode}")
        if run.returncode != 0:
            print(run.stdout[-4000:])
            return 1
        profile = json.load(open(os.path.join(artifacts, "profile_export_aiperf.json")))
        check(profile["request_count"]["avg"] == REQUESTS,
              f"request_count {profile['request_count']['avg']} == {REQUESTS}")
        check(profile.get("error_summary") == [], f"no errors: {profile.get('error_summary')}")
        check(profile.get("was_cancelled") is False, "not cancelled")
        check(profile["time_to_first_token"]["count"] == REQUESTS, "a TTFT per request")
        check(profile["inter_token_latency"]["count"] == REQUESTS, "an ITL per request")
        osl = profile["output_sequence_length"]
        check(osl["min"] == osl["max"] == OUTPUT_TOKENS,
              f"every output has {OUTPUT_TOKENS} tokens (server count: {osl})")
        isl = profile["input_sequence_length"]
        total_isl = profile["total_isl"]["avg"]

        server = json.load(open(os.path.join(artifacts, "server_metrics_export.json")))
        endpoints = set(server["summary"]["endpoints_successful"])
        check(endpoints == {m + "/metrics" for m in metrics},
              f"aiperf scraped the router and both workers: {sorted(endpoints)}")
        m = server["metrics"]
        check(series_total(m, "tandem:request_success", finished_reason="length") == REQUESTS,
              f"tandem:request_success_total{{length}} rose by {REQUESTS}")
        check(series_total(m, "tandem:request_success") == REQUESTS,
              "no request ended otherwise")
        check(series_total(m, "tandem:generation_tokens") == REQUESTS * OUTPUT_TOKENS,
              f"tandem:generation_tokens_total rose by {REQUESTS * OUTPUT_TOKENS}")
        check(series_total(m, "tandem:prompt_tokens") == total_isl,
              f"tandem:prompt_tokens_total rose by aiperf's total ISL {total_isl} "
              f"(per request {isl['min']}..{isl['max']})")
        for w in workers:
            scraped = [n for n, fam in m.items()
                       if any(s["endpoint_url"] == w for s in fam["series"])]
            check(any(n.startswith("tandem_worker_") for n in scraped),
                  f"{w}: worker series scraped ({len(scraped)} families)")
        print(f"aiperf: TTFT avg {profile['time_to_first_token']['avg']:.1f} ms, ITL avg "
              f"{profile['inter_token_latency']['avg']:.2f} ms (tiny model, CPU; not a benchmark)")
    finally:
        if serve is not None and serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            try:
                serve.wait(timeout=30)
            except subprocess.TimeoutExpired:
                serve.kill()
        if not failures:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")
    print(f"aiperf_test: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
