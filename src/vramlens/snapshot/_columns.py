"""Trace entries (a list of dicts) -> numpy columns, and the interning tables they point into.

10**6 entries are read in under half a second: one C-level pass per field
(``map(dict.get, entries, ...)`` into a list, then ``np.fromiter``), and a slow pass that
names the faulty entry only when a conversion fails. Frame lists are interned by object
identity first (the pickle memo shares one list between all entries with the same stack,
torch/csrc/cuda/memory_snapshot.cpp ``ivalue_symbolize``), then by content; strings by value.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import count, repeat
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from vramlens._untrusted import as_text
from vramlens.errors import InputError
from vramlens.snapshot.model import ACTIONS, MAX_SIZE, OOM, UNKNOWN, Frame, OomEntry, Trace

__all__ = ["StackTable", "StringTable", "read_trace"]

_CODES = {name: code for code, name in enumerate(ACTIONS)}
_U64 = 1 << 64
#: Characters kept of a frame's file or function name (real ones are under 300; a longer one is
#: abridged, so that no table or page is flooded by one field).
MAX_FRAME_TEXT = 4096
#: Characters kept of a metadata string (``user_metadata``, ``category``): vramlens tags name
#: modules, whose paths can be long.
MAX_METADATA_TEXT = 1 << 16


class StackTable:
    """Distinct stacks (tuples of :class:`Frame`, innermost first), interned by identity and content."""

    def __init__(self, name: str) -> None:
        """An empty table; ``name`` (the file) prefixes error messages."""
        self.name = name
        self.stacks: list[tuple[Frame, ...]] = []
        self._by_content: dict[tuple[Frame, ...], int] = {}
        self._by_id: dict[int, int] = {}
        self._keep: list[Any] = []  # holds interned objects alive so their ids stay unique

    def code(self, frames: Any, where: str) -> int:
        """Index of a ``frames`` list (-1 for None or an empty list)."""
        found = self._by_id.get(id(frames))
        if found is not None:
            return found
        self._keep.append(frames)
        stack = self._convert(frames, where)
        code = -1 if not stack else self._by_content.setdefault(stack, len(self._by_content))
        if code == len(self.stacks):
            self.stacks.append(stack)
        self._by_id[id(frames)] = code
        return code

    def _convert(self, frames: Any, where: str) -> tuple[Frame, ...]:
        """A snapshot frame list as :class:`Frame` tuples (missing fields: ``??`` and line 0)."""
        if frames is None:
            return ()
        if not isinstance(frames, (list, tuple)):
            raise InputError(f"{self.name}: {where}.frames must be a list of frames, not {type(frames).__name__}")
        result = []
        for frame in frames:
            if not isinstance(frame, dict):
                raise InputError(f"{self.name}: {where}.frames holds a {type(frame).__name__}; frames are dicts")
            line = frame.get("line", 0)
            result.append(
                Frame(
                    filename=as_text(frame.get("filename", "??"), MAX_FRAME_TEXT),
                    line=line if isinstance(line, int) and not isinstance(line, bool) and 0 <= line < 1 << 31 else 0,
                    name=as_text(frame.get("name", "??"), MAX_FRAME_TEXT),
                )
            )
        return tuple(result)


class StringTable:
    """Distinct strings (``user_metadata``, ``category``); empty strings and None are -1."""

    def __init__(self) -> None:
        """An empty table."""
        self.strings: dict[str, int] = {}

    def codes(self, values: Sequence[Any]) -> npt.NDArray[np.int32]:
        """Codes of ``values`` (non-strings are converted with ``str``)."""
        try:
            firsts, distinct = _first_occurrences(values, len(values))
        except TypeError:  # an unhashable value: compare by (bounded) text instead
            return self.codes([None if value is None else as_text(value, MAX_METADATA_TEXT) for value in values])
        table = np.full(len(values), -1, np.int32)
        for first in distinct:
            value = values[first]
            if value is not None and value != "":
                table[first] = self.strings.setdefault(as_text(value, MAX_METADATA_TEXT), len(self.strings))
        return table[firsts]


def _first_occurrences(keys: Iterable[Any], count_: int) -> tuple[npt.NDArray[np.int64], list[int]]:
    """For each key, the position of the first equal key; and those first positions (C-level
    passes: ``dict.setdefault`` mapped over the keys and a counter)."""
    seen: dict[Any, int] = {}
    firsts = np.fromiter(map(seen.setdefault, keys, count()), np.int64, count_)
    return firsts, list(seen.values())


def read_trace(entries: Any, device: int, name: str, stacks: StackTable, strings: StringTable) -> Trace:
    """The columns of one device's trace entries (see the module docstring)."""
    where = f"device_traces[{device}]"
    if not isinstance(entries, list):
        raise InputError(f"{name}: {where} must be a list of trace entries, not {type(entries).__name__}")
    if not entries:
        return Trace.empty()
    try:
        names = _field(entries, "action", None)
    except TypeError:
        bad = next(i for i, entry in enumerate(entries) if not isinstance(entry, dict))
        raise InputError(
            f"{name}: {where}[{bad}] is a {type(entries[bad]).__name__}; trace entries are dicts"
        ) from None
    if None in names:
        raise InputError(f"{name}: {where}[{names.index(None)}] has no 'action'")
    try:
        action = np.fromiter(map(_CODES.get, names, [UNKNOWN] * len(names)), np.int8, len(names))
    except TypeError:
        raise InputError(f"{name}: {where}: every 'action' must be a string") from None
    unknown = Counter(as_text(names[i], 100) for i in np.flatnonzero(action == UNKNOWN).tolist())
    categories = _field(entries, "category", None) if any(map(dict.__contains__, entries, repeat("category"))) else []
    size = _numbers(entries, "size", np.int64, f"{name}: {where}")
    memory = (action != OOM) & ((size < 0) | (size >= MAX_SIZE))  # an oom may ask for anything
    if memory.any():
        bad = int(np.argmax(memory))
        raise InputError(f"{name}: {where}[{bad}].size: {int(size[bad])} is not a byte count in [0, 2**50)")
    return Trace(
        action=action,
        addr=_numbers(entries, "addr", np.uint64, f"{name}: {where}"),
        size=size,
        stream=_numbers(entries, "stream", np.int64, f"{name}: {where}"),
        time_us=_times(entries, f"{name}: {where}"),
        stack=_stack_codes(entries, stacks, where),
        user_metadata=strings.codes(_field(entries, "user_metadata", None)),
        category=strings.codes(categories) if categories.count(None) < len(categories) else None,
        ooms=_ooms(entries, action, f"{name}: {where}"),
        unknown_actions=dict(unknown),
    )


