#!/usr/bin/env python3
"""The dashboard in a real browser: Debian's Chromium driven headless by Playwright.

Run by tests/it/browser.rs against a real daemon. Environment:
  HIVE_URL              https://127.0.0.1:PORT
  HIVE_OPERATOR_TOKEN   an operator token
  HIVE_VIEWER_TOKEN     a viewer token
  HIVE_ADMIN_TOKEN      an admin token (ConfigureProvider)
  HIVE_APPROVAL         the name of a pending approval to approve
  HIVE_ARTIFACTS        where screenshots go
  HIVE_CHROMIUM         the browser (default /usr/bin/chromium)
Exit 0 when every scenario passed; otherwise each failure is printed and exit is 1.
Tokens come from the environment, never the command line (which `ps` shows).
"""

import os
import re
import sys
import time
import traceback

import yaml
from playwright.sync_api import expect, sync_playwright

URL = os.environ["HIVE_URL"].rstrip("/")
OPERATOR = os.environ["HIVE_OPERATOR_TOKEN"]
VIEWER = os.environ["HIVE_VIEWER_TOKEN"]
ADMIN = os.environ["HIVE_ADMIN_TOKEN"]
APPROVAL = os.environ.get("HIVE_APPROVAL", "")
ART = os.environ.get("HIVE_ARTIFACTS", "browser-artifacts")
CHROMIUM = os.environ.get("HIVE_CHROMIUM", "/usr/bin/chromium")
SLOW = 90_000  # ms: Jobs, deploys and provisioning run real processes

os.makedirs(ART, exist_ok=True)
for old in os.listdir(ART):
    if old.endswith(".png"):
        os.remove(os.path.join(ART, old))
failures = []
state = {}


def scenario(name):
    def wrap(fn):
        def run(*args):
            started = time.time()
            try:
                fn(*args)
                print(f"ok   {name} ({time.time() - started:.1f}s)", flush=True)
            except Exception as err:  # noqa: BLE001 - every failure is reported, then the next runs
                failures.append(f"{name}: {err}")
                print(f"FAIL {name}: {err}", flush=True)
                traceback.print_exc()
                try:
                    args[0].screenshot(path=os.path.join(ART, f"failed-{re.sub(r'[^a-z]+', '-', name)}.png"), full_page=True)
                except Exception:  # noqa: BLE001
                    pass

        return run

    return wrap


def shot(page, name):
    page.screenshot(path=os.path.join(ART, f"{name}.png"), full_page=False)


def goto(page, path):
    """Navigates to URL + path. Chromium aborts a navigation with ERR_NETWORK_CHANGED
    when the machine's interfaces change (other tests on a shared host bring some up);
    that says nothing about the dashboard, so the navigation is retried."""
    for attempt in range(3):
        try:
            return page.goto(URL + path)
        except Exception as err:  # noqa: BLE001 - only this one network hiccup is retried
            if "ERR_NETWORK_CHANGED" not in str(err) or attempt == 2:
                raise
            time.sleep(0.5)


def api_call(page, method, path, body=None):
    """Calls the API from the page as the dashboard's own script does (session cookie,
    CSRF header); returns {status, body}."""
    return page.evaluate(
        """async ([method, path, body]) => {
            const csrf = document.querySelector('meta[name="csrf-token"]').content;
            const init = {method, credentials: 'same-origin', headers: {'X-CSRF-Token': csrf, Accept: 'application/json'}};
            if (body !== null) { init.body = JSON.stringify(body); init.headers['Content-Type'] = 'application/json'; }
            const r = await fetch(path, init);
            const text = await r.text();
            let json = null;
            try { json = JSON.parse(text); } catch (_) {}
            return {status: r.status, body: json};
        }""",
        [method, path, body],
    )


def post_event(page, name, kind, obj, reason, message):
    """Records a core Event about kind/obj through the API, happening now."""
    now = page.evaluate("() => new Date().toISOString()")
    reply = api_call(page, "POST", "/api/v1/events", {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
        "involvedObject": {"apiVersion": "hive.dev/v1", "kind": kind, "name": obj},
        "reason": reason, "message": message, "type": "Warning", "count": 1,
        "firstTimestamp": now, "lastTimestamp": now,
    })
    assert reply["status"] == 201, reply


def offline_agent(page, name):
    """Creates an agent that is never started (wanted Offline)."""
    reply = api_call(page, "POST", "/apis/hive.dev/v1/agents", {
        "apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name},
        "spec": {"wanted": "Offline", "config": {"repo": "https://git.example.invalid/" + name + ".git", "rev": "main"},
                 "runtime": {"type": "process", "process": {"command": ["./run.sh"]}}}})
    assert reply["status"] == 201, reply


