"""Where the terminal timeline's cells go (plain Python; drawn by :mod:`vramlens.report.timeline_text`).

Columns are equal slices of the x range; each shows the point of its slice with the highest
total (the peak column is exact), or, when no point falls in it, the last point before it
(live bytes change only at events). Phases and events get one unit of x each, so an
estimate's phases get equal runs of columns; milliseconds run from the first point to the
last. Rows are equal steps of ``scale / height`` bytes, where the scale is the larger of the
peak and the GPU capacity (a capacity over :data:`CAPACITY_OFF_SCALE` times the peak is
left off, or the run would be one row high); heights are counted in ``steps`` sub-rows per row (8 for the
Unicode eighth blocks, 1 in ASCII). The picture is at most a few hundred columns of a few
thousand points, so it is laid out without numpy (which an estimate's text output never loads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vramlens.report.points import SeriesPoints
from vramlens.units import format_bytes

if TYPE_CHECKING:
    from vramlens.report.series import StackedSeries

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

    series: SeriesPoints
    plot_width: int
    """Columns of the plot area (the picture is ``label_width + 2`` wider)."""
    height: int
    label_width: int
    scale_bytes: int
    """Bytes at the top of the plot: the larger of the peak and the capacity (unless the
    capacity is off the scale)."""
    shown: tuple[int, ...]
    """For each column, the index (into the series) of the point it shows."""
    point_column: tuple[int, ...]
    """For each point of the series, its column."""
    levels: tuple[int, ...]
    """Height of each column in sub-rows (``steps`` per row)."""
    steps: int
    """Sub-rows per row: 8 with Unicode eighth blocks, 1 in ASCII."""
    cells: tuple[tuple[int, ...], ...]
    """Category (index into ``series.categories``) of each cell, ``cells[row][column]``,
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
    series: SeriesPoints | StackedSeries, *, width: int, height: int = DEFAULT_HEIGHT, ascii_only: bool = False
) -> TimelineLayout:
    """Lay ``series`` out in ``width`` terminal cells and ``height`` rows (both >= 1)."""
    if width < 1 or height < 1:
        raise ValueError(f"width, height: {width}, {height}; must be at least 1")
    points = series if isinstance(series, SeriesPoints) else series.points()
    capacity = points.capacity_bytes
    if capacity is not None and capacity > CAPACITY_OFF_SCALE * max(points.peak_bytes, 1):
        capacity = None
    scale = max(points.peak_bytes, capacity or 0, 1)
    capacity_row = None
    if capacity is not None:
        capacity_row = min(max(math.ceil(capacity / scale * height) - 1, 0), height - 1)
    labels = _labels(scale, height, capacity_row, capacity)
    label_width = max(len(axis_label(value)) for value in (*labels.values(), 0))
    plot_width = max(width - label_width - 2, 1)
    shown, point_column = _columns(points, plot_width)
    steps = 1 if ascii_only else 8
    totals = [float(points.total[index]) for index in shown] if points.x else [0.0] * plot_width
    levels = tuple(_level(total, scale, height, steps) for total in totals)
    return TimelineLayout(
        series=points,
        plot_width=plot_width,
        height=height,
        label_width=label_width,
        scale_bytes=scale,
        shown=shown,
        point_column=point_column,
        levels=levels,
        steps=steps,
        cells=_cells(points, shown, levels, steps=steps, height=height, scale=scale),
        capacity_row=capacity_row,
        peak_column=_peak_column(points, shown, point_column),
        labels=labels,
    )


def _level(total: float, scale: int, height: int, steps: int) -> int:
    """A column's height in sub-rows, rounded half to even (as ``numpy.rint``); a column with
    any bytes is at least one sub-row high."""
    level = round(total / scale * height * steps)
    return 1 if total > 0 and level == 0 else level


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


def _positions(series: SeriesPoints) -> tuple[tuple[float, ...], float, float]:
    """Each point's position and the x range ``[lo, hi)`` the columns split: phases and
    events get one unit each; milliseconds run from the first to the last point."""
    x = series.x
    if series.x_unit != "ms":
        return x, x[0], x[-1] + 1.0
    if x[-1] <= x[0]:
        return tuple(float(i) for i in range(len(x))), 0.0, float(len(x))
    return x, x[0], x[-1]


def _columns(series: SeriesPoints, width: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The point each column shows (its slice's highest, else the last point before it) and
    each point's column."""
    if not series.x:
        return (-1,) * width, ()
    pos, lo, hi = _positions(series)
    column = tuple(min(max(math.floor((p - lo) / (hi - lo) * width), 0), width - 1) for p in pos)
    shown, last = [-1] * width, [-1] * width
    start, total = 0, series.total
    for end in range(1, len(column) + 1):
        if end == len(column) or column[end] != column[start]:
            run = total[start:end]
            shown[column[start]] = start + run.index(max(run))
            last[column[start]] = end - 1
            start = end
    carried = -1
    for index in range(width):
        carried = max(carried, last[index])
        if shown[index] < 0:
            shown[index] = carried
    return tuple(shown), column


def _cells(
    series: SeriesPoints,
    shown: tuple[int, ...],
    levels: tuple[int, ...],
    *,
    steps: int,
    height: int,
    scale: int,
) -> tuple[tuple[int, ...], ...]:
    """The category of each filled cell: the one with the most bytes inside the cell (the
    topmost category when rounding made the column a little taller than its bytes)."""
    if not series.categories or not series.x:
        return tuple((-1,) * len(shown) for _ in range(height))
    row_bytes = scale / height
    by_point = {index: _column_cells(series, index, row_bytes, height) for index in set(shown)}
    columns = [by_point[index] for index in shown]
    return tuple(
        tuple(column[row] if level > row * steps else -1 for column, level in zip(columns, levels, strict=True))
        for row in range(height)
    )


def _column_cells(series: SeriesPoints, index: int, row_bytes: float, height: int) -> list[int]:
    """For each row, the category covering most of its bytes in the column showing point
    ``index`` (the topmost category with bytes when no category reaches into the row)."""
    values = [float(row[index]) for row in series.values]
    upper, below = [], 0.0
    for value in values:
        below += value
        upper.append(below)
    lower = [top - value for top, value in zip(upper, values, strict=True)]
    top = next((k for k in range(len(values) - 1, -1, -1) if values[k] > 0), len(values) - 1)
    cells = []
    for row in range(height):
        floor, ceiling = row * row_bytes, (row + 1) * row_bytes
        overlap = [max(min(u, ceiling) - max(d, floor), 0.0) for u, d in zip(upper, lower, strict=True)]
        most = max(overlap)
        cells.append(overlap.index(most) if most > 0 else top)
    return cells


def _peak_column(series: SeriesPoints, shown: tuple[int, ...], point_column: tuple[int, ...]) -> int:
    """The column under which the peak marker goes: the peak point's column, or for an
    estimate the middle of the peak phase's columns."""
    if series.peak_index < 0:
        return -1
    if series.x_unit == "phase":
        columns = [column for column, index in enumerate(shown) if index == series.peak_index]
        return columns[len(columns) // 2]
    return point_column[series.peak_index]
