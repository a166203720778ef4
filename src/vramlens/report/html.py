"""The HTML report: one self-contained, offline file per :class:`MemoryReport` (``--html out.html``).

The page holds, in this order: the peak at each level and the fit, the stacked timeline
(drawn by the vendored uPlot chart, see ``assets/VENDORED.md``: drag to zoom, shift-drag or
the arrows to pan, the wheel to zoom, double-click or "Reset" to see it all, a click on a
legend entry hides the category and restacks the rest; hovering shows the time, the total,
each category's bytes and, for timelines, the event there with its module, phase and stack),
the breakdown at the peak with bars, the phases, the largest allocations at the peak (measured
runs: ``details["top_allocations"]``), the inputs (the workload) and the assumptions.

Everything is inline: uPlot's script and stylesheet, vramlens' own (``assets/html_report.*``)
and the data, as JSON in ``<script type="application/json" id="vramlens-data">`` with ``<``,
``>`` and ``&`` written as ``\\u003c``/``\\u003e``/``\\u0026`` so no string can close the block.
Names in a report (modules, stack frames, file and model names) come from untrusted files:
Python writes every string through :func:`html.escape`, the script only through
``textContent`` and canvas text, and a Content-Security-Policy forbids any network access.

The chart draws :func:`~vramlens.report.series.report_series`: at most ``max_points`` points
(min and max per bucket, so every peak is exact), so a 10**7-event timeline stays a small file
(0.6 MB at the default 4000 points, written in under a second: ``benchmarks/html_speed.py``).
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from vramlens._version import __version__
from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.report.palette import swatch
from vramlens.report.series import DEFAULT_POINTS, StackedSeries, report_series
from vramlens.result.report import MemoryReport
from vramlens.result.settings import applicable_inputs, settings_line
from vramlens.result.timeline import CATEGORY_ORDER, Timeline
from vramlens.units import format_bytes

__all__ = ["CSP", "asset", "chart_section", "embed_json", "page", "render_html", "save_html"]

#: The page may load nothing: scripts and styles are inline, images only ``data:``.
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
_ASSETS = ("uPlot.min.css", "html_report.css", "uPlot.iife.min.js", "html_report.js")
_STACK_FRAMES = 40
"""Frames kept per stack in the tooltip and the top-allocations table (innermost first)."""


def save_html(
    report: MemoryReport,
    path: str | os.PathLike[str],
    *,
    details: Mapping[str, Any] | None = None,
    max_points: int = DEFAULT_POINTS,
) -> Path:
    """Write the HTML report of ``report`` to ``path`` (UTF-8) and return the path.

    ``details``: more facts of a measured run, as ``vramlens view --format json`` gives them
    (``top_allocations``, ``modules``, ``source``); ``max_points``: points the timeline keeps.
    """
    target = Path(path)
    page = render_html(report, details=details, max_points=max_points)
    try:
        target.write_text(page, encoding="utf-8")
    except OSError as error:
        raise InputError(f"--html: cannot write {target}: {error.strerror or error}") from None
    return target


def render_html(
    report: MemoryReport, *, details: Mapping[str, Any] | None = None, max_points: int = DEFAULT_POINTS
) -> str:
    """The HTML report of ``report`` as one string (see the module docstring)."""
    if max_points < 2:
        raise InputError(f"max_points: {max_points}; accepted: an integer >= 2")
    details = details or {}
    series = report_series(report, max_points=max_points)
    body = [
        _header(report, series),
        chart_section(series),
        _breakdown_section(report),
        _phases_section(report),
        _allocations_section(details.get("top_allocations")),
        _modules_section(details.get("modules")),
        _inputs_section(report.workload_dict),
        _assumptions_section(report.assumptions),
    ]
    return page(f"vramlens: {report.model} ({report.engine})", body, _payload(report, series))


def page(title: str, body: Sequence[str], payload: Any, *, css: str = "") -> str:
    """A self-contained page: the CSP, inlined uPlot and vramlens' chart script and styles (plus
    ``css``), the ``body`` sections, a footer, and ``payload`` as the chart's JSON data block."""
    css_lib, css_own, js_lib, js_own = (asset(name) for name in _ASSETS)
    footer = (
        f"<footer>Made by vramlens {_e(__version__)}; chart drawn with uPlot 1.6.32 (MIT license, inlined).</footer>"
    )
    return "\n".join(
        [
            '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{_e(CSP)}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f'<meta name="generator" content="vramlens {_e(__version__)}">',
            f"<title>{_e(title)}</title>",
            f"<style>\n{css_lib}\n</style>\n<style>\n{css_own}\n{css}\n</style>\n</head>\n<body>",
            *body,
            footer,
            f'<script type="application/json" id="vramlens-data">{embed_json(payload)}</script>',
            f"<script>\n{js_lib}\n</script>\n<script>\n{js_own}\n</script>\n</body>\n</html>\n",
        ]
    )


