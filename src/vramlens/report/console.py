"""One width for everything vramlens prints: the terminal's on a terminal, :data:`PIPED_WIDTH`
columns when stdout is piped or redirected (rich tables, pictures and plain-text lines alike)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["PIPED_WIDTH", "fit_lines", "output_console", "output_width"]

#: Columns of piped output (a pager, a file, an issue comment).
PIPED_WIDTH = 120


def output_width() -> int | None:
    """The width to print at: None (the terminal's own) on a terminal, :data:`PIPED_WIDTH` when piped."""
    return None if sys.stdout.isatty() else PIPED_WIDTH


def output_console() -> Console:
    """A rich console for stdout at :func:`output_width` (:func:`vramlens.report.terminal.terminal_console`:
    no markup, control characters escaped)."""
    from vramlens.report.terminal import terminal_console

    return terminal_console(width=output_width())


def fit_lines(lines: Iterable[str], width: int | None = None) -> list[str]:
    """Plain-text ``lines`` wrapped at ``width`` (default: the piped width, or the terminal's),
    continuation lines indented 4 columns past the line's own indent."""
    limit = width or output_width() or output_console().width
    out: list[str] = []
    for line in lines:
        if len(line) <= limit:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip(" ")))
        out.extend(textwrap.wrap(line, width=limit, subsequent_indent=indent + "    ", break_on_hyphens=False))
    return out
