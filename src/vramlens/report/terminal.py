"""The one way vramlens prints rich output to a terminal: :func:`terminal_console`.

Strings from files (a config.json's names, a snapshot's frames, a store's run names) reach the
tables. Two things must never happen to them:

* Rich markup: ``[/bold]`` in a model name must print as it is, not crash the table or restyle
  it. The console is made with ``markup=False``, so only :class:`rich.text.Text` styles apply;
* terminal control sequences: ESC, BEL and the other control characters are escaped
  (:func:`vramlens._untrusted.terminal_text`) in every segment the console writes, except the
  console's own control segments (cursor moves of a progress bar). A ``config.json`` that says
  ``\\x1b]0;title\\x07`` prints those characters as ``\\x1b]0;title\\x07``, as the HTML report
  shows them escaped.

Plain text printed by the CLI goes through ``vramlens.cli._output.echo``, which escapes the same way.
"""

from __future__ import annotations

import sys

from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderableType, RenderHook, RenderResult
from rich.measure import Measurement
from rich.segment import Segment

from vramlens._untrusted import terminal_text

__all__ = ["EscapedRenderable", "terminal_console"]


class EscapedRenderable:
    """A renderable whose text segments have their control characters escaped."""

    def __init__(self, inner: RenderableType) -> None:
        self.inner = inner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.inner, options):
            if segment.control is None and segment.text:
                yield Segment(terminal_text(segment.text), segment.style, None)
            else:
                yield segment

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.inner)


class _EscapeHook(RenderHook):
    """Wraps everything printed on the console in :class:`EscapedRenderable`."""

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [EscapedRenderable(renderable) for renderable in renderables]


def terminal_console(*, stderr: bool = False, width: int | None = None) -> Console:
    """A console for stdout (or stderr): the terminal's width on a terminal, 120 columns when
    piped (``width`` overrides); no markup, no highlighting, control characters escaped."""
    stream = sys.stderr if stderr else sys.stdout
    console = Console(
        width=width if width is not None else (None if stream.isatty() else 120),
        highlight=False,
        markup=False,
        emoji=False,
        stderr=stderr,
    )
    console.push_render_hook(_EscapeHook())
    return console
