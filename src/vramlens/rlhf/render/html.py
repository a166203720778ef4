"""The HTML page of an RLHF step (``vramlens rlhf --html out.html``): one self-contained, offline file.

Built from the single-model HTML report's machinery (:mod:`vramlens.report.html`): the same
inlined stylesheet, uPlot chart and script (``assets/``), the same Content-Security-Policy (no
network), the same JSON data block. The page holds, in this order:

* the summary: the peak phase and its allocated, reserved and device levels on the busiest GPU,
  the GPU's capacity and the fit;
* the chart: the step's phases stacked by category at the device level
  (:func:`~vramlens.rlhf.render.series.rlhf_series`, drawn by ``html_report.js`` as it draws an
  estimate's phases: hover for each category's bytes, click a category to hide it);
* by model: one bar per phase stacked by model (:func:`~vramlens.rlhf.render.series.model_segments`)
  with the capacity marked, and where every model is (GPU, CPU, absent) and which ones run;
* the transitions between phases (what is loaded, offloaded, freed, with the PCIe time), the
  recommendations, the setup and the assumptions.

Every string is written through :func:`html.escape`; names in a setup come from user files.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vramlens.errors import InputError
from vramlens.report.html import chart_section, page
from vramlens.report.palette import swatch
from vramlens.report.series import StackedSeries
from vramlens.rlhf.render.series import model_segments, peak_index, rlhf_series, role_look
from vramlens.units import format_bytes

if TYPE_CHECKING:
    import os

    from vramlens.rlhf import ModelState, RlhfReport

__all__ = ["rlhf_html", "save_rlhf_html"]

#: The by-model bars: a box per phase with its segments and the capacity mark.
_CSS = (
    ".stack{position:relative;display:inline-block;width:320px;height:14px;background:#f6f6f6;vertical-align:middle}"
    ".stack span{display:inline-block;height:14px;vertical-align:top}"
    ".stack .cap{position:absolute;top:-3px;width:2px;height:20px;background:#b22222}"
    ".key{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:middle;margin-right:4px}"
    "#models td{white-space:nowrap}#models tr.peak td{font-weight:normal}"
    "#models tr.peak td:first-child,#models td.busy{font-weight:600}"
)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def save_rlhf_html(report: RlhfReport, path: str | os.PathLike[str]) -> Path:
    """Write :func:`rlhf_html` of ``report`` to ``path`` (UTF-8) and return the path."""
    target = Path(path)
    try:
        target.write_text(rlhf_html(report), encoding="utf-8")
    except OSError as error:
        raise InputError(f"--html: cannot write {target}: {error.strerror or error}") from None
    return target


def rlhf_html(report: RlhfReport) -> str:
    """The page as one string (see the module docstring)."""
    series = rlhf_series(report)
    body = [
        _header(report),
        chart_section(series, "Memory per phase, by category"),
        _models_section(report),
        _transitions_section(report),
        _recommendations_section(report),
        _setup_section(report),
        '<section id="assumptions"><h2>Assumptions</h2><ul>'
        + ("".join(f"<li>{_e(text)}</li>" for text in report.assumptions) or "<li>none stated</li>")
        + "</ul></section>",
    ]
    return page(_title(report), body, _payload(report, series), css=_CSS)


def _title(report: RlhfReport) -> str:
    setup = report.setup
    return f"vramlens: {setup.algo.value.upper()} step, actor {setup.actor.model} on {setup.gpus} x {setup.gpu}"


def _payload(report: RlhfReport, series: StackedSeries) -> dict[str, Any]:
    """What ``html_report.js`` draws, in the single-model report's format for phases."""
    return {
        "unit": "phase",
        "level": series.level,
        "events": series.events,
        "x": series.x.astype(int).tolist(),
        "categories": [[c.value, swatch(c).label, swatch(c).hex] for c in series.categories],
        "values": series.values.tolist(),
        "total": series.total.tolist(),
        "phases": [[name, int(x0), int(x1)] for name, x0, x1 in series.phases],
        "peak": [series.peak_index, series.peak_bytes],
        "capacity": series.capacity_bytes,
        "notes": [phase.note for phase in report.phases],
        "points": None,
    }


