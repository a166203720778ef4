"""The results store: one JSON line per finished run, appended so that an interruption loses at
most the run in progress.

Each row is written with a single ``write`` of the whole line on a file opened with
``O_APPEND``, then ``fsync``: a row is either entirely on disk or (if the process died inside
the write) a torn last line without its newline. Reading skips a torn last line, and the
next append first cuts it off, so the file is always whole rows. Rows are keyed by the run's
:attr:`~vramlens.experiments.matrix.RunSpec.key`; a key already present is never written twice
(re-running a matrix skips the runs it finds).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vramlens.errors import InputError

__all__ = ["ResultStore"]


class ResultStore:
    """JSON-lines results at ``path`` (created on the first append)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise InputError(f"--store: {str(self.path)!r} is a folder; give a file (e.g. results.jsonl)")
        if not self.path.parent.is_dir():
            raise InputError(f"--store: folder {str(self.path.parent)!r} does not exist")

    def rows(self) -> list[dict[str, Any]]:
        """Every whole row, in the order written (a torn last line is left out)."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        rows = []
        for number, line in enumerate(complete.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise InputError(
                    f"--store: {str(self.path)!r} line {number} is not JSON; is it a results store?"
                ) from None
            if not isinstance(row, dict) or "key" not in row:
                raise InputError(f"--store: {str(self.path)!r} line {number} has no run key; is it a results store?")
            rows.append(row)
        return rows

    def finished(self) -> dict[str, dict[str, Any]]:
        """Rows by run key (the first row of a key wins)."""
        found: dict[str, dict[str, Any]] = {}
        for row in self.rows():
            found.setdefault(str(row["key"]), row)
        return found

    def append(self, row: dict[str, Any]) -> bool:
        """Write ``row`` (which has a ``key``) durably; False (nothing written) when its key is
        already stored."""
        if "key" not in row:
            raise ValueError("row: needs a 'key'")
        if str(row["key"]) in self.finished():
            return False
        line = (json.dumps(row, sort_keys=True, separators=(",", ":")) + "\n").encode()
        self._cut_torn_tail()
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(descriptor, line)
            if written != len(line):  # a regular file takes the whole line unless the disk is full
                raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes")
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        return True

    def _cut_torn_tail(self) -> None:
        """Drop a last line without its newline (a write cut short by a kill)."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as handle:
                handle.truncate(data.rfind(b"\n") + 1)
                handle.flush()
                os.fsync(handle.fileno())
