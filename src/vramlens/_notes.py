"""The library's progress notes (a model read from its code, a layer recipe traced): INFO records of
the ``vramlens`` loggers, which the CLI prints on stderr as ``note: ...`` (stdout stays the answer).

``logging`` costs a cold command 7 ms of imports (its string templates compile regular
expressions) and an estimate of a catalog model emits no note, so :func:`notes_on_stderr` installs
the stderr handler at once only when ``logging`` is already loaded; otherwise :func:`note` installs
it before the first note. A note may quote a file's path or a config's strings, so it is abridged
and its control characters escaped, as every line the CLI prints.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from vramlens._untrusted import abridge, terminal_text
from vramlens.errors import MAX_MESSAGE_CHARS

if TYPE_CHECKING:
    import logging

__all__ = ["note", "notes_on_stderr"]

_wanted = False
_handler: logging.Handler | None = None


def notes_on_stderr() -> None:
    """Print the notes on stderr from now on (the CLI)."""
    global _wanted
    _wanted = True
    if "logging" in sys.modules:
        _install()


def note(logger: str, message: str, *args: object) -> None:
    """Emit ``message % args`` at INFO on the logger named ``logger`` (a module's ``__name__``)."""
    import logging

    if _wanted:
        _install()
    logging.getLogger(logger).info(message, *args)


def _install() -> None:
    """Add the stderr handler to the ``vramlens`` logger (once)."""
    import logging

    global _handler
    if _handler is None:
        _handler = logging.Handler()
        _handler.emit = _emit  # type: ignore[method-assign]
    root = logging.getLogger("vramlens")
    if _handler not in root.handlers:
        root.addHandler(_handler)
        root.setLevel(logging.INFO)


def _emit(record: logging.LogRecord) -> None:
    """Write ``record`` as ``note: ...`` to whatever ``sys.stderr`` is when it is emitted."""
    try:
        sys.stderr.write(f"note: {terminal_text(abridge(record.getMessage(), MAX_MESSAGE_CHARS))}\n")
    except Exception:
        if _handler is not None:
            _handler.handleError(record)
