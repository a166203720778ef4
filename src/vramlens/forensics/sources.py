"""Open any memory record as a :class:`~vramlens.result.timeline.Timeline`: what ``vramlens view`` reads.

Accepted inputs, recognised by their content (not their name):

* a vramlens timeline ``.npz`` (:func:`vramlens.trace.timeline_io.load_timeline`: tracked,
  simulated or estimated runs);
* a PyTorch memory snapshot: a ``torch.cuda.memory._dump_snapshot`` pickle of any layout, or
  its JSON form (:func:`vramlens.snapshot.load_snapshot`, a restricted unpickler that runs no
  code). Categories come from vramlens tags when the run was recorded by vramlens, else they
  are inferred from stacks and lifetimes (:func:`vramlens.snapshot.infer_categories`);
* a torch profiler memory timeline (``profile(profile_memory=True, record_shapes=True,
  with_stack=True)`` then ``prof.export_memory_timeline(path, device)``,
  torch/profiler/_memory_profiler.py): ``.json`` / ``.json.gz`` hold ``[times_us, sizes]``
  with ``sizes[i] = [0, bytes per category...]`` after each timestamp; ``.raw.json.gz`` holds
  rows ``[t_ns, action, numbytes, category]`` (t_ns -1: existed before profiling).

Profiler exports carry no tensor identities: the coalesced ``.json`` has only per-category
totals (no allocations, no allocator replay); in the raw rows a free is paired with the
newest live allocation of the same size and category, which keeps the live sizes and
categories exact at every instant (only the age of an allocation can be wrong).
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from vramlens._compat import StrEnum
from vramlens._files import LIMITS, FileKind, gunzip, inflation_limit, open_regular, read_open_file
from vramlens._untrusted import load_json
from vramlens.allocator import AllocatorSettings
from vramlens.categories import TORCH_PROFILER_CATEGORIES
from vramlens.errors import InputError
from vramlens.result.timeline import CATEGORY_ORDER, Timeline, TimelineBuilder

__all__ = [
    "ACCEPTED",
    "MAX_RECORD_BYTES",
    "PROFILER_CATEGORIES",
    "Source",
    "SourceFormat",
    "open_source",
    "read_source",
]

#: What ``vramlens view`` accepts, for error messages.
ACCEPTED = (
    "accepted: a vramlens timeline (.npz), a PyTorch memory snapshot (_dump_snapshot pickle or its JSON) "
    "or a torch profiler memory timeline (export_memory_timeline .json, .json.gz or .raw.json.gz)"
)

#: The profiler's category columns, in order (the coalesced JSON shifts them by one: column 0
#: is always 0), mapped to vramlens categories (:data:`vramlens.categories.TORCH_PROFILER_CATEGORIES`).
PROFILER_CATEGORIES = TORCH_PROFILER_CATEGORIES
_CODES = tuple(CATEGORY_ORDER.index(category) for _, category in PROFILER_CATEGORIES)
_RAW_ACTIONS = (1, 2, 3, 4)  # PREEXISTING, CREATE, INCREMENT_VERSION, DESTROY (Action.value)
#: Most bytes of a memory record read (or inflated from a compressed one) by default.
MAX_RECORD_BYTES: Final = LIMITS["record"].limit
#: Largest magnitude of a number in a profiler export (times in ns, byte counts): int64-safe.
_MAX_PROFILER_VALUE: Final = 1 << 62


class SourceFormat(StrEnum):
    """The kind of file a :class:`Source` was read from."""

    TIMELINE = "vramlens-timeline"
    SNAPSHOT = "pytorch-snapshot"
    PROFILER_JSON = "torch-profiler-memory-json"
    PROFILER_RAW = "torch-profiler-memory-raw"


@dataclass(frozen=True, kw_only=True, slots=True)
class Source:
    """One opened memory record: its timeline and what it can tell."""

    path: str
    format: SourceFormat
    timeline: Timeline
    identities: bool
    """Whether events are real allocations (alloc/free pairs of one storage): needed for top
    allocations, leaks and the allocator replay. False for the coalesced profiler JSON."""
    allocator: AllocatorSettings | None = None
    """The run's own ``PYTORCH_CUDA_ALLOC_CONF`` (snapshots that record it), for the replay."""
    notes: tuple[str, ...] = ()
    """What the reader assumed (which device, how categories were obtained)."""