def column(page, table, index):
    """The text of column `index` of the visible rows of `table`, top to bottom."""
    return page.evaluate(
        """([table, i]) => [...document.querySelector(table).tBodies[0].rows]
            .filter((tr) => !tr.hidden).map((tr) => tr.cells[i].textContent.trim())""",
        [table, index],
    )


def datetimes(page, rows):
    """The datetime of the last <time> in each row matched by `rows`, top to bottom."""
    return page.evaluate(
        """(sel) => [...document.querySelectorAll(sel)].map((tr) => {
            const t = [...tr.querySelectorAll('time[datetime]')];
            return t.length ? Date.parse(t[t.length - 1].getAttribute('datetime')) : null; })""",
        rows,
    )


def sign_in(page, token):
    goto(page, "/")
    expect(page).to_have_url(re.compile(r"/login$"))
    page.fill("#token", token)
    page.click("button[type=submit]")
    expect(page.locator("main h1")).to_have_text("Overview")


@scenario("sign in and see the overview live")
def signs_in(page):
    sign_in(page, OPERATOR)
    expect(page.locator("#live")).to_have_text(re.compile("live"), timeout=15_000)
    expect(page.locator("#ov-agents")).to_contain_text("agent", timeout=15_000)
    shot(page, "overview")


@scenario("the hello agent is Running and Ready")
def hello_ready(page):
    goto(page, "/agents")
    row = page.locator('tr[data-agent="hello"]')
    expect(row.locator("td").nth(1)).to_have_text(re.compile(r"Running$"), timeout=SLOW)
    expect(row).to_contain_text("Ready", timeout=SLOW)
    shot(page, "agents")


@scenario("restart hello: its Job card reaches Done and the log panel shows output")
def restart(page):
    goto(page, "/agents/hello")
    expect(page.locator("#agent-summary")).to_contain_text("Running", timeout=SLOW)
    page.click('button[data-template="Restart"]')
    card = page.locator("#power-job article.job")
    expect(card).to_be_visible(timeout=15_000)
    job = card.get_attribute("data-job")
    state["job"] = job
    expect(card).to_have_attribute("data-phase", "Done", timeout=SLOW)
    expect(page.locator("#agent-log")).to_have_text(re.compile(r"\S"), timeout=30_000)
    shot(page, "agent")
    goto(page, "/jobs")
    jc = page.locator(f'article[data-job="{job}"]')
    expect(jc).to_have_attribute("data-phase", "Done", timeout=SLOW)
    expect(page.locator("#job-log")).to_have_text(re.compile(r"\S"), timeout=30_000)
    shot(page, "jobs")


@scenario("approve a pending approval and see it deploy")
def approve(page):
    if not APPROVAL:
        raise AssertionError("no pending approval was set up (HIVE_APPROVAL is empty)")
    goto(page, "/approvals")
    card = page.locator(f'article[data-approval="{APPROVAL}"]')
    expect(card).to_be_visible(timeout=30_000)
    # What would change, compared by the server with the applied commit.
    expect(card.locator(".diff")).to_contain_text(re.compile(r"\d+ commits? · \d+ files? · \+\d+"), timeout=30_000)
    shot(page, "approvals-pending")
    reason = card.locator("input.reason-input")
    reason.fill("reviewed in the browser suite")
    # A re-list (the resumed watch answers 410) keeps what was typed in a pending card.
    relisted = []

    def on_approvals(route):
        if "watch=true" in route.request.url:
            if not relisted:
                relisted.append("410")
                body = '{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410,"message":"too old"}'
                return route.fulfill(status=410, content_type="application/json", body=body)
        elif relisted:
            relisted.append("list")
        route.continue_()

    approvals_url = re.compile(r".*/apis/hive\.dev/v1/approvals\?.*")
    page.route(approvals_url, on_approvals)
    try:
        # Hide and show the tab: the watch closes, then resumes (and gets the 410).
        page.evaluate(
            """() => {
                const set = (v) => {
                    Object.defineProperty(document, 'hidden', {value: v, configurable: true});
                    document.dispatchEvent(new Event('visibilitychange'));
                };
                set(true);
                setTimeout(() => set(false), 200);
            }"""
        )
        deadline = time.time() + 15
        while "list" not in relisted and time.time() < deadline:
            page.wait_for_timeout(100)
        assert "list" in relisted, f"no re-list after the 410: {relisted}"
        page.wait_for_timeout(300)  # a frame or two for the re-render
        expect(reason).to_have_value("reviewed in the browser suite")
    finally:
        page.unroute(approvals_url)
    card.locator("button[data-approve]").click()
    row = page.locator(f'#approvals-history tr[data-approval="{APPROVAL}"]')
    expect(row).to_contain_text("Deployed", timeout=SLOW)
    expect(row).to_contain_text("otto")
    shot(page, "approvals")


