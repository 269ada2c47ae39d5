#!/usr/bin/env python3
"""Logs, the Jobs filter and pages, charts and the /status page in a real browser.

Run by tests/it/browser.rs (logs_jobs_charts_and_metrics_work_in_a_browser) against a
daemon whose agent `hello` has run twice (v1, then v2) and whose process node HIVE_NODE
is Running with recent telemetry frames. Environment as for dashboard.py (whose helpers
it uses), plus HIVE_NODE. Exit 0 when every scenario passed.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dashboard as base  # noqa: E402 - the shared helpers, after the path is set

from playwright.sync_api import expect, sync_playwright  # noqa: E402

NODE = os.environ["HIVE_NODE"]
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z ")
scenario, shot, goto, sign_in = base.scenario, base.shot, base.goto, base.sign_in


@scenario("agent log: search highlights, timestamps toggle, download what is shown")
def agent_log(page):
    goto(page, "/agents/hello")
    log = page.locator("#agent-log")
    expect(log).to_contain_text("hello from v2", timeout=30_000)
    expect(log).to_contain_text("hello from v1")
    search = page.locator(".log-toolbar .log-search").first
    search.fill("from v2")
    expect(log.locator("mark")).to_have_count(1)
    expect(log.locator("mark")).to_have_text("from v2")
    expect(log).not_to_contain_text("hello from v1")
    expect(page.locator(".log-count").first).to_contain_text("1 line, 1 match")
    shot(page, "agent-log-search")
    with page.expect_download() as info:
        page.click(".log-toolbar .log-download")
    download = info.value
    assert download.suggested_filename == "hello.log", download.suggested_filename
    with open(download.path(), encoding="utf-8") as f:
        saved = f.read()
    assert saved == "hello from v2\n", repr(saved)
    search.fill("")
    page.check(".log-toolbar .log-timestamps")
    expect(log).to_have_attribute("data-timestamps", "true")
    expect(log).to_contain_text("hello from v2", timeout=15_000)
    lines = [line for line in log.inner_text().splitlines() if line.strip()]
    assert lines and all(STAMP.match(line) for line in lines), lines
    shot(page, "agent-log-timestamps")


@scenario("job log: the same toolbar; a node's build log has no timestamps to toggle")
def job_log(page):
    goto(page, "/jobs?template=Rebuild")
    card = page.locator("#jobs-history article.job:not([hidden])").first
    expect(card).to_be_visible(timeout=30_000)
    node = card.locator("li.node", has_text="prebuild")
    if node.count() == 0:
        node = card.locator("li.node").first
    node.first.click()
    log = page.locator("#job-log")
    expect(page.locator("#job-log-title")).to_contain_text("(pinned)", timeout=15_000)
    expect(log).to_have_text(re.compile(r"\S"), timeout=30_000)
    toolbar = page.locator("aside .log-toolbar")
    if page.locator("#job-log-title").get_attribute("data-source") == "node":
        expect(toolbar.locator(".log-timestamps")).to_be_disabled()
    word = re.search(r"[A-Za-z]{4,}", log.inner_text()).group(0)
    toolbar.locator(".log-search").fill(word)
    expect(log.locator("mark").first).to_be_visible()
    for line in log.inner_text().splitlines():
        assert word.lower() in line.lower(), (word, line)
    shot(page, "job-log-search")


@scenario("jobs: filter by template, agent and phase in the URL, and page the history")
def jobs_filter(page):
    goto(page, "/jobs")
    history = page.locator("#jobs-history article.job")
    expect(history.first).to_be_visible(timeout=30_000)
    page.select_option("#jobs-filter-template", "Rebuild")
    expect(page).to_have_url(re.compile(r"/jobs\?template=Rebuild$"))
    shown = page.locator("#jobs-history article.job:not([hidden]), #jobs-active article.job:not([hidden])")
    expect(shown.first).to_be_visible()
    for tag in shown.locator("header .tag").all_inner_texts():
        assert tag == "Rebuild", tag
    page.select_option("#jobs-filter-agent", "hello")
    page.select_option("#jobs-filter-phase", "Done")
    expect(page).to_have_url(re.compile(r"template=Rebuild&agent=hello&phase=Done"))
    expect(page.locator("#jobs-filter-count")).to_contain_text("Jobs match")
    shot(page, "jobs-filtered")
    # A linked view opens filtered; a phase nothing has shows the empty note.
    goto(page, "/jobs?phase=Cancelled")
    expect(page.locator("#jobs-filter-phase")).to_have_value("Cancelled", timeout=15_000)
    expect(page.locator("#jobs-history-empty")).to_contain_text("No finished Job matches", timeout=15_000)
    # Pages of one: the first and second show different Jobs, and the URL says which.
    goto(page, "/jobs?limit=1")
    visible = page.locator("#jobs-history article.job:not([hidden])")
    expect(visible).to_have_count(1, timeout=30_000)
    expect(page.locator("#jobs-pages")).to_contain_text(re.compile(r"Page 1 of [2-9]"))
    first = visible.get_attribute("data-job")
    page.click("#jobs-pages a[rel=next]")
    expect(page).to_have_url(re.compile(r"limit=1&page=2"))
    expect(visible).to_have_count(1)
    assert visible.get_attribute("data-job") != first
    shot(page, "jobs-paged")


@scenario("fleet charts: seeded from the hub's recent frames, with axes and a time scale")
def charts(page):
    goto(page, "/fleet")
    row = page.locator(f'#nodes-rows tr[data-node="{NODE}"]')
    expect(row).to_be_visible(timeout=30_000)
    # Seeded: the hub held at least six CPU frames before the page opened; the row's own
    # updates arrive one every few seconds.
    expect(row).to_have_attribute("data-seeded", "true", timeout=10_000)
    cpu = row.locator("td.metric").first
    expect(cpu).to_have_attribute("title", re.compile(r"CPU.*: ([6-9]|\d\d+) samples"), timeout=10_000)
    page.select_option("#explorer-node", NODE)
    page.locator('#explorer-channels button[data-channel="cpu.percent"]').click()
    chart = page.locator("#explorer-chart svg.timechart")
    expect(chart).to_be_visible(timeout=15_000)
    expect(chart.locator(".x-tick")).to_have_count(3)
    expect(chart.locator(".y-tick").last).to_contain_text("%")
    expect(chart.locator(".span")).to_contain_text("time · last")
    expect(chart.locator("polyline.series")).to_have_count(1)
    shot(page, "fleet-charts")


@scenario("status page: the key numbers from /metrics, refreshed (as a viewer)")
def status(page):
    goto(page, "/status")
    expect(page.locator("main h1")).to_have_text("Status")
    expect(page.locator("body")).to_have_attribute("data-metrics-readings", re.compile(r"^([2-9]|\d\d+)$"), timeout=30_000)
    value = lambda key: page.locator(f'[data-metric="{key}"] .stat-value').inner_text()  # noqa: E731
    assert value("request-rate") != "—", value("request-rate")
    assert int(value("objects")) > 0, value("objects")
    assert int(value("revision")) > 0, value("revision")
    assert int(value("fleet-nodes")) >= 1, value("fleet-nodes")
    assert re.match(r"\d+ / \d+", value("build-slots")), value("build-slots")
    for key in ["request-latency", "inflight", "watches", "commit-latency", "queue", "running-nodes", "agent-restarts"]:
        expect(page.locator(f'[data-metric="{key}"] .stat-value')).not_to_be_empty()
    expect(page.locator("#mx-store")).to_contain_text("agents")
    shot(page, "status")


def main():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=base.CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        operator = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 860}, accept_downloads=True)
        page = operator.new_page()
        page.on("pageerror", lambda err: base.failures.append(f"JavaScript error: {err}"))
        sign_in(page, base.OPERATOR)
        agent_log(page)
        job_log(page)
        jobs_filter(page)
        charts(page)
        view = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 860})
        viewer = view.new_page()
        viewer.on("pageerror", lambda err: base.failures.append(f"JavaScript error: {err}"))
        sign_in(viewer, base.VIEWER)
        status(viewer)
        browser.close()
    if base.failures:
        print(f"\n{len(base.failures)} failure(s):", file=sys.stderr)
        for f in base.failures:
            print("  - " + f, file=sys.stderr)
        sys.exit(1)
    print("all browser scenarios passed")


if __name__ == "__main__":
    main()
