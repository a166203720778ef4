"""A line of styled text without rich: what the terminal pictures are drawn in.

A :class:`StyledLine` is runs of ``(text, style)``, every character one terminal cell (the
pictures draw single-cell glyphs and clean the names they show to single-cell characters).
Styles are rich style strings (``"bold"``, ``"dim"``, ``"red on royal_blue1"``). Printed
without colors, a line is its :attr:`~StyledLine.plain` text, so an estimate piped to a file
or another program never imports rich (30-40 ms of a cold start); on a terminal,
:meth:`StyledLine.to_rich` gives the same line as a ``rich.text.Text`` with its colors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["StyledLine", "encoding_needs_ascii"]

#: Every non-ASCII character the Unicode pictures and tables use.
UNICODE_GLYPHS = "▁▂▃▄▅▆▇█▏│┤└─┴━▲…"


def encoding_needs_ascii(encoding: str) -> bool:
    """Whether a stream in ``encoding`` cannot show :data:`UNICODE_GLYPHS`."""
    try:
        UNICODE_GLYPHS.encode(encoding)
    except (UnicodeError, LookupError):
        return True
    return False


class StyledLine:
    """One line: runs of text, each with a style ("" for none)."""

    __slots__ = ("spans",)

    def __init__(self, text: str = "", style: str = "") -> None:
        self.spans: list[tuple[str, str]] = [(text, style)] if text else []

    @property
    def plain(self) -> str:
        """The text without styles."""
        return "".join(text for text, _ in self.spans)

    def __len__(self) -> int:
        return sum(len(text) for text, _ in self.spans)

    def append(self, text: str, style: str = "") -> StyledLine:
        """Add ``text`` in ``style`` at the end."""
        if text:
            self.spans.append((text, style))
        return self

    def rstrip(self) -> None:
        """Drop the whitespace at the end."""
        excess = len(self) - len(self.plain.rstrip())
        self.truncate(len(self) - excess)

    def truncate(self, width: int) -> None:
        """Cut the line to at most ``width`` cells."""
        kept, room = [], width
        for text, style in self.spans:
            if room <= 0:
                break
            kept.append((text[:room], style))
            room -= len(text)
        self.spans = [(text, style) for text, style in kept if text]

    def to_rich(self) -> Text:
        """The line as a rich ``Text`` (no wrapping, cropped at the console's width)."""
        from rich.text import Text

        line = Text(no_wrap=True, overflow="crop")
        for text, style in self.spans:
            line.append(text, style)
        return line
