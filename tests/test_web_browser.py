"""The web extension in a real browser (Debian's chromium via Python Playwright; never `playwright
install`), without ComfyUI: web/sjd_pac_sizes.js narrows the sampler's resolution widget to the sizes
the server route answers for the model its loader names, on a fake LiteGraph graph; web/sjd_pac.js
served by two copies of the pack registers once and throws nothing; and its setup makes the front end
see a refusal of our nodes' inputs once (web/sjd_pac_errors.js)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import shutil
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


@contextlib.contextmanager
def page_serving(directory: Path):
    """A chromium page at the root of a local HTTP server of `directory`."""
    sync_api = pytest.importorskip("playwright.sync_api")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_api.sync_playwright() as pw:
            chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                p = chromium.new_page()
                p.goto(f"http://127.0.0.1:{server.server_address[1]}/", wait_until="domcontentloaded")
                yield p
            finally:
                chromium.close()
    finally:
        server.shutdown()


@pytest.fixture()
def page():  # one chromium per test: Playwright's sync API runs one at a time
    with page_serving(WEB) as p:
        yield p


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


# --- two copies of the pack ----------------------------------------------------------------------

APP_JS = """const extensions = [];
export const app = {
  get extensions() { return extensions; },
  registerExtension(extension) {
    if (extensions.some((e) => e.name === extension.name)) {
      throw new Error(`Extension named '${extension.name}' already registered.`);
    }
    extensions.push(extension);
  },
};
"""
API_JS = "export const api = { fetchApi: async () => ({ ok: false }), addEventListener() {} };\n"


def test_a_second_copy_of_the_pack_registers_nothing_and_throws_nothing(tmp_path):
    """Two copies of the pack (a Manager install and a git clone) both serve the extension, and
    ComfyUI's front end throws on a second registration of one name: the second copy steps aside.
    ComfyUI's app and api modules are stood in for by what the extension uses at import (the
    `extensions` list and `registerExtension`, which throws as front end 1.27 does)."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "app.js").write_text(APP_JS)
    (tmp_path / "scripts" / "api.js").write_text(API_JS)
    for copy in ("sjd-pac", "sjd-pac-main"):
        shutil.copytree(WEB, tmp_path / "extensions" / copy)
    (tmp_path / "index.html").write_text("<!doctype html><title>two copies</title>")
    with page_serving(tmp_path) as page:
        out = page.evaluate("""async () => {
          const errors = [];
          for (const copy of ['sjd-pac', 'sjd-pac-main']) {
            try { await import(`/extensions/${copy}/sjd_pac.js`); } catch (e) { errors.push(String(e)); }
          }
          const { app } = await import('/scripts/app.js');
          return { errors, names: app.extensions.map((e) => e.name) };
        }""")
    assert out["errors"] == []
    assert out["names"] == ["sjd_pac.live_chart"]  # registered once, by the first copy


# --- a refusal shown once: the wiring of sjd_pac_errors.js into the front end --------------------

QUEUE_API_JS = """export const api = {
  fetchApi: async () => ({ ok: false }),
  addEventListener() {},
  async queuePrompt(number, prompt) {  // as ComfyUI answers a prompt its validation refused
    const rows = ['temperature', 'top_p', 'method'].map((name) => ({
      type: 'custom_validation_failed', message: 'Custom validation failed for node',
      details: `${name} - temperature must be > 0, got 0.0; use 1.0.`, extra_info: { input_name: name } }));
    const error = new Error('Prompt execution failed');
    error.response = { error: { type: 'prompt_outputs_failed_validation' },
                       node_errors: { '2': { class_type: 'SJDPACSampler', errors: rows, dependent_outputs: ['9'] } } };
    throw error;
  },
};
"""


def test_the_front_end_sees_a_refusal_once(tmp_path):
    """The extension's setup wraps api.queuePrompt (once, with two copies of the pack), so the error
    the front end shows and outlines carries one row, on the input the sentence names."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "app.js").write_text(APP_JS)
    (tmp_path / "scripts" / "api.js").write_text(QUEUE_API_JS)
    shutil.copytree(WEB, tmp_path / "extensions" / "sjd-pac")
    (tmp_path / "index.html").write_text("<!doctype html><title>refusal</title>")
    with page_serving(tmp_path) as page:
        out = page.evaluate("""async () => {
          await import('/extensions/sjd-pac/sjd_pac.js');
          const { app } = await import('/scripts/app.js');
          const { api } = await import('/scripts/api.js');
          await app.extensions[0].setup();
          await app.extensions[0].setup();  // a second setup does not wrap twice
          try { await api.queuePrompt(0, {}); } catch (e) { return e.response.node_errors['2'].errors; }
          return null;
        }""")
    assert out == [{"type": "custom_validation_failed", "message": "Custom validation failed for node",
                    "details": "temperature must be > 0, got 0.0; use 1.0.",
                    "extra_info": {"input_name": "temperature"}}]
