"""``load_snapshot``: any PyTorch memory snapshot -> :class:`~vramlens.snapshot.model.Snapshot`.

Layouts (``docs/snapshot-format.md``; ``docs/research/profilers-and-snapshot-format.md``):

* ``1.13-segments``: the file is a bare list of segments; blocks carry ``history``
  (``[{addr, real_size, frames}]``, the current allocation first) and no address;
* ``2.0``: a dict with ``segments`` and ``device_traces``; blocks still carry ``history``
  and no address (it is the segment's address plus the sizes of the blocks before it);
* ``2.1+``: blocks carry ``address``, ``requested_size`` and ``frames``; later versions add
  ``time_us`` to trace entries (2.2), ``allocator_settings``, ``external_annotations``,
  ``user_metadata``/``compile_context``, and the ``annotate`` action.

Files are opened by :mod:`vramlens.snapshot._unpickle` (nothing in them can run); every
malformed field gives a one-line :class:`InputError` naming the file and the field.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from vramlens._untrusted import as_text, brief
from vramlens.errors import InputError
from vramlens.snapshot._columns import MAX_FRAME_TEXT, StackTable, StringTable, read_trace
from vramlens.snapshot._unpickle import paused_gc, read_source
from vramlens.snapshot.model import MAX_SIZE, Annotation, Block, Segment, Snapshot, Trace

__all__ = ["load_snapshot", "snapshot_from_object"]

#: Keys only 2.1+ files have (on blocks or segments), and top-level keys of later versions.
_NEW_BLOCK_KEYS = ("address", "frames")
_NEW_SEGMENT_KEYS = ("is_expandable", "frames")
_NEW_TOP_KEYS = ("allocator_settings", "external_annotations")
_STATES = {
    "active_allocated": "active_allocated",
    "active_pending_free": "active_pending_free",
    "active_awaiting_free": "active_pending_free",
    "inactive": "inactive",
}


def load_snapshot(
    source: str | os.PathLike[str] | bytes | Mapping[str, Any] | list[Any], *, name: str | None = None
) -> Snapshot:
    """Read a PyTorch memory snapshot safely.

    ``source`` is a path to a ``torch.cuda.memory._dump_snapshot`` pickle (any layout from 1.13
    on) or to its JSON form, the bytes of either, an already-loaded snapshot dict, or the
    bare list of segments of 1.13 (``name`` names bytes, dicts and lists in messages). A pickle
    that would import or call anything, or whose lengths do not fit the file, is refused with a
    one-line :class:`InputError`.
    """
    with paused_gc():  # until the unpickled object is freed: its millions of dicts are no garbage
        obj, shown = read_source(source, name)
        snapshot = snapshot_from_object(obj, shown)
        del obj
    return snapshot


def snapshot_from_object(obj: Any, name: str = "<snapshot>") -> Snapshot:
    """Normalise a loaded snapshot object (dict or bare segment list) into a :class:`Snapshot`."""
    if isinstance(obj, list):
        raw: Mapping[str, Any] = {"segments": obj}
    elif isinstance(obj, Mapping):
        raw = obj
    else:
        raise InputError(f"{name}: a {type(obj).__name__}, not a memory snapshot (a dict, or a list of segments)")
    stacks, strings = StackTable(name), StringTable()
    with paused_gc():
        segments = _read_segments(raw.get("segments", []), name, stacks)
        traces = _read_traces(raw.get("device_traces", []), name, stacks, strings)
    devices = sorted({segment.device for segment in segments} | set(traces))
    return Snapshot(
        layout="1.13-segments" if isinstance(obj, list) else _layout(raw, traces),
        segments=segments,
        traces=traces,
        devices=tuple(devices),
        allocator_settings=_settings(raw.get("allocator_settings"), name),
        annotations=_read_annotations(raw.get("external_annotations"), name),
        stacks=tuple(stacks.stacks),
        strings=tuple(strings.strings),
        has_segments="segments" in raw,
        source=name,
    )


def _layout(raw: Mapping[str, Any], traces: Mapping[int, Trace]) -> str:
    """``2.1+`` when anything only 2.1 and later write is present, else ``2.0``."""
    if any(key in raw for key in _NEW_TOP_KEYS) or any(trace.time_us is not None for trace in traces.values()):
        return "2.1+"
    for segment in raw.get("segments") or ():
        if any(key in segment for key in _NEW_SEGMENT_KEYS):
            return "2.1+"
        if any(key in block for block in segment.get("blocks") or () for key in _NEW_BLOCK_KEYS):
            return "2.1+"
    return "2.0"


def _integer(value: Any, name: str, where: str, limit: int = 1 << 64) -> int:
    """``value`` when it is an integer in [0, ``limit``); otherwise a one-line error naming the field."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise InputError(f"{name}: {where} must be an integer in [0, {limit:#x}), not {as_text(value, 40)!r}")
    return value


def _size(value: Any, name: str, where: str) -> int:
    """A byte count: below 2**50 (1 PiB), so that sums of millions of them stay in int64."""
    return _integer(value, name, where, MAX_SIZE)


def _read_segments(raw: Any, name: str, stacks: StackTable) -> tuple[Segment, ...]:
    """Every segment with its blocks (addresses computed for files that give none)."""
    if not isinstance(raw, list):
        raise InputError(f"{name}: segments must be a list, not {type(raw).__name__}")
    result = []
    for index, segment in enumerate(raw):
        where = f"segments[{index}]"
        if not isinstance(segment, dict):
            raise InputError(f"{name}: {where} is a {type(segment).__name__}; segments are dicts")
        address = _integer(segment.get("address"), name, f"{where}.address")
        blocks = segment.get("blocks", [])
        if not isinstance(blocks, list):
            raise InputError(f"{name}: {where}.blocks must be a list")
        result.append(
            Segment(
                device=_integer(segment.get("device", 0), name, f"{where}.device"),
                address=address,
                total_size=_size(segment.get("total_size"), name, f"{where}.total_size"),
                stream=_integer(segment.get("stream", 0), name, f"{where}.stream"),
                segment_type=as_text(segment.get("segment_type", "large"), 100),
                pool_id=_pool(segment.get("segment_pool_id", (0, 0))),
                is_expandable=bool(segment.get("is_expandable", False)),
                stack=stacks.code(segment.get("frames"), where),
                blocks=_read_blocks(blocks, address, name, where, stacks),
            )
        )
    return tuple(result)


def _read_blocks(raw: list[Any], address: int, name: str, where: str, stacks: StackTable) -> tuple[Block, ...]:
    """A segment's blocks; 1.13/2.0 blocks take their address, requested size and frames from
    the segment's address and ``history[0]`` (the current allocation, ``_memory_viz._block_extra``)."""
    result = []
    for index, block in enumerate(raw):
        here = f"{where}.blocks[{index}]"
        if not isinstance(block, dict):
            raise InputError(f"{name}: {here} is a {type(block).__name__}; blocks are dicts")
        size = _size(block.get("size"), name, f"{here}.size")
        raw_state = block.get("state")
        state = _STATES.get(raw_state) if isinstance(raw_state, str) else None
        if state is None:
            raise InputError(
                f"{name}: {here}.state: {as_text(raw_state, 40)!r}; accepted: {', '.join(sorted(_STATES))}"
            )
        history = block.get("history")
        current = history[0] if isinstance(history, list) and history and isinstance(history[0], dict) else {}
        requested = block.get("requested_size", current.get("real_size", size if state != "inactive" else 0))
        frames = block.get("frames", current.get("frames") if state != "inactive" else None)
        result.append(
            Block(
                address=_integer(block.get("address", address), name, f"{here}.address"),
                size=size,
                requested_size=_size(requested, name, f"{here}.requested_size"),
                state=state,
                stack=stacks.code(frames, here),
            )
        )
        address = result[-1].address + size
    return tuple(result)


def _read_traces(raw: Any, name: str, stacks: StackTable, strings: StringTable) -> dict[int, Trace]:
    """Device ordinal -> its trace, for devices whose trace has entries."""
    if not isinstance(raw, list):
        raise InputError(f"{name}: device_traces must be a list (one list of entries per device)")
    traces = {}
    for device, entries in enumerate(raw):
        trace = read_trace(entries, device, name, stacks, strings)
        if len(trace):
            traces[device] = trace
    return traces


def _read_annotations(raw: Any, name: str) -> tuple[Annotation, ...]:
    """``external_annotations`` (``record_function`` scopes recorded with ``global_record_annotations``)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InputError(f"{name}: external_annotations must be a list")
    result = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InputError(f"{name}: external_annotations[{index}] is a {type(item).__name__}; annotations are dicts")
        device, time = item.get("device"), item.get("time_us")
        result.append(
            Annotation(
                name=as_text(item.get("name", ""), MAX_FRAME_TEXT),
                stage=as_text(item.get("stage", ""), 100).upper(),
                device=device if isinstance(device, int) else None,
                time_us=time if isinstance(time, int) else None,
            )
        )
    return tuple(result)


def _settings(raw: Any, name: str) -> dict[str, Any]:
    """``allocator_settings`` as a plain dict (empty when the file has none)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InputError(f"{name}: allocator_settings must be a dict, not {type(raw).__name__}")
    return {as_text(key, 100): _scalar(value) for key, value in raw.items()}


def _scalar(value: Any) -> Any:
    """A setting's value: a number, string, bool or None as it is (strings abridged), anything
    else as bounded text (settings reach JSON reports: a shared list must not expand there)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -(1 << 63) <= value < 1 << 64 else brief(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return as_text(value, MAX_FRAME_TEXT)


def _pool(raw: Any) -> tuple[int, int]:
    """``segment_pool_id``: a pair of integers ((0, 0) when absent or not a pair of integers)."""
    if isinstance(raw, (list, tuple)) and len(raw) == 2 and all(type(part) is int for part in raw):
        return raw[0], raw[1]
    return 0, 0
