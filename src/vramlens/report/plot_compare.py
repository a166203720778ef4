"""Bar charts (the ``[plot]`` extra): an estimate's phases as stacked bars (:func:`draw_phase_bars`)
and the breakdown at its peak (:func:`draw_breakdown`), both drawn by
:func:`~vramlens.report.plot.save_plot`, and several reports' peak breakdowns side by side
(:func:`save_comparison`).

In the comparison, one bar per report (estimate vs simulate vs measured, or the rows of a
technique experiment), stacked by category in :data:`~vramlens.result.timeline.CATEGORY_ORDER`
with the colors of :mod:`vramlens.report.palette`: the categories at the peak (allocated
level), then allocator slack and runtime memory where the report has them, so each bar reaches
the report's device level. Each total is written above its bar; the GPU's usable memory is a dashed line when the
reports name one. In an SVG each category is one ``<path>`` in a group ``compare-<category>``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.report.palette import PALETTE
from vramlens.report.plot import (
    Scale,
    add_legend,
    add_patch,
    check_size,
    draw_capacity,
    figure_of,
    plot_target,
    rectangles_path,
    save_figure,
    scale_for,
    stack_of,
)
from vramlens.report.series import StackedSeries
from vramlens.result.report import MemoryReport
from vramlens.result.timeline import CATEGORY_ORDER
from vramlens.units import format_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["breakdown_rows", "comparison_labels", "draw_breakdown", "draw_phase_bars", "save_comparison"]

_BAR_WIDTH = 0.55
_PHASE_BAR_WIDTH = 0.6


def save_comparison(
    reports: Sequence[MemoryReport],
    path: str | os.PathLike[str],
    *,
    labels: Sequence[str] | None = None,
    width_px: int = 1000,
    height_px: int = 650,
    dpi: int = 100,
) -> Path:
    """Draw the peak breakdown of each of ``reports`` as a stacked bar into ``path`` (.png or .svg).

    ``labels`` name the bars (default: :func:`comparison_labels`)."""
    target = plot_target(path)
    check_size(width_px, height_px, dpi)
    if not reports:
        raise InputError("reports: nothing to compare; pass at least one MemoryReport")
    names = comparison_labels(reports) if labels is None else [str(label) for label in labels]
    if len(names) != len(reports):
        raise InputError(f"labels: {len(names)} labels for {len(reports)} reports; pass one label per report")
    stacks = [dict(breakdown_rows(report)) for report in reports]
    totals = [sum(stack.values()) for stack in stacks]
    capacity = next((r.capacity_bytes for r in reports if r.capacity_bytes is not None), None)
    scale = scale_for(max([*totals, capacity or 0]))
    with figure_of(width_px, height_px, dpi) as figure:
        ax = figure.subplots()
        drawn = _draw_stacks(ax, stacks, scale.bytes)
        for index, total in enumerate(totals):
            ax.annotate(
                format_bytes(total, precision=1), (index, total / scale.bytes), xytext=(0, 3),
                textcoords="offset points", ha="center", va="bottom", fontsize=10, fontweight="bold",
            )  # fmt: skip
        gpu = next((r.gpu for r in reports if r.capacity_bytes == capacity), None)
        draw_capacity(ax, capacity, gpu, scale)
        ax.set_xticks(list(range(len(reports))), names)
        ax.set_xlim(-0.6, len(reports) - 0.4)
        ax.set_ylim(0, max([*totals, capacity or 0, 1]) * 1.15 / scale.bytes)
        ax.set_ylabel(f"memory at the peak ({scale.name})")
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        models = list(dict.fromkeys(report.model for report in reports))
        figure.suptitle(f"peak memory by category: {', '.join(models)}", x=0.01, ha="left", fontsize=12)
        add_legend(figure, drawn)
        save_figure(figure, target, dpi)
    return target


def breakdown_rows(report: MemoryReport) -> list[tuple[Category, int]]:
    """The peak's categories with bytes, then allocator slack and runtime memory when present."""
    rows = [(Category(c), int(b)) for c, b in report.breakdown.items() if b > 0]
    extra = ((Category.ALLOCATOR_SLACK, report.allocator_slack_bytes), (Category.RUNTIME, report.runtime_bytes))
    names = {c for c, _ in rows}
    return rows + [(c, b) for c, b in extra if b > 0 and c not in names]


