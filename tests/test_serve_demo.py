"""The demo page in headless Chromium (Debian's `chromium`, driven by Playwright for Python): type a
prompt, press Generate, see streamed text coloured by AR/NAR, and save a screenshot."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.serve_utils import LiveServer, Paced

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
DOCS_SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "demo.png"


@pytest.mark.slow
def test_demo_page_streams_tokens_coloured_by_path_in_headless_chromium(trained_model_dir, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install -y chromium)")
    import yue

    # The trained tiny model drafts code-like text; pacing makes the stream visibly incremental (0.05 s
    # a step once let a busy 2-core machine's browser take the whole answer in one DOM update).
    engine = Paced(yue.load(trained_model_dir), delay=0.25)
    with LiveServer(engine) as srv, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 760})
            page.goto(srv.url + "/")
            page.fill("#prompt", "def alpha_3(x):\n    return")
            page.select_option("#mode", "verified")
            page.uncheck("#use-model-threshold")  # threshold 1: draft every block, verification decides
            page.eval_on_selector(
                "#threshold", "e => { e.value = '1'; e.dispatchEvent(new Event('input')); }"
            )
            assert page.text_content("#threshold-value") == "1.00"
            # Record how many token spans exist after each DOM update: streaming means several updates.
            page.evaluate(
                """() => { window.counts = []; new MutationObserver(() => window.counts.push(
                   document.querySelectorAll('#output span[data-source]').length)).observe(
                   document.getElementById('output'), {childList: true}); }"""
            )
            page.click("#generate")
            page.wait_for_function(
                "document.getElementById('status').textContent.startsWith('done')", timeout=30000
            )

            spans = page.eval_on_selector_all(
                "#output span[data-source]", "els => els.map(e => [e.dataset.source, e.textContent])"
            )  # noqa: E501
            counts = sorted(set(page.evaluate("window.counts")) - {0})
            assert len(counts) >= 2 and counts[-1] == len(spans), counts  # arrived in several chunks
            sources = {s for s, _ in spans}
            assert sources == {"ar", "nar"}, sources
            colours = {
                s: page.eval_on_selector(f"#output span.{s}", "e => getComputedStyle(e).backgroundColor")
                for s in ("ar", "nar")
            }
            assert colours["ar"] != colours["nar"]
            n = int(page.text_content("#tokens"))
            assert n == len(spans) or n >= len(spans) > 0  # a span per token (fewer if a token ends mid-char)
            assert int(page.text_content("#ar-count")) + int(page.text_content("#nar-count")) == n
            assert float(page.text_content("#tps")) > 0
            assert page.text_content("#output").startswith("def alpha_3(x):\n    return")

            shot = tmp_path / "demo.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    if os.environ.get("YUE_UPDATE_DOCS"):  # refresh the README's screenshot on request only
        shutil.copyfile(shot, DOCS_SCREENSHOT)
