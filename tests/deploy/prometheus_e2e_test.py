#!/usr/bin/env python3
"""A real Prometheus server (Debian's `prometheus`) scraping a running `tandem serve` (tiny
random-weight model on the CPU backend, 1 prefill + 1 decode worker) with the committed
deploy/prometheus/prometheus.yml (its scrape interval lowered to 1 s to keep the test short),
while a load runs: streamed and plain completions, a burst past the router's admission limits
(429 queue_full), a bad request (400) and a client that disconnects mid-stream (abort). Then
every query of the Grafana dashboard (deploy/grafana/tandem.json, $__rate_interval = 30s,
$model_name = tiny) must return at least one series with a finite value, through the
Prometheus HTTP API, and a positive one except for the panels of gauges that read 0 on an idle
server (KV cache usage, queue) and preemptions (none happen at this load).

    prometheus_e2e_test.py --tandem build/bin/tandem [--screenshot deploy/grafana/dashboard.png]

It also renders the dashboard (deploy/grafana/render_dashboard.py, headless Chromium) and checks
the PNG; --screenshot keeps it at PATH (how deploy/grafana/dashboard.png was made).
Exits 77 (skipped) only where the `prometheus` binary is not installed.
"""
import argparse
import http.client
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.join(ROOT, "deploy", "grafana"))
import render_dashboard  # noqa: E402

