"""The terminal picture of a report: a stacked timeline of live bytes by category.

Drawn from :func:`~vramlens.report.series.report_series`, so it shows what the plots and
the HTML report show:

* **Columns** are slices of the x axis (time in ms, event index, or phases for an
  estimate). A column shows the point of its slice with the highest total (so the peak
  column is exact and the tallest); a slice with no point keeps the state of the last point
  before it (live bytes only change at events). An estimate gives each phase an equal run
  of columns.
* **Rows** are equal steps of bytes, ``height`` of them (10 by default). Each column's
  stack is drawn bottom-up in category order (:data:`~vramlens.result.timeline.CATEGORY_ORDER`);
  a cell takes the color (:data:`~vramlens.report.palette.PALETTE`) of the category that
  covers most of its bytes. Unicode full blocks fill the column and an eighth block
  (``▁▂▃▄▅▆▇``) tops it, so heights are exact to 1/8 of a row.
* The y axis is labelled in bytes (:func:`~vramlens.units.format_bytes`). The scale is the
  larger of the peak and the GPU capacity, so both always show (unless the capacity is
  over 4x the peak: then the scale is the peak's and the legend says the capacity is
  above it); the capacity is a red line
  across the row that holds it (drawn through the columns, so a column that rises above it
  is visibly over), and the peak column carries ``▲ peak <bytes>`` below the axis, with the
  overflow when the peak exceeds the capacity. Phase names go under their columns (cut
  with ``…`` to fit, left out rather than overlapped), then a legend.

**Plain ASCII** (``ascii_only``, the CLI's ``--ascii``): categories are filled with their
palette letters, heights are whole rows, and the frame uses ``| + - = ^``. The same happens
automatically when the console cannot show the block characters: its encoding cannot encode
them (``LANG=C``, ``PYTHONIOENCODING=ascii``, a cp1252 pipe) or it is a legacy Windows
console (:func:`needs_ascii`). Breakdown bars (:class:`Bar`) follow the same rule.

The picture is drawn in :class:`~vramlens.report.styled.StyledLine` lines (no rich): printed
without colors they are plain text; :class:`TerminalTimeline` hands them to rich as ``Text``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from vramlens.report.palette import Swatch, swatch
from vramlens.report.points import SeriesPoints, report_points
from vramlens.report.styled import UNICODE_GLYPHS, StyledLine, encoding_needs_ascii
from vramlens.report.timeline_layout import DEFAULT_HEIGHT, TimelineLayout, axis_label, layout_timeline
from vramlens.result.report import MemoryReport
from vramlens.units import format_bytes

if TYPE_CHECKING:
    from rich.box import Box
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.measure import Measurement

    from vramlens.report.series import StackedSeries

__all__ = [
    "UNICODE_GLYPHS",
    "DEFAULT_HEIGHT",
    "Bar",
    "TerminalTimeline",
    "TimelineLayout",
    "ascii_table_box",
    "bar",
    "layout_timeline",
    "needs_ascii",
    "render_timeline",
    "timeline_renderable",
    "timeline_text",
]

_EIGHTHS = " ▁▂▃▄▅▆▇█"
_CAPACITY_STYLE = "red"


@cache
def ascii_table_box() -> Box:
    """The tables' borderless box with an ASCII header rule (``--ascii``)."""
    from rich.box import Box

    return Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Glyphs:
    eighths: str | None
    """Partial-cell blocks, empty to full (None: whole rows, palette letters)."""
    axis: str
    tick: str
    corner: str
    rule: str
    phase_tick: str
    capacity: str
    peak: str
    more: str


_UNICODE = _Glyphs(
    eighths=_EIGHTHS, axis="│", tick="┤", corner="└", rule="─", phase_tick="┴", capacity="━", peak="▲", more="…"
)
_ASCII = _Glyphs(
    eighths=None, axis="|", tick="+", corner="+", rule="-", phase_tick="+", capacity="=", peak="^", more="~"
)


