"""The app in a real browser: Debian's chromium driven by Python Playwright (never
`playwright install`; CI installs chromium with `apt-get install -y chromium`).

Set SJD_PAC_APP_SCREENSHOT=docs/app_screenshot.png to refresh the screenshot in the docs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from test_app import PROMPT, app_model, reference_stats, served_app  # noqa: F401  (shared session fixtures)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)"),
]


def test_generate_in_the_browser_shows_image_chart_and_stats(served_app, app_model, tmp_path):  # noqa: F811
    sync_api = pytest.importorskip("playwright.sync_api")
    _, url = served_app
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1100})
            outside: list = []  # the page must load nothing from outside this machine
            page.on("request", lambda r: outside.append(r.url)
                    if r.url.split(":", 1)[0] in ("http", "https", "ws", "wss")
                    and not r.url.split("//", 1)[1].startswith(("127.0.0.1", "localhost")) else None)
            page.goto(url, wait_until="domcontentloaded")
            page.wait_for_selector("#run-stats [data-status='idle']", timeout=30_000)

            page.fill("#prompt textarea", PROMPT)
            page.get_by_label("gumbel (seed-exact: same tokens as AR)").check()
            page.click("#generate-btn")
            page.wait_for_selector("#run-stats [data-status='finished']", timeout=60_000)

            passes = int(page.get_attribute("#run-stats [data-status]", "data-passes"))
            assert passes == reference_stats(app_model[1], "sjd_pac", "gumbel").forward_passes
            stats_text = page.inner_text("#run-stats")
            assert "finished" in stats_text.lower() and "step compression" in stats_text.lower()
            for selector in ("#preview-image img", "#pass-chart img", "#hist-chart img"):
                # poll: the <img> is swapped for the final picture as the run ends
                page.wait_for_function(
                    "sel => { const img = document.querySelector(sel);"
                    " return img !== null && img.complete && img.naturalWidth >= 256; }",
                    arg=selector, timeout=15_000,
                )
            assert "⚠" not in page.inner_text("#message")
            assert outside == [], f"the page requested outside URLs: {outside[:5]}"

            page.screenshot(path=str(tmp_path / "app.png"), full_page=True)
            target = os.environ.get("SJD_PAC_APP_SCREENSHOT")
            if target:
                page.screenshot(path=target, full_page=True)
        finally:
            browser.close()
