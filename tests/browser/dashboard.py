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


@scenario("the hello agent is Ready")
def hello_ready(page):
    goto(page, "/agents")
    row = page.locator('tr[data-agent="hello"]')
    expect(row).to_contain_text("Ready", timeout=SLOW)
    shot(page, "agents")


@scenario("restart hello: its Job card reaches Done and the log panel shows output")
def restart(page):
    goto(page, "/agents/hello")
    expect(page.locator("#agent-summary")).to_contain_text("Ready", timeout=SLOW)
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
        kill(page)
        forged(page)
        resumes(page)
        goto(page, "/")
        page.wait_for_timeout(1500)
        shot(page, "overview-after")
        admin_ctx = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 860})
        admin(admin_ctx.new_page())
        view = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 860})
        viewer(view.new_page())
        browser.close()
    if failures:
        print(f"\n{len(failures)} failure(s):", file=sys.stderr)
        for f in failures:
            print("  - " + f, file=sys.stderr)
        sys.exit(1)
    print("all browser scenarios passed")


if __name__ == "__main__":
    main()
