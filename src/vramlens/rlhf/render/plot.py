"""Static picture of an RLHF step (``vramlens rlhf --plot out.png|out.svg``; the ``[plot]`` extra).

Two panels over the step's phases, per GPU on the busiest GPU, at the device level (so the bars
are read against the capacity, as :attr:`~vramlens.rlhf.RlhfReport.fits` does):

* left, one bar per phase stacked **by category**
  (:func:`~vramlens.rlhf.render.series.rlhf_series`: breakdown, allocator slack, runtime) in the
  colors of :mod:`vramlens.report.palette`, drawn by the single-model plot's own phase bars;
* right, the same bars stacked **by model** (:func:`~vramlens.rlhf.render.series.model_segments`:
  each model's bytes on the GPU in that phase, shared bytes, allocator and runtime), in the role
  colors of :data:`~vramlens.rlhf.render.series.ROLE_LOOKS`, with a dot under the models a phase
  runs;

both with the GPU's capacity as a dashed line and the peak phase marked. Bytes in binary units
(GiB). matplotlib is imported lazily, only through its object API (see :mod:`vramlens.report.plot`,
whose figure, capacity line, legend and file helpers this reuses); in an SVG each category's bars
are one ``<path>`` with the id ``area-<category>`` and each model's ``model-<role>``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from vramlens.report.plot import (
    Scale,
    add_legend,
    check_size,
    draw_capacity,
    figure_of,
    plot_target,
    rectangles_path,
    save_figure,
    scale_for,
    visible_categories,
)
from vramlens.report.plot_compare import draw_phase_bars
from vramlens.rlhf.render.series import ROLE_LOOKS, model_segments, peak_index, rlhf_series, role_look
from vramlens.units import format_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from vramlens.rlhf import RlhfReport

__all__ = ["plot_rlhf"]

_HEADROOM = 1.22  # the y axis's top over max(peak, capacity): room for the peak's label
_BAR_WIDTH = 0.7


def plot_rlhf(
    report: RlhfReport, path: str | os.PathLike[str], *, width_px: int = 1400, height_px: int = 650, dpi: int = 100
) -> Path:
    """Draw ``report`` (see the module docstring) into ``path`` (.png or .svg) of ``width_px`` x
    ``height_px`` pixels and return the path."""
    target = plot_target(path)
    check_size(width_px, height_px, dpi)
    series = rlhf_series(report)
    top = max(series.peak_bytes, report.capacity_bytes or 0, 1)
    scale = scale_for(top)
    with figure_of(width_px, height_px, dpi) as figure:
        by_category, by_model = figure.subplots(1, 2, sharey=True)
        draw_phase_bars(by_category, series, scale)
        by_category.set_title("by category")
        _draw_model_bars(by_model, report, scale)
        by_model.set_title("by model")
        for ax in (by_category, by_model):
            ax.set_ylim(0, top * _HEADROOM / scale.bytes)
            ax.set_xlabel("phase (order of one step)")
            draw_capacity(ax, report.capacity_bytes, "GPU", scale)
            _mark_peak(ax, report, scale)
        by_category.set_ylabel(f"memory per GPU, device level ({scale.name})")
        figure.suptitle(_title(report), x=0.01, ha="left", fontsize=12)
        add_legend(figure, visible_categories(series))
        _role_legend(by_model, report)
        save_figure(figure, target, dpi)
    return target


def _draw_model_bars(ax: Axes, report: RlhfReport, scale: Scale) -> None:
    """One bar per phase stacked by model; one compound path per role over all bars."""
    from matplotlib.patches import PathPatch

    rects: dict[str, list[tuple[float, float, float, float]]] = {}
    half = _BAR_WIDTH / 2
    for x, phase in enumerate(report.phases):
        bottom = 0
        for role, value in model_segments(phase):
            rects.setdefault(role, []).append(
                (x - half, x + half, bottom / scale.bytes, (bottom + value) / scale.bytes)
            )
            bottom += value
    order = list(ROLE_LOOKS)
    for role in sorted(rects, key=lambda name: (order.index(name) if name in order else len(order), name)):
        patch = PathPatch(
            rectangles_path(rects[role]), facecolor=role_look(role).hex, edgecolor="white", linewidth=0.6, zorder=2
        )
        patch.set_gid(f"model-{role}")
        ax.add_patch(patch)
    names = [_busy_label(phase.name, [r for r, s in phase.models.items() if s.busy]) for phase in report.phases]
    ax.set_xticks(list(range(len(names))), names)
    ax.set_xlim(-0.7, len(names) - 0.3)


def _busy_label(name: str, busy: list[str]) -> str:
    """A phase's tick: its name and, below, the models it runs."""
    runs = ", ".join(busy)
    return name.replace("_", " ") + (f"\n(runs {runs})" if runs else "")


def _mark_peak(ax: Axes, report: RlhfReport, scale: Scale) -> None:
    """An arrow from above to the top of the peak phase's bar, with its device level."""
    index = peak_index(report)
    if index < 0:
        return
    y = report.phases[index].device_bytes / scale.bytes
    label = f"peak {format_bytes(report.phases[index].device_bytes, precision=1)}"
    if report.capacity_bytes and not report.fits:
        label += f"\n{format_bytes(report.phases[index].device_bytes - report.capacity_bytes, precision=1)} over"
    ax.annotate(
        label, (index, y), xytext=(index, ax.get_ylim()[1] * 0.93), ha="center", va="top", fontsize=9,
        fontweight="bold", zorder=5, arrowprops={"arrowstyle": "->", "color": "#222222", "linewidth": 1.1},
    )  # fmt: skip


def _role_legend(ax: Axes, report: RlhfReport) -> None:
    """The roles drawn, in stacking order (top first), right of the by-model panel (clear of the bars
    and the peak's label)."""
    from matplotlib.patches import Patch

    drawn = {role for phase in report.phases for role, _ in model_segments(phase)}
    order = [role for role in ROLE_LOOKS if role in drawn] + sorted(drawn - set(ROLE_LOOKS))
    handles = [Patch(facecolor=role_look(role).hex, label=role_look(role).label) for role in reversed(order)]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _title(report: RlhfReport) -> str:
    """What was estimated, then the peak and the fit."""
    setup = report.setup
    head = (
        f"{setup.algo.value.upper()} step, actor {setup.actor.model} on {setup.gpus} x {setup.gpu}: "
        "memory per phase on the busiest GPU (device level)"
    )
    peak = f"peak {format_bytes(report.peak_device_bytes, precision=1)} in {report.peak_phase.replace('_', ' ')}"
    if report.capacity_bytes:
        capacity = format_bytes(report.capacity_bytes, precision=1)
        gap = format_bytes(abs(report.capacity_bytes - report.peak_device_bytes), precision=1)
        peak += f" - fits {capacity} (headroom {gap})" if report.fits else f" - does NOT fit {capacity} ({gap} over)"
    return f"{head}\n{peak}"