def embed_json(value: Any) -> str:
    """``value`` as compact JSON that is safe inside ``<script>``: ``<``, ``>`` and ``&`` are
    written as JSON escapes, so no string can end the block or open a comment."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def asset(name: str) -> str:
    """An inlined file of ``assets/`` (refused if it could end its own ``<script>``/``<style>``)."""
    text = resources.files("vramlens.report").joinpath("assets", name).read_text(encoding="utf-8")
    if "</script" in text.lower() or "</style" in text.lower():
        raise RuntimeError(f"assets/{name}: contains a closing tag; it cannot be inlined")
    return text


def _e(value: object) -> str:
    """Escape any value for HTML text or a quoted attribute."""
    return html.escape(str(value), quote=True)


# -- data for the chart -----------------------------------------------------------------------


def _payload(report: MemoryReport, series: StackedSeries) -> dict[str, Any]:
    """What the script draws: the stacked series, phases, peak, capacity and, for timelines,
    the event behind each point (strings in deduplicated tables)."""
    unit = series.x_unit
    x = np.round(series.x, 3).tolist() if unit == "ms" else series.x.astype(np.int64).tolist()
    data: dict[str, Any] = {
        "unit": unit,
        "level": series.level,
        "events": series.events,
        "x": x,
        "categories": [[c.value, swatch(c).label, swatch(c).hex] for c in series.categories],
        "values": series.values.tolist(),
        "total": series.total.tolist(),
        "phases": [[name, _round(x0), _round(x1)] for name, x0, x1 in series.phases],
        "peak": [series.peak_index, series.peak_bytes],
        "capacity": series.capacity_bytes,
        "notes": [phase.note for phase in report.phases] if unit == "phase" else [],
        "points": None,
    }
    if report.timeline is not None and unit != "phase":
        data["points"] = _points(report.timeline, series.source_index, series.categories)
    return data


def _round(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(float(value), 3)


def _points(timeline: Timeline, keep: npt.NDArray[np.int64], categories: Sequence[Category]) -> dict[str, Any]:
    """The event behind each drawn point: index, signed bytes, category (index into the drawn
    ``categories``) and codes into compact module/phase/stack tables (-1: none); each stack is
    a list of indexes into one table of distinct frames, innermost first."""
    module, modules = _compact(timeline.module[keep], timeline.modules)
    phase, phases = _compact(timeline.phase[keep], timeline.phases)
    stack, stacks = _compact(timeline.stack[keep], timeline.stacks)
    frames: dict[str, int] = {}
    return {
        "event": keep.tolist(),
        "nbytes": timeline.nbytes[keep].tolist(),
        "category": _category_index(timeline.category[keep], categories),
        "module": module,
        "phase": phase,
        "stack": stack,
        "modules": modules,
        "phases": phases,
        "stacks": [[frames.setdefault(line, len(frames)) for line in _trim_stack(text)] for text in stacks],
        "frames": list(frames),
    }


def _category_index(codes: npt.NDArray[np.int8], categories: Sequence[Category]) -> list[int]:
    """Each event's category as an index into the drawn ``categories`` (-1: not drawn)."""
    lookup = np.full(len(CATEGORY_ORDER), -1, dtype=np.int64)
    for index, category in enumerate(categories):
        lookup[CATEGORY_ORDER.index(category)] = index
    found: list[int] = lookup[codes.astype(np.int64)].tolist()
    return found


def _compact(codes: npt.NDArray[np.int32], names: Sequence[str]) -> tuple[list[int], list[str]]:
    """Codes renumbered into a table of only the names they use (-1 stays -1)."""
    used, inverse = np.unique(codes, return_inverse=True)
    valid = used >= 0
    renumber = np.where(valid, np.cumsum(valid) - 1, -1)
    return renumber[inverse].astype(np.int64).tolist(), [names[code] for code in used[valid].tolist()]