@scenario("provision a process node (a double submit provisions once) and see it Ready")
def provision(page):
    goto(page, "/provision")
    expect(page.locator("#provision-provider option")).not_to_have_count(0, timeout=15_000)
    page.select_option("#provision-provider", "process")
    command = page.locator("#provision-command").inner_text()
    page.click("#provision-form button[type=submit]")
    expect(page.locator("#provision-result")).to_contain_text("Submitted as " + command, timeout=15_000)
    page.click("#provision-form button[type=submit]")
    expect(page.locator("#provision-result")).to_contain_text("Already submitted", timeout=15_000)
    row = page.locator(f'#commands-rows tr[data-command="{command}"]')
    expect(row).to_contain_text("Succeeded", timeout=SLOW)
    shot(page, "provision")
    node = row.locator("td").nth(3).inner_text().split(",")[0].strip()
    state["node"] = node
    goto(page, "/fleet")
    expect(page.locator(f'#nodes-rows tr[data-node="{node}"]')).to_contain_text("Running", timeout=SLOW)
    shot(page, "fleet")


@scenario("the node's telemetry changes (explorer stream and node row)")
def telemetry(page):
    node = state.get("node")
    if not node:
        raise AssertionError("no provisioned node to watch")
    goto(page, "/fleet")
    page.select_option("#explorer-node", node)
    status = page.locator("#explorer-status")
    expect(status).not_to_have_text(re.compile("Connecting"), timeout=15_000)
    text = status.inner_text()
    if "unavailable" in text or "failed" in text:
        raise AssertionError(f"GET /hive/v1/fleet/nodes/{node}/telemetry is not served yet: {text}")
    expect(page.locator("#explorer-channels li").first).to_be_visible(timeout=15_000)
    # A channel that always moves (uptime grows; CPU rarely sits still), not whichever
    # descriptor came first: a constant channel would look like a stalled stream.
    for channel in ["uptime.seconds", "cpu.percent"]:
        button = page.locator(f'#explorer-channels button[data-channel="{channel}"]')
        if button.count():
            button.click()
            break
    else:
        raise AssertionError("neither uptime.seconds nor cpu.percent is offered")
    title = page.locator("#explorer-chart .chart-title")
    expect(title).to_contain_text(channel)
    expect(title).not_to_contain_text("no frames yet", timeout=30_000)
    frames = lambda: int(status.get_attribute("data-frames") or 0)  # noqa: E731
    first, first_frames = title.inner_text(), frames()
    deadline = time.time() + 30
    while (title.inner_text() == first or frames() <= first_frames) and time.time() < deadline:
        time.sleep(0.5)
    if title.inner_text() == first or frames() <= first_frames:
        raise AssertionError(f"telemetry did not change in 30 s (still {first!r}, {frames()} frames)")
    shot(page, "fleet-telemetry")


@scenario("kill the node with a confirmation")
def kill(page):
    node = state.get("node")
    if not node:
        raise AssertionError("no provisioned node to kill")
    goto(page, "/provision")
    expect(page.locator(f'#kill-node option[value="{node}"]')).to_have_count(1, timeout=15_000)
    page.select_option("#kill-node", node)
    page.click("#kill-form button[type=submit]")
    expect(page.locator("#kill-confirm")).to_be_visible()
    # The confirmation names the node it asked about, whatever the select shows later.
    expect(page.locator("#kill-confirm")).to_have_attribute("data-node", node)
    page.click("#kill-yes")
    expect(page.locator("#kill-result")).to_contain_text("submitted", timeout=15_000)
    goto(page, "/fleet")
    expect(page.locator(f'#nodes-rows tr[data-node="{node}"]')).to_contain_text("Killed", timeout=SLOW)
    shot(page, "fleet-killed")


@scenario("a forged mutation without the CSRF token is refused")
def forged(page):
    goto(page, "/agents")
    reply = page.evaluate(
        """async () => {
            const r = await fetch('/apis/hive.dev/v1/jobs', {method: 'POST', credentials: 'same-origin',
              headers: {'Content-Type': 'application/json'},
              body: JSON.stringify({apiVersion: 'hive.dev/v1', kind: 'Job', metadata: {}, spec: {template: 'Stop', agents: ['hello']}})});
            return {status: r.status, body: await r.json()};
        }"""
    )
    assert reply["status"] == 403, reply
    assert "CSRF" in reply["body"]["message"], reply


