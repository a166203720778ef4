"""The CPU allocator's own events, merged into a tracker's timeline (``allocator_events=True``).

A dispatch mode sees the storages operators return, not what an operator allocates inside
itself (a type-promotion copy inside ``MmBackward0``, the 8-byte tensors Python numbers are
wrapped in). torch's profiler with ``profile_memory=True`` records every call of the CPU
allocator with its address, size and time. This module reads those events and merges them
with the tracker's: an allocator event at the address and size of a tracked storage, at or
just before the moment the tracker saw that storage, *is* that storage and takes its
category, phase and module; every other allocation is an operator's internal temporary.
The merged timeline's running total is the allocator's own, to the byte.

Clocks: the profiler stamps events with Unix-epoch nanoseconds (``c10::getTime``); with
``allocator_events`` the tracker stamps its events with ``time.time_ns()`` too, so both are
on one clock (measured here: the allocator's call precedes the tracker's record by tens of
microseconds).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vramlens.categories import Category
from vramlens.result.timeline import CATEGORY_ORDER, Timeline

__all__ = ["AllocatorEvent", "AllocatorRecorder", "merge_allocator_events"]

#: How far (ns) an allocator event may be stamped after the tracker's record of the same
#: storage and still match it. Both read the system clock, and the allocation happens
#: before the operator returns, so this only absorbs the profiler's clock conversion.
CLOCK_TOLERANCE_NS = 20_000
_TEMPORARY = CATEGORY_ORDER.index(Category.TEMPORARY)


@dataclass(frozen=True, slots=True)
class AllocatorEvent:
    """One call of the CPU allocator: ``nbytes`` > 0 allocates, < 0 frees, at ``ptr``."""

    time_ns: int
    """Unix-epoch nanoseconds."""
    ptr: int
    nbytes: int


@dataclass(slots=True)
class AllocatorRecorder:
    """Runs torch's profiler (CPU, ``profile_memory``) while a tracker is entered."""

    events: list[AllocatorEvent] = field(default_factory=list)
    _profile: Any = None

    def start(self) -> None:
        """Begin recording allocator calls."""
        import warnings

        import torch

        self._profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._profile.__enter__()

    def stop(self) -> None:
        """Stop recording and keep this stretch's allocator events."""
        if self._profile is None:
            return
        profile, self._profile = self._profile, None
        profile.__exit__(None, None, None)
        self.events.extend(_allocations(profile.profiler.kineto_results.experimental_event_tree()))
        self.events.sort(key=lambda event: event.time_ns)


def _allocations(roots: list[Any]) -> list[AllocatorEvent]:
    """The allocator events anywhere in the profiler's event tree (CPU device only)."""
    found: list[AllocatorEvent] = []
    pending = list(roots)
    while pending:
        node = pending.pop()
        pending.extend(node.children)
        fields = node.extra_fields
        if type(fields).__name__ == "_ExtraFields_Allocation" and fields.device.type == "cpu":
            found.append(AllocatorEvent(time_ns=node.start_time_ns, ptr=fields.ptr, nbytes=fields.alloc_size))
    return found


def merge_allocator_events(
    timeline: Timeline, pointers: dict[int, int], start_unix_ns: int, events: list[AllocatorEvent]
) -> Timeline:
    """The tracker's ``timeline`` with the allocator's ``events`` merged in (see module doc).

    ``pointers[serial]`` is the data pointer of each tracked storage, ``start_unix_ns`` the
    Unix time of the timeline's time 0 (its ``time`` is in ns). Matched allocator events
    replace the tracker's; unmatched allocations become ``temporary`` storages with the
    phase and module of the next tracker event; frees of memory neither side saw allocated
    are dropped. Tracker events without an allocator counterpart (registrations, events
    outside the profiled stretches) stay at their own times.
    """
    if timeline.time_unit != "ns":
        raise ValueError("time_unit: allocator events merge only into a timeline stamped in ns")
    unix = timeline.time.astype(np.int64) + start_unix_ns
    taken = _match(timeline, pointers, unix, events)
    rows = _merged_rows(timeline, unix, events, taken)
    rows.sort(key=lambda row: (row[0], row[1]))  # by time; ties keep each source's order
    return _timeline_from_rows(timeline, rows, start_unix_ns)


