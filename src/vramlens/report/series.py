"""What every picture of a report draws: live bytes stacked by category over time (numpy only).

One :class:`StackedSeries` feeds the terminal timeline, the static plots and the HTML report,
so the four renderings of a :class:`~vramlens.result.report.MemoryReport` agree.

* A report with a :class:`~vramlens.result.timeline.Timeline` (simulated, measured, snapshot)
  is drawn over its events. Long timelines are reduced to at most ``max_points`` points by
  level of detail: the events are cut into equal buckets and each bucket keeps the event
  with its highest and the one with its lowest live total, in time order. Every local high
  point that is the highest of its bucket survives, so the global peak is always drawn at
  its exact value and position (the min/max-per-pixel rule of time-series plotters).
* An estimate (no timeline) is drawn over its phases: one point per phase, at the phase's
  high point, with the phase's breakdown.

Bytes are the report's ``allocated`` level for estimates and the timeline's own level for
the others (:attr:`StackedSeries.level` says which). ``base_bytes`` of a timeline (memory
not itemised) is drawn as ``other``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from vramlens.categories import CATEGORY_ORDER, Category
from vramlens.report.points import SeriesPoints, estimate_points, phase_points
from vramlens.result.report import MemoryReport
from vramlens.result.timeline import Timeline

__all__ = ["StackedSeries", "phase_series", "report_series", "timeline_series"]

#: Default number of points a picture needs (a wide screen's pixels, twice: min and max).
DEFAULT_POINTS = 4000
_OTHER = CATEGORY_ORDER.index(Category.OTHER)


@dataclass(frozen=True, kw_only=True, slots=True)
class StackedSeries:
    """Live bytes by category at a sequence of points, ready to draw."""

    x: npt.NDArray[np.float64]
    """Position of each point: milliseconds since the start (``x_unit="ms"``), the event index
    (``"event"``) or the phase index (``"phase"``)."""
    x_unit: str
    categories: tuple[Category, ...]
    """Categories with any bytes, in :data:`CATEGORY_ORDER` (the stacking order, bottom first)."""
    values: npt.NDArray[np.int64]
    """Bytes, shape ``(len(categories), len(x))``."""
    total: npt.NDArray[np.int64]
    """Live bytes at each point (the sum of ``values`` over categories)."""
    phases: tuple[tuple[str, float, float], ...]
    """Named stretches as ``(phase, x of the first point, x of the last point)``, in order."""
    peak_index: int
    """Index (into ``x``) of the highest total; -1 when there are no points."""
    peak_bytes: int
    capacity_bytes: int | None
    """The GPU's usable memory, when the report names a GPU (drawn as a line)."""
    level: str
    """What the bytes are: ``tensor``, ``allocated`` (a timeline's level, or an estimate's)."""
    events: int
    """Events the series was reduced from (phases for an estimate)."""
    source_index: npt.NDArray[np.int64]
    """For each point, the timeline event (or phase) it shows."""

    @property
    def peak_x(self) -> float:
        """Position of the peak (nan when there are no points)."""
        return float(self.x[self.peak_index]) if self.peak_index >= 0 else float("nan")

    def points(self) -> SeriesPoints:
        """The same points as plain tuples (what the terminal picture lays out)."""
        return SeriesPoints(
            x=tuple(float(value) for value in self.x.tolist()),
            x_unit=self.x_unit,
            categories=self.categories,
            values=tuple(tuple(int(value) for value in row) for row in self.values.tolist()),
            total=tuple(int(value) for value in self.total.tolist()),
            phases=self.phases,
            peak_index=self.peak_index,
            peak_bytes=self.peak_bytes,
            capacity_bytes=self.capacity_bytes,
            level=self.level,
            events=self.events,
        )


def report_series(report: MemoryReport, *, max_points: int = DEFAULT_POINTS) -> StackedSeries:
    """The series of a report: over its timeline when it has one, else over its phases."""
    if report.timeline is not None and len(report.timeline):
        return timeline_series(report.timeline, max_points=max_points, capacity_bytes=report.capacity_bytes)
    return _phase_series(report)


