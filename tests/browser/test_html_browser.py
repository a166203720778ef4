"""The HTML report in a real browser: Playwright driving Debian's Chromium, network cut off.

Needs the Python package ``playwright`` and ``/usr/bin/chromium`` (``.ci/run`` installs both;
Playwright's own browser download is never used). Each test opens a report written by
``save_html`` from a ``file://`` URL in a fresh context whose every non-file request is
counted and aborted, and fails on any console error or page error (a Content-Security-Policy
violation is one).
"""

from __future__ import annotations

import base64
import dataclasses
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browser_helpers import NEEDS_CHROMIUM, chromium

from vramlens.categories import Category
from vramlens.estimator import estimate
from vramlens.forensics.sources import open_source
from vramlens.forensics.view import build_view
from vramlens.report.html import save_html
from vramlens.report.palette import PALETTE
from vramlens.result.timeline import CATEGORY_ORDER, Timeline, TimelineBuilder
from vramlens.snapshot import save_snapshot

pytestmark = NEEDS_CHROMIUM
SCRIPT_PAYLOAD = "<script>window.__pwned=1</script>"
IMG_PAYLOAD = '<img src=x onerror="window.__pwned=1">'
VIEWPORT = {"width": 1000, "height": 900}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium()


@dataclasses.dataclass
class Opened:
    page: Any
    requests: list[str]
    errors: list[str]
    dialogs: list[str]

    def js(self, expression: str, arg: Any = None) -> Any:
        return self.page.evaluate(expression, arg)


@pytest.fixture
def open_report(browser: Any, tmp_path: Path) -> Iterator[Any]:
    """``open_report(report, details=None) -> Opened``: the report drawn in a fresh page."""
    contexts: list[Any] = []

    def opener(report: Any, details: dict[str, Any] | None = None) -> Opened:
        path = save_html(report, tmp_path / f"report{len(contexts)}.html", details=details)
        context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
        contexts.append(context)
        opened = Opened(page=context.new_page(), requests=[], errors=[], dialogs=[])
        url = path.resolve().as_uri()
        context.route("**/*", lambda route: route.continue_() if route.request.url == url else route.abort())
        opened.page.on("request", lambda request: None if request.url == url else opened.requests.append(request.url))
        opened.page.on("console", lambda msg: opened.errors.append(msg.text) if msg.type == "error" else None)
        opened.page.on("pageerror", lambda error: opened.errors.append(str(error)))
        opened.page.on("dialog", lambda dialog: (opened.dialogs.append(dialog.message), dialog.dismiss()))
        opened.page.goto(url)
        opened.page.wait_for_function("window.vramlens && window.vramlens.drawn", timeout=10_000)
        return opened

    yield opener
    for context in contexts:
        context.close()


def _code(category: Category) -> int:
    return CATEGORY_ORDER.index(category)


def _training_timeline(module: str = "model.layers.1.mlp", frame: str = "model.py:42 in forward") -> Timeline:
    """Parameters 4 MiB (load); activations 1, 2, 3 MiB (forward, in ``module``, stack ending
    in ``frame``); then freed one by one while 1 MiB gradients are made (backward). Live bytes
    climb to the peak of 10 MiB after the third activation (event 3). 1 ms apart."""
    mib = 2**20
    builder = TimelineBuilder(time_unit="ns")
    load, forward, backward = (builder.code("phase", name) for name in ("load", "forward", "backward"))
    mod = builder.code("module", module)
    stack = builder.code("stack", f"train.py:9 in main\nmodel.py:30 in __call__\n{frame}")
    rows = [(4 * mib, Category.PARAMETERS, 1, load, -1, -1)]
    rows += [(k * mib, Category.ACTIVATIONS, 10 + k, forward, mod, stack) for k in (1, 2, 3)]
    for k in (3, 2, 1):
        rows += [(-k * mib, Category.ACTIVATIONS, 10 + k, backward, mod, stack)]
        rows += [(mib, Category.GRADIENTS, 20 + k, backward, mod, stack)]
    for index, (nbytes, category, storage, phase, module_code, stack_code) in enumerate(rows):
        builder.append(index * 1_000_000, nbytes, _code(category), storage, phase, module_code, stack_code)
    return builder.build()


def _measured() -> tuple[Any, dict[str, Any]]:
    view = build_view(_training_timeline())
    return view.report, view.to_dict()