@scenario("a dropped watch shows the indicator, resumes from its resourceVersion, re-lists after 410")
def resumes(page):
    # Counted, not timed: the first two watches drop, the third answers 410, then all
    # pass. `log` is the order of requests: ("list", None) or ("watch", resourceVersion).
    log = []
    answered = {"watches": 0}

    def on_route(route):
        url = route.request.url
        if "watch=true" not in url:
            log.append(("list", None))
            return route.continue_()
        rv = re.search(r"resourceVersion=([^&]*)", url).group(1)
        log.append(("watch", rv))
        answered["watches"] += 1
        n = answered["watches"]
        if n <= 2:
            return route.abort("connectionreset")  # the stream drops
        if n == 3:
            body = '{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410,"message":"too old"}'
            return route.fulfill(status=410, content_type="application/json", body=body)
        route.continue_()

    # No dashboard page may be open while the route counts: the previous scenario's page
    # watches agents too, and its watch, re-opened once the route is in place, came
    # first in the log on a loaded machine.
    page.goto("about:blank")
    page.route(re.compile(r".*/apis/hive\.dev/v1/agents\?.*"), on_route)
    try:
        goto(page, "/agents")
        expect(page.locator("#live")).to_have_text(re.compile("reconnecting"), timeout=5_000)
        shot(page, "stream-down")
        expect(page.locator("#live")).to_have_text(re.compile("live"), timeout=20_000)
        kinds = [k for k, _ in log]
        assert kinds[:5] == ["list", "watch", "watch", "watch", "list"], f"unexpected order: {log}"
        # After a drop, the next watch resumes from the last resourceVersion, no list between.
        assert log[1][1] and log[2][1] == log[1][1] and log[3][1] == log[1][1], f"no resume: {log}"
        # After the 410, a re-list, then a watch from the new list's resourceVersion.
        assert len(log) >= 6 and log[5][0] == "watch" and log[5][1], f"no watch after the re-list: {log}"
        # Still live after all that: a new agent appears without a reload.
        status = page.evaluate(
            """async () => {
                const csrf = document.querySelector('meta[name="csrf-token"]').content;
                const r = await fetch('/apis/hive.dev/v1/agents', {method: 'POST', credentials: 'same-origin',
                  headers: {'Content-Type': 'application/json', 'X-CSRF-Token': csrf},
                  body: JSON.stringify({apiVersion: 'hive.dev/v1', kind: 'Agent', metadata: {name: 'zz-live'},
                    spec: {wanted: 'Offline', config: {repo: 'https://git.example.invalid/zz.git', rev: 'main'},
                           runtime: {type: 'process', process: {command: ['./run.sh']}}}})});
                return r.status;
            }"""
        )
        assert status == 201, status
        expect(page.locator('tr[data-agent="zz-live"]')).to_be_visible(timeout=10_000)
        assert ("list", None) not in log[6:], f"the live watch re-listed: {log}"
    finally:
        page.unroute(re.compile(r".*/apis/hive\.dev/v1/agents\?.*"))


@scenario("the overview lists recent events, newest first, live")
def overview_events(page):
    goto(page, "/")
    rows = page.locator("#ov-events tbody tr")
    expect(rows.first).to_be_visible(timeout=30_000)
    times = datetimes(page, "#ov-events tbody tr")
    assert times == sorted(times, reverse=True), f"not newest first: {times}"
    post_event(page, "browser-suite-hello", "Agent", "hello", "BrowserSuite", "recorded by the browser suite")
    expect(rows.first).to_contain_text("BrowserSuite", timeout=15_000)
    expect(rows.first.locator("a")).to_have_attribute("href", "/agents/hello")
    shot(page, "overview-events")


