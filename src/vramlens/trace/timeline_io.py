"""Saving and loading a :class:`~vramlens.result.timeline.Timeline` (``.npz`` + JSON header).

The format (documented for other tools in ``docs/timeline-format.md``) is a plain numpy
``.npz`` archive, read with ``allow_pickle=False`` so a file can never run code:

* ``header``: a uint8 array holding UTF-8 JSON: ``{"format": "vramlens.timeline",
  "version": 1, "events": n, "categories": [...], "phases": [...], "modules": [...],
  "stacks": [...], "base_bytes": int, "time_unit": "ns"|"event", "level":
  "tensor"|"allocated", "metadata": {...}}``;
* one array per column, ``n`` entries each: ``time`` int64, ``nbytes`` int64,
  ``category`` int8, ``phase``/``module``/``stack`` int32 (-1 = none), ``storage`` int64;
  optionally ``stream`` int8 (the allocation's CUDA stream; absent: all on the default stream).

Category codes index the header's ``categories`` list, so files stay readable when
vramlens adds categories; names it does not know load as ``other``.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Final

import numpy as np

from vramlens._files import LIMITS, inflation_limit, open_regular
from vramlens._untrusted import abridge, load_json
from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.result.timeline import CATEGORY_ORDER, Timeline

__all__ = ["FORMAT", "MAX_TIMELINE_BYTES", "VERSION", "load_timeline", "save_timeline"]

FORMAT = "vramlens.timeline"
VERSION = 1
#: Most bytes a timeline archive may inflate to (a 10**8-event timeline takes 3.7 GB).
MAX_TIMELINE_BYTES: Final = 4 << 30
_DTYPES = {
    "time": np.int64,
    "nbytes": np.int64,
    "category": np.int8,
    "phase": np.int32,
    "module": np.int32,
    "stack": np.int32,
    "storage": np.int64,
}
#: Optional columns: written when the timeline has them.
_OPTIONAL_DTYPES = {"stream": np.int8}


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
    if timeline.stream is not None:
        columns["stream"] = timeline.stream
    target = Path(path)
    saver = np.savez_compressed if compress else np.savez
    saver(target, header=encoded, **columns)
    return target if target.suffix == ".npz" else target.with_name(target.name + ".npz")


def load_timeline(
    source: str | Path | bytes | BinaryIO, *, max_bytes: int = MAX_TIMELINE_BYTES, name: str | None = None
) -> Timeline:
    """Read a file written by :func:`save_timeline` (a path, its bytes or an open binary file);
    a malformed file raises a one-line :class:`InputError`.

    The archive is read entry by entry with bounds: only the entries of the format, each
    declared and actually inflated size within :func:`vramlens._files.inflation_limit` of the
    archive's size (and ``max_bytes``), each column's ``.npy`` header checked (1-D, the format's
    dtype, as many bytes as its shape needs) before its bytes become an array. Nothing is
    allocated from what a header merely claims. ``name`` names the file in messages."""
    if name is None:
        name = str(source) if isinstance(source, (str, Path)) else "<timeline>"
    try:
        if isinstance(source, (str, Path)):
            try:
                handle = open_regular(source, LIMITS["record"], InputError)
            except InputError as error:
                raise InputError(
                    f"{name}: not a readable vramlens timeline (.npz): {str(error).removeprefix(f'{name}: ')}"
                ) from None
            with handle:
                return _load_archive(handle, name, max_bytes)
        return _load_archive(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source, name, max_bytes)
    except InputError:
        raise
    except (
        OSError,
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        EOFError,
        zlib.error,
        ValueError,
        NotImplementedError,
    ) as error:
        raise InputError(f"{name}: not a readable vramlens timeline (.npz): {abridge(str(error), 120)}") from None


def _load_archive(handle: BinaryIO, path: str, max_bytes: int) -> Timeline:
    """The timeline in an open ``.npz`` archive (see :func:`load_timeline`)."""
    size = handle.seek(0, io.SEEK_END)
    handle.seek(0)
    budget = inflation_limit(size, max_bytes)
    with zipfile.ZipFile(handle) as archive:
        entries = {info.filename: info for info in archive.infolist()}
        declared = sum(info.file_size for info in entries.values())
        if declared > budget:
            raise InputError(
                f"{path}: its entries inflate to {declared:,} bytes, more than the {budget:,} accepted for an "
                f"archive of {size:,} bytes (a decompression bomb?)"
            )
        header = _header(_entry(archive, entries, "header", path), path)
        columns = {
            name: _column(_entry(archive, entries, name, path), name, header["events"], path) for name in _DTYPES
        }
        if "stream.npy" in entries:
            columns["stream"] = _column(_entry(archive, entries, "stream", path), "stream", header["events"], path)
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


def _entry(archive: zipfile.ZipFile, entries: dict[str, zipfile.ZipInfo], name: str, path: str) -> np.ndarray:
    """The 1-D array stored as ``name.npy``, read within its declared size (a ``.npy`` header
    whose shape and dtype do not match the bytes stored is refused)."""
    info = entries.get(f"{name}.npy")
    if info is None:
        what = "no 'header' entry; not a vramlens timeline" if name == "header" else f"column {name!r} is missing"
        raise InputError(f"{path}: {what}")
    with archive.open(info) as member:
        data = member.read(info.file_size + 1)
    if len(data) != info.file_size:
        raise InputError(
            f"{path}: entry {info.filename!r} holds {len(data):,} bytes, not the {info.file_size:,} declared"
        )
    stream = io.BytesIO(data)
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
    if dtype.hasobject:
        raise InputError(f"{path}: entry {info.filename!r} holds Python objects, not numbers")
    body = memoryview(data)[stream.tell() :]
    if math.prod(shape) * dtype.itemsize != len(body):
        raise InputError(
            f"{path}: entry {info.filename!r} declares shape {shape} of {dtype.itemsize}-byte items but holds {len(body):,} bytes"
        )
    return np.frombuffer(body, dtype=dtype).reshape(shape, order="F" if fortran else "C").copy()


def _header(raw: np.ndarray, path: str | Path) -> dict[str, Any]:
    if raw.dtype != np.uint8:
        raise InputError(f"{path}: header must be uint8 (UTF-8 JSON)")
    try:
        header = load_json(raw.tobytes(), name="header", max_values=None)
    except InputError as error:
        raise InputError(f"{path}: header is not JSON ({str(error).removeprefix('header: ')})") from None
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


def _column(column: np.ndarray, name: str, events: int, path: str | Path) -> np.ndarray:
    dtype = _DTYPES.get(name) or _OPTIONAL_DTYPES[name]
    if column.dtype != dtype or column.ndim != 1 or len(column) != events:
        raise InputError(f"{path}: column {name!r} must be {np.dtype(dtype).name}[{events}]")
    return np.asarray(column)


def _remap_categories(codes: np.ndarray, names: list[str], path: str | Path) -> np.ndarray:
    known = {c.value: index for index, c in enumerate(CATEGORY_ORDER)}
    other = CATEGORY_ORDER.index(Category.OTHER)
    table = np.array([known.get(name, other) for name in names] or [other], dtype=np.int8)
    if len(codes) and (int(codes.min()) < 0 or int(codes.max()) >= len(names)):
        raise InputError(f"{path}: column 'category' has codes outside header.categories")
    return table[codes.astype(np.int64)] if len(codes) else codes
