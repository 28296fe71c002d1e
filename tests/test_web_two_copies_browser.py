"""web/sjd_pac.js twice in a real browser (Debian's chromium via Python Playwright; never `playwright
install`): two copies of the pack (a Manager install and a git clone) both serve the extension, and
ComfyUI's front end throws on a second registration of one name. The second copy must step aside
without an error in the console. ComfyUI's app and api modules are stood in for by the two calls the
extension makes at import (its `extensions` list and `registerExtension`, which throws as 1.27 does)."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

import pytest

WEB = Path(__file__).resolve().parent.parent / "web"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]

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
    sync_api = pytest.importorskip("playwright.sync_api")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "app.js").write_text(APP_JS)
    (tmp_path / "scripts" / "api.js").write_text(API_JS)
    for copy in ("sjd-pac", "sjd-pac-main"):
        shutil.copytree(WEB, tmp_path / "extensions" / copy)
    (tmp_path / "index.html").write_text("<!doctype html><title>two copies</title>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page()
                page.goto(f"http://127.0.0.1:{server.server_address[1]}/", wait_until="domcontentloaded")
                out = page.evaluate("""async () => {
                  const errors = [];
                  for (const copy of ['sjd-pac', 'sjd-pac-main']) {
                    try { await import(`/extensions/${copy}/sjd_pac.js`); } catch (e) { errors.push(String(e)); }
                  }
                  const { app } = await import('/scripts/app.js');
                  return { errors, names: app.extensions.map((e) => e.name) };
                }""")
            finally:
                browser.close()
    finally:
        server.shutdown()
    assert out["errors"] == []
    assert out["names"] == ["sjd_pac.live_chart"]  # registered once, by the first copy
