#!/usr/bin/env python3
"""Why is it failing, at a glance (issue 32), in a real browser at desktop and phone
width: the agents table's Status column says CrashLoopBackOff, Stopped or Running; a
True `Crashed` condition is red, never a green check; the agent page shows the last
exit (code, the last lines of stderr) above the fold; the overview's Failing panel says
it in one short line.

Run by tests/it/browser.rs (why_an_agent_fails_shows_in_a_browser) against a daemon
whose agent `crashy` crash-loops (exit 3 after a panic on stderr), `off` is Offline on
purpose and `hello` runs. Environment as for dashboard.py (whose helpers it uses).
Exit 0 when every scenario passed.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dashboard as base  # noqa: E402 - the shared helpers, after the path is set

from playwright.sync_api import expect, sync_playwright  # noqa: E402

scenario, shot, goto, sign_in = base.scenario, base.shot, base.goto, base.sign_in
LIVE = 30_000  # ms: a watch event reaching the page


def status_cell(page, agent):
    return page.locator(f'tr[data-agent="{agent}"] td').nth(1)


def checks(width):
    @scenario(f"the Status column says where each agent stands ({width})")
    def status_column(page):
        goto(page, "/agents")
        expect(page.locator("#agents-table thead th").nth(1)).to_have_text("Status")
        expect(status_cell(page, "crashy")).to_contain_text("CrashLoopBackOff", timeout=LIVE)
        expect(status_cell(page, "crashy").locator(".st-bad")).to_be_visible()
        expect(status_cell(page, "off")).to_contain_text("Stopped", timeout=LIVE)
        expect(status_cell(page, "hello")).to_contain_text("Running", timeout=LIVE)
        # A True Crashed is bad news: red, with no check mark.
        crashed = page.locator('tr[data-agent="crashy"] .cond[data-condition="Crashed"]')
        expect(crashed).to_have_class("cond bad")
        expect(crashed).not_to_contain_text("✓")
        shot(page, f"why-agents-{width}")

    @scenario(f"the agent page shows the last exit above the fold ({width})")
    def last_exit(page):
        goto(page, "/agents/crashy")
        box = page.locator("#agent-last-exit")
        expect(box).to_be_visible(timeout=LIVE)
        expect(box).to_contain_text("exit code 3")
        expect(box).to_contain_text("panic: $STATE_DIR/agents/crashy/")
        expect(box).to_contain_text("config.toml: no such file")
        expect(page.locator("#agent-summary")).to_contain_text("CrashLoopBackOff")
        bottom = box.evaluate("e => e.getBoundingClientRect().bottom")
        height = page.viewport_size["height"]
        assert bottom <= height, f"the last exit ends at {bottom} px, below the fold at {height} px"
        crashed = page.locator('#agent-conditions tr[data-condition="Crashed"] .st')
        expect(crashed).to_have_class("st st-bad", timeout=LIVE)
        shot(page, f"why-agent-{width}")
        # An agent that never exited on its own has no such block.
        goto(page, "/agents/off")
        expect(page.locator("#agent-summary")).to_contain_text("Stopped", timeout=LIVE)
        expect(page.locator("#agent-last-exit")).to_be_hidden()

    @scenario(f"the overview's Failing panel says it once, short ({width})")
    def failing(page):
        goto(page, "/")
        panel = page.locator("#ov-failing")
        expect(panel).to_contain_text("crashy", timeout=LIVE)
        expect(panel).to_contain_text("CrashLoopBackOff")
        expect(panel).to_contain_text("exit code 3: panic:")
        expect(panel).not_to_contain_text("off")
        text = panel.inner_text()
        assert len(text) < 300, f"the Failing panel holds {len(text)} characters: {text}"
        shot(page, f"why-overview-{width}")

    return [status_column, last_exit, failing]


def main():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=base.CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        for width, context in [
            ("desktop", browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 860})),
            ("phone", browser.new_context(ignore_https_errors=True, viewport={"width": 375, "height": 800}, is_mobile=True)),
        ]:
            page = context.new_page()
            page.on("pageerror", lambda err: base.failures.append(f"JavaScript error: {err}"))
            sign_in(page, base.VIEWER)
            for check in checks(width):
                check(page)
            context.close()
        browser.close()
    if base.failures:
        print(f"\n{len(base.failures)} failure(s):", file=sys.stderr)
        for f in base.failures:
            print("  - " + f, file=sys.stderr)
        sys.exit(1)
    print("all why-failing scenarios passed")


if __name__ == "__main__":
    main()
