"""Saving and loading a :class:`~vramlens.trace.timeline.Timeline` (``.npz`` + JSON header).

The format (documented for other tools in ``docs/timeline-format.md``) is a plain numpy
``.npz`` archive, read with ``allow_pickle=False`` so a file can never run code:

* ``header``: a uint8 array holding UTF-8 JSON: ``{"format": "vramlens.timeline",
  "version": 1, "events": n, "categories": [...], "phases": [...], "modules": [...],
  "stacks": [...], "base_bytes": int, "time_unit": "ns"|"event", "level":
  "tensor"|"allocated", "metadata": {...}}``;
* one array per column, ``n`` entries each: ``time`` int64, ``nbytes`` int64,
  ``category`` int8, ``phase``/``module``/``stack`` int32 (-1 = none), ``storage`` int64.

Category codes index the header's ``categories`` list, so files stay readable when
vramlens adds categories; names it does not know load as ``other``.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.trace.timeline import CATEGORY_ORDER, Timeline

__all__ = ["FORMAT", "VERSION", "load_timeline", "save_timeline"]

FORMAT = "vramlens.timeline"
VERSION = 1
_DTYPES = {
    "time": np.int64,
    "nbytes": np.int64,
    "category": np.int8,
    "phase": np.int32,
    "module": np.int32,
    "stack": np.int32,
    "storage": np.int64,
}


def save_timeline(timeline: Timeline, path: str | Path, *, compress: bool = False) -> Path:
    """Write ``timeline`` to ``path`` (``.npz`` is appended by numpy when missing); returns the path written."""
    header = {
        "format": FORMAT,
        "version": VERSION,
        "events": len(timeline),
        "categories": [c.value for c in CATEGORY_ORDER],
        "phases": list(timeline.phases),
        "modules": list(timeline.modules),
        "stacks": list(timeline.stacks),
        "base_bytes": timeline.base_bytes,
        "time_unit": timeline.time_unit,
        "level": timeline.level,
        "metadata": timeline.metadata,
    }
    encoded = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    columns = {name: getattr(timeline, name) for name in _DTYPES}
    target = Path(path)
    saver = np.savez_compressed if compress else np.savez
    saver(target, header=encoded, **columns)
    return target if target.suffix == ".npz" else target.with_name(target.name + ".npz")


def load_timeline(path: str | Path) -> Timeline:
    """Read a file written by :func:`save_timeline`; a malformed file raises a one-line :class:`InputError`."""
    try:
        with open(Path(path), "rb") as handle:
            archive = np.load(handle, allow_pickle=False)
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise InputError(f"{path}: a single numpy array, not a vramlens timeline (.npz archive)")
            with archive:
                header = _header(archive, path)
                columns = {name: _column(archive, name, header["events"], path) for name in _DTYPES}
    except InputError:
        raise
    except (OSError, zipfile.BadZipFile, EOFError, zlib.error, ValueError) as error:
        raise InputError(f"{path}: not a readable vramlens timeline (.npz): {error}") from None
    columns["category"] = _remap_categories(columns["category"], header["categories"], path)
    return Timeline(
        **columns,
        phases=tuple(header["phases"]),
        modules=tuple(header["modules"]),
        stacks=tuple(header["stacks"]),
        base_bytes=header["base_bytes"],
        time_unit=header["time_unit"],
        level=header["level"],
        metadata=header["metadata"],
    )


def _header(archive: Any, path: str | Path) -> dict[str, Any]:
    if "header" not in archive.files:
        raise InputError(f"{path}: no 'header' entry; not a vramlens timeline")
    try:
        header = json.loads(archive["header"].tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: header is not JSON ({error})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise InputError(f"{path}: header.format must be {FORMAT!r}")
    if header.get("version") != VERSION:
        raise InputError(f"{path}: header.version {header.get('version')!r} is not supported; accepted: {VERSION}")
    expected: dict[str, type | tuple[type, ...]] = {
        "events": int,
        "categories": list,
        "phases": list,
        "modules": list,
        "stacks": list,
        "base_bytes": int,
        "time_unit": str,
        "level": str,
        "metadata": dict,
    }
    for key, kind in expected.items():
        if not isinstance(header.get(key), kind):
            raise InputError(f"{path}: header.{key} is missing or not a {getattr(kind, '__name__', kind)}")
    for key in ("categories", "phases", "modules", "stacks"):
        if not all(isinstance(item, str) for item in header[key]):
            raise InputError(f"{path}: header.{key} must be a list of strings")
    return header


def _column(archive: Any, name: str, events: int, path: str | Path) -> np.ndarray:
    if name not in archive.files:
        raise InputError(f"{path}: column {name!r} is missing")
    column = archive[name]
    if column.dtype != _DTYPES[name] or column.ndim != 1 or len(column) != events:
        raise InputError(f"{path}: column {name!r} must be {np.dtype(_DTYPES[name]).name}[{events}]")
    return np.asarray(column)


def _remap_categories(codes: np.ndarray, names: list[str], path: str | Path) -> np.ndarray:
    known = {c.value: index for index, c in enumerate(CATEGORY_ORDER)}
    other = CATEGORY_ORDER.index(Category.OTHER)
    table = np.array([known.get(name, other) for name in names] or [other], dtype=np.int8)
    if len(codes) and (int(codes.min()) < 0 or int(codes.max()) >= len(names)):
        raise InputError(f"{path}: column 'category' has codes outside header.categories")
    return table[codes.astype(np.int64)] if len(codes) else codes