def _canvas_pixels(opened: Opened) -> Any:
    """The chart canvas's RGBA bytes inside the plot area (uPlot's bbox, canvas pixels), one row each."""
    encoded = opened.js(
        """() => { const u = window.vramlens.plot, b = u.bbox;
             const d = u.ctx.getImageData(b.left, b.top, b.width, b.height).data;
             let s = "";
             for (let i = 0; i < d.length; i += 0x8000) s += String.fromCharCode.apply(null, d.subarray(i, i + 0x8000));
             return btoa(s); }"""
    )
    return np.frombuffer(base64.b64decode(encoded), dtype=np.uint8).reshape(-1, 4)


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def _count(pixels: Any, color: str) -> int:
    return int(np.all(pixels[:, :3] == _rgb(color), axis=1).sum())


def _hover_step(opened: Opened, point: int) -> str:
    """Move the mouse to the middle of drawn point ``point``'s step, half way up; the tooltip text."""
    x, y = opened.js(
        """(i) => { const u = window.vramlens.plot, D = window.vramlens.data, r = u.over.getBoundingClientRect();
             const x1 = i + 1 < D.x.length ? D.x[i + 1] : D.x[i];
             return [r.left + (u.valToPos(D.x[i], "x") + u.valToPos(x1, "x")) / 2, r.top + r.height / 2]; }""",
        point,
    )
    opened.page.mouse.move(x, y)
    opened.page.wait_for_selector("#vl-tooltip:not([hidden])", timeout=5_000)
    return str(opened.page.inner_text("#vl-tooltip"))


def test_loads_offline_without_errors_and_draws(open_report: Any) -> None:
    for report in (estimate({"model": "llama-3.1-8b", "method": "lora", "gpu": "a100-80gb"}), _measured()[0]):
        opened = open_report(report)
        assert opened.requests == [] and opened.errors == []
        pixels = _canvas_pixels(opened)
        painted = np.any(pixels[:, :3] < 250, axis=1) & (pixels[:, 3] > 0)
        assert painted.mean() > 0.2, "the stacked bands fill a good part of the plot"
        assert _count(pixels, PALETTE[Category.PARAMETERS].hex) > 1000


def test_hiding_a_category_restacks_the_chart(open_report: Any) -> None:
    opened = open_report(*_measured())
    activations = PALETTE[Category.ACTIVATIONS].hex
    before = _canvas_pixels(opened)
    assert _count(before, activations) > 1000
    opened.page.click("#vl-legend .vl-item[data-category=activations]")
    after = _canvas_pixels(opened)
    assert _count(after, activations) == 0 and not np.array_equal(before, after)
    assert opened.page.get_attribute("#vl-legend .vl-item[data-category=activations]", "aria-pressed") == "false"
    opened.page.click("#vl-legend .vl-item[data-category=activations]")
    assert np.array_equal(_canvas_pixels(opened), before)
    assert opened.errors == []


def test_hovering_shows_the_allocation_module_phase_and_stack(open_report: Any) -> None:
    opened = open_report(*_measured())
    text = _hover_step(opened, 3)  # the peak: the third activation (3 MiB) was just made
    assert text.startswith("3.000 ms")
    assert "total\n10.00 MiB" in text and "activations\n6.00 MiB" in text and "parameters\n4.00 MiB" in text
    assert "allocation of 3.00 MiB (activations), event #3" in text
    assert "phase\nforward" in text and "module\nmodel.layers.1.mlp" in text
    assert "model.py:42 in forward\nmodel.py:30 in __call__\ntrain.py:9 in main" in text  # innermost first
    assert "free of 3.00 MiB (activations), event #4" in _hover_step(opened, 4)
    assert opened.errors == []