@scenario("the agent page shows its Jobs, Events and spec as YAML")
def agent_detail(page):
    goto(page, "/agents/hello")
    jobs = page.locator("#agent-jobs tbody tr")
    expect(jobs.first).to_be_visible(timeout=30_000)
    if state.get("job"):
        expect(page.locator(f'#agent-jobs tr[data-job="{state["job"]}"]')).to_have_attribute("data-phase", "Done")
    times = page.evaluate(
        """() => [...document.querySelectorAll('#agent-jobs tbody tr')].map((tr) =>
            Date.parse(tr.cells[3].querySelector('time').getAttribute('datetime')))"""
    )
    assert times == sorted(times, reverse=True), f"Jobs not newest first: {times}"
    expect(page.locator("#agent-events")).to_contain_text("BrowserSuite", timeout=15_000)
    # Live: a new event about hello appears without a reload; one about another agent does not.
    post_event(page, "browser-suite-hello-2", "Agent", "hello", "BrowserSuiteLive", "second")
    post_event(page, "browser-suite-other", "Agent", "zz-live", "NotAboutHello", "elsewhere")
    expect(page.locator("#agent-events tbody tr").first).to_contain_text("BrowserSuiteLive", timeout=15_000)
    expect(page.locator("#agent-events")).not_to_contain_text("NotAboutHello")
    yaml_text = page.locator("#agent-yaml").inner_text()
    parsed = yaml.safe_load(yaml_text)
    api_agent = api_call(page, "GET", "/apis/hive.dev/v1/agents/hello")["body"]
    assert parsed["kind"] == "Agent" and parsed["metadata"]["name"] == "hello", yaml_text
    assert parsed["spec"] == api_agent["spec"], f"the YAML is not the spec: {parsed['spec']} vs {api_agent['spec']}"
    # The converter itself, on values YAML would misread if left plain.
    tricky = {"yes": "yes", "no": "no", "null": "null", "num": "0123", "float": "1e3", "date": "2024-01-01",
              "colon": "a: b", "hash": "#not a comment", "dash": "- x", "empty": "", "spaces": " pad ",
              "lines": "one\ntwo", "markup": "<script>alert(1)</script>", "quote": "it's \"quoted\"",
              "unicode": "é ✓ \u2028", "n": 1.5, "t": True, "z": None, "list": [1, "two", {"a": []}, [3, [4]]],
              "obj": {"nested": {"deep": "v"}, "emptyObj": {}}, "key: with colon": "k", "": "empty key"}
    out = page.evaluate("(v) => hive.toYaml(v)", tricky)
    assert yaml.safe_load(out) == tricky, out
    assert page.locator("#agent-yaml script").count() == 0
    page.screenshot(path=os.path.join(ART, "agent-detail.png"), full_page=True)


@scenario("tables sort by a clicked header (stable, kept under live updates)")
def sorting(page):
    offline_agent(page, "aa-sorted")
    goto(page, "/agents")
    expect(page.locator('tr[data-agent="aa-sorted"]')).to_be_visible(timeout=15_000)
    expect(page.locator('tr[data-agent="zz-live"]')).to_be_visible(timeout=15_000)
    header = page.locator("#agents-table thead th").nth(0)
    header.locator("button").click()
    expect(header).to_have_attribute("aria-sort", "ascending")
    names = column(page, "#agents-table", 0)
    assert names == sorted(names), names
    header.locator("button").click()
    expect(header).to_have_attribute("aria-sort", "descending")
    names = column(page, "#agents-table", 0)
    assert names == sorted(names, reverse=True), names
    shot(page, "agents-sorted-desc")
    # A new agent lands in its sorted place, not at the key order's.
    offline_agent(page, "mm-sorted")
    expect(page.locator('tr[data-agent="mm-sorted"]')).to_be_visible(timeout=15_000)
    page.wait_for_timeout(300)
    names = column(page, "#agents-table", 0)
    assert names == sorted(names, reverse=True), f"after a live insert: {names}"
    # Ties keep the rows' own (key) order, in either direction.
    wanted = page.locator("#agents-table thead th").nth(2)
    wanted.locator("button").click()
    expect(wanted).to_have_attribute("aria-sort", "ascending")
    expect(header).not_to_have_attribute("aria-sort", re.compile("."))
    rows = list(zip(column(page, "#agents-table", 2), column(page, "#agents-table", 0)))
    assert rows == sorted(rows), f"ascending by Wanted, ties by name: {rows}"
    wanted.locator("button").click()
    rows = list(zip(column(page, "#agents-table", 2), column(page, "#agents-table", 0)))
    expected = sorted(rows, key=lambda r: r[1])
    expected = sorted(expected, key=lambda r: r[0], reverse=True)
    assert rows == expected, f"descending by Wanted, ties still by name: {rows}"
    # The fleet's table sorts too.
    goto(page, "/fleet")
    page.locator("#nodes-table thead th button").first.click()
    expect(page.locator("#nodes-table thead th").first).to_have_attribute("aria-sort", "ascending")