def _trim_stack(stack: str) -> list[str]:
    """A stack string (outermost frame first) as innermost-first lines, at most ``_STACK_FRAMES``."""
    frames = [line for line in stack.split("\n") if line][::-1]
    extra = len(frames) - _STACK_FRAMES
    return frames[:_STACK_FRAMES] + ([f"... {extra} more frames"] if extra > 0 else [])


# -- sections written by Python (every string escaped) --------------------------------------


def _header(report: MemoryReport, series: StackedSeries) -> str:
    """Title and summary (a measured record without the device level says so)."""
    device = format_bytes(report.device_bytes) if report.device_known else "not recorded"
    fit = {None: "no GPU given", True: "fits", False: "does not fit"}[report.fits]
    gpu = f"{report.gpu} ({format_bytes(report.capacity_bytes)})" if report.gpu and report.capacity_bytes else "-"
    headroom = report.headroom_bytes
    rows = [
        ("peak allocated", f"{format_bytes(report.allocated_bytes)} in {report.peak_phase}"),
        ("peak reserved", format_bytes(report.reserved_bytes)),
        ("peak on the device", device),
        ("GPU", gpu),
        ("fit", fit if headroom is None else f"{fit} (headroom {format_bytes(headroom)})"),
        ("drawn", _drawn(series)),
    ]
    cells = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in rows)
    line = settings_line(report)
    settings = f'<p class="settings" id="settings">{_e(line)}</p>' if line else ""
    return (
        f'<header><h1><span class="model">{_e(report.model)}</span></h1>'
        f'<p class="sub">{_e(report.engine)} report, per GPU</p>{settings}<dl class="summary">{cells}</dl></header>'
    )


def _drawn(series: StackedSeries) -> str:
    if series.x_unit == "phase":
        return f"{series.events} phases at their high points ({series.level} bytes)"
    kept = len(series.x)
    how = "every event" if kept == series.events else "min and max per bucket, every peak exact"
    return f"{series.events:,} events as {kept:,} points ({how}; {series.level} bytes)"


def chart_section(series: StackedSeries, title: str = "Memory over time") -> str:
    """The chart's section (heading, zoom controls, legend, plot area) for ``series``."""
    axis = {"ms": "time since the first event (ms)", "event": "event", "phase": "phase"}[series.x_unit]
    return (
        f'<section id="timeline"><h2>{_e(title)}</h2>'
        '<div class="controls"><button type="button" id="vl-reset">Reset zoom</button>'
        '<button type="button" id="vl-left" aria-label="pan left">&#9664;</button>'
        '<button type="button" id="vl-right" aria-label="pan right">&#9654;</button>'
        '<span class="hint">drag to zoom, shift-drag or arrows to pan, wheel to zoom, double-click to reset; '
        "click a category to hide it</span></div>"
        '<div id="vl-legend" role="group" aria-label="categories"></div>'
        f'<div id="vl-chart" data-axis="{_e(axis)}"><div id="vl-tooltip" hidden></div></div>'
        "<noscript><p>The chart needs JavaScript; the tables below do not.</p></noscript></section>"
    )


def _bar_rows(rows: Iterable[tuple[str, str, int]], total: int) -> str:
    """Table rows ``name | bytes | share | bar`` (``rows``: name, color, bytes)."""
    out = []
    for name, color, value in rows:
        share = value / total if total > 0 else 0.0
        width = max(0.0, min(100.0, share * 100))
        out.append(
            f"<tr><td>{_e(name)}</td><td class='num'>{_e(format_bytes(value))}</td>"
            f"<td class='num'>{share:.1%}</td><td class='barcell'><span class='bar' "
            f"style='width:{width:.2f}%;background:{_e(color)}'></span></td></tr>"
        )
    return "".join(out)


def _breakdown_section(report: MemoryReport) -> str:
    peak = report.peak
    rows = [(swatch(c).label, swatch(c).hex, int(b)) for c, b in peak.breakdown.items() if b > 0]
    for category, value in (
        (Category.ALLOCATOR_SLACK, report.allocator_slack_bytes),
        (Category.RUNTIME, report.runtime_bytes),
    ):
        if value > 0:
            rows.append((swatch(category).label, swatch(category).hex, value))
    rows.sort(key=lambda row: -row[2])
    note = f" ({peak.note})" if peak.note else ""
    return (
        f'<section id="breakdown"><h2>Breakdown at the peak</h2><p>{_e(peak.name)}{_e(note)}; shares of the '
        f"device-level peak, {_e(format_bytes(report.device_bytes))}.</p>"
        '<table class="bars"><thead><tr><th>category</th><th>memory</th><th>share</th><th></th></tr></thead>'
        f"<tbody>{_bar_rows(rows, report.device_bytes)}</tbody></table></section>"
    )