def test_zoom_pan_and_reset_change_the_visible_range(open_report: Any) -> None:
    opened = open_report(*_measured())
    page = opened.page

    def visible() -> list[float]:
        return list(opened.js("() => [window.vramlens.plot.scales.x.min, window.vramlens.plot.scales.x.max]"))

    full = visible()
    box = page.locator("#vl-chart .u-over").bounding_box()
    y = box["y"] + 50
    page.mouse.move(box["x"] + box["width"] * 0.2, y)  # drag-select zooms in on x
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=5)
    page.mouse.up()
    zoomed = visible()
    assert full[0] < zoomed[0] < zoomed[1] < full[1]
    page.click("#vl-right")  # the arrows pan by a quarter of the view
    panned = visible()
    assert panned[0] > zoomed[0] and panned[1] - panned[0] == pytest.approx(zoomed[1] - zoomed[0])
    page.keyboard.down("Shift")  # shift-drag pans: dragging right shows earlier times
    page.mouse.move(box["x"] + box["width"] * 0.3, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.4, y, steps=5)
    page.mouse.up()
    page.keyboard.up("Shift")
    dragged = visible()
    assert dragged[0] < panned[0] and dragged[1] - dragged[0] == pytest.approx(panned[1] - panned[0])
    page.click("#vl-reset")
    assert visible() == full
    page.mouse.move(box["x"] + box["width"] * 0.5, y)
    page.mouse.wheel(0, -100)  # the wheel zooms around the cursor
    page.wait_for_function(f"window.vramlens.plot.scales.x.max < {full[1]}")
    wheeled = visible()
    assert full[0] < wheeled[0] < wheeled[1] < full[1]
    page.dblclick("#vl-chart .u-over")  # double-click shows everything again
    assert visible() == full
    assert opened.errors == []


def test_hostile_names_from_a_snapshot_execute_nothing(open_report: Any, tmp_path: Path) -> None:
    """Frame, file, module and model names carrying script payloads are shown, never run."""
    timeline = _training_timeline(module=IMG_PAYLOAD, frame=f"{SCRIPT_PAYLOAD}:7 in {IMG_PAYLOAD}")
    path = save_snapshot(timeline, tmp_path / "hostile.pickle")
    view = build_view(open_source(path))
    report = dataclasses.replace(view.report, model=SCRIPT_PAYLOAD + IMG_PAYLOAD, assumptions=(IMG_PAYLOAD,))
    opened = open_report(report, view.to_dict())
    assert opened.js("() => typeof window.__pwned") == "undefined"
    assert opened.page.inner_text("h1") == SCRIPT_PAYLOAD + IMG_PAYLOAD
    assert opened.js("() => document.querySelectorAll('img').length") == 0
    assert opened.js("() => document.scripts.length") == 3
    points = opened.js("() => window.vramlens.data.x.length")
    texts = [_hover_step(opened, point) for point in range(points)]
    assert opened.js("() => typeof window.__pwned") == "undefined"
    assert opened.js("() => document.querySelectorAll('img').length") == 0
    assert any(f"module\n{IMG_PAYLOAD}" in text and f"{SCRIPT_PAYLOAD}:7 in {IMG_PAYLOAD}" in text for text in texts)
    opened.page.click("#top-allocations summary")  # open a stack of the largest allocations
    assert f"{SCRIPT_PAYLOAD}:7 in {IMG_PAYLOAD}" in opened.page.inner_text("#top-allocations")
    assert opened.dialogs == [] and opened.requests == [] and opened.errors == []


def _png_pixels(data: bytes) -> Any:
    """RGB(A) pixels of an 8-bit, non-interlaced PNG (what Chromium's screenshots are), as an
    array ``(height, width, channels)``; every PNG filter undone (PNG specification, section 9)."""
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", data[16:29])
    assert depth == 8 and interlace == 0 and color in (2, 6)
    channels = 3 if color == 2 else 4
    chunks, pos = [], 8
    while pos < len(data):
        (size,) = struct.unpack(">I", data[pos : pos + 4])
        if data[pos + 4 : pos + 8] == b"IDAT":
            chunks.append(data[pos + 8 : pos + 8 + size])
        pos += size + 12
    raw = np.frombuffer(zlib.decompress(b"".join(chunks)), dtype=np.uint8).reshape(height, 1 + width * channels)
    out = np.zeros((height, width * channels), dtype=np.uint8)
    previous = np.zeros(width * channels, dtype=np.int64)
    for row in range(height):
        kind, line = int(raw[row, 0]), raw[row, 1:].astype(np.int64)
        if kind == 0:
            current = line
        elif kind == 2:
            current = (line + previous) % 256
        elif kind == 1:
            current = (np.cumsum(line.reshape(width, channels), axis=0) % 256).reshape(-1)
        else:
            current = _sequential_filter(kind, line.tolist(), previous.tolist(), channels)
        out[row] = current
        previous = np.asarray(current, dtype=np.int64)
    return out.reshape(height, width, channels)


