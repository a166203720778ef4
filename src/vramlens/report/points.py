"""The points a terminal picture draws, in plain Python (no numpy on the estimate's text path).

:class:`SeriesPoints` holds what :class:`~vramlens.report.series.StackedSeries` holds, as
tuples: an estimate's few phases are built here directly (:func:`phase_points`), a timeline's
series is reduced with numpy first and converted (:meth:`StackedSeries.points`). The numpy
series of an estimate (:func:`vramlens.report.series.phase_series`) is made from
:func:`phase_points`, so the two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vramlens.categories import CATEGORY_ORDER, Category
from vramlens.result.report import MemoryReport

__all__ = ["SeriesPoints", "phase_points", "report_points"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SeriesPoints:
    """Live bytes by category at a sequence of points (the fields of
    :class:`~vramlens.report.series.StackedSeries`, as tuples)."""

    x: tuple[float, ...]
    """Position of each point: milliseconds (``x_unit="ms"``), event index (``"event"``) or phase index (``"phase"``)."""
    x_unit: str
    categories: tuple[Category, ...]
    """Categories with any bytes, in :data:`~vramlens.categories.CATEGORY_ORDER` (bottom first)."""
    values: tuple[tuple[int, ...], ...]
    """Bytes, one row per category, one column per point."""
    total: tuple[int, ...]
    """Live bytes at each point."""
    phases: tuple[tuple[str, float, float], ...]
    """Named stretches as ``(phase, x of the first point, x of the last point)``, in order."""
    peak_index: int
    """Index (into ``x``) of the highest total; -1 when there are no points."""
    peak_bytes: int
    capacity_bytes: int | None
    level: str
    events: int
    """Events the points were reduced from (phases for an estimate)."""


def phase_points(
    names: Sequence[str],
    stacks: Sequence[Mapping[Category, int]],
    *,
    peak: int,
    capacity_bytes: int | None,
    level: str,
) -> SeriesPoints:
    """One point per phase (``names``), stacked by the categories of ``stacks`` (bytes per
    category, one mapping per phase) in :data:`CATEGORY_ORDER`; ``peak`` is the peak phase's
    index (-1: none) and ``level`` the memory level the stacks are at."""
    present = {category for stack in stacks for category, value in stack.items() if value > 0}
    categories = tuple(category for category in CATEGORY_ORDER if category in present)
    values = tuple(tuple(int(stack.get(category, 0)) for stack in stacks) for category in categories)
    total = tuple(sum(row[i] for row in values) for i in range(len(stacks)))
    return SeriesPoints(
        x=tuple(float(i) for i in range(len(stacks))),
        x_unit="phase",
        categories=categories,
        values=values,
        total=total,
        phases=tuple((name, float(i), float(i)) for i, name in enumerate(names)),
        peak_index=peak,
        peak_bytes=total[peak] if peak >= 0 else 0,
        capacity_bytes=capacity_bytes,
        level=level,
        events=len(stacks),
    )


def estimate_points(report: MemoryReport) -> SeriesPoints:
    """An estimate over its phases: one point per phase at its high point (allocated level)."""
    phases = report.phases
    peak = next((i for i, phase in enumerate(phases) if phase.name == report.peak_phase), -1)
    return phase_points(
        [phase.name for phase in phases],
        [phase.breakdown for phase in phases],
        peak=peak,
        capacity_bytes=report.capacity_bytes,
        level="allocated",
    )


def report_points(report: MemoryReport) -> SeriesPoints:
    """The points of a report: over its phases (plain Python), or over its timeline when it has
    one (reduced by :func:`vramlens.report.series.report_series`, which needs numpy)."""
    if report.timeline is not None and len(report.timeline):
        from vramlens.report.series import report_series

        return report_series(report).points()
    return estimate_points(report)