def open_source(path: str | Path, *, device: int | None = None, max_bytes: int = MAX_RECORD_BYTES) -> Source:
    """Open ``path`` as a :class:`Source`; ``device`` picks a snapshot's device (default: its
    first). Only a regular file is read, of at most ``max_bytes`` (compressed input inflated to
    at most that too, see :func:`read_source`). Unreadable or unknown files raise a one-line
    :class:`InputError` naming the file and the accepted formats."""
    kind = FileKind(what=LIMITS["record"].what, limit=max_bytes)
    with _naming_formats(), open_regular(path, kind, InputError) as handle:
        head = handle.read(8)
        handle.seek(0)
        if head.startswith(b"PK"):
            from vramlens.trace.timeline_io import load_timeline

            timeline = load_timeline(handle, max_bytes=max_bytes, name=str(path))
            return Source(path=str(path), format=SourceFormat.TIMELINE, timeline=timeline, identities=True)
        data = read_open_file(handle, kind, path, InputError)
    return read_source(data, name=str(path), device=device, max_bytes=max_bytes)


def read_source(data: bytes, *, name: str, device: int | None = None, max_bytes: int = MAX_RECORD_BYTES) -> Source:
    """A memory record from its bytes (as :func:`open_source` reads a file; ``name`` is shown in
    messages). A gzip file is inflated to at most :func:`vramlens._files.inflation_limit` of its
    size and ``max_bytes``."""
    head = data[:8]
    if head.startswith(b"PK"):
        from vramlens.trace.timeline_io import load_timeline

        with _naming_formats():
            timeline = load_timeline(io.BytesIO(data), max_bytes=max_bytes, name=name)
        return Source(path=name, format=SourceFormat.TIMELINE, timeline=timeline, identities=True)
    if head.startswith(b"\x1f\x8b"):
        limit = inflation_limit(len(data), max_bytes)
        return _from_json(name, gunzip(data, name=name, limit=limit, error=InputError, accepted=ACCEPTED), device)
    if head.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] in (b"[", b"{"):
        return _from_json(name, data, device)
    if head[:1] == b"\x80" or head[:2] in (b"(l", b"(d", b"]q", b"}q", b"(L"):
        return _from_snapshot(name, data, device)
    raise InputError(f"{name}: not a known memory file (starts with {head[:4]!r}); {ACCEPTED}")


@contextmanager
def _naming_formats() -> Iterator[None]:
    """Re-raise a reader's one-line InputError with the accepted formats appended."""
    try:
        yield
    except InputError as error:
        raise InputError(f"{error}; {ACCEPTED}") from None


def _from_json(path: str, data: bytes, device: int | None) -> Source:
    """A JSON document: a profiler export (a list) or a snapshot (a dict, or a bare segment list)."""
    with _naming_formats():
        document = load_json(data, name=path, what="a JSON memory record", max_values=None)
    if isinstance(document, list) and document and all(_int_row(row, 4) for row in document):
        return _profiler_raw(path, document)
    if _is_coalesced(document):
        return _profiler_coalesced(path, document)
    if isinstance(document, dict) or (isinstance(document, list) and all(isinstance(s, dict) for s in document)):
        return _from_snapshot(path, document, device)
    raise InputError(f"{path}: JSON of an unknown shape; {ACCEPTED}")


def _is_coalesced(document: Any) -> bool:
    """``[times, sizes]``: two lists, the second a list of rows (lists)."""
    return (
        isinstance(document, list)
        and len(document) == 2
        and all(isinstance(item, list) for item in document)
        and all(isinstance(row, list) for row in document[1])
    )


def _from_snapshot(path: str, source: Any, device: int | None) -> Source:
    """A PyTorch snapshot through vramlens.snapshot (imported here: it is optional at import time)."""
    from vramlens.snapshot import load_snapshot
    from vramlens.snapshot.infer import infer_categories

    with _naming_formats():
        snapshot = load_snapshot({"segments": source} if isinstance(source, list) else source, name=path)
    devices = tuple(getattr(snapshot, "devices", ()) or ())
    chosen = device if device is not None else (devices[0] if devices else 0)
    if devices and chosen not in devices:
        raise InputError(f"--device: {chosen} is not in {path}; its devices: {', '.join(map(str, devices))}")
    notes = [f"device {chosen} of the snapshot's devices {list(devices)}"] if len(devices) > 1 else []
    timeline = snapshot.timeline(chosen)
    if timeline.metadata.get("categories") == "none":
        timeline = infer_categories(timeline)
        notes.append("categories inferred from stacks and lifetimes (the run was not recorded by vramlens)")
    return Source(
        path=path,
        format=SourceFormat.SNAPSHOT,
        timeline=timeline,
        identities=True,
        allocator=_allocator_settings(getattr(snapshot, "allocator_settings", None), notes),
        notes=tuple(notes),
    )


