"""The app in a real browser: Debian's chromium driven by Python Playwright (never
`playwright install`; CI installs chromium with `apt-get install -y chromium`).

One app server (127.0.0.1) and one chromium serve the whole module; the demo runs take seconds.
Set SJD_PAC_APP_SCREENSHOT=docs/app_screenshot.png (and SJD_PAC_APP_SCREENSHOT_PHONE=
docs/app_screenshot_phone.png) to refresh the screenshots in the docs.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from test_app import PROMPT, app_model, served_app  # noqa: F401  (shared session fixtures)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
GUMBEL = "gumbel (seed-exact: same tokens as AR)"
RUN_TIMEOUT = 120_000  # ms; the demo runs take seconds, the shared 2-core machine can be slow

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)"),
]


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def open_page(browser, url: str, width: int = 1440, height: int = 1100):
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector("#run-stats [data-status='idle']", timeout=30_000)
    return page


def finished_run(page) -> None:
    """A gumbel run of the page's settings, to its end."""
    page.get_by_label(GUMBEL).check()
    page.click("#generate-btn")
    assert wait_status(page, "finished") == "finished"


def status(page) -> str:
    return page.get_attribute("#run-stats [data-status]", "data-status")


def set_number(page, selector: str, value: str) -> None:
    field = page.locator(selector)
    field.fill(value)
    field.press("Tab")


def wait_status(page, *wanted: str, timeout: int = RUN_TIMEOUT) -> str:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    selector = ", ".join(f"#run-stats [data-status='{w}']" for w in wanted)
    try:
        page.wait_for_selector(selector, timeout=timeout)
    except PlaywrightTimeout:  # say what the page showed instead
        raise AssertionError(f"no status {wanted} within {timeout / 1000:.0f} s; the page shows status "
                             f"{status(page)!r}, message {page.inner_text('#message')!r}") from None
    return status(page)


# --- items 1 and 2: refused at once while another tab runs; Stop on a queued run ---------------

def test_budget_error_is_immediate_and_a_queued_run_stopped_never_starts(served_app, browser):  # noqa: F811
    _, url = served_app
    busy, page = open_page(browser, url), open_page(browser, url)
    try:
        # Tab 1 holds the sampler with a comparison (AR, SJD, SJD-PAC, three times: the longest).
        busy.get_by_role("tab", name="Compare").click()
        busy.click("#compare-btn")
        busy.wait_for_selector("#compare-card-ar [data-status='progress']", timeout=RUN_TIMEOUT)
        running = "#compare-summary [data-status='progress']"

        # Tab 2: the slider tops follow the tree budget (D's top is 4 at K = 4, 6 at K = 2 (first level 8, then K)), and a
        # depth typed past the top is held at the top: the page cannot send an oversize tree.
        depth_top = "#tree-depth input[type=range]"
        assert page.get_attribute(depth_top, "max") == "4"
        set_number(page, "#tree-width input[type=number]", "2")
        page.wait_for_function(f"() => document.querySelector('{depth_top}').max === '6'", timeout=10_000)
        set_number(page, "#tree-width input[type=number]", "4")
        page.wait_for_function(f"() => document.querySelector('{depth_top}').max === '4'", timeout=10_000)
        set_number(page, "#tree-depth input[type=number]", "8")
        assert page.input_value(depth_top) == "4"
        # Settings are checked at once, outside the queue, while tab 1 still holds the sampler.
        page.fill("#window input", "2.5")
        page.keyboard.press("Enter")
        page.click("#generate-btn")
        page.wait_for_selector("#message .error-line", timeout=5_000)
        assert "window L must be a whole number" in page.inner_text("#message")
        assert busy.locator(running).count() == 1 and status(page) == "idle"
        page.fill("#window input", "auto")
        page.keyboard.press("Enter")

        # The page keeps answering: a valid run waits behind tab 1; a Stop ends it at once, while
        # tab 1's comparison still holds the sampler (it used to show "Waiting" until that ended).
        page.click("#generate-btn")
        page.wait_for_function("() => !document.querySelector('#message .error-line')", timeout=5_000)
        page.wait_for_selector("#run-stats [data-status='waiting']", timeout=10_000)
        page.click("#stop-btn")
        assert wait_status(page, "stopped", "finished", "progress", timeout=15_000) == "stopped"
        assert busy.locator(running).count() == 1  # tab 1 still runs
        assert page.get_attribute("#run-stats [data-status]", "data-passes") == ""  # no forward pass ran
        assert "before it started" in page.inner_text("#message")
        busy.click("#stop-btn")  # then end tab 1 early too
        busy.wait_for_selector("#compare-summary [data-status='stopped']", state="attached", timeout=RUN_TIMEOUT)
    finally:
        busy.close()
        page.close()


