"""The demo page in headless Chromium (Debian's `chromium`, driven by Playwright for Python): a chat
through the OpenAI chat endpoint: type a message, press Send, see the answer stream coloured by AR/NAR,
send a second turn with the first in the conversation, and save a screenshot."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.serve_utils import LiveServer, Paced

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
DOCS_SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "demo.png"


@contextmanager
def _demo_page(model_dir, delay: float, **page_options):
    """(page, errors): the demo page of a paced server on `model_dir`, open in headless Chromium, and the
    page's script errors as they come; skips where Playwright or Debian's Chromium is missing."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install -y chromium)")
    import yue

    engine = Paced(yue.load(model_dir), delay=delay)
    with LiveServer(engine) as srv, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(**page_options)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(srv.url + "/")
            yield page, errors
        finally:
            browser.close()


@pytest.mark.slow
def test_demo_page_streams_tokens_coloured_by_path_in_headless_chromium(trained_model_dir, tmp_path):
    # The trained tiny model drafts code-like text; pacing makes the stream visibly incremental (0.05 s
    # a step once let a busy 2-core machine's browser take the whole answer in one DOM update).
    with _demo_page(trained_model_dir, 0.25, viewport={"width": 1000, "height": 760}) as (page, errors):
        page.fill("#prompt", "def alpha_3(x):\n    return")
        # Both turns bounded: where a random tiny model stops depends on its float rounding (kernels).
        page.fill("#max-tokens", "32")
        assert page.input_value("#mode") == ""  # the model's default mode unless another is picked
        page.select_option("#mode", "hybrid")
        page.uncheck("#use-model-threshold")  # hybrid at tolerance 1 keeps every draft: NAR tokens certain
        page.eval_on_selector("#threshold", "e => { e.value = '1'; e.dispatchEvent(new Event('input')); }")
        assert page.text_content("#threshold-value") == "1.00"
        # Record how many token spans exist after each DOM update: streaming means several updates.
        page.evaluate(
            """() => { window.counts = []; new MutationObserver(() => window.counts.push(
               document.querySelectorAll('#output span[data-source]').length)).observe(
               document.getElementById('output'), {childList: true, subtree: true}); }"""
        )
        page.click("#generate")
        try:
            page.wait_for_function(
                "document.getElementById('status').textContent.startsWith('done')", timeout=30000
            )
        finally:
            assert not errors, errors
            print("status:", page.text_content("#status"))

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
        assert page.text_content(".msg.user .text") == "def alpha_3(x):\n    return"
        answer = "".join(t for _, t in spans)
        assert page.text_content(".msg.assistant .text") == answer and answer

        # A second turn: the request carries the whole conversation, and the page shows both answers.
        sent = []
        page.on("request", lambda r: sent.append(r.post_data_json) if r.method == "POST" else None)
        page.fill("#prompt", "def beta(y):")
        page.click("#generate")
        page.wait_for_function(
            "document.querySelectorAll('.msg.assistant').length == 2 && "
            "document.getElementById('status').textContent.startsWith('done')",
            timeout=30000,
        )
        roles = [m["role"] for m in sent[-1]["messages"]]
        assert roles == ["user", "assistant", "user"] and sent[-1]["messages"][1]["content"] == answer
        assert "mode" in sent[-1] and sent[-1]["pieces"] is True

        shot = tmp_path / "demo.png"
        page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("YUE_UPDATE_DOCS"):  # refresh the README's screenshot on request only
        shutil.copyfile(shot, DOCS_SCREENSHOT)


@pytest.mark.slow
def test_demo_page_colours_anchors_apart_from_fill_in_headless_chromium(trained_model_dir):
    """The anchor experiment on the demo page: anchors (the AR path's) and fill (the NAR set's) in
    colours of their own, counted as AR and NAR tokens."""
    with _demo_page(trained_model_dir, 0.1) as (page, _):
        page.fill("#prompt", "def alpha_3(x):\n    return")
        page.select_option("#mode", "anchor")
        page.click("#generate")
        page.wait_for_function(
            "document.getElementById('status').textContent.startsWith('done')", timeout=30000
        )
        spans = page.eval_on_selector_all(
            "#output span[data-source]", "els => els.map(e => e.dataset.source)"
        )
        assert set(spans) == {"anchor", "fill"}, set(spans)
        colours = {
            s: page.eval_on_selector(f"#output span.{s}", "e => getComputedStyle(e).backgroundColor")
            for s in ("anchor", "fill")
        }
        assert colours["anchor"] != colours["fill"]
        ar, nar = int(page.text_content("#ar-count")), int(page.text_content("#nar-count"))
        assert ar == spans.count("anchor") and nar == spans.count("fill")
