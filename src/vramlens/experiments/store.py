"""The results store: one JSON line per finished run, appended so that an interruption loses at
most the run in progress.

Each row is written with a single ``write`` of the whole line on a file opened with
``O_APPEND``, then ``fsync``: a row is either entirely on disk or (if the process died inside
the write) a torn last line without its newline. Reading skips a torn last line, and the
next append first cuts it off, so the file is always whole rows. Rows are keyed by the run's
:attr:`~vramlens.experiments.matrix.RunSpec.key`; a key already present is never written twice
(re-running a matrix skips the runs it finds).

A store is never confused with another file: a path that is not a regular file, or a file
whose lines are not store rows (each a JSON object with a ``key`` and the fields of a run, of
the right types), is refused with one line and left as it is. Only a torn last line of a real
store (at least one whole row before it, and the line starts as a row does) is ever cut off: a
one-line notes file or a minified ``config.json`` is not a store, so nothing of it is removed.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any, Final

from vramlens._files import LIMITS, read_regular
from vramlens._untrusted import brief, load_json
from vramlens.errors import InputError

__all__ = ["ResultStore", "check_row"]

#: Largest byte count a row may hold (2**62: beyond any memory, and int64-safe).
_MAX_BYTES: Final = 1 << 62
_BYTE_FIELDS: Final = ("measured_peak_bytes", "reserved_peak_bytes", "predicted_peak_bytes", "simulated_peak_bytes")
_NUMBER_FIELDS: Final = ("tokens_per_s", "step_seconds", "loss")
_TEXT_FIELDS: Final = ("name", "device", "skipped", "measured_by", "finished_at")
_TEXT_LIST_FIELDS: Final = ("techniques", "notes", "prediction_notes")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _problem(row: dict[str, Any]) -> str | None:
    """What makes ``row`` not a store row (None when it is one)."""
    if not isinstance(row.get("key"), str) or not 0 < len(row["key"]) <= 100:
        return "has no run key"
    for field in _BYTE_FIELDS:
        value = row.get(field)
        if value is not None and not (_is_int(value) and 0 <= value < _MAX_BYTES):
            return f"{field} is {brief(value, 40)}, not a byte count (an integer >= 0)"
    for field in _NUMBER_FIELDS:
        value = row.get(field)
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
            return f"{field} is {brief(value, 40)}, not a number"
        if field != "loss" and value is not None and value < 0:
            return f"{field} is {brief(value, 40)}, not a number >= 0"
    for field in _TEXT_FIELDS:
        if row.get(field) is not None and not isinstance(row[field], str):
            return f"{field} is {brief(row[field], 40)}, not text"
    for field in _TEXT_LIST_FIELDS:
        value = row.get(field)
        if value is not None and not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            return f"{field} is {brief(value, 40)}, not a list of text"
    losses = row.get("losses")
    if losses is not None and not (
        isinstance(losses, list) and all(x is None or isinstance(x, (int, float)) for x in losses)
    ):
        return f"losses is {brief(losses, 40)}, not a list of numbers"
    breakdown = row.get("measured_breakdown")
    if breakdown is not None and not (
        isinstance(breakdown, dict) and all(_is_int(v) and 0 <= v < _MAX_BYTES for v in breakdown.values())
    ):
        return f"measured_breakdown is {brief(breakdown, 40)}, not bytes per category"
    return None


def check_row(row: Any, where: str) -> dict[str, Any]:
    """``row`` if it is a store row; else a one-line :class:`InputError` naming ``where``."""
    problem = "is not a JSON object" if not isinstance(row, dict) else _problem(row)
    if problem is not None:
        raise InputError(f"{where} {problem}; is it a results store?")
    return dict(row)


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


class ResultStore:
    """JSON-lines results at ``path`` (created on the first append)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise InputError(f"--store: {str(self.path)!r} is a folder; give a file (e.g. results.jsonl)")
        if not self.path.parent.is_dir():
            raise InputError(f"--store: folder {str(self.path.parent)!r} does not exist")
        if self.path.exists() and not stat.S_ISREG(self.path.stat().st_mode):
            raise InputError(
                f"--store: {str(self.path)!r} is not a regular file (a device, FIFO or socket); give a file "
                "(e.g. results.jsonl)"
            )

    def _where(self) -> str:
        return f"--store: {str(self.path)!r}"

    def _split(self) -> tuple[list[dict[str, Any]], bytes]:
        """The whole rows (checked) and the torn last line (b"" when the file ends in a newline)."""
        if not self.path.exists():
            return [], b""
        data = read_regular(self.path, LIMITS["store"], InputError)
        cut = data.rfind(b"\n") + 1
        rows = []
        for number, line in enumerate(data[:cut].splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{self._where()} line {number}"
            try:
                row = load_json(line, name=where, max_values=100_000)
            except InputError:
                raise InputError(f"{where} is not JSON; is it a results store?") from None
            rows.append(check_row(row, where))
        tail = data[cut:]
        if tail.strip() and (not rows or not tail.lstrip().startswith(b"{")):
            raise InputError(
                f"{self._where()} is not a vramlens results store: its last line does not end in a newline and is "
                f"not a row cut short ({'no whole row before it' if not rows else 'it does not start as a row'}); "
                "nothing was changed: give another file name (a store whose first row was cut off can be deleted)"
            )
        return rows, tail

    def rows(self) -> list[dict[str, Any]]:
        """Every whole row, in the order written (a torn last line is left out)."""
        return self._split()[0]

    def finished(self) -> dict[str, dict[str, Any]]:
        """Rows by run key (the first row of a key wins)."""
        found: dict[str, dict[str, Any]] = {}
        for row in self.rows():
            found.setdefault(str(row["key"]), row)
        return found

    def append(self, row: dict[str, Any]) -> bool:
        """Write ``row`` (which has a ``key``) durably; False (nothing written) when its key is
        already stored. Non-finite numbers (a loss that diverged) are written as null."""
        if "key" not in row:
            raise ValueError("row: needs a 'key'")
        rows, tail = self._split()
        if any(str(stored["key"]) == str(row["key"]) for stored in rows):
            return False
        line = (json.dumps(_finite(row), sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n").encode()
        if tail:
            self._cut_torn_tail(len(tail))
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(descriptor, line)
            if written != len(line):  # a regular file takes the whole line unless the disk is full
                raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes")
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        return True

    def _cut_torn_tail(self, length: int) -> None:
        """Drop the last ``length`` bytes: a last line without its newline (a write cut short by a
        kill) after at least one whole row (checked by :meth:`_split`)."""
        with self.path.open("r+b") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.truncate(size - length)
            handle.flush()
            os.fsync(handle.fileno())