def _phases_section(report: MemoryReport) -> str:
    highest = max((phase.allocated_bytes for phase in report.phases), default=0)
    rows = []
    for phase in report.phases:
        parts = ", ".join(f"{swatch(c).label} {format_bytes(b)}" for c, b in phase.breakdown.items() if b)
        mark = " class='peak'" if phase.name == report.peak_phase else ""
        rows.append(
            f"<tr{mark}><td class='name'>{_e(phase.name)}</td><td class='num'>{_e(format_bytes(phase.allocated_bytes))}</td>"
            f"<td class='barcell'><span class='bar' style='width:{_share(phase.allocated_bytes, highest):.2f}%'>"
            f"</span></td><td>{_e(parts)}</td><td>{_e(phase.note)}</td></tr>"
        )
    return (
        '<section id="phases"><h2>Phases</h2><table><thead><tr><th>phase</th><th>allocated at its high point'
        "</th><th></th><th>by category</th><th>where</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


def _share(value: int, whole: int) -> float:
    return max(0.0, min(100.0, 100.0 * value / whole)) if whole > 0 else 0.0


def _allocations_section(items: Any) -> str:
    """The largest allocations live at the peak, each with its stack (innermost frame first)."""
    if not isinstance(items, Sequence) or not items:
        return ""
    rows = []
    for rank, item in enumerate(items, start=1):
        if not isinstance(item, Mapping):
            continue
        stack = item.get("stack") or []
        frames = [str(frame) for frame in stack][:_STACK_FRAMES] if isinstance(stack, Sequence) else []
        cell = f"<details><summary>{len(frames)} frames</summary><pre>{_e(chr(10).join(frames))}</pre></details>"
        size = item.get("bytes")
        rows.append(
            f"<tr><td class='num'>{rank}</td><td class='num'>{_e(format_bytes(size) if isinstance(size, int) else '-')}"
            f"</td><td>{_e(item.get('category', ''))}</td><td>{_e(item.get('module', '') or '-')}</td>"
            f"<td>{_e(item.get('phase', '') or '-')}</td><td>{cell if frames else '-'}</td></tr>"
        )
    return (
        '<section id="top-allocations"><h2>Largest allocations live at the peak</h2><table><thead><tr><th>#</th>'
        "<th>size</th><th>category</th><th>module</th><th>phase</th><th>stack (innermost first)</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


def _modules_section(items: Any) -> str:
    """Allocated bytes live at the peak by allocating module (``details["modules"]``)."""
    if not isinstance(items, Sequence) or not items:
        return ""
    rows = [
        (str(item.get("module", "")) or "-", "#7a7a7a", int(item["bytes"]))
        for item in items
        if isinstance(item, Mapping) and isinstance(item.get("bytes"), int)
    ]
    total = max((value for _, _, value in rows), default=0)
    return (
        '<section id="modules"><h2>Modules at the peak</h2><table class="bars"><thead><tr><th>module</th>'
        f"<th>memory</th><th>of the largest</th><th></th></tr></thead><tbody>{_bar_rows(rows, total)}</tbody>"
        "</table></section>"
    )


def _inputs_section(workload: Mapping[str, Any]) -> str:
    """The workload keys that apply to the run (mode, method, engine), one row each (``lora.rank``)."""
    if not workload:
        return '<section id="inputs"><h2>Inputs</h2><p>No workload recorded.</p></section>'
    rows = "".join(f"<tr><th>{_e(key)}</th><td>{_e(value)}</td></tr>" for key, value in applicable_inputs(workload))
    return f'<section id="inputs"><h2>Inputs</h2><table class="kv"><tbody>{rows}</tbody></table></section>'


def _assumptions_section(assumptions: Sequence[str]) -> str:
    items = "".join(f"<li>{_e(text)}</li>" for text in assumptions) or "<li>none stated</li>"
    return f'<section id="assumptions"><h2>Assumptions</h2><ul>{items}</ul></section>'
