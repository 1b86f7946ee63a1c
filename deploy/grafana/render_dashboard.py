#!/usr/bin/env python3
"""Renders deploy/grafana/tandem.json's panels as an HTML page from a live Prometheus, and
screenshots it with headless Chromium (Grafana is not packaged in Debian, so the README's
picture is this rendering of the very same queries, not Grafana itself).

    render_dashboard.py --prometheus http://127.0.0.1:9090 --out dashboard.png \
        [--model-name tiny] [--minutes 2] [--rate-interval 30s]

Each panel runs its queries through /api/v1/query_range (Grafana's $__rate_interval and
$model_name replaced as given) and draws them as SVG line charts. tests/deploy/prometheus_e2e_test.py
calls it after its load; it needs only the Python standard library and `chromium`.
"""
import argparse
import html
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

DASHBOARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tandem.json")
COLORS = ["#3274d9", "#e0752d", "#37872d", "#c4162a", "#8f3bb8", "#fade2a"]


def substitute(expr, rate_interval, model_name):
    return expr.replace("$__rate_interval", rate_interval).replace("$model_name", model_name)


def query_range(prometheus, expr, start, end, step):
    url = prometheus + "/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def legend(fmt, metric):
    out = fmt
    for k, v in metric.items():
        out = out.replace("{{" + k + "}}", v)
    return out


def fmt_value(v, unit):
    if unit == "s":
        return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s"
    if unit == "percentunit":
        return f"{v * 100:.1f}%"
    if unit == "Bps":
        return f"{v / 1024:.1f} KiB/s" if v >= 1024 else f"{v:.0f} B/s"
    return f"{v:.3g}"


def svg_chart(series, unit, width=420, height=170):
    points = [(t, v) for s in series for t, v in s["values"]]
    if not points:
        return '<div class="nodata">no data</div>'
    t0, t1 = min(p[0] for p in points), max(p[0] for p in points)
    vmax = max(p[1] for p in points) or 1.0
    sx = lambda t: 40 + (width - 50) * ((t - t0) / ((t1 - t0) or 1))
    sy = lambda v: height - 20 - (height - 30) * (v / vmax)
    parts = [f'<svg width="{width}" height="{height}">',
             f'<line x1="40" y1="{height - 20}" x2="{width - 10}" y2="{height - 20}" class="axis"/>',
             f'<text x="2" y="14" class="tick">{html.escape(fmt_value(vmax, unit))}</text>',
             f'<text x="2" y="{height - 22}" class="tick">0</text>']
    for i, s in enumerate(series):
        pts = " ".join(f"{sx(t):.1f},{sy(v):.1f}" for t, v in s["values"])
        parts.append(f'<polyline fill="none" stroke="{COLORS[i % len(COLORS)]}" '
                     f'stroke-width="1.8" points="{pts}"/>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(prometheus, model_name, minutes, rate_interval):
    dash = json.load(open(DASHBOARD))
    end = time.time()
    start = end - 60 * minutes
    step = max(1, int(60 * minutes / 120))
    cells = []
    for panel in dash["panels"]:
        unit = panel["fieldConfig"]["defaults"].get("unit", "short")
        series = []
        for target in panel["targets"]:
            expr = substitute(target["expr"], rate_interval, model_name)
            for r in query_range(prometheus, expr, start, end, step):
                values = [(float(t), float(v)) for t, v in r["values"]
                          if not math.isnan(float(v)) and not math.isinf(float(v))]
                if values:
                    series.append({"name": legend(target.get("legendFormat", ""), r["metric"]),
                                   "values": values})
        legends = "".join(
            f'<span style="color:{COLORS[i % len(COLORS)]}">&#9632;</span> '
            f'{html.escape(s["name"])} {html.escape(fmt_value(s["values"][-1][1], unit))}&nbsp; '
            for i, s in enumerate(series))
        cells.append(f'<div class="panel"><h3>{html.escape(panel["title"])}</h3>'
                     f'{svg_chart(series, unit)}<div class="legend">{legends}</div></div>')
    return f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ background:#111217; color:#ccccdc; font: 12px sans-serif; margin: 8px; }}
h1 {{ font-size: 16px; margin: 4px 0 8px; }} h3 {{ font-size: 13px; margin: 0 0 4px; }}
.grid {{ display:grid; grid-template-columns: repeat(3, 440px); gap: 8px; }}
.panel {{ background:#181b1f; border:1px solid #2c3235; padding:6px; height: 240px; }}
.axis {{ stroke:#444; }} .tick {{ fill:#888; font-size: 10px; }}
.legend {{ font-size: 11px; }} .nodata {{ color:#888; padding: 60px; }}
</style></head><body>
<h1>tandem — {html.escape(dash["title"])} dashboard (model_name={html.escape(model_name)},
last {minutes} min; the queries of deploy/grafana/tandem.json on Prometheus)</h1>
<div class="grid">{''.join(cells)}</div></body></html>"""


def screenshot(html_text, out_png, width=1360, height=1100):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise RuntimeError("chromium is not installed")
    with tempfile.TemporaryDirectory() as d:
        page = os.path.join(d, "dashboard.html")
        with open(page, "w") as f:
            f.write(html_text)
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", f"--user-data-dir={d}/profile",
                        f"--window-size={width},{height}", f"--screenshot={out_png}",
                        "file://" + page], check=True, timeout=60,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not os.path.exists(out_png):
        raise RuntimeError("chromium wrote no screenshot")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prometheus", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model-name", default=".*")
    p.add_argument("--minutes", type=float, default=2)
    p.add_argument("--rate-interval", default="30s")
    a = p.parse_args()
    screenshot(render_html(a.prometheus, a.model_name, a.minutes, a.rate_interval), a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
