"""A picture of a :class:`~vramlens.planner.sweep.Sweep`: PNG or SVG (the ``[plot]`` extra).

One axis: stacked bars per category (the colors of :mod:`vramlens.report.palette`, allocator slack
and runtime on top, so a bar's top is the device peak) across the values, with the GPU's usable
memory as a dashed line and a ``✗`` over each value that does not fit. Two axes: a heatmap of the
device peak (GiB) over the grid, each cell labelled, and the cells that do not fit hatched.
matplotlib only through ``Figure`` on the Agg canvas, as :mod:`vramlens.report.plot` draws.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from vramlens.categories import Category
from vramlens.planner.sweep import Sweep
from vramlens.report.palette import PALETTE
from vramlens.report.plot import add_legend, check_size, draw_capacity, figure_of, plot_target, save_figure, scale_for
from vramlens.units import GiB

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

__all__ = ["save_sweep_plot"]

_HEADROOM = 1.15  # the y axis's top over max(peak, capacity)


def save_sweep_plot(
    sweep: Sweep, path: str | os.PathLike[str], *, width_px: int = 1100, height_px: int = 650, dpi: int = 100
) -> Path:
    """Draw ``sweep`` into ``path`` (.png or .svg) of ``width_px`` x ``height_px`` pixels."""
    target = plot_target(path)
    check_size(width_px, height_px, dpi)
    with figure_of(width_px, height_px, dpi) as figure:
        ax = figure.subplots()
        if len(sweep.axes) == 1:
            categories = _draw_bars(ax, sweep)
            add_legend(figure, categories)
        else:
            _draw_grid(ax, sweep, figure)
        figure.suptitle(_title(sweep), x=0.01, ha="left", fontsize=12)
        save_figure(figure, target, dpi)
    return target


def _title(sweep: Sweep) -> str:
    model = next((row.report.model for row in sweep.rows if row.report is not None), "?")
    over = " x ".join(a.key for a in sweep.axes)
    return f"{model}: per-GPU peak over {over}" + ("" if sweep.gpu is None else f" on {sweep.gpu}")


def _draw_bars(ax: Axes, sweep: Sweep) -> list[Category]:
    """Stacked bars, one per row; returns the categories drawn (bottom first)."""
    categories = [c for c in Category if any(c in row.stack for row in sweep.rows)]
    top = max([r.report.device_bytes for r in sweep.rows if r.report is not None] + [sweep.capacity_bytes or 0, 1])
    scale = scale_for(top)
    xs = list(range(len(sweep.rows)))
    bottoms = [0.0] * len(xs)
    for category in categories:
        heights = [row.stack.get(category, 0) / scale.bytes for row in sweep.rows]
        ax.bar(xs, heights, bottom=bottoms, width=0.7, color=PALETTE[category].hex, edgecolor="white", linewidth=0.5,
               gid=f"bar-{category.value}")  # fmt: skip
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    for x, row, height in zip(xs, sweep.rows, bottoms, strict=True):
        mark = "error" if row.report is None else ("" if row.fits or sweep.capacity_bytes is None else "✗")
        if mark:
            ax.annotate(mark, (x, height), xytext=(0, 3), textcoords="offset points", ha="center", color="#b22222")
    key = sweep.axes[0].key
    ax.set_xticks(xs, [str(row.values[key]) for row in sweep.rows])
    ax.set_xlabel(key)
    ax.set_ylabel(f"memory ({scale.name})")
    ax.set_ylim(0, top * _HEADROOM / scale.bytes)
    draw_capacity(ax, sweep.capacity_bytes, sweep.gpu, scale)
    return categories


def _draw_grid(ax: Axes, sweep: Sweep, figure: Figure) -> None:
    """Heatmap of the device peak in GiB; cells that do not fit hatched, errors blank."""
    import numpy as np

    first, second = sweep.axes
    grid = np.full((len(first.values), len(second.values)), np.nan)
    for index, row in enumerate(sweep.rows):
        i, j = divmod(index, len(second.values))
        if row.report is not None:
            grid[i, j] = row.report.device_bytes / GiB
        label = "error" if row.report is None else f"{grid[i, j]:.1f}"
        ax.text(j, i, label, ha="center", va="center", fontsize=8, color="black",
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.6})  # fmt: skip
        if row.report is not None and not row.fits and sweep.capacity_bytes is not None:
            ax.add_patch(_hatch(j, i))
    image = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
    figure.colorbar(image, ax=ax, label="peak (GiB)")
    ax.set_xticks(range(len(second.values)), [str(v) for v in second.values])
    ax.set_yticks(range(len(first.values)), [str(v) for v in first.values])
    ax.set_xlabel(second.key)
    ax.set_ylabel(first.key)
    if sweep.capacity_bytes is not None:
        ax.set_title(f"hatched: does not fit {sweep.gpu}", loc="left", fontsize=9)


def _hatch(x: float, y: float) -> Rectangle:
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1.0, 1.0, fill=False, hatch="///", edgecolor="#b22222", linewidth=0)