def _sequential_filter(kind: int, line: list[int], above: list[int], bpp: int) -> Any:
    """Undo the Average (3) or Paeth (4) filter of one row."""
    current = [0] * len(line)
    for i, value in enumerate(line):
        left = current[i - bpp] if i >= bpp else 0
        up, corner = above[i], (above[i - bpp] if i >= bpp else 0)
        if kind == 3:
            predicted = (left + up) // 2
        else:
            guess = left + up - corner
            pa, pb, pc = abs(guess - left), abs(guess - up), abs(guess - corner)
            predicted = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
        current[i] = (value + predicted) % 256
    return np.array(current, dtype=np.int64)


def _close(pixel: Any, color: str, tolerance: int = 6) -> bool:
    return all(abs(int(a) - b) <= tolerance for a, b in zip(pixel[:3], _rgb(color), strict=True))


def test_screenshot_shows_the_bands_legend_capacity_and_peak(open_report: Any) -> None:
    report = dataclasses.replace(_measured()[0], gpu="test-gpu", capacity_bytes=12 * 2**20)
    opened = open_report(report)
    chart = opened.page.locator("#timeline").bounding_box()
    shot = _png_pixels(opened.page.screenshot(clip=chart))
    at = opened.js(
        """() => { const u = window.vramlens.plot, D = window.vramlens.data, r = u.over.getBoundingClientRect();
             const i = D.peak[0], mid = (u.valToPos(D.x[i], "x") + u.valToPos(D.x[i + 1], "x")) / 2;
             const y = (v) => r.top + u.valToPos(v, "y");
             return { x: r.left + mid, params: y(2 * 2 ** 20), acts: y(7 * 2 ** 20), above: y(11 * 2 ** 20),
                      capacity: y(12 * 2 ** 20), left: r.left, right: r.right }; }"""
    )

    def pixel(x: float, y: float) -> Any:
        return shot[round(y - chart["y"]), round(x - chart["x"])]

    # At the peak the stack is parameters (0-4 MiB) under activations (4-10 MiB), white above.
    assert _close(pixel(at["x"], at["params"]), PALETTE[Category.PARAMETERS].hex)
    assert _close(pixel(at["x"], at["acts"]), PALETTE[Category.ACTIVATIONS].hex)
    assert not _close(pixel(at["x"], at["above"]), PALETTE[Category.ACTIVATIONS].hex)
    # The capacity line (dashed, red) crosses the plot at 12 MiB.
    xs = np.linspace(at["left"] + 5, at["right"] - 120, 60)
    hits = [sum(_close(pixel(x, at["capacity"] + dy), "#b00020", tolerance=40) for x in xs) for dy in (-1, 0, 1)]
    assert max(hits) >= 20, hits
    # The legend shows each category's swatch in its color.
    for category in (Category.PARAMETERS, Category.GRADIENTS, Category.ACTIVATIONS):
        swatch = opened.page.locator(f"#vl-legend .vl-item[data-category={category.value}] .vl-swatch").bounding_box()
        assert _close(
            pixel(swatch["x"] + swatch["width"] / 2, swatch["y"] + swatch["height"] / 2), PALETTE[category].hex
        )
    assert opened.errors == []


def test_phase_names_never_break_mid_word_in_a_narrow_window(open_report: Any) -> None:
    """Each phase name sits on one line (it broke inside ``optimizer_step`` on a narrow page), and
    the inputs are a table of the keys that apply (``lora.rank``), not raw JSON."""
    opened = open_report(estimate({"model": "llama-3.1-8b", "method": "lora", "gpu": "a100-80gb"}))
    opened.page.set_viewport_size({"width": 420, "height": 900})
    lines = opened.js(
        """() => [...document.querySelectorAll('#phases tbody td:first-child')].map((td) => {
             const range = document.createRange(); range.selectNodeContents(td);
             return [td.textContent, new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size]; })"""
    )
    assert [name for name, _ in lines] == ["forward", "backward", "optimizer_step"]
    assert all(count == 1 for _, count in lines), lines
    keys = opened.js("() => [...document.querySelectorAll('#inputs th')].map((th) => th.textContent)")
    assert "lora.rank" in keys and "lora" not in keys and "prompt" not in keys