def _match(
    timeline: Timeline, pointers: dict[int, int], unix: np.ndarray, events: list[AllocatorEvent]
) -> dict[int, int]:
    """allocator event index -> tracker event index, for events that are the same call.

    An allocation is found by address, size and time (:func:`_allocation_of`). A free is paired by
    address, not time (a storage's Python object can die before its memory is released):
    the next allocator call at that address after the matched allocation, or, for a storage
    allocated before recording began, the first call at its address if that is a free.
    """
    by_ptr: dict[int, list[int]] = defaultdict(list)
    for index, event in enumerate(events):
        by_ptr[event.ptr].append(index)
    taken: dict[int, int] = {}
    allocated_at: dict[int, int] = {}  # storage serial -> its allocator allocation's index
    for row in np.flatnonzero(timeline.nbytes > 0).tolist():
        serial = int(timeline.storage[row])
        ptr = pointers.get(serial)
        if ptr is None:
            continue
        found = _allocation_of(by_ptr.get(ptr, []), events, int(unix[row]), int(timeline.nbytes[row]), taken)
        if found is not None:
            taken[found] = row
            allocated_at[serial] = found
    for row in np.flatnonzero(timeline.nbytes < 0).tolist():
        serial = int(timeline.storage[row])
        free = _free_of(serial, pointers, allocated_at, by_ptr, events)
        if free is not None and free not in taken and events[free].nbytes == timeline.nbytes[row]:
            taken[free] = row
    return taken


def _allocation_of(
    calls: list[int], events: list[AllocatorEvent], seen_ns: int, nbytes: int, taken: dict[int, int]
) -> int | None:
    """The allocator call (index) that made a storage the tracker saw at ``seen_ns``: among
    the untaken calls of that size at its address, the latest one at or before ``seen_ns``
    still live then; failing that, the first one within :data:`CLOCK_TOLERANCE_NS` after."""
    best = None
    for position, index in enumerate(calls):
        event = events[index]
        if event.nbytes != nbytes or index in taken:
            continue
        if event.time_ns <= seen_ns:
            following = calls[position + 1] if position + 1 < len(calls) else None
            if following is None or events[following].time_ns >= seen_ns:
                best = index
        elif best is None and event.time_ns <= seen_ns + CLOCK_TOLERANCE_NS:
            return index
        else:
            break
    return best


def _free_of(
    serial: int,
    pointers: dict[int, int],
    allocated_at: dict[int, int],
    by_ptr: dict[int, list[int]],
    events: list[AllocatorEvent],
) -> int | None:
    """Index of the allocator call that freed storage ``serial``, if recorded."""
    ptr = pointers.get(serial)
    if ptr is None:
        return None
    calls = by_ptr.get(ptr, [])
    start = allocated_at.get(serial)
    if start is None:  # allocated before recording: freed by the first call at its address
        return calls[0] if calls and events[calls[0]].nbytes < 0 else None
    after = calls.index(start) + 1
    return calls[after] if after < len(calls) else None


def _merged_rows(
    timeline: Timeline, unix: np.ndarray, events: list[AllocatorEvent], taken: dict[int, int]
) -> list[list[int]]:
    """[time, order, from_allocator_only, nbytes, category, phase, module, stack, storage] rows."""
    rows = []
    matched_rows = set(taken.values())
    for tracked in range(len(timeline)):
        if tracked not in matched_rows:
            rows.append([int(unix[tracked]), tracked, 0, *_attributes(timeline, tracked)])
    live: dict[int, int] = {}  # ptr -> storage id of a live allocation only the allocator saw
    next_storage = int(timeline.storage.max()) + 1 if len(timeline) else 0
    for index, event in enumerate(events):
        order = len(timeline) + index
        row = taken.get(index)
        if row is not None:
            rows.append([event.time_ns, order, 0, *_attributes(timeline, row)])
        elif event.nbytes < 0 and event.ptr in live:
            rows.append([event.time_ns, order, 1, event.nbytes, _TEMPORARY, -1, -1, -1, live.pop(event.ptr)])
        elif event.nbytes > 0:
            live[event.ptr] = next_storage
            rows.append([event.time_ns, order, 1, event.nbytes, _TEMPORARY, -1, -1, -1, next_storage])
            next_storage += 1
    return rows


def _attributes(timeline: Timeline, row: int) -> tuple[int, int, int, int, int, int]:
    return (
        int(timeline.nbytes[row]),
        int(timeline.category[row]),
        int(timeline.phase[row]),
        int(timeline.module[row]),
        int(timeline.stack[row]),
        int(timeline.storage[row]),
    )


def _timeline_from_rows(timeline: Timeline, rows: list[list[int]], start_unix_ns: int) -> Timeline:
    """The merged rows as a Timeline; allocator-only rows take the phase and module of the
    next tracker row (an operator's internal allocations come before its output is seen)."""
    phase = module = -1
    for row in reversed(rows):
        if row[2]:
            row[5], row[6] = phase, module
        else:
            phase, module = row[5], row[6]
    columns = np.array(rows, dtype=np.int64).reshape(len(rows), 9)
    return dataclasses.replace(
        timeline,
        time=columns[:, 0] - start_unix_ns,
        nbytes=columns[:, 3],
        category=columns[:, 4].astype(np.int8),
        phase=columns[:, 5].astype(np.int32),
        module=columns[:, 6].astype(np.int32),
        stack=columns[:, 7].astype(np.int32),
        storage=columns[:, 8],
        metadata={**timeline.metadata, "allocator_events": True},
    )
