"""Reading a run config: the format recognised by its content (or forced), then its reader (:mod:`vramlens.workload.sources`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vramlens._files import read_small_text
from vramlens.errors import InputError
from vramlens.workload.sources._formats import FORMATS
from vramlens.workload.sources._mapping import SourcedWorkload
from vramlens.workload.sources._text import parse_document, split_command
from vramlens.workload.sources.shared import MAX_SOURCE_BYTES, ReadContext

__all__ = ["parse_run_config", "read_run_config"]


def _accepted() -> str:
    return ", ".join(f"{f.name} ({f.description})" for f in FORMATS.values())


def _document(text: str, origin: str, suffix: str) -> Any:
    if suffix in (".json", ".yaml", ".yml") or text.lstrip().startswith(("{", "---")):
        return parse_document(text, origin, json_first=suffix == ".json")
    return None


def parse_run_config(
    text: str, *, origin: str = "upload", format: str | None = None, directory: Path | None = None
) -> SourcedWorkload:
    """Read run-config ``text``; ``format`` forces a reader (else the content decides), ``directory``
    is where files it names are looked up (None: not looked up, as for uploads)."""
    if format is not None and format not in FORMATS:
        raise InputError(f"--from-format: unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    ctx = ReadContext(origin=origin, directory=directory)
    suffix = Path(origin).suffix.lower()
    data = _document(text, origin, suffix)
    if data is None and (format is None or FORMATS[format].kind == "document"):
        parsed = parse_document(text, origin, json_first=False) if format is not None else _maybe_yaml(text)
        data = parsed if isinstance(parsed, Mapping) else None
        if format is not None and data is None:
            raise InputError(f"{origin}: a {format} config is a YAML/JSON mapping of keys")
    candidates = [FORMATS[format]] if format is not None else list(FORMATS.values())
    if isinstance(data, Mapping):
        for fmt in candidates:
            if fmt.kind == "document" and fmt.detect(data):
                return fmt.read(data, ctx)
        if format is None and "model" in data and not isinstance(data.get("model"), Mapping):
            raise InputError(f"{origin}: this is a vramlens workload file; give it with -c, not --from")
        raise InputError(
            f"{origin}: not a run config vramlens knows; expected {_accepted()} (or force one with --from-format)"
        )
    tokens = split_command(text, origin)
    for fmt in candidates:
        if fmt.kind == "command" and (format is not None or fmt.detect(tokens)):
            return fmt.read(tokens, ctx)
    raise InputError(
        f"{origin}: not a run config vramlens knows; expected {_accepted()} (or force one with --from-format)"
    )


def _maybe_yaml(text: str) -> Any:
    """YAML when the text parses as a mapping, else None (then it is read as a command line)."""
    try:
        return parse_document(text, "text", json_first=False)
    except InputError:
        return None


def read_run_config(path: str | os.PathLike[str], *, format: str | None = None) -> SourcedWorkload:
    """Read a run config file (the files it names are looked up beside it)."""
    file, text = read_small_text(path, limit=MAX_SOURCE_BYTES, error=InputError, what="a run config")
    return parse_run_config(text, origin=file.name, format=format, directory=file.parent)