# --- typed numbers stay; the live picture travels with the numbers --------------------------------

# Every change of the live picture and of the pass counter, as the page shows them.
WATCH_JS = """() => {
  window.__frames = [];
  new MutationObserver(() => {
    const img = document.querySelector('#live-image img');
    const card = document.querySelector('#run-stats [data-status]');
    window.__frames.push([img ? img.src : '', card ? card.dataset.status : '', card ? card.dataset.passes : '']);
  }).observe(document.body, {subtree: true, childList: true, attributes: true});
}"""


def test_typed_numbers_stay_and_the_live_picture_comes_with_its_numbers(served_app, browser):  # noqa: F811
    from sjd_pac_app.layout import WINDOW_CHOICES

    _, url = served_app
    page = open_page(browser, url)
    try:
        # A budget picked while L shows the model's own window turns L to auto (it would cap the
        # budget's main chain); below, a typed L stays when a budget is typed after it.
        page.fill("#node-budget input", "128")
        page.keyboard.press("Enter")
        page.wait_for_function("() => document.querySelector('#window input').value === 'auto'", timeout=10_000)
        # Enter keeps a typed L and node budget (Gradio's list made 4 into 24 and 12 into 128).
        for selector, typed in (("#window input", "4"), ("#node-budget input", "12")):
            page.fill(selector, typed)
            page.keyboard.press("Enter")
            assert page.input_value(selector) == typed
        page.get_by_label(GUMBEL).check()
        page.evaluate(WATCH_JS)
        page.click("#generate-btn")
        assert wait_status(page, "finished") == "finished"
        line = page.inner_text("#run-stats .run-line")
        assert "window L 4" in line and "node budget 12" in line, line  # the run used them
        frames = page.evaluate("() => window.__frames")
        running = [(src, passes) for src, status, passes in frames if status == "progress" and passes]
        pictures = {src for src, _ in running if src.startswith("data:image/png;base64,")}
        counts = {passes for _, passes in running}
        # Each update brings its picture inline with its numbers (no file for the browser to fetch
        # later, which busy tabs' connections held up); the page may draw two quick ones as one.
        assert len(counts) >= 2 and len(pictures) >= max(2, len(counts) // 2), (len(pictures), len(counts))
        assert page.locator("#live-image img").count() == 0 and page.locator("#preview-image img").first.is_visible()

        field = page.locator("#window input")  # the list still picks: typed "6", then its choice 16
        field.fill("")
        field.press_sequentially("6")  # typed as a user types, key by key (the list filters on keys)
        page.get_by_role("option", name="16", exact=True).click(timeout=10_000)
        assert page.input_value("#window input") == "16" and "16" in WINDOW_CHOICES
        field.fill("lots")  # and a word is kept, then refused in words when a run is asked for
        field.press("Enter")
        assert page.input_value("#window input") == "lots"
        page.click("#generate-btn")
        page.wait_for_selector("#message .error-line", timeout=10_000)
        assert "window L must be a whole number" in page.inner_text("#message")
    finally:
        page.close()


# --- item 4 (and the basics): random seeds, the seed shown, the picture to keep -----------------

def test_two_runs_with_random_seeds_give_two_pictures_to_keep(served_app, browser, tmp_path):  # noqa: F811
    from PIL import Image

    _, url = served_app
    page = open_page(browser, url)
    outside: list = []  # the page must load nothing from outside this machine
    page.on("request", lambda r: outside.append(r.url)
            if r.url.split(":", 1)[0] in ("http", "https", "ws", "wss")
            and not r.url.split("//", 1)[1].startswith(("127.0.0.1", "localhost")) else None)
    try:
        assert page.locator("#seed input, #seed textarea").first.input_value() == "-1"
        assert "circle" in page.inner_text("#prompt-words")  # the demo's vocabulary, next to the prompt
        page.fill("#prompt textarea", PROMPT)
        seeds, pictures = [], []
        for run in range(2):
            if run == 0:
                page.click("#generate-btn")
            else:  # Ctrl+Enter generates too
                page.focus("#prompt textarea")
                page.keyboard.press("Control+Enter")
                page.wait_for_selector("#run-stats [data-status='progress']", timeout=RUN_TIMEOUT)
            assert wait_status(page, "finished") == "finished"
            line = page.inner_text("#run-stats .run-line")
            seed = int(line.split("Seed ", 1)[1].split(" ", 1)[0])
            assert "(random)" in line and "1 CPU thread" in line
            link = page.locator("#download-file a").first
            page.wait_for_function(
                f"() => [...document.querySelectorAll('#download-file a')].some(a => a.href.includes('seed-{seed}_'))",
                timeout=15_000)
            href = [h for h in page.eval_on_selector_all("#download-file a", "els => els.map(a => a.href)")
                    if f"seed-{seed}_" in h][0]
            assert link is not None and "a-red-circle-top-left-on-a-blue-background_seed-" in href
            body = page.request.get(href).body()
            with Image.open(io.BytesIO(body)) as image:
                assert max(image.size) >= 512
                record = json.loads(image.text["sjd_pac"])
                pictures.append(image.convert("RGB").tobytes())
            assert record["seed"] == seed and record["prompt"] == PROMPT
            assert {"method", "verify", "window", "tree_depth", "tree_width", "cfg_scale", "temperature"} <= set(record)
            seeds.append(seed)
        assert seeds[0] != seeds[1] and pictures[0] != pictures[1]

        stats_text = page.inner_text("#run-stats").lower()
        assert "finished" in stats_text and "step compression" in stats_text
        for selector in ("#preview-image img", "#pass-chart img", "#hist-chart img"):
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
        page.close()


# --- item 6: Compare is seed-exact by default ---------------------------------------------------

def test_compare_shows_identical_yes_and_stop_leaves_every_card_final(served_app, browser):  # noqa: F811
    _, url = served_app
    page = open_page(browser, url)
    try:
        page.get_by_role("tab", name="Compare").click()
        assert page.locator("#compare-verify input[value='gumbel']").is_checked()
        set_number(page, "#compare-repeats input", "1")
        page.click("#compare-btn")
        page.wait_for_selector("#compare-summary [data-status='finished']", timeout=3 * RUN_TIMEOUT)
        for m in ("sjd", "sjd_pac"):
            card = page.inner_text(f"#compare-card-{m}")
            assert "identical to AR\tyes" in card or "identical to AR yes" in card.replace("\n", " ")
        assert "noisy" in page.inner_text("#compare-summary")

        page.click("#compare-btn")  # again, and stop it during AR: every card reaches a final state
        page.wait_for_selector("#compare-card-ar [data-status='progress']", timeout=RUN_TIMEOUT)
        page.click("#stop-btn")
        page.wait_for_selector("#compare-card-sjd_pac [data-status='skipped']", timeout=RUN_TIMEOUT)
        final = [page.get_attribute(f"#compare-card-{m} [data-status]", "data-status") for m in ("ar", "sjd", "sjd_pac")]
        assert set(final) <= {"finished", "stopped", "skipped"} and "stopped" in final, final
    finally:
        page.close()


# --- item 12: a phone-sized layout ----------------------------------------------------------------

OVERFLOW_JS = """() => {
  const width = document.documentElement.clientWidth;
  const bad = [];
  for (const el of document.querySelectorAll('#run-stats *, .gradio-container *')) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.height === 0) continue;
    let clipped = false;  // inside a scroller or a clipping box: not a page overflow
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      const s = getComputedStyle(p);
      if (s.overflowX !== 'visible' && p.getBoundingClientRect().right <= width + 1) { clipped = true; break; }
    }
    if (!clipped && (box.right > width + 1 || box.left < -1)) bad.push((el.id || el.className || el.tagName) + ' ' + Math.round(box.right));
  }
  return {scroll: document.documentElement.scrollWidth, width, bad: bad.slice(0, 10)};
}"""

# Contrast by WCAG 2's formula: the text colour against the first opaque background up the tree.
COLOR_JS = """
  const parse = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
                                return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const background = (el) => { for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor); if (c.length >= 3 && (c.length < 4 || c[3] > 0.5)) return c; }
    return [255, 255, 255]; };
  const contrast = (e) => { const a = lum(parse(getComputedStyle(e).color)), b = lum(background(e));
                            return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05); };
"""

CONTRAST_JS = "(sel) => {" + COLOR_JS + """
  return [...document.querySelectorAll(sel)].filter(e => e.innerText.trim()).map(e =>
    [e.innerText.slice(0, 30), contrast(e)]);
}"""


def test_phone_layout_has_results_near_the_button_no_overflow_and_readable_hints(served_app, browser, tmp_path):  # noqa: F811
    _, url = served_app
    page = open_page(browser, url, width=400, height=860)
    try:
        finished_run(page)
        layout = page.evaluate(OVERFLOW_JS)
        assert layout["scroll"] <= layout["width"] and layout["bad"] == [], layout
        button = page.locator("#generate-btn").bounding_box()
        stats = page.locator("#run-stats").bounding_box()
        image = page.locator("#preview-image").bounding_box()
        assert stats["y"] - (button["y"] + button["height"]) < 250  # the results follow the buttons
        assert image["y"] < stats["y"] + 700 and image["width"] >= 300
        for selector in (".hint", "[data-testid='block-info'] + div, .info-text", ".stat .label", ".stat .sub"):
            measured = page.evaluate(CONTRAST_JS, selector)
            assert measured, f"no text found for {selector}"
            for text, ratio in measured:
                assert ratio >= 4.5, f"{text!r}: contrast {ratio:.2f}:1 is below WCAG AA"
        page.screenshot(path=str(tmp_path / "phone.png"), full_page=True)
        target = os.environ.get("SJD_PAC_APP_SCREENSHOT_PHONE")
        if target:  # what a phone shows from the prompt down
            page.evaluate("window.scrollTo(0, document.querySelector('#prompt').getBoundingClientRect().top"
                          " + window.scrollY - 8)")
            page.screenshot(path=target, full_page=False)
    finally:
        page.close()


# --- a Generate pressed during a run, then Stop: the next Generate runs ------------------------

def test_generate_pressed_during_a_run_leaves_no_stop_behind(served_app, browser):  # noqa: F811
    """Gradio drops a second click of a running event; a later Stop must not leave a flag for a run
    that never queued, so the Generate after that Stop runs to the end (before, it ended at once
    with "Stopped before it started"). The second and third presses follow the first within
    milliseconds, while its run (seconds) is still queued or going, and the Stop comes after the
    first run's end, so the test depends neither on how fast the run is nor on seeing a progress
    frame (a loaded machine may draw none before the run ends)."""
    _, url = served_app
    page = open_page(browser, url)
    try:
        page.get_by_label("AR", exact=True).check()  # one token per pass: the longest run
        page.click("#generate-btn")
        page.click("#generate-btn")  # dropped by Gradio: the run is still going
        page.focus("#prompt textarea")
        page.keyboard.press("Control+Enter")  # dropped too
        assert wait_status(page, "finished", "stopped") in ("finished", "stopped")
        page.click("#stop-btn")  # nothing runs now: this Stop must stop nothing later
        page.wait_for_timeout(300)
        page.get_by_label("SJD-PAC", exact=True).check()
        page.click("#generate-btn")
        page.wait_for_function(  # this run's end (the status card names its method), or the bug's message
            "() => [...document.querySelectorAll('#run-stats [data-status=finished] .stat .sub')]"
            ".some(e => e.innerText.trim() === 'SJD-PAC')"
            " || document.querySelector('#message').innerText.includes('before it started')",
            timeout=RUN_TIMEOUT)
        assert "before it started" not in page.inner_text("#message")
        assert status(page) == "finished"
    finally:
        page.close()


# --- six tabs on one browser: Stop still reaches the server, a sixth tab still loads ------------

@pytest.mark.slow
def test_stop_works_and_a_sixth_tab_loads_with_five_tabs_busy(served_app, browser):  # noqa: F811
    """Browsers open at most six connections per host (HTTP/1.1) for all tabs of a profile
    together. An idle tab holds none (no heartbeat stream), a waiting or running one holds one
    (its queue stream): with five tabs busy, a sixth loads; with six busy, Stop (sent without
    credentials, on connections of its own) still stops every one."""
    _, url = served_app
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    try:
        pages = []
        for _ in range(5):
            page = context.new_page()
            page.goto(url, wait_until="domcontentloaded")
            page.wait_for_selector("#run-stats [data-status='idle']", timeout=60_000)
            pages.append(page)
        busy, waiting = pages[0], pages[1:]
        busy.fill("#window input", "1")  # SJD and SJD-PAC at L = 1 take about as long as AR: a long job
        busy.keyboard.press("Enter")  # (Enter keeps a typed value; Gradio's list would pick 12)
        assert busy.input_value("#window input") == "1"  # the long job it is meant to be
        busy.get_by_role("tab", name="Compare").click()
        set_number(busy, "#compare-repeats input", "10")
        busy.click("#compare-btn")
        busy.wait_for_selector("#compare-card-ar [data-status='progress']", timeout=RUN_TIMEOUT)
        for page in waiting:  # four runs queue behind it, each tab holding its queue stream
            page.click("#generate-btn")
            page.wait_for_selector("#run-stats [data-status='waiting']", timeout=10_000)
            assert "Waiting" in page.inner_text("#run-stats .status")  # not "Ready"

        sixth = context.new_page()
        sixth.goto(url, wait_until="domcontentloaded", timeout=30_000)
        sixth.wait_for_selector("#run-stats [data-status='idle']", timeout=30_000)

        sixth.click("#generate-btn")  # six tabs busy: their queue streams hold all six connections
        sixth.wait_for_selector("#run-stats [data-status='waiting']", timeout=10_000)
        waiting.append(sixth)

        assert busy.locator("#compare-summary [data-status='progress']").count() == 1, "the job ended too soon"
        # Stop in every waiting tab, then in the busy one, at once (a script's click: no waiting for
        # the pages between them); each waiting run then starts stopped and never runs, and the busy
        # one stops, though no connection is free (a plain request would wait for the job to end).
        for page in [*waiting, busy]:
            page.evaluate("() => document.querySelector('#stop-btn').click()")
        busy.wait_for_selector("#compare-summary [data-status='stopped']", state="attached", timeout=30_000)
        for page in waiting:
            page.wait_for_function("() => document.querySelector('#message').innerText.includes('before it started')",
                                   timeout=RUN_TIMEOUT)
            assert page.get_attribute("#run-stats [data-status]", "data-passes") == ""
        sixth.click("#generate-btn")  # and the sixth tab runs
        assert wait_status(sixth, "finished") == "finished"
    finally:
        context.close()


# --- accessibility: contrast of every text, names of images and controls --------------------------

TEXT_CONTRAST_JS = "() => {" + COLOR_JS + """
  const low = [];
  let checked = 0;
  for (const e of document.querySelectorAll('.gradio-container *')) {
    const own = [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own || !e.offsetParent || e.closest('[disabled], footer')) continue;
    checked += 1;
    const ratio = contrast(e);
    if (ratio < 4.5) low.push([e.textContent.trim().slice(0, 30), ratio.toFixed(2)]);
  }
  return {checked, low};
}"""


def unnamed_controls(page) -> list:
    """Buttons and links in the accessibility tree Chromium computes that have no name (a toolbar
    button with only an icon, an image-wrapping button whose image has no alt text)."""
    cdp = page.context.new_cdp_session(page)
    try:
        nodes = cdp.send("Accessibility.getFullAXTree")["nodes"]
    finally:
        cdp.detach()
    bad = []
    for node in nodes:
        role = node.get("role", {}).get("value")
        if node.get("ignored") or role not in ("button", "link"):
            continue
        if not str(node.get("name", {}).get("value", "")).strip():
            html = cdp_html(page, node.get("backendDOMNodeId"))
            bad.append((role, html))
    return bad


def cdp_html(page, backend_id) -> str:
    cdp = page.context.new_cdp_session(page)
    try:
        obj = cdp.send("DOM.resolveNode", {"backendNodeId": backend_id})["object"]
        out = cdp.send("Runtime.callFunctionOn", {"objectId": obj["objectId"], "returnByValue": True,
                                                  "functionDeclaration": "function() { return (this.parentElement ? this.parentElement.outerHTML : this.outerHTML).slice(0, 300); }"})
        return out["result"].get("value", "")
    finally:
        cdp.detach()


def test_every_text_meets_wcag_aa_and_every_control_has_a_name(served_app, browser):  # noqa: F811
    _, url = served_app
    page = open_page(browser, url)
    try:
        finished_run(page)
        page.hover("#preview-image")  # its toolbar shows
        for tab in ("Live", "Compare"):
            page.get_by_role("tab", name=tab).click()
            measured = page.evaluate(TEXT_CONTRAST_JS)
            assert measured["checked"] > 40 and measured["low"] == [], (tab, measured["low"])
            page.hover("#generate-btn")  # the button's hover colour too
            hovered = page.evaluate(TEXT_CONTRAST_JS)["low"]
            assert hovered == [], (tab, hovered)
            assert unnamed_controls(page) == [], tab
        alts = page.eval_on_selector_all("img", "els => els.map(e => [e.alt, (e.closest('[id]') || {}).id])")
        assert all(alt.strip() for alt, _ in alts), alts  # Gradio's footer icons included
        ours = [alt for alt, where in alts if where and where.startswith(("preview", "hist", "pass", "compare"))]
        assert len(ours) == 6 and all(len(alt) > 20 for alt in ours), ours
    finally:
        page.close()


# --- Gradio's own download button: the picture keeps its settings --------------------------------

def test_the_image_download_buttons_keep_the_run_record(served_app, browser, tmp_path):  # noqa: F811
    from PIL import Image

    _, url = served_app
    page = open_page(browser, url)
    try:
        finished_run(page)
        seed = int(page.inner_text("#run-stats .run-line").split("Seed ", 1)[1].split(" ", 1)[0])

        def download(selector: str) -> dict:
            page.hover(selector)
            with page.expect_download() as info:
                page.locator(f"{selector} button[aria-label='Download']").first.click()
            with Image.open(info.value.path()) as image:
                return {"record": json.loads(image.text["sjd_pac"]), "parameters": image.text["parameters"]}

        preview = download("#preview-image")
        assert preview["record"]["seed"] == seed and preview["record"]["prompt"] == page.input_value("#prompt textarea")
        assert f"Seed: {seed}" in preview["parameters"]
        page.get_by_role("tab", name="Compare").click()
        set_number(page, "#compare-repeats input", "1")
        page.click("#compare-btn")
        page.wait_for_selector("#compare-summary [data-status='finished']", timeout=3 * RUN_TIMEOUT)
        for method in ("ar", "sjd_pac"):
            saved = download(f"#compare-image-{method}")
            assert saved["record"]["method"] == method and saved["record"]["verify"] == "gumbel"
    finally:
        page.close()
