"""The self-contained HTML report (report/html.py), without a browser: structure, data, escaping."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.estimator import estimate
from vramlens.forensics.view import build_view
from vramlens.report.html import CSP, embed_json, render_html, save_html
from vramlens.result.timeline import CATEGORY_ORDER, Timeline, TimelineBuilder

SCRIPT_PAYLOAD = "</script><script>alert(1)</script>"
IMG_PAYLOAD = '"><img src=x onerror=alert(2)>'
COMMENT_PAYLOAD = "<!--<script>alert(3)//"
ASSETS = resources.files("vramlens.report").joinpath("assets")


class _Page(HTMLParser):
    """Every start tag with its attributes, the text of each <script> and all visible text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.text: list[str] = []
        self._script: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._script = dict(attrs)
            self.scripts.append((self._script, ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)
        else:
            self.text.append(data)


def _parse(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    parser.close()
    return parser


def _data(page: str) -> dict[str, Any]:
    blocks = [text for attrs, text in _parse(page).scripts if attrs.get("id") == "vramlens-data"]
    assert len(blocks) == 1
    data: dict[str, Any] = json.loads(blocks[0])
    return data


def _code(category: Category) -> int:
    return CATEGORY_ORDER.index(category)


def _timeline(
    module: str = "model.layers.0.mlp", frame: str = "model.py:7 in forward", phase: str = "forward"
) -> Timeline:
    """params 1000 (load), activations 400 then 200 (``phase``, ``module``, stack ``frame``),
    activation 400 freed. Live: 1000, 1400, 1600, 1200; 1 ms apart."""
    builder = TimelineBuilder(time_unit="ns")
    load, work = builder.code("phase", "load"), builder.code("phase", phase)
    mod = builder.code("module", module)
    stack = builder.code("stack", f"train.py:3 in main\n{frame}")
    rows = [
        (100, Category.PARAMETERS, 1, load, -1, -1),
        (400, Category.ACTIVATIONS, 2, work, mod, stack),
        (200, Category.ACTIVATIONS, 3, work, mod, stack),
        (-400, Category.ACTIVATIONS, 2, work, mod, stack),
    ]
    for index, (nbytes, category, storage, phase_code, module_code, stack_code) in enumerate(rows):
        size = nbytes * 10 if category is Category.PARAMETERS else nbytes
        builder.append(index * 1_000_000, size, _code(category), storage, phase_code, module_code, stack_code)
    return builder.build()


def _estimate_report() -> Any:
    return estimate({"model": "llama-3.1-8b", "method": "lora", "recompute": "full", "gpu": "a100-80gb"})


def test_an_estimate_is_drawn_over_its_phases() -> None:
    report = _estimate_report()
    page = render_html(report)
    data = _data(page)
    names = [phase.name for phase in report.phases]
    assert data["unit"] == "phase" and data["x"] == list(range(len(names)))
    assert [name for name, _, _ in data["phases"]] == names
    drawn = [Category(name) for name, _, _ in data["categories"]]
    for point, phase in enumerate(report.phases):
        by_category = {category: data["values"][row][point] for row, category in enumerate(drawn)}
        assert {c: v for c, v in by_category.items() if v} == {c: b for c, b in phase.breakdown.items() if b}
        assert data["total"][point] == sum(phase.breakdown.values())
    assert data["peak"] == [names.index(report.peak_phase), sum(report.breakdown.values())]
    assert data["capacity"] == report.capacity_bytes and data["points"] is None
    assert data["notes"] == [phase.note for phase in report.phases]
    text = " ".join(_parse(page).text)
    for section in ("Breakdown at the peak", "Phases", "Inputs", "Assumptions", "Memory over time"):
        assert section in text
    assert report.assumptions[0] in text and "lora" in text  # the assumptions and the workload's inputs


def test_a_timeline_is_drawn_event_by_event_with_the_allocation_behind_each_point() -> None:
    report = build_view(_timeline()).report
    data = _data(render_html(report))
    assert data["unit"] == "ms" and data["x"] == [0, 1, 2, 3]
    assert data["categories"] == [["parameters", "parameters", "#3b6fd4"], ["activations", "activations", "#f08a24"]]
    assert data["values"] == [[1000] * 4, [0, 400, 600, 200]] and data["total"] == [1000, 1400, 1600, 1200]
    assert data["peak"] == [2, 1600]
    points = data["points"]
    assert points["event"] == [0, 1, 2, 3] and points["nbytes"] == [1000, 400, 200, -400]
    assert points["category"] == [0, 1, 1, 1]  # indexes into data["categories"]
    assert points["modules"] == ["model.layers.0.mlp"] and points["module"] == [-1, 0, 0, 0]
    assert points["phases"] == ["load", "forward"] and points["phase"] == [0, 1, 1, 1]
    # Stacks innermost frame first.
    assert points["stacks"] == [[0, 1]] and points["stack"] == [-1, 0, 0, 0]
    assert points["frames"] == ["model.py:7 in forward", "train.py:3 in main"]
    assert data["phases"] == [["load", 0, 0], ["forward", 1, 3]]


def test_a_long_timeline_keeps_few_points_and_its_exact_peak() -> None:
    rng = np.random.default_rng(7)
    count = 200_000
    sizes = rng.integers(1, 10_000, count)
    nbytes = np.where(rng.random(count) < 0.5, sizes, -sizes // 2).astype(np.int64)
    nbytes[0] = 10**9  # keeps the total positive
    timeline = Timeline(
        time=np.arange(count, dtype=np.int64),
        nbytes=nbytes,
        category=np.full(count, _code(Category.ACTIVATIONS), dtype=np.int8),
        phase=np.full(count, -1, dtype=np.int32),
        module=np.full(count, -1, dtype=np.int32),
        stack=np.full(count, -1, dtype=np.int32),
        storage=np.arange(count, dtype=np.int64),
    )
    report = build_view(timeline, replay_allocator=False).report
    page = render_html(report, max_points=500)
    data = _data(page)
    assert len(data["x"]) <= 500 and data["unit"] == "event"
    peak_index, peak_bytes = data["peak"]
    assert peak_bytes == timeline.peak_bytes and data["x"][peak_index] == timeline.peak_index
    assert len(page.encode()) < 200_000
    assert f"{count:,} events as {len(data['x']):,} points" in page


def test_deep_stacks_share_one_frame_table_and_are_trimmed() -> None:
    """2000 distinct 60-frame stacks drawn from 100 frames: the page stores each frame once and
    each stack as its 40 innermost frame indexes plus a "... 20 more frames" line."""
    rng = np.random.default_rng(5)
    builder = TimelineBuilder()
    stacks = [[f"/site-packages/lib/module_{k}.py:{k} in f" for k in rng.integers(0, 100, 60)] for _ in range(2000)]
    for index, frames in enumerate(stacks):
        stack = builder.code("stack", "\n".join(frames))
        builder.append(index, 1000, _code(Category.ACTIVATIONS), index, -1, -1, stack)
    page = render_html(build_view(builder.build(), replay_allocator=False).report, max_points=4000)
    points = _data(page)["points"]
    inner = {frame for frames in stacks for frame in frames[20:]}  # the 40 innermost (the last 40, outermost first)
    assert len(points["stacks"]) == 2000 and len(points["frames"]) == len(inner) + 1
    assert points["frames"].count("... 20 more frames") == 1 and all(len(stack) == 41 for stack in points["stacks"])
    first = [points["frames"][code] for code in points["stacks"][points["stack"][0]]]
    assert first == [*stacks[0][::-1][:40], "... 20 more frames"]
    assert len(page.encode()) < 600_000


def _hostile_report() -> tuple[Any, dict[str, Any]]:
    timeline = _timeline(module=IMG_PAYLOAD, frame=f"{SCRIPT_PAYLOAD}:1 in {IMG_PAYLOAD}", phase=COMMENT_PAYLOAD)
    view = build_view(timeline)
    report = dataclasses.replace(
        view.report,
        model=SCRIPT_PAYLOAD + IMG_PAYLOAD,
        workload={"model": SCRIPT_PAYLOAD, IMG_PAYLOAD: [COMMENT_PAYLOAD]},
        assumptions=(SCRIPT_PAYLOAD, IMG_PAYLOAD),
    )
    return report, view.to_dict()


def test_hostile_names_never_become_markup() -> None:
    report, details = _hostile_report()
    page = render_html(report, details=details)
    for payload in (SCRIPT_PAYLOAD, IMG_PAYLOAD, COMMENT_PAYLOAD, "<script>alert", "<img", "<!--<"):
        assert payload not in page
    parsed = _parse(page)
    assert [tag for tag, _ in parsed.tags].count("script") == 3  # the data, uPlot, vramlens' own
    assert not [tag for tag, _ in parsed.tags if tag in ("img", "iframe", "object", "embed")]
    assert not [(tag, name) for tag, attrs in parsed.tags for name in attrs if name.startswith("on")]
    text = "\x00".join(parsed.text)
    # The names are shown as text, exactly: the model, the workload, the allocations' stacks and modules.
    assert text.count(SCRIPT_PAYLOAD + IMG_PAYLOAD) == 2  # <title> and <h1>
    assert f"{SCRIPT_PAYLOAD}:1 in {IMG_PAYLOAD}" in text and IMG_PAYLOAD in text and COMMENT_PAYLOAD in text
    # The data block round-trips them for the chart's tooltip.
    points = _data(page)["points"]
    assert points["modules"] == [IMG_PAYLOAD] and points["phases"] == ["load", COMMENT_PAYLOAD]
    assert points["frames"] == [f"{SCRIPT_PAYLOAD}:1 in {IMG_PAYLOAD}", "train.py:3 in main"]


def test_embedded_json_cannot_close_its_script_block() -> None:
    value = {"a": "</script><!-- & -->", "b": ["\u2028", 1]}
    text = embed_json(value)
    assert not set(text) & {"<", ">", "&"}
    assert json.loads(text) == value


def test_the_page_loads_nothing_from_outside() -> None:
    report, details = build_view(_timeline()).report, build_view(_timeline()).to_dict()
    page = render_html(report, details=details)
    parsed = _parse(page)
    assert not [(tag, attrs) for tag, attrs in parsed.tags if {"src", "href", "action", "srcset"} & set(attrs)]
    # The only address in the file is uPlot's home page in its license header comment.
    addresses = [m.start() for m in re.finditer(r"https?://", page)]
    header = page.index("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    assert addresses == [header + len("/*! ")]
    assert "@import" not in page and "url(" not in page
    meta = [attrs for tag, attrs in parsed.tags if tag == "meta" and attrs.get("http-equiv")]
    assert meta == [{"http-equiv": "Content-Security-Policy", "content": CSP}]
    assert page.index("Content-Security-Policy") < page.index("<script") and "connect-src" not in CSP
    assert CSP.startswith("default-src 'none';")


def test_measured_runs_list_their_largest_allocations_with_stacks() -> None:
    view = build_view(_timeline())
    page = render_html(view.report, details=view.to_dict())
    text = " ".join(_parse(page).text)
    assert "Largest allocations live at the peak" in text and "Modules at the peak" in text
    # Live at the peak (event 2): the parameters (1000 B) and both activations (400 B, 200 B).
    top = view.to_dict()["top_allocations"]
    assert [item["bytes"] for item in top] == [1000, 400, 200]
    assert "model.py:7 in forward\ntrain.py:3 in main" in text  # innermost frame first, in a <pre>
    assert "model.layers.0.mlp" in text


def test_save_html_writes_one_utf8_file(tmp_path: Path) -> None:
    target = save_html(_estimate_report(), tmp_path / "out.html")
    assert target == tmp_path / "out.html"
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert list(tmp_path.iterdir()) == [target]
    with pytest.raises(InputError, match=r"^--html: cannot write"):
        save_html(_estimate_report(), tmp_path / "missing" / "out.html")
    with pytest.raises(InputError, match="max_points"):
        render_html(_estimate_report(), max_points=1)


def test_the_vendored_chart_library_is_inlined_verbatim_and_recorded() -> None:
    record = ASSETS.joinpath("VENDORED.md").read_text(encoding="utf-8")
    page = render_html(_estimate_report())
    for name in ("uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE"):
        content = ASSETS.joinpath(name).read_bytes()
        assert f"`{name}` `{hashlib.sha256(content).hexdigest()}`" in record
        if name != "uPlot.LICENSE":
            assert content.decode() in page
    assert "Version**: 1.6.32" in record and "MIT" in record
    assert ASSETS.joinpath("uPlot.LICENSE").read_text(encoding="utf-8").startswith("The MIT License (MIT)")


def test_the_asset_files_are_package_data() -> None:
    """pyproject.toml ships assets/ in the wheel (an editable install would hide a missing entry)."""
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["vramlens.report"]
    for path in ASSETS.iterdir():
        assert any(Path("assets", path.name).match(pattern) for pattern in patterns), path.name


def test_a_measured_record_without_the_device_level_says_so() -> None:
    """``vramlens view`` knows no device level for a tracked run (its JSON has null there; the
    report's ``device_known`` is False): the page must not show a number."""
    view = build_view(_timeline())
    assert view.to_dict()["peak"]["device_bytes"] is None
    assert "<dt>peak on the device</dt><dd>not recorded</dd>" in render_html(view.report)
    known = dataclasses.replace(view.report, device_known=True)
    assert "<dt>peak on the device</dt><dd>not recorded</dd>" not in render_html(known)