LAYOUT = """
model: ""
backend: cpu
host: 127.0.0.1
router: {port: 0, grpc_port: 0, args: [--max-running, "4", --max-waiting, "2"]}
engine: {page_size: 16, num_pages: 1024, max_num_seqs: 64, max_num_batched_tokens: 1024}
groups:
  - {role: prefill, count: 1}
  - {role: decode, count: 1}
"""
RATE_INTERVAL = "30s"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def post(http_addr, body, timeout=30):
    req = urllib.request.Request(f"http://{http_addr}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def stream_then_disconnect(http_addr):
    """Reads the first event of a long stream, then closes the connection (an abort)."""
    host, port = http_addr.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(
        {"model": "tiny", "prompt": "abort me", "max_tokens": 200, "stream": True,
         "ignore_eos": True}), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.status
    r.fp.readline()
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


def prom_query(prom, expr):
    url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tandem", required=True)
    p.add_argument("--prometheus", default=shutil.which("prometheus"))
    p.add_argument("--screenshot")
    a = p.parse_args()
    if not a.prometheus:
        print("prometheus is not installed (Debian package `prometheus`; "
              "deploy/install-deps.sh --with-python installs it); skipping")
        return 77
    tmp = tempfile.mkdtemp(prefix="tandem-prom-test-")
    procs = []
    try:
        with open(os.path.join(tmp, "layout.yaml"), "w") as f:
            f.write(LAYOUT)
        out_path = os.path.join(tmp, "serve.out")
        env = dict(os.environ, TANDEM_CACHE_DIR=os.path.join(tmp, "cache"))
        serve = subprocess.Popen(
            [a.tandem, "serve", "--layout", os.path.join(tmp, "layout.yaml"), "--port", "0",
             "--log-dir", os.path.join(tmp, "logs"), "--drain-timeout-s", "5"],
            stdout=open(out_path, "w"), stderr=subprocess.STDOUT, env=env)
        procs.append(serve)
        read_out = lambda: open(out_path).read()
        ready = wait_for("tandem serve to be ready",
                         lambda: re.search(r"ready at http://([0-9.]+:[0-9]+)", read_out()), 90)
        http_addr = ready.group(1)
        metrics = re.findall(r"http://([0-9.]+:[0-9]+)/metrics", read_out())
        assert len(metrics) == 3, read_out()  # the router and two workers

        # The committed configuration, its targets file written for this run's ports.
        prom_dir = os.path.join(tmp, "prometheus")
        os.makedirs(os.path.join(prom_dir, "targets"))
        config = open(os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")).read()
        config = re.sub(r"scrape_interval: \S+", "scrape_interval: 1s", config)
        with open(os.path.join(prom_dir, "prometheus.yml"), "w") as f:
            f.write(config)
        with open(os.path.join(prom_dir, "targets", "tandem.json"), "w") as f:
            json.dump([{"targets": metrics[:1], "labels": {"tandem_role": "router"}},
                       {"targets": metrics[1:], "labels": {"tandem_role": "worker"}}], f)
        check = subprocess.run(["promtool", "check", "config",
                                os.path.join(prom_dir, "prometheus.yml")],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        prom_port = free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        procs.append(subprocess.Popen(
            [a.prometheus, f"--config.file={prom_dir}/prometheus.yml",
             f"--storage.tsdb.path={prom_dir}/data", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=open(os.path.join(tmp, "prometheus.log"), "w"), stderr=subprocess.STDOUT))

        def targets_up():
            try:
                r = prom_query(prom, "up")
            except (OSError, ValueError):
                return False
            return sum(1 for s in r["data"]["result"] if s["value"][1] == "1") == 3
        wait_for("Prometheus to scrape the router and both workers", targets_up, 30)

        # Load. The failures come twice: a counter's first sample only creates its series, so
        # the second round is what the error panels' rate() sees.
        def failures_round():
            codes = []
            burst = [threading.Thread(target=lambda i=i: codes.append(post(http_addr, {
                "model": "tiny", "prompt": f"burst {i}", "max_tokens": 48,
                "ignore_eos": True})[0])) for i in range(10)]
            for t in burst:
                t.start()
            for t in burst:
                t.join()
            assert 429 in codes and 200 in codes, codes  # past max_running + max_waiting (4 + 2)
            bad, _ = post(http_addr, {"model": "tiny", "prompt": "x", "max_tokens": -1})
            assert bad == 400, bad
            stream_then_disconnect(http_addr)
        failures_round()
        time.sleep(2.5)  # two scrapes
        stop = time.time() + 8
        statuses = []

        def client(seed):
            i = 0
            while time.time() < stop:
                i += 1
                body = {"model": "tiny", "prompt": "hello " * (1 + (seed * 7 + i) % 20),
                        "max_tokens": 4 + (seed + i) % 16, "ignore_eos": True,
                        "stream": i % 2 == 0}
                statuses.append(post(http_addr, body)[0])
        clients = [threading.Thread(target=client, args=(s,)) for s in range(3)]
        for t in clients:
            t.start()
        time.sleep(3)
        failures_round()
        for t in clients:
            t.join()
        # The clients may meet the second burst's 429s; nothing else.
        assert set(statuses) <= {200, 429} and statuses.count(200) >= 20, statuses
        time.sleep(2.5)  # the last requests' samples scraped

        dashboard = json.load(open(os.path.join(ROOT, "deploy", "grafana", "tandem.json")))
        problems = []
        n = 0
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                n += 1
                expr = render_dashboard.substitute(target["expr"], RATE_INTERVAL, "tiny")
                r = prom_query(prom, expr)
                result = r["data"]["result"] if r.get("status") == "success" else []
                values = [float(s["value"][1]) for s in result]
                finite = [v for v in values if math.isfinite(v)]
                # Gauges of an idle server and preemptions (none happen here) may read 0; every
                # other query must see the load.
                may_be_zero = panel["title"] in ("KV cache usage", "Queue", "Preemptions")
                if not finite or (not may_be_zero and max(finite) <= 0):
                    problems.append(f'{panel["title"]}: {expr} -> {result}')
        for p_ in problems:
            print("NO DATA:", p_)
        print(f"{n - len(problems)} of {n} dashboard queries returned data")
        # The README's picture: rendered on every run (so render_dashboard.py cannot rot), kept
        # with --screenshot.
        if shutil.which("chromium"):
            png = a.screenshot or os.path.join(tmp, "dashboard.png")
            render_dashboard.screenshot(
                render_dashboard.render_html(prom, "tiny", 0.75, RATE_INTERVAL), png)
            with open(png, "rb") as f:
                header = f.read(24)
            width, height = int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
            if header[:8] != b"\x89PNG\r\n\x1a\n" or (width, height) != (1360, 1100):
                problems.append(f"screenshot {png}: not a 1360x1100 PNG ({width}x{height})")
            print("rendered the dashboard with headless Chromium:", png)
        elif a.screenshot:
            problems.append("--screenshot needs chromium (Debian package `chromium`)")
        else:
            print("chromium is not installed: the dashboard's rendering is not checked")
        return 1 if problems else 0
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