def timeline_series(
    timeline: Timeline, *, max_points: int = DEFAULT_POINTS, capacity_bytes: int | None = None
) -> StackedSeries:
    """A timeline's live bytes by category, reduced to at most ``max_points`` points (min and
    max of each bucket; see the module docstring). ``max_points`` must be >= 2."""
    if max_points < 2:
        raise ValueError(f"max_points: {max_points}; must be at least 2")
    keep = lod_indices(timeline.live_bytes, max_points)
    codes = [code for code in range(len(CATEGORY_ORDER)) if np.any(timeline.category == code)]
    if timeline.base_bytes and _OTHER not in codes:
        codes = sorted([*codes, _OTHER])
    rows = [_category_at(timeline, code, keep) for code in codes]
    values = np.array(rows, dtype=np.int64).reshape(len(codes), len(keep))
    total = timeline.live_bytes[keep].astype(np.int64)
    x, unit = _positions(timeline, keep)
    peak = int(np.argmax(total)) if len(total) else -1
    return StackedSeries(
        x=x,
        x_unit=unit,
        categories=tuple(CATEGORY_ORDER[code] for code in codes),
        values=values,
        total=total,
        phases=_timeline_phases(timeline, keep, x),
        peak_index=peak,
        peak_bytes=int(total[peak]) if peak >= 0 else 0,
        capacity_bytes=capacity_bytes,
        level=timeline.level,
        events=len(timeline),
        source_index=keep,
    )


def lod_indices(curve: npt.NDArray[np.int64], max_points: int) -> npt.NDArray[np.int64]:
    """Indices of ``curve`` to draw: all of them when they fit, else per bucket (``max_points
    // 2`` equal buckets) the index of the bucket's maximum and of its minimum, sorted and
    unique. The global maximum is always among them."""
    n = len(curve)
    if n <= max_points:
        return np.arange(n, dtype=np.int64)
    buckets = max_points // 2
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    width = int(np.max(np.diff(edges)))
    # Pad every bucket to the widest one so argmax/argmin run on one 2-D view.
    starts = edges[:-1]
    offsets = np.arange(width, dtype=np.int64)
    index = np.minimum(starts[:, None] + offsets[None, :], edges[1:, None] - 1)
    block = curve[index]
    highs = index[np.arange(buckets), np.argmax(block, axis=1)]
    lows = index[np.arange(buckets), np.argmin(block, axis=1)]
    return np.unique(np.concatenate([highs, lows]))


def _category_at(timeline: Timeline, code: int, keep: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Live bytes of category ``code`` after each kept event (``base_bytes`` counts as other)."""
    curve = np.cumsum(np.where(timeline.category == code, timeline.nbytes, 0), dtype=np.int64)[keep]
    if code == _OTHER and timeline.base_bytes:
        curve = curve + timeline.base_bytes
    return curve


def _positions(timeline: Timeline, keep: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.float64], str]:
    """x of each kept event: milliseconds for a timeline stamped in ns, else the event index."""
    if timeline.time_unit == "ns" and len(keep):
        start = int(timeline.time[0])
        return (timeline.time[keep] - start).astype(np.float64) / 1e6, "ms"
    return keep.astype(np.float64), "event"


def _timeline_phases(
    timeline: Timeline, keep: npt.NDArray[np.int64], x: npt.NDArray[np.float64]
) -> tuple[tuple[str, float, float], ...]:
    """Phase stretches of the timeline mapped onto the kept points (stretches with no kept
    point are dropped; unnamed stretches are left out)."""
    spans = []
    for name, first, last in timeline.phase_spans():
        lo, hi = np.searchsorted(keep, first), np.searchsorted(keep, last, side="right") - 1
        if name and lo <= hi:
            spans.append((name, float(x[lo]), float(x[hi])))
    return tuple(spans)


def _phase_series(report: MemoryReport) -> StackedSeries:
    """An estimate over its phases: one point per phase at its high point."""
    return _of_points(estimate_points(report))


def phase_series(
    names: Sequence[str],
    stacks: Sequence[Mapping[Category, int]],
    *,
    peak: int,
    capacity_bytes: int | None,
    level: str,
) -> StackedSeries:
    """One point per phase (``names``), stacked by the categories of ``stacks`` (bytes per
    category, one mapping per phase) in :data:`CATEGORY_ORDER`; ``peak`` is the peak phase's
    index (-1: none) and ``level`` the memory level the stacks are at
    (:func:`vramlens.report.points.phase_points`, as arrays)."""
    return _of_points(phase_points(names, stacks, peak=peak, capacity_bytes=capacity_bytes, level=level))


def _of_points(points: SeriesPoints) -> StackedSeries:
    """The series of plain phase points (one point per phase)."""
    count = len(points.x)
    return StackedSeries(
        x=np.array(points.x, dtype=np.float64).reshape(count),
        x_unit=points.x_unit,
        categories=points.categories,
        values=np.array(points.values, dtype=np.int64).reshape(len(points.categories), count),
        total=np.array(points.total, dtype=np.int64).reshape(count),
        phases=points.phases,
        peak_index=points.peak_index,
        peak_bytes=points.peak_bytes,
        capacity_bytes=points.capacity_bytes,
        level=points.level,
        events=points.events,
        source_index=np.arange(count, dtype=np.int64),
    )
