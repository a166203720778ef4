"""A picture of an experiment: peak memory against time per step, one point per technique
(PNG or SVG; the ``[plot]`` extra).

Filled dots are the measured allocated-level peaks, hollow circles at the same time the
estimator's predictions, joined to their measurement by a thin line; each run is labelled
with its name. The control's time and peak are dashed guides, so the quadrant a technique
lands in shows what it buys (lower) and what it costs (further right). matplotlib only
through ``Figure`` on the Agg canvas, as :mod:`vramlens.report.plot` draws.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vramlens.experiments.render.table import experiment_rows, peak_unit
from vramlens.report.plot import check_size, figure_of, plot_target, save_figure

__all__ = ["save_experiment_plot"]

_MEASURED = "#1f77b4"
_PREDICTED = "#ff7f0e"


def save_experiment_plot(
    rows: Sequence[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    device: str,
    width_px: int = 1000,
    height_px: int = 650,
    dpi: int = 100,
) -> Path:
    """Draw the runs of ``rows`` (store rows) into ``path`` (.png or .svg); runs without a
    measurement or a time are left out."""
    target = plot_target(path)
    check_size(width_px, height_px, dpi)
    drawn = [(row, table) for row, table in zip(rows, experiment_rows(rows), strict=True)
             if table.measured and row.get("step_seconds")]  # fmt: skip
    unit_name, unit = peak_unit(rows)
    with figure_of(width_px, height_px, dpi) as figure:
        ax = figure.subplots()
        for row, table in drawn:
            x, y = float(row["step_seconds"]), (table.measured or 0) / unit
            ax.scatter([x], [y], color=_MEASURED, zorder=3, gid=f"measured-{table.name}")
            ax.annotate(table.name, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=9)
            if table.predicted is not None:
                ax.scatter([x], [table.predicted / unit], facecolors="none", edgecolors=_PREDICTED, zorder=3)
                ax.plot([x, x], [y, table.predicted / unit], color=_PREDICTED, linewidth=0.8, zorder=2)
        control = next((row for row, table in drawn if table.reduction is None), None)
        if control is not None:
            ax.axvline(float(control["step_seconds"]), color="grey", linestyle="--", linewidth=0.8)
            ax.axhline(control["measured_peak_bytes"] / unit, color="grey", linestyle="--", linewidth=0.8)
        ax.scatter([], [], color=_MEASURED, label="measured peak")
        ax.scatter([], [], facecolors="none", edgecolors=_PREDICTED, label="vramlens estimate")
        ax.legend(loc="lower left", frameon=False)
        ax.set_xlabel("seconds per training step (after warm-up)")
        ax.set_ylabel(f"peak allocated memory ({unit_name})")
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0, right=max([float(row["step_seconds"]) for row, _ in drawn] + [1e-3]) * 1.3)
        figure.suptitle(f"Memory-saving techniques on {device}: peak memory vs time", x=0.01, ha="left", fontsize=12)
        save_figure(figure, target, dpi)
    return target