@scenario("the status filter matches a status exactly")
def ready_filter(page):
    # One agent that is StartFailed, injected into the list answer: the filter decides
    # on the status word the server put in status.phase.
    fake = {"apiVersion": "hive.dev/v1", "kind": "Agent",
            "metadata": {"name": "zz-probe", "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"wanted": "Up", "config": {"repo": "https://git.example.invalid/f.git"}, "runtime": {"type": "process"}},
            "status": {"phase": "StartFailed", "power": "Stopped",
                       "conditions": [{"type": "Ready", "status": "False", "reason": "StartFailed"}]}}

    def on_list(route):
        if "watch=true" in route.request.url:
            return route.continue_()
        response = route.fetch()
        body = response.json()
        body["items"].append(fake)
        route.fulfill(response=response, json=body)

    pattern = re.compile(r".*/apis/hive\.dev/v1/agents\?.*")
    page.route(pattern, on_list)
    try:
        goto(page, "/agents")
        expect(page.locator('tr[data-agent="zz-probe"]')).to_contain_text("StartFailed", timeout=15_000)
        expect(page.locator('tr[data-agent="hello"]')).to_be_visible(timeout=15_000)
        hello_state = page.locator('tr[data-agent="hello"] td').nth(1).inner_text()
        page.fill("#filter", "Running")
        expect(page.locator('tr[data-agent="zz-probe"]')).to_be_hidden()
        if "Running" in hello_state:
            expect(page.locator('tr[data-agent="hello"]')).to_be_visible()
        shot(page, "agents-filter-status")
        page.fill("#filter", "startfailed")
        expect(page.locator('tr[data-agent="zz-probe"]')).to_be_visible()
        expect(page.locator('tr[data-agent="hello"]')).to_be_hidden()
        page.fill("#filter", "sorted")
        expect(page.locator('tr[data-agent="aa-sorted"]')).to_be_visible()
        expect(page.locator('tr[data-agent="zz-probe"]')).to_be_hidden()
    finally:
        page.unroute(pattern)


@scenario("a missing agent, node or Job is a 404 page with a way back and no controls")
def not_found(page):
    for path, words, back in [("/agents/nope", "no agent named", "/agents"),
                              ("/nodes/nope", "no node named", "/fleet"),
                              ("/jobs/nope", "no job named", "/jobs")]:
        response = goto(page, path)
        assert response.status == 404, f"{path}: HTTP {response.status}"
        expect(page.locator("#not-found")).to_contain_text(words)
        expect(page.locator("main")).not_to_contain_text("Loading")
        expect(page.locator("button[data-template], #agent-kill, #agent-delete, #power")).to_have_count(0)
        expect(page.locator(f'#not-found a[href="{back}"]')).to_be_visible()
        expect(page.locator("#live")).to_be_hidden()
        shot(page, "not-found-" + path.split("/")[1])
    # An agent deleted while its page is open: the script says so and hides the controls.
    goto(page, "/agents/aa-sorted")
    expect(page.locator("#agent-yaml")).to_contain_text("aa-sorted", timeout=15_000)
    expect(page.locator("#agent-kill")).to_be_enabled()
    reply = api_call(page, "DELETE", "/apis/hive.dev/v1/agents/aa-sorted")
    assert reply["status"] in (200, 202), reply
    expect(page.locator("#agent-summary")).to_contain_text("There is no agent named aa-sorted", timeout=SLOW)
    expect(page.locator("#power")).to_be_hidden()
    expect(page.locator("#agent-danger")).to_be_hidden()
    expect(page.locator("main")).not_to_contain_text("Loading")
    shot(page, "agent-deleted-while-open")


@scenario("Kill, after a confirmation, leaves the agent stopped")
def agent_kill(page):
    goto(page, "/agents/hello")
    expect(page.locator("#agent-kill")).to_be_enabled(timeout=15_000)
    page.click("#agent-kill")
    expect(page.locator("#agent-confirm")).to_be_visible()
    expect(page.locator("#agent-confirm-question")).to_contain_text("Kill hello?")
    page.click("#agent-confirm-no")
    expect(page.locator("#agent-confirm")).to_be_hidden()
    expect(page.locator("#agent-danger-result")).to_have_text("")
    page.click("#agent-kill")
    shot(page, "agent-kill-confirm")
    page.click("#agent-confirm-yes")
    expect(page.locator("#agent-danger-result")).to_contain_text("Kill submitted as", timeout=15_000)
    job = page.locator("#agent-danger-result a").inner_text()
    row = page.locator(f'#agent-jobs tr[data-job="{job}"]')
    expect(row).to_have_attribute("data-phase", "Done", timeout=SLOW)
    expect(row).to_contain_text("Kill")
    expect(page.locator("#agent-summary")).to_contain_text("observed Stopped", timeout=SLOW)
    expect(page.locator("#agent-summary")).to_contain_text("wanted Offline")
    shot(page, "agent-killed")
    goto(page, "/jobs/" + job)
    expect(page.locator(f'#job-card article[data-job="{job}"]')).to_have_attribute("data-phase", "Done", timeout=15_000)
    shot(page, "job-page")


@scenario("Delete, after a confirmation, navigates away and the agent leaves the list")
def agent_delete(page):
    offline_agent(page, "doomed")
    goto(page, "/agents/doomed")
    expect(page.locator("#agent-delete")).to_be_enabled(timeout=15_000)
    page.click("#agent-delete")
    expect(page.locator("#agent-confirm-question")).to_contain_text("Delete doomed?")
    page.click("#agent-confirm-yes")
    expect(page).to_have_url(re.compile(r"/agents$"), timeout=15_000)
    expect(page.locator('tr[data-agent="doomed"]')).to_have_count(0, timeout=SLOW)
    expect(page.locator('tr[data-agent="hello"]')).to_be_visible()
    shot(page, "agent-deleted")


@scenario("a node's page: phase, conditions, telemetry and events, linked from the fleet")
def node_page(page):
    node = state.get("node")
    if not node:
        raise AssertionError("no provisioned node to look at")
    goto(page, "/fleet")
    page.locator(f'#nodes-rows tr[data-node="{node}"] a[href="/nodes/{node}"]').click()
    expect(page).to_have_url(re.compile(f"/nodes/{node}$"))
    expect(page.locator("#node-summary")).to_contain_text("Running", timeout=15_000)
    expect(page.locator('#node-conditions tr[data-condition="Ready"]')).to_contain_text("True")
    expect(page.locator("#node-facts")).to_contain_text("Hostname")
    expect(page.locator("#explorer-channels li").first).to_be_visible(timeout=15_000)
    status = page.locator("#explorer-status")
    frames = lambda: int(status.get_attribute("data-frames") or 0)  # noqa: E731
    deadline = time.time() + 30
    while frames() < 2 and time.time() < deadline:
        time.sleep(0.5)
    assert frames() >= 2, f"no telemetry frames on the node page: {status.inner_text()}"
    expect(page.locator("#node-events")).to_contain_text(re.compile("No events|Reason"), timeout=15_000)
    post_event(page, "browser-suite-node", "Node", node, "BrowserSuiteNode", "about the node")
    expect(page.locator("#node-events tbody tr").first).to_contain_text("BrowserSuiteNode", timeout=15_000)
    page.screenshot(path=os.path.join(ART, "node.png"), full_page=True)


@scenario("a killed node's page says Killed")
def node_killed(page):
    node = state.get("node")
    if not node:
        raise AssertionError("no provisioned node to look at")
    goto(page, f"/nodes/{node}")
    expect(page.locator("#node-summary")).to_contain_text("Killed", timeout=SLOW)


@scenario("dark mode follows prefers-color-scheme")
def dark(page):
    sign_in(page, OPERATOR)
    for path in ["/", "/agents/hello"]:
        goto(page, path)
        page.wait_for_timeout(1000)
        colors = page.evaluate(
            """() => {
                const rgb = (c) => (c.match(/[0-9.]+/g) || []).slice(0, 3).map(Number);
                const lum = ([r, g, b]) => (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255;
                const card = document.querySelector('.card');
                return {page: lum(rgb(getComputedStyle(document.documentElement).backgroundColor)),
                        card: lum(rgb(getComputedStyle(card).backgroundColor)),
                        ink: lum(rgb(getComputedStyle(document.body).color))};
            }"""
        )
        assert colors["page"] < 0.2 and colors["card"] < 0.25, f"{path} is not dark: {colors}"
        assert colors["ink"] > 0.7, f"{path}: text is not light on dark: {colors}"
        shot(page, "dark" + path.replace("/", "-").rstrip("-"))


@scenario("at phone width (375 px) no page scrolls sideways")
def phone(page):
    sign_in(page, OPERATOR)
    node = state.get("node")
    paths = ["/", "/agents", "/agents/hello", "/jobs", "/approvals", "/fleet", "/provision"]
    if node:
        paths.append(f"/nodes/{node}")
    for path in paths:
        goto(page, path)
        page.wait_for_timeout(1500)  # live content in
        width = page.evaluate("() => document.documentElement.scrollWidth")
        wide = page.evaluate(
            """() => [...document.querySelectorAll('body *')].filter((e) => e.getBoundingClientRect().right > 376
                && !e.closest('.scroll, table.rows')).slice(0, 5).map((e) => e.tagName + '#' + e.id + '.' + e.className)"""
        )
        assert width <= 375, f"{path} is {width} px wide at a 375 px viewport; too wide: {wide}"
        shot(page, "phone" + (path.replace("/", "-").rstrip("-") or "-overview"))
    # A wide table scrolls inside its own box.
    goto(page, "/agents")
    page.wait_for_timeout(1000)
    inner = page.evaluate("() => { const t = document.querySelector('#agents-table'); return [t.scrollWidth, t.clientWidth]; }")
    assert inner[1] <= 375, inner


@scenario("an admin's ConfigureProvider key is write-only; a failed offer search says why")
def admin(page):
    sign_in(page, ADMIN)
    goto(page, "/provision")
    expect(page.locator("#configure-provider option")).not_to_have_count(0, timeout=15_000)
    secret = "sk-browser-suite-not-a-real-key"
    page.fill("#configure-form input[name=apiKey]", secret)
    # Nothing listens there: the check fails without any traffic leaving this machine.
    page.fill("#configure-form input[name=baseUrl]", "http://127.0.0.1:9/api/v0")
    page.click("#configure-form button[type=submit]")
    # The Vast.ai client retries a refused connection with backoff before it gives up
    # (12-16 s here), so the answer takes longer than a page action.
    expect(page.locator("#configure-result")).to_have_text(re.compile(r"\S"), timeout=SLOW)
    expect(page.locator("#configure-form input[name=apiKey]")).to_have_value("")
    assert secret not in page.content(), "the key stayed in the page"
    page.click("#offers-form button[type=submit]")
    expect(page.locator("#offers")).not_to_contain_text("Searching", timeout=15_000)
    expect(page.locator("#offers")).to_contain_text(re.compile("Offer search failed|No offers|Offer"))
    shot(page, "provision-admin")


@scenario("a viewer sees no mutation controls and the API refuses it anyway")
def viewer(page):
    sign_in(page, VIEWER)
    goto(page, "/agents/hello")
    expect(page.locator("#agent-summary")).to_contain_text("wanted", timeout=15_000)
    expect(page.locator("button[data-template]")).to_have_count(0)
    expect(page.locator("#agent-kill, #agent-delete")).to_have_count(0)
    expect(page.locator("#agent-yaml")).to_contain_text("kind: Agent")
    goto(page, "/jobs")
    expect(page.locator("#jobs-history article.job").first).to_be_visible(timeout=15_000)
    expect(page.locator("button[data-cancel]")).to_have_count(0)
    goto(page, "/approvals")
    expect(page.locator("button[data-approve], button[data-deny]")).to_have_count(0)
    goto(page, "/provision")
    for form in ["#provision-form", "#kill-form", "#configure-form", "#offers-form"]:
        expect(page.locator(form)).to_have_count(0)
    shot(page, "viewer-provision")
    reply = page.evaluate(
        """async () => {
            const csrf = document.querySelector('meta[name="csrf-token"]').content;
            const r = await fetch('/apis/hive.dev/v1/jobs', {method: 'POST', credentials: 'same-origin',
              headers: {'Content-Type': 'application/json', 'X-CSRF-Token': csrf},
              body: JSON.stringify({apiVersion: 'hive.dev/v1', kind: 'Job', metadata: {}, spec: {template: 'Stop', agents: ['hello']}})});
            return {status: r.status, body: await r.json()};
        }"""
    )
    assert reply["status"] == 403 and "viewer" in reply["body"]["message"], reply


def main():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        operator = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 860})
        page = operator.new_page()
        page.on("pageerror", lambda err: failures.append(f"JavaScript error: {err}"))
        signs_in(page)
        hello_ready(page)
        restart(page)
        approve(page)
        provision(page)
        telemetry(page)
        node_page(page)
        kill(page)
        node_killed(page)
        forged(page)
        resumes(page)
        overview_events(page)
        agent_detail(page)
        sorting(page)
        ready_filter(page)
        not_found(page)
        agent_kill(page)
        agent_delete(page)
        goto(page, "/")
        page.wait_for_timeout(1500)
        shot(page, "overview-after")
        admin_ctx = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 860})
        admin(admin_ctx.new_page())
        view = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 860})
        viewer(view.new_page())
        dark_ctx = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 860}, color_scheme="dark")
        dark(dark_ctx.new_page())
        phone_ctx = browser.new_context(ignore_https_errors=True, viewport={"width": 375, "height": 800}, is_mobile=True)
        phone(phone_ctx.new_page())
        browser.close()
    if failures:
        print(f"\n{len(failures)} failure(s):", file=sys.stderr)
        for f in failures:
            print("  - " + f, file=sys.stderr)
        sys.exit(1)
    print("all browser scenarios passed")


if __name__ == "__main__":
    main()
