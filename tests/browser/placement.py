#!/usr/bin/env python3
"""Where agents run, in a real browser: the agents table's Node column, the agent page's
node (a link to the node page) and the node page's Agents, kept live.

Run by tests/it/browser.rs (agents_on_nodes_show_in_the_dashboard) against a daemon
whose agent `alpha` runs on the process node HIVE_NODE and whose agent `local` runs on
the daemon's host. Environment as for dashboard.py (whose helpers it uses), plus
HIVE_NODE. Exit 0 when every scenario passed.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dashboard as base  # noqa: E402 - the shared helpers, after the path is set

from playwright.sync_api import expect, sync_playwright  # noqa: E402

NODE = os.environ["HIVE_NODE"]
scenario, shot, goto, sign_in, api_call = base.scenario, base.shot, base.goto, base.sign_in, base.api_call
LIVE = 15_000  # ms: a watch event reaching the page


def placed_agent(page, name, node):
    """Creates an agent placed on `node` that is never started (wanted Offline)."""
    reply = api_call(page, "POST", "/apis/hive.dev/v1/agents", {
        "apiVersion": "hive.dev/v1", "kind": "Agent", "metadata": {"name": name},
        "spec": {"wanted": "Offline", "placement": {"node": node},
                 "config": {"repo": "https://git.example.invalid/" + name + ".git", "rev": "main"},
                 "runtime": {"type": "process", "process": {"command": ["./run.sh"]}}}})
    assert reply["status"] == 201, reply


@scenario("the agents table has a Node column linking to the node")
def agents_table(page):
    goto(page, "/agents")
    headers = page.locator("#agents-table thead th")
    expect(headers.nth(7)).to_contain_text("Node")
    alpha = page.locator('tr[data-agent="alpha"] td[data-node]')
    expect(alpha).to_have_attribute("data-node", NODE, timeout=LIVE)
    expect(alpha.locator("a")).to_have_attribute("href", f"/nodes/{NODE}")
    expect(page.locator('tr[data-agent="local"] td[data-node]')).to_have_text("—", timeout=LIVE)
    shot(page, "agents-node-column")


@scenario("the agent page says where it runs, and links to its node")
def agent_page(page):
    goto(page, "/agents/local")
    expect(page.locator("#agent-node")).to_contain_text("on the daemon's host", timeout=LIVE)
    expect(page.locator("#agent-node a")).to_have_count(0)
    goto(page, "/agents/alpha")
    where = page.locator("#agent-node")
    expect(where).to_have_attribute("data-node", NODE, timeout=LIVE)
    expect(where).to_contain_text(f"on node {NODE}")
    expect(page.locator('#agent-conditions')).to_contain_text("Placed", timeout=LIVE)
    where.locator("a").click()
    expect(page).to_have_url(re.compile(f"/nodes/{NODE}$"))
    expect(page.locator("#node-summary")).to_contain_text("Running", timeout=LIVE)


@scenario("the node page lists its agents, live")
def node_page(page):
    goto(page, f"/nodes/{NODE}")
    alpha = page.locator('#node-agents tr[data-agent="alpha"]')
    expect(alpha).to_contain_text("Running", timeout=LIVE)
    expect(alpha.locator("td").nth(4)).to_contain_text("True")
    expect(alpha.locator('a[href="/agents/alpha"]')).to_be_visible()
    expect(page.locator('#node-agents tr[data-agent="local"]')).to_have_count(0)
    expect(page.locator("#node-agents-empty")).to_be_hidden()
    # Live: an agent placed here appears without a reload; one placed elsewhere does not.
    placed_agent(page, "beta", NODE)
    placed_agent(page, "gamma", "node-elsewhere")
    beta = page.locator('#node-agents tr[data-agent="beta"]')
    expect(beta).to_contain_text("Offline", timeout=LIVE)
    expect(page.locator('#node-agents tr[data-agent="gamma"]')).to_have_count(0)
    shot(page, "node-agents")
    # And leaves when it is deleted.
    assert api_call(page, "DELETE", "/apis/hive.dev/v1/agents/beta")["status"] in (200, 202)
    expect(beta).to_have_count(0, timeout=LIVE)
    expect(page.locator('#node-agents tr[data-agent="alpha"]')).to_be_visible()


@scenario("a node without agents says so")
def node_without_agents(page):
    goto(page, f"/nodes/{NODE}")
    expect(page.locator('#node-agents tr[data-agent="alpha"]')).to_be_visible(timeout=LIVE)
    expect(page.locator("#node-agents-empty")).to_be_hidden()
    # The other node's page (the test provisions two): none of these agents, the empty line.
    nodes = api_call(page, "GET", "/apis/hive.dev/v1/nodes")["body"]["items"]
    others = [n["metadata"]["name"] for n in nodes if n["metadata"]["name"] != NODE]
    assert others, f"a second node to look at: {nodes}"
    goto(page, f"/nodes/{others[0]}")
    expect(page.locator("#node-agents-empty")).to_be_visible(timeout=LIVE)
    expect(page.locator("#node-agents tr[data-agent]")).to_have_count(0)


def main():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=base.CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        context = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 860})
        page = context.new_page()
        page.on("pageerror", lambda err: base.failures.append(f"JavaScript error: {err}"))
        sign_in(page, base.OPERATOR)
        agents_table(page)
        agent_page(page)
        node_page(page)
        node_without_agents(page)
        browser.close()
    if base.failures:
        print(f"\n{len(base.failures)} failure(s):", file=sys.stderr)
        for f in base.failures:
            print("  - " + f, file=sys.stderr)
        sys.exit(1)
    print("all placement scenarios passed")


if __name__ == "__main__":
    main()