def _glyphs(layout: TimelineLayout) -> _Glyphs:
    return _ASCII if layout.steps == 1 else _UNICODE


def needs_ascii(console: Console) -> bool:
    """Whether ``console`` cannot show the Unicode pictures: a legacy Windows console, or an
    encoding that cannot encode :data:`UNICODE_GLYPHS`."""
    return console.legacy_windows or encoding_needs_ascii(console.encoding)


@dataclass(frozen=True, kw_only=True, slots=True)
class Bar:
    """A proportional bar of ``cells`` cells (``▏`` / ``|`` when it rounds to nothing) that
    turns ASCII (``#``) when asked or when the console cannot show ``█``."""

    cells: int
    ascii_only: bool = False

    def chars(self, ascii_only: bool) -> str:
        """The bar's text."""
        if ascii_only:
            return "#" * self.cells if self.cells else "|"
        return "█" * self.cells if self.cells else "▏"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.text import Text

        yield Text(self.chars(self.ascii_only or needs_ascii(console)), no_wrap=True, end="")

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        from rich.measure import Measurement

        return Measurement(max(self.cells, 1), max(self.cells, 1))


def bar(share: float, width: int, *, ascii_only: bool = False) -> Bar:
    """The bar of ``share`` (0..1) over ``width`` cells."""
    return Bar(cells=round(max(share, 0.0) * width), ascii_only=ascii_only)


class _Row:
    """One line of cells below the plot, filled with labels that never overlap."""

    def __init__(self, width: int) -> None:
        self.chars = [" "] * width
        self.styles: list[str] = [""] * width
        self.used = [False] * width

    def put(self, column: int, text: str, style: str = "", *, gap: int = 1) -> bool:
        """Write ``text`` from ``column`` when it fits and keeps ``gap`` free cells from the
        labels already there; say whether it did."""
        end = column + len(text)
        if not text or column < 0 or end > len(self.chars):
            return False
        if any(self.used[max(column - gap, 0) : min(end + gap, len(self.chars))]):
            return False
        for offset, char in enumerate(text):
            self.chars[column + offset], self.styles[column + offset] = char, style
            self.used[column + offset] = True
        return True

    def text(self, prefix: str) -> StyledLine:
        line = StyledLine(prefix)
        _append_runs(line, list(zip(self.chars, self.styles, strict=True)))
        line.rstrip()
        return line


def _append_runs(line: StyledLine, cells: list[tuple[str, str]]) -> None:
    """Append ``(character, style)`` cells, one span per run of equal styles."""
    start = 0
    for end in range(1, len(cells) + 1):
        if end == len(cells) or cells[end][1] != cells[start][1]:
            line.append("".join(char for char, _ in cells[start:end]), cells[start][1])
            start = end


def _clean(name: str, ascii_only: bool) -> str:
    """A name from a record, safe to print: one cell per character, no control characters."""
    if ascii_only:
        return "".join(c if " " <= c <= "~" else "?" for c in name)
    if name.isascii():  # a printable ASCII character is one cell
        return "".join(c if c.isprintable() else "?" for c in name)
    from rich.cells import cell_len

    return "".join(c if c.isprintable() and cell_len(c) == 1 else "?" for c in name)


def _fit(name: str, room: int, more: str) -> str:
    """``name``, or its start and ``more`` when it needs more than ``room`` cells; nothing
    when fewer than 4 cells (3 of the name) are free."""
    if len(name) <= room:
        return name
    return name[: room - 1] + more if room >= 4 else ""


def _plot_rows(layout: TimelineLayout) -> Iterator[StyledLine]:
    """The plot area, top row first, with the y axis and its labels."""
    glyphs, series = _glyphs(layout), layout.series
    swatches = [swatch(category) for category in series.categories]
    for row in range(layout.height - 1, -1, -1):
        value = layout.labels.get(row)
        label = "" if value is None else axis_label(value)
        style = _CAPACITY_STYLE if row == layout.capacity_row else ""
        line = StyledLine()
        line.append(label.rjust(layout.label_width) + " ", style)
        line.append(glyphs.tick if label else glyphs.axis, "dim")
        _append_runs(line, [_cell(layout, row, column, swatches) for column in range(layout.plot_width)])
        line.rstrip()
        yield line