def draw_phase_bars(ax: Axes, series: StackedSeries, scale: Scale) -> None:
    """An estimate: one stacked bar per phase (x = phase index), the phase names as ticks."""
    cumulative, visible = stack_of(series)
    half = _PHASE_BAR_WIDTH / 2
    for index, category in enumerate(visible):
        rects = [
            (x - half, x + half, lo / scale.bytes, hi / scale.bytes)
            for x, lo, hi in zip(
                series.x.tolist(), cumulative[index].tolist(), cumulative[index + 1].tolist(), strict=True
            )
            if hi > lo
        ]
        add_patch(ax, rectangles_path(rects), category, f"area-{category.value}")
    ax.set_xticks(series.x.tolist(), [name.replace("_", " ") for name, _, _ in series.phases])
    ax.set_xlim(-0.7, len(series.x) - 0.3)
    ax.set_xlabel("phase (each bar: the phase's high point)")


def draw_breakdown(ax: Axes, report: MemoryReport) -> None:
    """Horizontal bars of the breakdown at the peak, largest on top, each labelled with its bytes
    and share (the right-hand part of :func:`~vramlens.report.plot.save_plot`)."""
    from matplotlib.ticker import MaxNLocator

    rows = sorted(breakdown_rows(report), key=lambda row: -row[1])
    total = sum(b for _, b in rows) or 1
    scale = scale_for(max((b for _, b in rows), default=0))
    for rank, (category, value) in enumerate(rows):
        y, width = float(len(rows) - 1 - rank), value / scale.bytes
        add_patch(ax, rectangles_path([(0.0, width, y - 0.35, y + 0.35)]), category, f"bar-{category.value}")
        share = f"{value / total:.0%}" if value / total >= 0.005 else "<1%"
        ax.text(width, y, f" {format_bytes(value, precision=1)}  {share}", va="center", fontsize=8)
    ax.set_yticks([len(rows) - 1 - rank for rank in range(len(rows))], [PALETTE[c].label for c, _ in rows])
    ax.set_ylim(-0.6, max(len(rows), 1) - 0.4)
    ax.set_xlim(0, max((b for _, b in rows), default=1) / scale.bytes * 1.7)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]))
    ax.set_xlabel(f"{scale.name} (total {format_bytes(total, precision=1)})")
    ax.set_title(f"at the peak: {report.peak_phase.replace('_', ' ')}", loc="left")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def comparison_labels(reports: Sequence[MemoryReport]) -> list[str]:
    """Default bar names: the engine, with the model when the reports are of several models,
    numbered when two would read the same."""
    several_models = len({report.model for report in reports}) > 1
    names = [f"{r.engine}\n{r.model}" if several_models else r.engine for r in reports]
    if len(set(names)) < len(names):
        names = [f"{name} #{index + 1}" for index, name in enumerate(names)]
    return names


def _draw_stacks(ax: Axes, stacks: list[dict[Category, int]], unit_bytes: int) -> list[Category]:
    """One compound path per category over all bars; returns the categories drawn, bottom first."""
    order: list[Category] = [c for c in CATEGORY_ORDER if c not in (Category.ALLOCATOR_SLACK, Category.RUNTIME)]
    order += [Category.ALLOCATOR_SLACK, Category.RUNTIME]
    bottoms = [0] * len(stacks)
    drawn: list[Category] = []
    half = _BAR_WIDTH / 2
    for category in order:
        rects = []
        for index, stack in enumerate(stacks):
            value = stack.get(category, 0)
            if value > 0:
                low, bottoms[index] = bottoms[index], bottoms[index] + value
                rects.append((index - half, index + half, low / unit_bytes, bottoms[index] / unit_bytes))
        if rects:
            add_patch(ax, rectangles_path(rects), category, f"compare-{category.value}")
            drawn.append(category)
    return drawn