def _field(entries: list[dict[str, Any]], key: str, default: Any) -> list[Any]:
    """``entry.get(key, default)`` for every entry, in one C-level pass (TypeError for a non-dict)."""
    count_ = len(entries)
    return list(map(dict.get, entries, repeat(key, count_), repeat(default, count_)))


def _numbers(entries: list[dict[str, Any]], key: str, dtype: type[np.generic], where: str) -> npt.NDArray[Any]:
    """An integer column (0 where an entry lacks ``key``): in one C-level pass when every entry
    has ``key`` and every value converts, else through :func:`_as_array` (which names a bad entry)."""
    try:
        return np.fromiter(map(itemgetter(key), entries), dtype, len(entries))
    except (KeyError, TypeError, ValueError, OverflowError):
        return _as_array(_field(entries, key, 0), dtype, where, key)


def _times(entries: list[dict[str, Any]], where: str) -> npt.NDArray[np.int64] | None:
    """The ``time_us`` column, None when an entry lacks it (or holds None): in one C-level pass
    when every entry has an integer, else the slow way (which names a bad entry)."""
    try:
        return np.fromiter(map(itemgetter("time_us"), entries), np.int64, len(entries))
    except (KeyError, TypeError, ValueError, OverflowError):
        times = _field(entries, "time_us", None)
        return _as_array(times, np.int64, where, "time_us") if None not in times else None


def _as_array(values: list[Any], dtype: type[np.generic], where: str, key: str) -> npt.NDArray[Any]:
    """``values`` as a numpy column; a failed conversion names the first bad entry."""
    try:
        return np.fromiter(values, dtype, len(values))
    except (TypeError, ValueError, OverflowError):
        pass
    converted = []
    lowest = 0 if dtype is np.uint64 else -(1 << 63)
    for index, value in enumerate(values):
        if not isinstance(value, int) or not lowest <= value < _U64:
            raise InputError(f"{where}[{index}].{key}: {as_text(value, 40)!r} is not a valid integer")
        converted.append(value - _U64 if dtype is np.int64 and value >= 1 << 63 else value)  # raw uint64 stream ids
    return np.asarray(converted, dtype=dtype)


def _stack_codes(entries: list[dict[str, Any]], stacks: StackTable, where: str) -> npt.NDArray[np.int32]:
    """Stack code of every entry: one :meth:`StackTable.code` call per distinct frames object."""
    objects = _field(entries, "frames", None)
    ids = np.fromiter(map(id, objects), np.int64, len(objects))  # shared lists: a few distinct ids
    _, firsts, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(firsts)  # in order of first use, as the stacks are numbered
    codes = np.empty(len(firsts), np.int32)
    codes[order] = [stacks.code(objects[first], f"{where}[{first}]") for first in firsts[order].tolist()]
    return codes[inverse.reshape(-1)]


def _ooms(entries: list[dict[str, Any]], action: npt.NDArray[np.int8], where: str) -> tuple[OomEntry, ...]:
    """The ``oom`` entries (rare), with ``device_free`` in place of ``addr``."""
    result = []
    for index in np.flatnonzero(action == OOM).tolist():
        entry = entries[index]
        free, size, stream, time = (entry.get(key) for key in ("device_free", "size", "stream", "time_us"))
        if not isinstance(size, int) or (free is not None and not isinstance(free, int)):
            raise InputError(f"{where}[{index}]: an oom entry needs integer 'size' and 'device_free'")
        result.append(
            OomEntry(
                index=index,
                requested_bytes=size,
                device_free_bytes=free,
                stream=stream if isinstance(stream, int) else 0,
                time_us=time if isinstance(time, int) else None,
            )
        )
    return tuple(result)
