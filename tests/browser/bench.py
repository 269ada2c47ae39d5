#!/usr/bin/env python3
"""Dashboard load measurement on a seeded store (docs/benchmarks.md, "Dashboard").

Start a daemon without the Agent controller (seeded agents then stay put), e.g.
  hive serve --listen 127.0.0.1:0 --state-dir /tmp/dash-bench --agent-controller=false
then: HIVE_URL=https://127.0.0.1:PORT HIVE_TOKEN=<admin token> python3 tests/browser/bench.py
Seeds AGENTS agents and NODES nodes (with telemetry in their status), then measures the
server (page HTML, API list) and the browser (first render of all rows, re-render of a
burst of watch events).
"""

import json
import os
import ssl
import statistics
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from playwright.sync_api import sync_playwright

URL = os.environ["HIVE_URL"].rstrip("/")
TOKEN = os.environ["HIVE_TOKEN"]
AGENTS = int(os.environ.get("AGENTS", "500"))
NODES = int(os.environ.get("NODES", "300"))
CHROMIUM = os.environ.get("HIVE_CHROMIUM", "/usr/bin/chromium")
CTX = ssl._create_unverified_context()  # the daemon's private CA; measurement only


def call(method, path, body=None, ctype="application/json"):
    req = urllib.request.Request(URL + path, method=method, data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Bearer " + TOKEN)
    if body is not None:
        req.add_header("Content-Type", ctype)
    try:
        with urllib.request.urlopen(req, context=CTX) as resp:
            return resp.read()
    except urllib.error.HTTPError as err:
        if err.code == 409 and method == "POST":  # seeded by an earlier run
            return b""
        raise


def agent(i):
    return {"apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": f"agent-{i:04d}", "labels": {"bench": "1"}},
            "spec": {"wanted": "Offline", "config": {"repo": f"https://git.example.invalid/a{i}.git", "rev": "main"},
                     "runtime": {"type": "process", "process": {"command": ["./run.sh"]}}}}


def node(i):
    return {"apiVersion": "hive.dev/v1", "kind": "Node", "metadata": {"name": f"bench-{i:04d}"},
            "spec": {"logicalId": 100000 + i, "provider": "process", "command": "bench"}}


def telemetry(i, cpu):
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"status": {"phase": "Running", "telemetry": {"updatedAt": now, "cpuPercent": cpu, "memoryUsedBytes": 2 << 30,
                                                         "memoryTotalBytes": 16 << 30, "gpuUtilizationPercent": cpu / 2}}}


def timed(fn, n=20):
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    return statistics.median(samples), max(samples)


def main():
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: call("POST", "/apis/hive.dev/v1/agents", agent(i)), range(AGENTS)))
        list(pool.map(lambda i: call("POST", "/apis/hive.dev/v1/nodes", node(i)), range(NODES)))
        list(pool.map(lambda i: call("PATCH", f"/apis/hive.dev/v1/nodes/bench-{i:04d}/status", telemetry(i, 10.0),
                                     "application/merge-patch+json"), range(NODES)))
    print(f"seeded {AGENTS} agents, {NODES} nodes")
    out = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        ctx = browser.new_context(ignore_https_errors=True, bypass_csp=True, viewport={"width": 1280, "height": 860})  # wait_for_function evaluates strings
        page = ctx.new_page()
        page.goto(URL + "/login")
        page.fill("#token", TOKEN)
        page.click("button[type=submit]")
        page.wait_for_selector("#ov-agents .big")
        cookie = next(c for c in ctx.cookies() if c["name"] == "hive_session")["value"]

        def page_html(path):
            req = urllib.request.Request(URL + path)
            req.add_header("Cookie", "hive_session=" + cookie)
            with urllib.request.urlopen(req, context=CTX) as resp:
                resp.read()

        out["server: GET /agents page (shell) ms median/max"] = timed(lambda: page_html("/agents"))
        out["server: GET /fleet page (shell) ms median/max"] = timed(lambda: page_html("/fleet"))
        out["server: GET agents list (500) ms median/max"] = timed(lambda: call("GET", "/apis/hive.dev/v1/agents"))
        out["server: GET nodes list (300) ms median/max"] = timed(lambda: call("GET", "/apis/hive.dev/v1/nodes"))

        for path, sel, n in [("/agents", "#agents-rows tr", AGENTS), ("/fleet", "#nodes-rows tr", NODES)]:
            t = time.perf_counter()
            page.goto(URL + path)
            page.wait_for_function(f"document.querySelectorAll('{sel}').length >= {n}", timeout=60_000)
            out[f"browser: {path} navigation → {n} rows ms"] = round((time.perf_counter() - t) * 1000, 1)
            out[f"browser: {path} first render (JS) ms"] = round(page.evaluate("Math.max(...window.hiveRenderMs)"), 1)

        # A burst of watch events: every node's telemetry changes at once.
        page.evaluate("window.hiveRenderMs = []")
        t = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: call("PATCH", f"/apis/hive.dev/v1/nodes/bench-{i:04d}/status", telemetry(i, 55.0),
                                         "application/merge-patch+json"), range(NODES)))
        page.wait_for_function(f"[...document.querySelectorAll('#nodes-rows [data-metric=cpu]')].filter(e => e.textContent === '55%').length >= {NODES}", timeout=60_000)
        frames = page.evaluate("window.hiveRenderMs")
        out[f"browser: {NODES} node updates → all rows show them ms (incl. {NODES} PATCHes)"] = round((time.perf_counter() - t) * 1000, 1)
        out["browser: fleet update frames (count, median ms, max ms)"] = (len(frames), round(statistics.median(frames), 2), round(max(frames), 2))

        page.goto(URL + "/agents")
        page.wait_for_function(f"document.querySelectorAll('#agents-rows tr').length >= {AGENTS}", timeout=60_000)
        page.evaluate("window.hiveRenderMs = []")
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: call("PATCH", f"/apis/hive.dev/v1/agents/agent-{i:04d}", {"metadata": {"labels": {"bench": "2"}}},
                                         "application/merge-patch+json"), range(100)))
        page.wait_for_timeout(1500)
        frames = page.evaluate("window.hiveRenderMs")
        out["browser: 100 agent updates: frames (count, median ms, max ms)"] = (len(frames), round(statistics.median(frames), 2), round(max(frames), 2))
        browser.close()
    for k, v in out.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
