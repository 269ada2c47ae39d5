#!/usr/bin/env python3
"""The Events page and a Job's graph (issue 32), in a real browser at desktop and phone
width.

- `/events` is a page (it answered raw JSON before): every Event, newest first, live,
  filtered by kind, object, type, reason and age, the filter kept in the URL.
- `/jobs/NAME` draws the Job as its DAG: one lane per agent, every edge of the spec as
  it is, the AfterAny edges marked, with the log pane beside it; the Jobs page's cards
  draw one chain per agent, so one agent's last node never reads as the next one's
  dependency; the cards' relative times tick.

Run by tests/it/browser.rs (events_and_job_graphs_show_in_a_browser) against a daemon
where `crashy` crash-loops (Warning Events), `hello` and `second` run, and HIVE_JOB (a
Rebuild of hello and second) is Done. Environment as for dashboard.py (whose helpers it
uses). Exit 0 when every scenario passed.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dashboard as base  # noqa: E402 - the shared helpers, after the path is set

from playwright.sync_api import expect, sync_playwright  # noqa: E402

scenario, shot, goto, sign_in, api_call = base.scenario, base.shot, base.goto, base.sign_in, base.api_call
JOB = os.environ["HIVE_JOB"]
LIVE = 30_000  # ms: a watch event reaching the page


def rows(page):
    """(type, reason, object) of each row of the Events page's table, top to bottom."""
    return page.evaluate(
        """() => [...document.querySelectorAll('#events-rows tr')].map((tr) =>
            [tr.dataset.type, tr.dataset.reason, tr.dataset.object])"""
    )


def no_sideways_scroll(page):
    wide = page.evaluate("() => document.scrollingElement.scrollWidth - window.innerWidth")
    assert wide <= 1, f"the page scrolls sideways by {wide} px"


def post_event(page, name, reason, when):
    reply = api_call(page, "POST", "/api/v1/events", {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
        "involvedObject": {"apiVersion": "hive.dev/v1", "kind": "Agent", "name": "crashy"},
        "reason": reason, "message": "posted by the browser suite", "type": "Warning", "count": 1,
        "firstTimestamp": when, "lastTimestamp": when,
    })
    assert reply["status"] == 201, reply