def _allocator_settings(settings: Any, notes: list[str]) -> AllocatorSettings | None:
    """The snapshot's ``PYTORCH_CUDA_ALLOC_CONF`` as replay settings (None when absent or not modelled)."""
    conf = settings.get("PYTORCH_CUDA_ALLOC_CONF") if isinstance(settings, dict) else None
    if not isinstance(conf, str) or not conf.strip():
        return None
    try:
        return AllocatorSettings.from_conf(conf)
    except ValueError:
        notes.append(f"the run's PYTORCH_CUDA_ALLOC_CONF {conf!r} is not modelled: replayed with the defaults")
        return None


def _profiler_coalesced(path: str, document: list[Any]) -> Source:
    """``[times_us, sizes]`` -> one event per category change (frees first within a timestamp, so
    the running total never passes the profiler's own per-timestamp totals)."""
    times, sizes = document
    width = len(PROFILER_CATEGORIES) + 1
    if len(times) != len(sizes) or not all(_int_row(row, width) for row in sizes):
        raise InputError(f"{path}: profiler memory JSON needs equal-length times and rows of {width} ints; {ACCEPTED}")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < _MAX_PROFILER_VALUE // 1000 for t in times):
        raise InputError(f"{path}: profiler memory JSON times must be integers (microseconds); {ACCEPTED}")
    builder = TimelineBuilder(time_unit="ns")
    previous = [0] * width
    start = times[0] if times else 0
    for serial, (time_us, row) in enumerate(zip(times, sizes, strict=True)):
        deltas = [(row[i] - previous[i], i) for i in range(1, width) if row[i] != previous[i]]
        for delta, column in sorted(deltas):
            builder.append((time_us - start) * 1000, delta, _CODES[column - 1], serial, -1, -1, -1)
        previous = row
    metadata = {"source": SourceFormat.PROFILER_JSON.value, "categories": "inferred", "device": None}
    notes = (
        "torch.profiler memory timeline (coalesced per microsecond): categories are the profiler's own "
        "heuristics; no allocations, so no top allocations, leaks or allocator replay",
    )
    return Source(
        path=path,
        format=SourceFormat.PROFILER_JSON,
        timeline=builder.build(metadata=metadata),
        identities=False,
        notes=notes,
    )


def _int_row(row: Any, width: int) -> bool:
    """Whether ``row`` is a list of ``width`` ints (bools excluded)."""
    return (
        isinstance(row, list)
        and len(row) == width
        and all(
            isinstance(v, int) and not isinstance(v, bool) and -_MAX_PROFILER_VALUE < v < _MAX_PROFILER_VALUE
            for v in row
        )
    )


def _profiler_raw(path: str, rows: list[Any]) -> Source:
    """Raw rows ``[t_ns, action, numbytes, category]`` -> events; a free takes the storage id of
    the newest live allocation of its size and category (module docstring)."""
    if not all(_int_row(row, 4) and row[1] in _RAW_ACTIONS and 0 <= row[3] < len(_CODES) for row in rows):
        raise InputError(
            f"{path}: profiler raw rows must be [t_ns, action 1-4, numbytes, category 0-{len(_CODES) - 1}]; {ACCEPTED}"
        )
    known = [row[0] for row in rows if row[0] >= 0]
    start = min(known) if known else 0
    live: defaultdict[tuple[int, int], list[int]] = defaultdict(list)
    builder = TimelineBuilder(time_unit="ns")
    unmatched = 0
    for serial, (time_ns, _action, nbytes, column) in enumerate(rows):
        key = (abs(nbytes), column)
        if nbytes >= 0:
            live[key].append(serial)
            storage = serial
        elif live[key]:
            storage = live[key].pop()
        else:
            storage, unmatched = -1 - serial, unmatched + 1
        builder.append(max(time_ns, start) - start, nbytes, _CODES[column], storage, -1, -1, -1)
    metadata = {"source": SourceFormat.PROFILER_RAW.value, "categories": "inferred", "device": None}
    notes = [
        "torch.profiler raw memory events: categories are the profiler's own heuristics; frees are paired "
        "with the newest live allocation of the same size and category (ages may be approximate)"
    ]
    if unmatched:
        notes.append(f"{unmatched} frees had no live allocation of their size and category")
    return Source(
        path=path,
        format=SourceFormat.PROFILER_RAW,
        timeline=builder.build(metadata=metadata),
        identities=True,
        notes=tuple(notes),
    )
