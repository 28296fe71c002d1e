"""web/sjd_pac_sizes.js in a real browser (Debian's chromium via Python Playwright; never
`playwright install`): the sampler's resolution widget narrowed to the sizes the server route
answers for the model its loader names, on a fake LiteGraph graph (no ComfyUI here)."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest

from sjd_pac_core.models import sizes

WEB = Path(__file__).resolve().parent.parent / "web"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]


@pytest.fixture(scope="module")
def page():
    sync_api = pytest.importorskip("playwright.sync_api")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(WEB))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                p = browser.new_page()
                p.goto(f"http://127.0.0.1:{server.server_address[1]}/", wait_until="domcontentloaded")
                yield p
            finally:
                browser.close()
    finally:
        server.shutdown()


SCENARIO = """async ({all, answers, mapLinks}) => {
  const m = await import('/sjd_pac_sizes.js');
  const calls = [];
  const lookup = m.createSizeLookup(async (model) => {
    calls.push(model);
    if (answers[model] === 'throw') throw new Error('offline');
    return answers[model];
  });
  const loader = {id: 1, type: 'LoadARImageModel', widgets: [{name: 'model', value: 'lumina-mgpt-7b-768'}]};
  const reroute = {id: 2, type: 'Reroute', inputs: [{name: '', link: 11}]};
  const sampler = {id: 3, type: 'SJDPACSampler', inputs: [{name: 'model', link: 12}],
                   widgets: [{name: 'resolution', value: '512x512', options: {values: [...all]}}]};
  const nodes = {1: loader, 2: reroute, 3: sampler};
  const entries = [[11, {origin_id: 1}], [12, {origin_id: 2}]];
  const graph = {links: mapLinks ? new Map(entries) : Object.fromEntries(entries), getNodeById: (id) => nodes[id]};
  const widget = sampler.widgets[0];
  const out = {};
  await m.refreshResolutions(graph, sampler, lookup);
  out.lumina = {values: [...widget.options.values], value: widget.value};
  widget.value = '1024x576';
  await m.refreshResolutions(graph, sampler, lookup);
  out.kept = widget.value;
  out.callsAfterTwo = calls.length;
  loader.widgets[0].value = 'emu3-gen';
  await m.refreshResolutions(graph, sampler, lookup);
  out.emu3 = {values: [...widget.options.values], value: widget.value};
  loader.widgets[0].value = 'broken';
  await m.refreshResolutions(graph, sampler, lookup);
  out.broken = widget.options.values.length;
  await m.refreshResolutions(graph, sampler, lookup);
  out.brokenCalls = calls.filter((c) => c === 'broken').length;
  loader.widgets[0].value = 'offline';
  await m.refreshResolutions(graph, sampler, lookup);
  out.offline = widget.options.values.length;
  sampler.inputs[0].link = null;
  await m.refreshResolutions(graph, sampler, lookup);
  out.unplugged = widget.options.values.length;
  return out;
}"""


@pytest.mark.parametrize("map_links", [True, False])  # graph.links: a Map (new front end) or an object
def test_sampler_resolutions_follow_the_loaders_model(page, map_links):
    all_values = ["default", *sizes.known_resolutions()]
    lumina = [f"{w}x{h}" for w, h in sizes.trained_sizes(768)]
    answers = {
        "lumina-mgpt-7b-768": {"family": "lumina_mgpt", "resolutions": lumina},
        "emu3-gen": {"family": "emu3", "resolutions": list(sizes.EMU3_RESOLUTIONS)},
        "broken": {"error": "Model folder 'broken' was not found."},
        "offline": "throw",
    }
    out = page.evaluate(SCENARIO, {"all": all_values, "answers": answers, "mapLinks": map_links})
    expected_lumina = ["default"] + [v for v in all_values if v in set(lumina)]
    assert out["lumina"] == {"values": expected_lumina, "value": "default"}  # 512x512 is not a -768 size
    assert set(out["lumina"]["values"][1:]) == set(lumina)
    assert out["kept"] == "1024x576" and out["callsAfterTwo"] == 1  # one request per model name
    assert out["emu3"] == {"values": ["default", *sizes.EMU3_RESOLUTIONS], "value": "default"}
    # Unknown sizes (error answer, no server, no loader connected): every size again.
    assert out["broken"] == out["offline"] == out["unplugged"] == len(all_values)
    assert out["brokenCalls"] == 2  # a failed answer is asked again, not kept