def checks(width):
    @scenario(f"/events is a live, filterable Events page ({width})")
    def events(page):
        goto(page, "/events")
        expect(page.locator("main h1")).to_have_text("Events")
        expect(page.locator('nav a[href="/events"]')).to_have_attribute("aria-current", "page")
        expect(page.locator("#events-rows tr").first).to_be_visible(timeout=LIVE)
        # Newest first, by when each last happened.
        stamps = [t for t in base.datetimes(page, "#events-rows tr") if t is not None]
        assert stamps == sorted(stamps, reverse=True), f"not newest first: {stamps}"
        # Warnings about crashy: the filter narrows the rows and says so in the URL.
        page.select_option("#events-filter-type", "Warning")
        page.fill("#events-filter-object", "agent/crashy")
        expect(page).to_have_url(re.compile(r"type=Warning"))
        expect(page).to_have_url(re.compile(r"object=agent%2Fcrashy"))
        expect(page.locator("#events-filter-count")).to_contain_text("match")
        seen = rows(page)
        assert seen, "no Warning about crashy"
        assert all(t == "Warning" and o == "Agent/crashy" for t, _, o in seen), seen
        # A reason to choose from the ones the page saw.
        reasons = page.eval_on_selector_all("#events-filter-reason option", "os => os.map((o) => o.value)")
        assert "BackOff" in reasons or "Crashed" in reasons, reasons
        # Live: an Event recorded now shows up under the filter without a reload; one
        # that last happened two hours ago is left out by "since 1 hour".
        now = page.evaluate("() => new Date().toISOString()")
        old = page.evaluate("() => new Date(Date.now() - 2 * 3600 * 1000).toISOString()")
        post_event(page, f"live-{width}", "ProbeFailed", now)
        post_event(page, f"old-{width}", "ProbeFailedLongAgo", old)
        expect(page.locator(f'#events-rows tr[data-event="live-{width}"]')).to_be_visible(timeout=LIVE)
        expect(page.locator(f'#events-rows tr[data-event="old-{width}"]')).to_be_visible(timeout=LIVE)
        page.select_option("#events-filter-since", "1h")
        expect(page).to_have_url(re.compile(r"since=1h"))
        expect(page.locator(f'#events-rows tr[data-event="old-{width}"]')).to_have_count(0)
        expect(page.locator(f'#events-rows tr[data-event="live-{width}"]')).to_be_visible()
        # A linked view opens filtered as it was.
        goto(page, "/events?type=Warning&object=agent/crashy&reason=ProbeFailed&since=1h")
        expect(page.locator(f'#events-rows tr[data-event="live-{width}"]')).to_be_visible(timeout=LIVE)
        # The desktop pass posted one such Event, the phone pass a second.
        expect(page.locator("#events-rows tr")).to_have_count(1 if width == "desktop" else 2)
        expect(page.locator("#events-filter-reason")).to_have_value("ProbeFailed")
        goto(page, "/events?type=Warning&object=agent/crashy")
        expect(page.locator("#events-rows tr").first).to_be_visible(timeout=LIVE)
        no_sideways_scroll(page)
        shot(page, f"events-{width}")
        # An object's page links to its Events there.
        goto(page, "/agents/crashy")
        link = page.locator("a.all-events")
        expect(link).to_have_attribute("href", "/events?kind=Agent&object=crashy", timeout=LIVE)

    @scenario(f"/jobs/NAME draws the Job as its graph, with its log ({width})")
    def graph(page):
        goto(page, "/jobs/" + JOB)
        job = api_call(page, "GET", "/apis/hive.dev/v1/jobs/" + JOB)["body"]
        nodes = job["spec"]["nodes"]
        deps = [(d["node"], n["id"], d.get("edge", "AfterOk")) for n in nodes for d in n.get("deps", [])]
        agents = sorted({n["agent"] for n in nodes if n.get("agent")})
        dag = page.locator(f'.dag[data-job="{JOB}"]')
        expect(dag).to_be_visible(timeout=LIVE)
        expect(dag).to_have_attribute("data-edges", str(len(deps)))
        expect(dag.locator(".lane-name")).to_have_count(len(agents))
        expect(dag.locator(".dag-node")).to_have_count(len(nodes))
        for n in nodes:
            box = dag.locator(f'.dag-node[data-node="{n["id"]}"]')
            expect(box).to_have_attribute("data-lane", n.get("agent") or "")
            expect(box).to_have_attribute("data-state", "Done")
        # Every edge is drawn from its dependency to its dependent, left to right; the
        # AfterAny ones (swap → reconcile) are marked.
        drawn = page.evaluate(
            """() => [...document.querySelectorAll('svg.dag-edges path.edge')].map((p) =>
                [p.dataset.from, p.dataset.to, p.classList.contains('after-any') ? 'AfterAny' : 'AfterOk'])"""
        )
        assert sorted(map(tuple, drawn)) == sorted(deps), f"edges {drawn} are not the spec's {deps}"
        assert any(e == "AfterAny" for _, _, e in deps), "a Rebuild has AfterAny edges"
        expect(dag.locator("svg .edge-label")).to_have_count(sum(1 for _, _, e in deps if e == "AfterAny"))
        for a, b, _ in deps:
            ra = dag.locator(f'.dag-node[data-node="{a}"]').bounding_box()
            rb = dag.locator(f'.dag-node[data-node="{b}"]').bounding_box()
            assert ra["x"] + ra["width"] <= rb["x"], f"{a} is not left of {b}"
        # One lane per agent: an agent's nodes share a band no other agent's node enters.
        bands = {}
        for n in nodes:
            r = dag.locator(f'.dag-node[data-node="{n["id"]}"]').bounding_box()
            lo, hi = bands.get(n["agent"], (r["y"], r["y"] + r["height"]))
            bands[n["agent"]] = (min(lo, r["y"]), max(hi, r["y"] + r["height"]))
        ordered = sorted(bands.values())
        assert all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:])), f"lanes overlap: {bands}"
        # The log pane: a click pins a node's log.
        dag.locator(f'.dag-node[data-node="{agents[0]}/prebuild"]').click()
        expect(page.locator("#job-log-title")).to_contain_text("(pinned)", timeout=15_000)
        expect(page.locator("#job-log-title")).to_contain_text(f"{agents[0]}/prebuild")
        expect(page.locator("#job-log")).to_have_text(re.compile(r"\S"), timeout=30_000)
        no_sideways_scroll(page)
        dag.scroll_into_view_if_needed()
        # A graph wider than the screen scrolls in its own box, never the page.
        left = page.evaluate("() => document.querySelector('main h1').getBoundingClientRect().left")
        assert left >= 0, f"the page moved sideways by {-left} px to show the graph"
        shot(page, f"job-graph-{width}")

    @scenario(f"the Jobs page draws a chain per agent and its times tick ({width})")
    def cards(page):
        goto(page, "/jobs")
        card = page.locator(f'article[data-job="{JOB}"]')
        expect(card).to_be_visible(timeout=LIVE)
        lanes = card.locator("ol.chain")
        expect(lanes).to_have_count(2)
        for lane in [lanes.nth(0), lanes.nth(1)]:
            agent = lane.get_attribute("data-lane")
            ids = lane.locator("li.node").evaluate_all("ls => ls.map((l) => l.dataset.node)")
            assert ids and all(i.startswith(agent + "/") for i in ids), f"lane {agent} holds {ids}"
            expect(lane.locator("li.node").first.locator(".arrow")).to_have_count(0)
        expect(card.locator("a.jlink")).to_have_attribute("href", "/jobs/" + JOB)
        stamp = card.locator("time[data-rel]").first
        before = stamp.inner_text()
        expect(stamp).not_to_have_text(before, timeout=10_000)

    return [events, graph, cards]


def main():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=base.CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        for width, context in [
            ("desktop", browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 860})),
            ("phone", browser.new_context(ignore_https_errors=True, viewport={"width": 375, "height": 800}, is_mobile=True)),
        ]:
            page = context.new_page()
            page.on("pageerror", lambda err: base.failures.append(f"JavaScript error: {err}"))
            sign_in(page, base.OPERATOR)
            for check in checks(width):
                check(page)
            context.close()
        browser.close()
    if base.failures:
        print(f"\n{len(base.failures)} failure(s):", file=sys.stderr)
        for f in base.failures:
            print("  - " + f, file=sys.stderr)
        sys.exit(1)
    print("all events and graph scenarios passed")


if __name__ == "__main__":
    main()
