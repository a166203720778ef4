"""The plan as a picture: per-GPU peak memory against relative step time (the ``[plot]`` extra).

Every fitting frontier configuration the search estimated is a grey dot; the plan's entries
(the Pareto front: nothing else is both smaller and faster) are blue dots joined by a step line,
the best one labelled; the usable budget, capacity x (1 - headroom), is a dashed red line.
matplotlib is used through its object API on the Agg canvas, like :mod:`vramlens.report.plot`.
"""

from __future__ import annotations

import os
from pathlib import Path

from vramlens.errors import InputError
from vramlens.planner.model import Plan
from vramlens.report.plot import check_size, figure_of, plot_target, save_figure, scale_for
from vramlens.units import format_bytes

__all__ = ["save_plan_plot"]

_FRONT = "#1f77b4"
_OTHER = "#b0b0b0"
_BUDGET = "#b22222"


def save_plan_plot(
    plan: Plan, path: str | os.PathLike[str], *, width_px: int = 1000, height_px: int = 650, dpi: int = 100
) -> Path:
    """Draw the plan's memory-vs-time scatter and Pareto front into ``path`` (.png or .svg)."""
    if not plan.candidates:
        raise InputError("--plot: nothing fits, so there is no plan to draw (see the 'impossible' message)")
    target = plot_target(path)
    check_size(width_px, height_px, dpi)
    capacity = plan.candidates[0].report.capacity_bytes or 0
    budget = capacity * (1.0 - plan.headroom)
    scale = scale_for(int(max(capacity, *(c.report.device_bytes for c in plan.candidates))))
    front = sorted((c.relative_step_time, c.report.device_bytes / scale.bytes) for c in plan.candidates)
    with figure_of(width_px, height_px, dpi) as figure:
        ax = figure.subplots()
        if plan.explored:
            ax.scatter(
                [t for _, t in plan.explored], [b / scale.bytes for b, _ in plan.explored],
                s=14, color=_OTHER, label="fitting configurations searched", zorder=2,
            )  # fmt: skip
        xs, ys = [x for x, _ in front], [y for _, y in front]
        ax.step(xs, ys, where="post", color=_FRONT, linewidth=1.2, zorder=3)
        ax.scatter(xs, ys, s=30, color=_FRONT, label="plan (Pareto front)", zorder=4)
        best = plan.candidates[0]
        ax.annotate(
            "best", (best.relative_step_time, best.report.device_bytes / scale.bytes),
            xytext=(6, 6), textcoords="offset points", color=_FRONT,
        )  # fmt: skip
        ax.axhline(budget / scale.bytes, color=_BUDGET, linestyle=(0, (5, 3)), linewidth=1.2)
        ax.annotate(
            f"budget {format_bytes(int(budget), precision=1)} ({plan.headroom:.0%} headroom)",
            (1.0, budget / scale.bytes), xycoords=("axes fraction", "data"), xytext=(-4, 3),
            textcoords="offset points", ha="right", va="bottom", color=_BUDGET,
        )  # fmt: skip
        ax.set_ylim(0, capacity * 1.1 / scale.bytes)
        ax.set_xlabel(f"step time relative to {plan.reference}")
        ax.set_ylabel(f"per-GPU peak ({scale.name}, device level)")
        ax.set_title(f"{plan.workload.model if isinstance(plan.workload.model, str) else plan.workload.model.name}"
                     f" on {plan.gpus} x {plan.gpu}")  # fmt: skip
        ax.legend(loc="lower right", frameon=False)
        save_figure(figure, target, dpi)
    return target
