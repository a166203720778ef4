"""The terminal table of a :class:`~vramlens.planner.sweep.Sweep`.

One row per value (or pair of values): the bytes of each category at the peak (categories with
bytes in some row, plus allocator slack and runtime, so a row adds up to its device peak), the
device-level peak, the headroom on the GPU and the fit (``✓``/``✗``; ``yes``/``no`` in ASCII).
A marker line stands where the rows stop fitting; under the table, the growth of each category
along each numeric axis and the largest value that fits. Bytes in binary units (GiB = 2**30).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vramlens.categories import Category
from vramlens.planner.sweep import Sweep, SweepRow
from vramlens.report.palette import PALETTE
from vramlens.units import format_bytes

__all__ = ["sweep_table"]


def _size(num_bytes: int | None) -> str:
    return "-" if num_bytes is None else format_bytes(num_bytes, precision=1)


def _cells(row: SweepRow, sweep: Sweep, categories: Sequence[Category], *, ascii_only: bool) -> list[str]:
    values = [str(row.values[axis.key]) for axis in sweep.axes]
    if row.report is None:
        return values
    report = row.report
    fit = "-" if report.fits is None else ("yes" if ascii_only else "✓") if row.fits else ("no" if ascii_only else "✗")
    stack = row.stack
    return [
        *values,
        *(_size(stack.get(c, 0)) for c in categories),
        _size(report.device_bytes),
        report.peak_phase,
        _size(report.headroom_bytes),
        fit,
    ]


def _render(header: list[str], body: list[tuple[list[str], str | None]]) -> list[str]:
    """Fixed-width columns (first columns left-aligned values, the rest right-aligned); a body line
    with a note prints the note after the value columns instead of the cells."""
    widths = [len(h) for h in header]
    for cells, _ in body:
        for i, cell in enumerate(cells):
            widths[i] = max(widths[i], len(cell))

    def line(cells: list[str]) -> str:
        return "  ".join(cell.rjust(widths[i]) for i, cell in enumerate(cells)).rstrip()

    lines = [line(header), "  ".join("-" * w for w in widths)]
    for cells, note in body:
        lines.append(line(cells) if note is None else f"{line(cells)}  {note}")
    return lines


def sweep_table(sweep: Sweep, *, ascii_only: bool = False) -> str:
    """The table, the stop-fitting marker, and the growth summary, as text (ends with a newline)."""
    categories = [c for c in Category if any(c in row.stack for row in sweep.rows)]
    header = [
        *(a.key for a in sweep.axes),
        *(PALETTE[c].label for c in categories),
        "peak",
        "peak in",
        "headroom",
        "fits",
    ]
    body: list[tuple[list[str], str | None]] = []
    previous: SweepRow | None = None
    for row in sweep.rows:
        if _stops(sweep, previous, row):
            body.append(([], f"{'--' if ascii_only else '──'} stops fitting {_gpu(sweep)} here"))
        body.append(
            (
                _cells(row, sweep, categories, ascii_only=ascii_only),
                None if row.error is None else f"error: {row.error}",
            )
        )
        previous = row
    lines = [_title(sweep), "", *_render(header, body), "", *_summary(sweep)]
    return "\n".join(lines).rstrip() + "\n"


def _stops(sweep: Sweep, previous: SweepRow | None, row: SweepRow) -> bool:
    """Whether the rows stop fitting between ``previous`` and ``row`` (within one value of the first
    of two axes: the next block starts over)."""
    if previous is None or not previous.fits or row.fits or row.report is None:
        return False
    outer = sweep.axes[0].key
    return len(sweep.axes) == 1 or previous.values[outer] == row.values[outer]


def _phases(sweep: Sweep, key: str) -> list[str]:
    """The peak phases along ``key`` (the other axis at its first value), in order, without repeats."""
    others = [a for a in sweep.axes if a.key != key]
    rows = [r for r in sweep.rows if not others or r.values[others[0].key] == others[0].values[0]]
    return list(dict.fromkeys(r.report.peak_phase for r in rows if r.report is not None))


def _gpu(sweep: Sweep) -> str:
    if sweep.capacity_bytes is None:
        return "the GPU"
    return f"{sweep.gpu} ({format_bytes(sweep.capacity_bytes, precision=1)})"


def _title(sweep: Sweep) -> str:
    model = next((row.report.model for row in sweep.rows if row.report is not None), "?")
    over = " x ".join(a.key for a in sweep.axes)
    where = "no GPU given (--gpu)" if sweep.capacity_bytes is None else f"on {_gpu(sweep)}"
    return f"{model}: per-GPU memory at the peak over {over}, {where}"


def _summary(sweep: Sweep) -> list[str]:
    lines: list[str] = []
    numeric = {a.key for a in sweep.axes if a.numeric}
    held = "" if len(sweep.axes) == 1 else " (the other key at its first value)"
    for axis in sweep.axes:
        if axis.key in numeric and any(g.axis == axis.key and g.shape != "n/a" for g in sweep.growth):
            lines.append(f"growth along {axis.key}{held}:")
            lines.extend(f"  {g.summary()}" for g in sweep.growth if g.axis == axis.key and g.shape != "n/a")
            phases = _phases(sweep, axis.key)
            if len(phases) > 1:
                lines.append(
                    f"  note: the peak moves between phases ({', '.join(phases)}); categories compare different moments"
                )
    largest: Any = sweep.largest_fitting
    if sweep.capacity_bytes is not None and len(sweep.axes) == 1 and sweep.axes[0].numeric:
        key = sweep.axes[0].key
        lines.append(f"largest {key} that fits: {largest}" if largest is not None else f"no {key} tried fits")
    return lines
