"""Where the terminal timeline's cells go (numpy; drawn by :mod:`vramlens.report.timeline_text`).

Columns are equal slices of the x range; each shows the point of its slice with the highest
total (the peak column is exact), or, when no point falls in it, the last point before it
(live bytes change only at events). Phases and events get one unit of x each, so an
estimate's phases get equal runs of columns; milliseconds run from the first point to the
last. Rows are equal steps of ``scale / height`` bytes, where the scale is the larger of the
peak and the GPU capacity (a capacity over :data:`CAPACITY_OFF_SCALE` times the peak is
left off, or the run would be one row high); heights are counted in ``steps`` sub-rows per row (8 for the
Unicode eighth blocks, 1 in ASCII).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from vramlens.report.series import StackedSeries
from vramlens.units import format_bytes

__all__ = ["CAPACITY_OFF_SCALE", "DEFAULT_HEIGHT", "TimelineLayout", "axis_label", "layout_timeline"]

#: Rows of the plot area by default.
DEFAULT_HEIGHT = 10
#: A capacity more than this many times the peak is left off the scale (the legend says
#: so): on its scale the whole run would be one row high.
CAPACITY_OFF_SCALE = 4


@dataclass(frozen=True, kw_only=True, eq=False)
class TimelineLayout:
    """Where everything goes (computed by :func:`layout_timeline`; drawn by
    :func:`vramlens.report.timeline_text.render_timeline`)."""

    series: StackedSeries
    plot_width: int
    """Columns of the plot area (the picture is ``label_width + 2`` wider)."""
    height: int
    label_width: int
    scale_bytes: int
    """Bytes at the top of the plot: the larger of the peak and the capacity (unless the
    capacity is off the scale)."""
    shown: npt.NDArray[np.int64]
    """For each column, the index (into the series) of the point it shows."""
    point_column: npt.NDArray[np.int64]
    """For each point of the series, its column."""
    levels: npt.NDArray[np.int64]
    """Height of each column in sub-rows (``steps`` per row)."""
    steps: int
    """Sub-rows per row: 8 with Unicode eighth blocks, 1 in ASCII."""
    cells: npt.NDArray[np.int64]
    """Category (index into ``series.categories``) of each cell, ``(height, plot_width)``,
    row 0 at the bottom; -1 for an empty cell."""
    capacity_row: int | None
    """Row (0 at the bottom) the capacity line is drawn on: the one whose top edge is the
    first at or above the capacity. None without a capacity, or when it is more than
    :data:`CAPACITY_OFF_SCALE` times the peak (then the scale is the peak's)."""
    peak_column: int
    labels: dict[int, int]
    """Byte labels of the y axis by row: the top row (the scale), the capacity row (the
    capacity) and a middle row when it is not next to the capacity."""


def layout_timeline(
    series: StackedSeries, *, width: int, height: int = DEFAULT_HEIGHT, ascii_only: bool = False
) -> TimelineLayout:
    """Lay ``series`` out in ``width`` terminal cells and ``height`` rows (both >= 1)."""
    if width < 1 or height < 1:
        raise ValueError(f"width, height: {width}, {height}; must be at least 1")
    capacity = series.capacity_bytes
    if capacity is not None and capacity > CAPACITY_OFF_SCALE * max(series.peak_bytes, 1):
        capacity = None
    scale = max(series.peak_bytes, capacity or 0, 1)
    capacity_row = None
    if capacity is not None:
        capacity_row = min(max(math.ceil(capacity / scale * height) - 1, 0), height - 1)
    labels = _labels(scale, height, capacity_row, capacity)
    label_width = max(len(axis_label(value)) for value in (*labels.values(), 0))
    plot_width = max(width - label_width - 2, 1)
    shown, point_column = _columns(series, plot_width)
    steps = 1 if ascii_only else 8
    totals = series.total[shown].astype(np.float64) if len(series.x) else np.zeros(plot_width)
    levels = np.rint(totals / scale * height * steps).astype(np.int64)
    levels = np.where((totals > 0) & (levels == 0), 1, levels)
    return TimelineLayout(
        series=series,
        plot_width=plot_width,
        height=height,
        label_width=label_width,
        scale_bytes=scale,
        shown=shown,
        point_column=point_column,
        levels=levels,
        steps=steps,
        cells=_cells(series, shown, levels, steps=steps, height=height, scale=scale),
        capacity_row=capacity_row,
        peak_column=_peak_column(series, shown, point_column),
        labels=labels,
    )


def axis_label(value: int) -> str:
    """A byte label of the y axis: ``79.2 GiB``."""
    return format_bytes(value, precision=1)


def _labels(scale: int, height: int, capacity_row: int | None, capacity: int | None) -> dict[int, int]:
    """Row -> bytes of the y-axis labels (a row's label is the bytes at its top edge, the
    capacity's is the capacity)."""
    labels = {height - 1: scale}
    middle = height // 2 - 1
    if middle >= 0 and (capacity_row is None or abs(middle - capacity_row) > 1):
        labels.setdefault(middle, scale * (middle + 1) // height)
    if capacity_row is not None and capacity is not None:
        labels[capacity_row] = capacity
    return labels


def _positions(series: StackedSeries) -> tuple[npt.NDArray[np.float64], float, float]:
    """Each point's position and the x range ``[lo, hi)`` the columns split: phases and
    events get one unit each; milliseconds run from the first to the last point."""
    n = len(series.x)
    if series.x_unit != "ms":
        return series.x, float(series.x[0]), float(series.x[-1]) + 1.0
    if series.x[-1] <= series.x[0]:
        return np.arange(n, dtype=np.float64), 0.0, float(n)
    return series.x, float(series.x[0]), float(series.x[-1])


def _columns(series: StackedSeries, width: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The point each column shows (its slice's highest, else the last point before it) and
    each point's column."""
    if not len(series.x):
        return np.full(width, -1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    pos, lo, hi = _positions(series)
    column = np.clip(np.floor((pos - lo) / (hi - lo) * width), 0, width - 1).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, column[1:] != column[:-1]])
    ends = np.r_[starts[1:], len(column)]
    shown = np.full(width, -1, dtype=np.int64)
    last = np.full(width, -1, dtype=np.int64)
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        shown[column[start]] = start + int(np.argmax(series.total[start:end]))
        last[column[start]] = end - 1
    carried = np.maximum.accumulate(last)
    return np.where(shown >= 0, shown, carried), column


def _cells(
    series: StackedSeries,
    shown: npt.NDArray[np.int64],
    levels: npt.NDArray[np.int64],
    *,
    steps: int,
    height: int,
    scale: int,
) -> npt.NDArray[np.int64]:
    """The category of each filled cell: the one with the most bytes inside the cell (the
    topmost category when rounding made the column a little taller than its bytes)."""
    cells = np.full((height, len(shown)), -1, dtype=np.int64)
    if not len(series.categories) or not len(series.x):
        return cells
    values = series.values[:, shown].astype(np.float64)
    upper = np.cumsum(values, axis=0)
    lower = upper - values
    row_bytes = scale / height
    top = len(series.categories) - 1 - np.argmax((values > 0)[::-1], axis=0)
    for row in range(height):
        overlap = np.clip(np.minimum(upper, (row + 1) * row_bytes) - np.maximum(lower, row * row_bytes), 0, None)
        best = np.where(overlap.max(axis=0) > 0, np.argmax(overlap, axis=0), top)
        cells[row] = np.where(levels > row * steps, best, -1)
    return cells


def _peak_column(series: StackedSeries, shown: npt.NDArray[np.int64], point_column: npt.NDArray[np.int64]) -> int:
    """The column under which the peak marker goes: the peak point's column, or for an
    estimate the middle of the peak phase's columns."""
    if series.peak_index < 0:
        return -1
    if series.x_unit == "phase":
        columns = np.flatnonzero(shown == series.peak_index)
        return int(columns[len(columns) // 2])
    return int(point_column[series.peak_index])
