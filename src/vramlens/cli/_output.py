"""Printing plain text from the CLI: control characters escaped (:func:`vramlens._untrusted.terminal_text`).

Every text line the CLI prints may hold a string from a file (a model name, a run name, a path),
so it goes through :func:`echo`, which writes ``\\x1b`` for ESC and so on: a file can never set
the terminal's title or rewrite what was printed. JSON output needs nothing: ``json.dumps``
escapes control characters itself (and refuses NaN, see :func:`dumps`).
"""

from __future__ import annotations

import json
from typing import Any

import click

from vramlens._untrusted import terminal_text

__all__ = ["dumps", "echo"]


def echo(text: str = "", *, err: bool = False, nl: bool = True) -> None:
    """``click.echo(text)`` with control characters escaped."""
    click.echo(terminal_text(text), err=err, nl=nl)


def dumps(data: Any, *, indent: int | None = None) -> str:
    """``data`` as strict JSON: NaN and infinity are a bug here (every input is checked to be
    finite), so they raise instead of printing ``NaN``, which no JSON reader accepts."""
    return json.dumps(data, indent=indent, allow_nan=False)