def _header(report: RlhfReport) -> str:
    capacity = report.capacity_bytes
    if capacity:
        gap = format_bytes(abs(capacity - report.peak_device_bytes))
        fit = f"fits (headroom {gap})" if report.fits else f"does not fit ({gap} over)"
    else:
        fit = "no GPU given"
    rows = [
        ("peak phase", report.peak_phase),
        ("peak allocated", format_bytes(report.peak_allocated_bytes)),
        ("peak reserved", format_bytes(report.peak_reserved_bytes)),
        ("peak on the device", format_bytes(report.peak_device_bytes)),
        ("GPU capacity", format_bytes(capacity) if capacity else "-"),
        ("fit", fit),
        ("drawn", f"{len(report.phases)} phases of one step, busiest GPU, device level"),
    ]
    cells = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in rows)
    return (
        f'<header><h1><span class="model">{_e(_title(report).removeprefix("vramlens: "))}</span></h1>'
        f'<p class="sub">RLHF memory timeline, per GPU</p><dl class="summary">{cells}</dl></header>'
    )


def _models_section(report: RlhfReport) -> str:
    """One stacked bar per phase by model, and where each model is."""
    scale = max([phase.device_bytes for phase in report.phases] + [report.capacity_bytes or 0, 1])
    peak = peak_index(report)
    cap = ""
    if report.capacity_bytes:
        cap = f"<span class='cap' style='left:{100 * report.capacity_bytes / scale:.2f}%'></span>"
    rows = []
    for index, phase in enumerate(report.phases):
        parts = "".join(
            f"<span title='{_e(role_look(role).label)}: {_e(format_bytes(value))}' "
            f"style='width:{100 * value / scale:.3f}%;background:{_e(role_look(role).hex)}'></span>"
            for role, value in model_segments(phase)
        )
        where = "".join(_where(phase.models.get(role)) for role in _roles(report))
        mark = " class='peak'" if index == peak else ""
        rows.append(
            f"<tr{mark}><td class='name'>{_e(phase.name)}</td><td class='num'>{_e(format_bytes(phase.device_bytes))}</td>"
            f"<td><span class='stack'>{parts}{cap}</span></td>{where}<td>{_e(phase.gpu_group)}</td></tr>"
        )
    keys = "".join(
        f"<th><span class='key' style='background:{_e(role_look(r).hex)}'></span>{_e(r)}</th>" for r in _roles(report)
    )
    return (
        '<section id="models"><h2>Memory per phase, by model</h2><p>Bars: each model on the GPU, then shared '
        "bytes and allocator + runtime (grey); the red mark is the GPU's capacity. Bold: the models the phase "
        "runs.</p><table><thead><tr><th>phase</th><th>device</th><th></th>"
        f"{keys}<th>group</th></tr></thead><tbody>{''.join(rows)}</tbody></table></section>"
    )


def _where(state: ModelState | None) -> str:
    """A model's cell in one phase: where it is (with its bytes on the GPU), bold when it runs."""
    if state is None:
        return "<td>-</td>"
    text = _e(state.where) + (" " + _e(format_bytes(state.bytes)) if state.where == "gpu" else "")
    return f"<td class='{'busy' if state.busy else 'idle'}'>{text}</td>"


def _roles(report: RlhfReport) -> list[str]:
    """Every role of the step, first seen first."""
    roles: list[str] = []
    for phase in report.phases:
        roles += [role for role in phase.models if role not in roles]
    return roles


def _transitions_section(report: RlhfReport) -> str:
    if not report.transitions:
        return '<section id="transitions"><h2>Transitions</h2><p>Nothing moves between phases.</p></section>'
    rows = "".join(
        f"<tr><td>{_e(t.before)} &rarr; {_e(t.after)}</td><td>{_e(t.role)}</td><td>{_e(t.action)}</td>"
        f"<td class='num'>{_e(format_bytes(t.bytes))}</td><td class='num'>{t.seconds:.2f} s</td></tr>"
        for t in report.transitions
    )
    return (
        '<section id="transitions"><h2>Transitions</h2><table><thead><tr><th>between</th><th>model</th>'
        f"<th>action</th><th>per GPU</th><th>time</th></tr></thead><tbody>{rows}</tbody></table></section>"
    )


def _recommendations_section(report: RlhfReport) -> str:
    items = "".join(f"<li>{_e(r.text)} (saves {_e(format_bytes(r.saves_bytes))})</li>" for r in report.recommendations)
    return f'<section id="recommendations"><h2>Recommendations</h2><ul>{items or "<li>none</li>"}</ul></section>'


def _setup_section(report: RlhfReport) -> str:
    setup = report.to_dict().get("setup")
    if not isinstance(setup, Mapping) or not setup:
        return ""
    rows = "".join(f"<tr><th>{_e(key)}</th><td>{_e(_plain(value))}</td></tr>" for key, value in setup.items())
    return f'<section id="inputs"><h2>Setup</h2><table class="kv"><tbody>{rows}</tbody></table></section>'


def _plain(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence | Mapping):
        return json.dumps(value, separators=(", ", ": "), default=str)
    return str(value)
