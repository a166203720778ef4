"""What a text report is made of, without rich: lines, tables and the timeline picture.

:mod:`vramlens.report.text` describes a report as :data:`Block` values. On a terminal (colors)
they become rich renderables (:func:`to_rich`); printed to a pipe or a file they are laid out
here as plain text, character for character what rich prints without colors
(:func:`plain_lines`, checked against rich by ``tests/report/test_blocks.py``), so a piped
``vramlens estimate`` never imports rich. Where rich would do more than this layout knows -
a table wider than the line (rich wraps its cells), text that is not plain ASCII (cell widths),
an encoding without the box characters - :func:`plain_lines` answers None and rich prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from vramlens.report.points import SeriesPoints
from vramlens.report.styled import UNICODE_GLYPHS
from vramlens.report.timeline_text import DEFAULT_HEIGHT, Bar, TerminalTimeline, ascii_table_box, render_timeline

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ["Block", "Column", "Line", "TableBlock", "TimelineBlock", "plain_lines", "to_rich"]

#: A table cell: text, (text, style), or a proportional bar.
Cell = str | tuple[str, str] | Bar
_WORD = re.compile(r"\s*\S+\s*")
_SAFE = frozenset(UNICODE_GLYPHS)


@dataclass(frozen=True, kw_only=True, slots=True)
class Line:
    """A paragraph of text (wrapped at the line width, words kept whole)."""

    text: str
    style: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Column:
    header: str
    justify: Literal["left", "right"] = "left"
    no_wrap: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class TableBlock:
    """A borderless table with a header rule (rich's ``SIMPLE_HEAD`` box, or ASCII)."""

    columns: tuple[Column, ...]
    rows: list[tuple[Cell, ...]] = field(default_factory=list)
    title: str | None = None
    ascii_only: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class TimelineBlock:
    points: SeriesPoints
    ascii_only: bool = False
    height: int = DEFAULT_HEIGHT


Block = Line | TableBlock | TimelineBlock


def to_rich(block: Block) -> RenderableType:
    """The rich renderable of ``block``."""
    from rich.text import Text

    if isinstance(block, Line):
        return Text(block.text, style=block.style)
    if isinstance(block, TimelineBlock):
        return TerminalTimeline(series=block.points, height=block.height, ascii_only=block.ascii_only)
    from rich import box
    from rich.table import Table

    table = Table(box=ascii_table_box() if block.ascii_only else box.SIMPLE_HEAD, title=block.title)
    table.title_justify = "left"
    for column in block.columns:
        table.add_column(column.header, justify=column.justify, no_wrap=column.no_wrap)
    for row in block.rows:
        table.add_row(*(Text(cell[0], style=cell[1]) if isinstance(cell, tuple) else cell for cell in row))
    return table


def _text(cell: Cell) -> str:
    if isinstance(cell, Bar):
        return cell.chars(cell.ascii_only)
    return cell if isinstance(cell, str) else cell[0]


def _plain_safe(text: str) -> bool:
    """Printable ASCII, or the pictures' single-cell glyphs: one cell per character, nothing to escape."""
    return (text.isascii() or all(c.isascii() or c in _SAFE for c in text)) and text.isprintable()


def wrap(text: str, width: int, *, pad: bool = False) -> list[str]:
    """``text`` cut into lines of at most ``width`` cells at word boundaries, as rich wraps a
    ``Text`` (``rich._wrap.divide_line``: a word keeps its trailing spaces, a word longer than
    the line is folded); ``pad``: each line filled with spaces to ``width`` (left-justified)."""
    starts, offset = [0], 0
    for match in _WORD.finditer(text):
        start, word = match.start(), match.group(0)
        length = len(word.rstrip())
        if width - offset >= length:
            offset += len(word)
        elif length > width:
            for piece_start in range(start, start + len(word), width):
                if piece_start:
                    starts.append(piece_start)
                offset = len(word[piece_start - start : piece_start - start + width])
        elif offset and start:
            starts.append(start)
            offset = len(word)
    lines = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    lines = [line[: max(width, len(line.rstrip()))] for line in lines]  # rich's rstrip_end
    return [line[:width].ljust(width) if pad else line[:width] for line in lines]


def _table(block: TableBlock, width: int) -> list[str] | None:
    """The table's lines as rich lays out a table that fits: each column as wide as its widest
    cell plus one space each side; None when it does not fit ``width`` (rich would wrap cells)."""
    cells = [tuple(column.header for column in block.columns), *(tuple(_text(c) for c in r) for r in block.rows)]
    if not all(_plain_safe(text) for row in cells for text in row) or not _plain_safe(block.title or ""):
        return None
    widths = [max(len(row[i]) for row in cells) + 2 for i in range(len(block.columns))]
    total = sum(widths) + len(widths) + 1
    if total > width:
        return None
    rule = "-" if block.ascii_only else "─"
    lines = wrap(block.title, total, pad=True) if block.title else []
    lines.append(" " * total)
    for index, row in enumerate(cells):
        texts = [
            " " + (text.rstrip().rjust(w - 2) if column.justify == "right" else text.ljust(w - 2)) + " "
            for text, w, column in zip(row, widths, block.columns, strict=True)
        ]
        lines.append(" " + " ".join(texts) + " ")
        if index == 0:
            lines.append(" " + rule.join(rule * w for w in widths) + " ")
    lines.append(" " * total)
    return lines


def plain_lines(blocks: list[Block], width: int) -> list[str] | None:
    """The blocks as rich prints them without colors at ``width`` columns on a UTF-8 stream,
    or None where only rich lays them out (see the module docstring)."""
    lines: list[str] = []
    for block in blocks:
        if isinstance(block, Line):
            if not _plain_safe(block.text):
                return None
            lines += wrap(block.text, width)
        elif isinstance(block, TimelineBlock):
            picture = render_timeline(block.points, width=width, height=block.height, ascii_only=block.ascii_only)
            lines += [line.plain for line in picture]
        else:
            table = _table(block, width)
            if table is None:
                return None
            lines += table
    return lines