def _cell(layout: TimelineLayout, row: int, column: int, swatches: list[Swatch]) -> tuple[str, str]:
    """The character and style of one plot cell."""
    glyphs = _glyphs(layout)
    category = layout.cells[row][column]
    on_capacity = row == layout.capacity_row
    if category < 0:
        return (glyphs.capacity, _CAPACITY_STYLE) if on_capacity else (" ", "")
    color = swatches[category].rich
    if on_capacity:
        return glyphs.capacity, f"{_CAPACITY_STYLE} on {color}"
    if glyphs.eighths is None:
        return swatches[category].ascii, color
    filled = min(layout.levels[column] - row * layout.steps, layout.steps)
    return glyphs.eighths[filled], color


def _phase_row(layout: TimelineLayout) -> tuple[_Row, list[int]]:
    """Phase names centred under their columns (cut to the room before the next phase, left
    out when there is none) and the columns where the named phases start."""
    series, width = layout.series, layout.plot_width
    row, ticks = _Row(width), []
    spans = []
    for name, first, last in series.phases:
        lo, after = bisect_left(series.x, first), bisect_right(series.x, last)
        end = layout.point_column[after] - 1 if after < len(series.x) else width - 1
        spans.append((name, layout.point_column[min(lo, len(series.x) - 1)], end))
    following = [width] * len(spans)
    for i in range(len(spans) - 2, -1, -1):
        following[i] = spans[i + 1][1] if spans[i + 1][1] > spans[i][1] else following[i + 1]
    for (name, lo, end), nxt in zip(spans, following, strict=True):
        room = nxt - lo - 1 if nxt < width else width - lo
        text = _fit(_clean(name, _glyphs(layout).eighths is None), room, _glyphs(layout).more)
        start = lo + max(0, (min(end, nxt - 1) - lo + 1 - len(text)) // 2)
        if row.put(start, text):
            ticks.append(lo)
    return row, ticks


def _xaxis_label(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value:,.0f} ms" if value >= 100 else f"{value:.3g} ms"
    return f"event {int(value):,}"


def _peak_row(layout: TimelineLayout) -> _Row:
    """``▲ peak <bytes>`` under the peak column (and the overflow past the capacity), then
    the first and last x when they fit."""
    series, glyphs, column = layout.series, _glyphs(layout), layout.peak_column
    row = _Row(layout.plot_width)
    if column >= 0:
        text = f"peak {format_bytes(series.peak_bytes)}"
        capacity = series.capacity_bytes
        if capacity is not None and series.peak_bytes > capacity:
            text += f", {format_bytes(series.peak_bytes - capacity)} over capacity"
        short = f"peak {format_bytes(series.peak_bytes)}"
        for words in (text, short, ""):
            right, left = f"{glyphs.peak} {words}".strip(), f"{words} {glyphs.peak}".strip()
            if row.put(column, right, "bold") or row.put(column + 1 - len(left), left, "bold"):
                break
    if series.x_unit != "phase" and len(series.x):
        row.put(0, _xaxis_label(float(series.x[0]), series.x_unit), "dim")
        last = _xaxis_label(float(series.x[-1]), series.x_unit)
        row.put(layout.plot_width - len(last), last, "dim")
    return row


def _legend(layout: TimelineLayout, width: int) -> list[StyledLine]:
    """Swatch and name of each category drawn, then the capacity line; wrapped to ``width``."""
    glyphs, series = _glyphs(layout), layout.series
    items: list[tuple[str, str, str]] = []
    for category in series.categories:
        look = swatch(category)
        items.append((look.ascii if glyphs.eighths is None else "█", look.rich, look.label))
    if series.capacity_bytes is not None:
        label = f"GPU capacity {format_bytes(series.capacity_bytes)}"
        if layout.capacity_row is None:
            label += f", above the scale ({series.capacity_bytes / max(series.peak_bytes, 1):,.0f}x the peak)"
        items.append((glyphs.capacity, _CAPACITY_STYLE, label))
    indent = " " * (layout.label_width + 2)
    lines, line = [], StyledLine(indent)
    for glyph, style, label in items:
        needed = len(glyph) + 1 + len(label) + (2 if len(line) > len(indent) else 0)
        if len(line) > len(indent) and len(line) + needed > width:
            lines.append(line)
            line = StyledLine(indent)
        if len(line) > len(indent):
            line.append("  ")
        line.append(glyph, style)
        line.append(" " + label)
    lines.append(line)
    return lines


def _title(series: SeriesPoints, width: int) -> StyledLine:
    """The longest of the titles that fits ``width``."""
    over = {"phase": "by phase", "ms": "over time"}.get(series.x_unit, "over events")
    events = "" if series.x_unit == "phase" else f"; {series.events:,} events"
    titles = (
        f"memory {over} ({series.level} bytes, stacked by category{events})",
        f"memory {over} ({series.level} bytes{events})",
        f"memory {over}",
    )
    return StyledLine(next((title for title in titles if len(title) <= width), titles[-1]), "bold")


def render_timeline(
    series: SeriesPoints | StackedSeries, *, width: int, height: int = DEFAULT_HEIGHT, ascii_only: bool = False
) -> list[StyledLine]:
    """The picture's lines, none wider than ``width`` cells (see the module docstring)."""
    if not len(series.x):
        return [StyledLine("timeline: no memory events to draw")]
    layout = layout_timeline(series, width=width, height=height, ascii_only=ascii_only)
    glyphs, prefix, series = _glyphs(layout), " " * (layout.label_width + 2), layout.series
    phases, ticks = _phase_row(layout)
    axis = StyledLine(axis_label(0).rjust(layout.label_width) + " " + glyphs.corner, "dim")
    rule = [glyphs.rule] * layout.plot_width
    for column in ticks:
        rule[column] = glyphs.phase_tick if column else rule[column]
    axis.append("".join(rule), "dim")
    lines = [_title(series, width), *_plot_rows(layout), axis]
    if any(phases.used):
        lines.append(phases.text(prefix))
    lines += [_peak_row(layout).text(prefix), *_legend(layout, width)]
    for line in lines:
        line.truncate(width)
    return lines


@dataclass(frozen=True, kw_only=True, eq=False)
class TerminalTimeline:
    """The timeline as a rich renderable: as wide as the console (or ``width``), ASCII when
    asked or when the console cannot show the blocks (:func:`needs_ascii`)."""

    series: SeriesPoints | StackedSeries
    height: int = DEFAULT_HEIGHT
    ascii_only: bool = False
    width: int | None = None

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width if self.width is None else min(self.width, options.max_width)
        plain = self.ascii_only or needs_ascii(console)
        lines = render_timeline(self.series, width=width, height=self.height, ascii_only=plain)
        yield from (line.to_rich() for line in lines)


def timeline_renderable(
    report: MemoryReport, *, ascii_only: bool = False, height: int = DEFAULT_HEIGHT, width: int | None = None
) -> TerminalTimeline:
    """The terminal timeline of a report (over its timeline, or over its phases)."""
    return TerminalTimeline(series=report_points(report), height=height, ascii_only=ascii_only, width=width)


def timeline_text(
    report: MemoryReport, *, width: int = 100, height: int = DEFAULT_HEIGHT, ascii_only: bool = False
) -> str:
    """The timeline as plain text (no colors), e.g. for a README or a log."""
    lines = render_timeline(report_points(report), width=width, height=height, ascii_only=ascii_only)
    return "\n".join(line.plain for line in lines) + "\n"
