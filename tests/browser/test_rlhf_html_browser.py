"""The RLHF HTML page in a real browser: Playwright driving Debian's Chromium, network cut off
(as tests/browser/test_html_browser.py does for the single-model report).

The page of a real ``rlhf_estimate`` (GRPO of a 7B on one H100) must load offline with no
console or page error, draw its chart (one step per phase), show a bar per phase in the
by-model table with the capacity mark, and run nothing from hostile names in the setup.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_helpers import NEEDS_CHROMIUM, chromium

from vramlens.rlhf import RlhfReport, load_rlhf, rlhf_estimate
from vramlens.rlhf.render.html import save_rlhf_html

pytestmark = NEEDS_CHROMIUM
PAYLOAD = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script>'


def grpo_report() -> RlhfReport:
    setup = load_rlhf(
        {"algo": "grpo", "actor": {"model": "qwen2.5-7b", "method": "lora"}, "micro_batch": 2, "gpu": "h100-80gb"}
    )
    return rlhf_estimate(setup)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium()


def open_page(browser: Any, path: Path) -> tuple[Any, Any, list[str], list[str]]:
    """The page drawn in a fresh context where every other request is recorded and aborted."""
    context = browser.new_context(viewport={"width": 1200, "height": 900}, device_scale_factor=1)
    page = context.new_page()
    url = path.resolve().as_uri()
    requests: list[str] = []
    errors: list[str] = []
    context.route("**/*", lambda route: route.continue_() if route.request.url == url else route.abort())
    page.on("request", lambda request: None if request.url == url else requests.append(request.url))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    page.wait_for_function("window.vramlens && window.vramlens.drawn", timeout=10_000)
    return context, page, requests, errors


def test_page_draws_offline_with_its_phases_and_model_bars(browser: Any, tmp_path: Path) -> None:
    report = grpo_report()
    context, page, requests, errors = open_page(browser, save_rlhf_html(report, tmp_path / "grpo.html"))
    try:
        assert requests == [] and errors == []
        phases = page.evaluate("() => window.vramlens.data.phases.map((p) => p[0])")
        assert phases == [phase.name for phase in report.phases]
        assert page.evaluate("() => window.vramlens.plot.data[0].length") == len(report.phases) + 1
        assert page.locator("#vl-legend .vl-item[data-category=kv_cache]").count() == 1
        assert page.locator("#models .stack").count() == len(report.phases)
        box = page.locator("#models .stack").first.bounding_box()
        mark = page.locator("#models .stack .cap").first.bounding_box()
        share = report.capacity_bytes / max(max(p.device_bytes for p in report.phases), report.capacity_bytes)
        assert mark["x"] - box["x"] == pytest.approx(share * box["width"], abs=2)  # the capacity mark
        assert page.locator("#models tr.peak td").first.inner_text() == report.peak_phase
    finally:
        context.close()


def test_hostile_names_in_the_setup_run_nothing(browser: Any, tmp_path: Path) -> None:
    report = grpo_report()
    actor = dataclasses.replace(report.setup.actor, model=PAYLOAD)
    bad = dataclasses.replace(report, setup=dataclasses.replace(report.setup, actor=actor), assumptions=(PAYLOAD,))
    context, page, requests, errors = open_page(browser, save_rlhf_html(bad, tmp_path / "bad.html"))
    try:
        assert page.evaluate("() => typeof window.__pwned") == "undefined"
        assert requests == [] and errors == []
        assert PAYLOAD in page.locator("h1").inner_text()  # shown as text
    finally:
        context.close()
