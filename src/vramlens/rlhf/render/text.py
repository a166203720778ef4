"""The terminal picture of an RLHF step (``vramlens rlhf``): the seed's kind of timeline, exact.

Seed ``000_*``/``001_*`` prints one bar per RLHF phase against the GPU's memory. This draws the
same thing from a :class:`~vramlens.rlhf.RlhfReport`, per GPU on the busiest GPU, in two parts:

1. **By category, over the phases** (the step's phases left to right): the terminal timeline of
   :mod:`vramlens.report.timeline_text` fed with :func:`~vramlens.rlhf.render.series.rlhf_series`,
   so each column is a phase's device-level memory (its breakdown, allocator slack and runtime)
   stacked by category, the GPU capacity is a red line across, and the peak column carries
   ``▲ peak`` (with the overflow when it is over the capacity).
2. **By model, one bar per phase** (the seed's horizontal bars): each model's bytes on the GPU
   in that phase (:func:`~vramlens.rlhf.render.series.model_segments`), then shared and
   allocator/runtime bytes, against a capacity mark (``┃``, ``|`` in ASCII) at the same scale
   for every phase; the bar's total and ``◀ peak`` on the peak phase follow it.

Then one line with the verdict (peak phase, device level, fits or by how much it does not).

Unicode (the default) tells models apart by shade (``█▓▒░▚``) and, in a color terminal, by
color; ``ascii`` (the CLI's ``--ascii``, or a console that cannot show the blocks, see
:func:`~vramlens.report.timeline_text.needs_ascii`) uses lower-case letters for models (``a`` actor,
``c`` critic, ``r`` reward, ``f`` reference, ``g`` rollout engine) and the palette's upper-case
letters for categories.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console, ConsoleOptions, RenderResult
from rich.style import Style
from rich.text import Text

from vramlens.report.timeline_text import needs_ascii, render_timeline
from vramlens.rlhf.render.series import model_segments, peak_index, rlhf_series, role_look
from vramlens.units import format_bytes

if TYPE_CHECKING:
    from vramlens.rlhf import RlhfReport

__all__ = ["RlhfTimeline", "render_rlhf_timeline", "rlhf_timeline_lines"]

_NAME_MAX = 18
_CAPACITY_STYLE = "red"
_MIN_BAR = 10


def _clean(name: str) -> str:
    """A phase name safe to print in one cell per character (ASCII)."""
    return "".join(c if " " <= c <= "~" else "?" for c in name.replace("_", " "))


def _bar_line(
    name: str, segments: list[tuple[str, int]], *, cells: int, scale: int, capacity_cell: int | None, ascii: bool
) -> Text:
    """One phase's bar: segments as runs of cells (rounded on the running total, so the bar's
    length is exact to a cell), the capacity mark drawn over the cell that holds it."""
    chars: list[tuple[str, str | Style]] = []
    running, drawn = 0, 0
    for role, value in segments:
        running += value
        end = min(round(running / scale * cells), cells) if scale > 0 else 0
        look = role_look(role)
        chars += [(look.ascii if ascii else look.block, look.rich)] * (end - drawn)
        drawn = max(drawn, end)
    chars += [(" ", "")] * (cells - len(chars))
    if capacity_cell is not None and 0 <= capacity_cell < cells:
        under = chars[capacity_cell][1]
        mark = "|" if ascii else "┃"
        style = Style(color=_CAPACITY_STYLE, bgcolor=under) if isinstance(under, str) and under else _CAPACITY_STYLE
        chars[capacity_cell] = (mark, style)
    line = Text(name, no_wrap=True, overflow="crop")
    for char, style in chars:
        line.append(char, style)
    return line


def _model_bars(report: RlhfReport, *, width: int, ascii: bool) -> list[Text]:
    """Part 2 of the picture (see the module docstring)."""
    if not report.phases:
        return []
    names = [_clean(phase.name)[:_NAME_MAX] for phase in report.phases]
    name_width = max(len(name) for name in names) + 1
    peak = peak_index(report)
    scale = max(max(phase.device_bytes for phase in report.phases), report.capacity_bytes or 0, 1)
    tail = 12 + len(" < peak")
    cells = max(width - name_width - tail, _MIN_BAR)
    capacity_cell = None
    if report.capacity_bytes:
        capacity_cell = min(max(round(report.capacity_bytes / scale * cells) - 1, 0), cells - 1)
    mark = "|" if ascii else "┃"
    head = f"by model, per GPU (device level; {mark} = GPU capacity {format_bytes(report.capacity_bytes)})"
    lines = [Text(head, style="bold", no_wrap=True, overflow="crop")]
    for index, (name, phase) in enumerate(zip(names, report.phases, strict=True)):
        line = _bar_line(
            name.ljust(name_width),
            model_segments(phase),
            cells=cells,
            scale=scale,
            capacity_cell=capacity_cell,
            ascii=ascii,
        )
        line.append(f" {format_bytes(phase.device_bytes, precision=1):>10}")
        if index == peak:
            line.append(" < peak" if ascii else " ◀ peak", "bold")
        lines.append(line)
    lines += _role_legend(report, width=width, ascii=ascii, indent=name_width)
    return lines


def _role_legend(report: RlhfReport, *, width: int, ascii: bool, indent: int) -> list[Text]:
    """Glyph and name of every segment drawn, wrapped to ``width``."""
    roles: list[str] = []
    for phase in report.phases:
        roles += [role for role, _ in model_segments(phase) if role not in roles]
    order = [role for role in ("actor", "critic", "reward", "reference", "rollout") if role in roles]
    roles = order + [role for role in roles if role not in order]
    lines, line = [], Text(" " * indent, no_wrap=True, overflow="crop")
    for role in roles:
        look = role_look(role)
        item = (look.ascii if ascii else look.block) + " " + _clean(look.label)
        if len(line) > indent and len(line) + 2 + len(item) > width:
            lines.append(line)
            line = Text(" " * indent, no_wrap=True, overflow="crop")
        if len(line) > indent:
            line.append("  ")
        line.append(item[0], look.rich)
        line.append(item[1:])
    lines.append(line)
    return lines


def _verdict(report: RlhfReport, width: int) -> list[Text]:
    """``peak: actor training, 96.0 GiB on the device: does NOT fit 79.1 GiB (16.9 GiB over)``,
    wrapped to ``width``."""
    head = f"peak: {_clean(report.peak_phase)}, {format_bytes(report.peak_device_bytes, precision=1)} on the device"
    capacity, style = report.capacity_bytes, "bold"
    if not capacity:
        return [Text(head, style=style)]
    if report.fits:
        headroom = format_bytes(capacity - report.peak_device_bytes, precision=1)
        tail = f"fits {format_bytes(capacity, precision=1)} (headroom {headroom})"
    else:
        over = format_bytes(report.peak_device_bytes - capacity, precision=1)
        tail, style = f"does NOT fit {format_bytes(capacity, precision=1)} ({over} over)", "bold red"
    lines = textwrap.wrap(f"{head}: {tail}", width=width, subsequent_indent="  ", break_long_words=False)
    return [Text(line, style=style) for line in lines]


def rlhf_timeline_lines(report: RlhfReport, *, width: int, ascii: bool = False, height: int = 10) -> list[Text]:
    """The picture's lines (styled), none wider than ``width`` cells."""
    width = max(width, 40)
    lines = [Text("RLHF step: memory per phase (busiest GPU)", style="bold")]
    lines += [
        line.to_rich() for line in render_timeline(rlhf_series(report), width=width, height=height, ascii_only=ascii)
    ]
    lines.append(Text(""))
    lines += _model_bars(report, width=width, ascii=ascii)
    lines += _verdict(report, width)
    for line in lines:
        line.truncate(width, overflow="crop")
    return lines


def render_rlhf_timeline(report: RlhfReport, *, width: int, ascii: bool) -> str:
    """The picture as plain text (no colors), e.g. for a README, a log or a test."""
    return "\n".join(line.plain.rstrip() for line in rlhf_timeline_lines(report, width=width, ascii=ascii)) + "\n"


@dataclass(frozen=True, kw_only=True, eq=False)
class RlhfTimeline:
    """The picture as a rich renderable: as wide as the console (at most ``width``), ASCII when
    asked or when the console cannot show the blocks."""

    report: RlhfReport
    ascii: bool = False
    width: int | None = None

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width if self.width is None else min(self.width, options.max_width)
        yield from rlhf_timeline_lines(self.report, width=width, ascii=self.ascii or needs_ascii(console))
