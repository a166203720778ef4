"""A snapshot's allocations on one device as a :class:`~vramlens.result.timeline.Timeline`.

One allocation event (+bytes) and, when it ends, one free event (-bytes) per allocation, in
trace order, ``level="tensor"`` (trace sizes are the requested bytes), each allocation its own
storage id (addresses are reused). Allocations that existed before the trace begins come
first, at the time of the first entry: frees without an allocation (recording started late,
or the ring buffer dropped the allocation) and active blocks in ``segments`` whose address the
trace never mentions ("ghost" blocks, which live to the end). Pairing rules:
:mod:`vramlens.snapshot._pairing`; labels: :mod:`vramlens.snapshot._labels`.

``time_unit`` is ``ns`` (``time_us`` * 1000 from the first entry) when every entry has
``time_us``, else ``event`` (the event's position). Metadata (JSON-safe): ``source``,
``layout``, ``device``, ``file``, ``categories`` (``recorded`` / ``none``), ``reserved_bytes``
and ``reserved_peak_bytes`` (from ``segments`` and the segment entries; null without
segments), ``reserved_at_peak_bytes``, ``segments_allocated_bytes`` (rounded sizes of
``active_allocated`` blocks), ``segments_requested_bytes`` (requested sizes of active blocks:
what the timeline's end equals for a consistent snapshot), ``preexisting_bytes``,
``trace_overflowed``, ``trace_entries``, ``unknown_actions``, ``oom`` and ``annotations``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.result.timeline import CATEGORY_ORDER, Timeline
from vramlens.snapshot._labels import NO_CATEGORY, Labels, parse_labels, span_phases, spans
from vramlens.snapshot._pairing import Pairs, live_allocation, pair_trace
from vramlens.snapshot.model import (
    ANNOTATE,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    Block,
    Snapshot,
    Trace,
)

__all__ = ["snapshot_timeline"]

_OTHER = CATEGORY_ORDER.index(Category.OTHER)
IntArray = npt.NDArray[np.int64]


def snapshot_timeline(snapshot: Snapshot, device: int = 0) -> Timeline:
    """The allocations of ``device`` in ``snapshot`` as a tensor-level :class:`Timeline` (see the module docstring)."""
    snapshot.check_device(device)
    trace = snapshot.trace(device)
    blocks = [block for segment in snapshot.segments_on(device) for block in segment.blocks if block.active]
    active = np.unique(np.array([b.address for b in blocks], np.uint64)) if snapshot.has_segments else None
    pairs = pair_trace(trace, active)
    mentioned = np.isin(np.array([b.address for b in blocks], np.uint64), pairs.mentioned)
    ghosts = [block for block, seen in zip(blocks, mentioned.tolist(), strict=True) if not seen]
    labels = parse_labels(snapshot.strings)
    categories, recorded = _categories(trace, pairs, labels, len(pairs.orphans) + len(ghosts))
    events = _events(trace, pairs, ghosts, categories)
    if float(np.abs(events["nbytes"]).sum(dtype=np.float64)) >= 2.0**62:
        raise InputError(f"{snapshot.source}: device {device}'s allocations add up to more than 2**62 bytes")
    order = np.argsort(events["key"], kind="stable")
    events = {name: column[order] for name, column in events.items()}
    phase_names = dict.fromkeys(labels.phases)
    phase_table = {name: code for code, name in enumerate(phase_names)}
    phase = _phases(trace, events["src"], labels, spans(snapshot.annotations, device), phase_table)
    meta = _meta_codes(trace, events["src"])
    module = np.where(events["real"], labels.module[meta + 1], -1).astype(np.int32)
    stacks, stack_codes = _stack_table(snapshot, events["stack"])
    preexisting = int(trace.size[pairs.orphans].sum()) + sum(block.requested_size for block in ghosts)
    facts = _Facts(recorded=recorded, preexisting=preexisting, peak_src=_peak_src(events))
    return Timeline(
        time=_times(trace, events["src"]),
        nbytes=events["nbytes"],
        category=categories[events["storage"]].astype(np.int8),
        phase=phase,
        module=module,
        stack=stack_codes,
        storage=events["storage"],
        phases=tuple(phase_table),
        modules=tuple(labels.modules),
        stacks=stacks,
        time_unit="ns" if trace.time_us is not None else "event",
        level="tensor",
        metadata=_metadata(snapshot, device, trace, pairs, events["key"], facts),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _Facts:
    recorded: bool
    preexisting: int
    peak_src: int
    """Trace position of the event at the allocated peak (-1: before the trace or no events)."""


def _peak_src(events: dict[str, Any]) -> int:
    """``src`` of the first event where live bytes peak (``Timeline.peak_index``)."""
    if not len(events["nbytes"]):
        return -1
    return int(events["src"][int(np.argmax(np.cumsum(events["nbytes"])))])


def _meta_codes(trace: Trace, src: IntArray) -> IntArray:
    """``user_metadata`` string code of each event's trace entry (-1 without one)."""
    if not len(trace):
        return np.full(len(src), -1, np.int64)
    return np.where(src >= 0, trace.user_metadata[np.maximum(src, 0)], -1).astype(np.int64)


def _categories(trace: Trace, pairs: Pairs, labels: Labels, preexisting: int) -> tuple[npt.NDArray[np.int64], bool]:
    """Category code of every allocation (``preexisting`` ones first, then the trace's), and
    whether any was recorded: a vramlens tag, else a ``category`` field, then ``annotate`` tags
    (the later wins). Pre-existing allocations are ``other``."""
    tagged = labels.category[trace.user_metadata[pairs.alloc] + 1].astype(np.int64)
    if trace.category is not None:
        field = labels.field_category[trace.category[pairs.alloc] + 1]
        tagged = np.where(tagged == NO_CATEGORY, field, tagged)
    live = live_allocation(trace, pairs)
    notes = labels.category[trace.user_metadata[trace.action == ANNOTATE] + 1]
    for index, code in zip(live.tolist(), notes.tolist(), strict=True):
        if index >= 0 and code != NO_CATEGORY:
            tagged[index] = code
    recorded = bool((tagged != NO_CATEGORY).any())
    codes = np.full(preexisting + len(pairs.alloc), _OTHER, np.int64)
    codes[preexisting:] = np.where(tagged == NO_CATEGORY, _OTHER, tagged)
    return codes, recorded


def _events(trace: Trace, pairs: Pairs, ghosts: list[Block], categories: IntArray) -> dict[str, Any]:
    """Unsorted event columns: pre-existing allocations (orphans' and ghosts'), the trace's
    allocations, the orphans' frees and the trace allocations' frees. ``src`` is the trace
    position an event's time and labels come from (-1: before the trace); ``real`` marks
    events that are trace entries themselves."""
    orphans, allocs = pairs.orphans, pairs.alloc
    pre = len(orphans) + len(ghosts)
    closed = np.flatnonzero(pairs.free_key >= 0)
    free_src = pairs.free_key[closed] // 2
    ghost_sizes = np.array([block.requested_size for block in ghosts], np.int64)
    sizes = trace.size
    stacks = trace.stack.astype(np.int64)
    return {
        "key": np.concatenate([np.arange(pre) - pre, 2 * allocs + 1, 2 * orphans + 1, pairs.free_key[closed]]),
        "nbytes": np.concatenate([sizes[orphans], ghost_sizes, sizes[allocs], -sizes[orphans], -sizes[allocs[closed]]]),
        "storage": np.concatenate(
            [np.arange(pre), pre + np.arange(len(allocs)), np.arange(len(orphans)), pre + closed]
        ),
        "src": np.concatenate([np.full(pre, -1), allocs, orphans, free_src]).astype(np.int64),
        "real": np.concatenate(
            [np.zeros(pre, bool), np.ones(len(allocs) + len(orphans), bool), pairs.free_real[closed]]
        ),
        "stack": np.concatenate(
            [
                np.full(len(orphans), -1),
                np.array([block.stack for block in ghosts], np.int64),
                stacks[allocs],
                stacks[orphans],
                np.where(pairs.free_real[closed], stacks[free_src], -1),
            ]
        ).astype(np.int64),
    }


def _phases(
    trace: Trace, src: IntArray, labels: Labels, scopes: list[tuple[float, float, str]], table: dict[str, int]
) -> npt.NDArray[np.int32]:
    """Phase of every event: its entry's vramlens tag, else the innermost annotated scope at its time."""
    phase = labels.phase[_meta_codes(trace, src) + 1].astype(np.int32)
    phase[src < 0] = -1
    if scopes and trace.time_us is not None:
        from_scopes = span_phases(trace.time_us[np.maximum(src, 0)], scopes, table)
        phase = np.where((phase < 0) & (src >= 0), from_scopes, phase).astype(np.int32)
    return phase


def _times(trace: Trace, src: IntArray) -> IntArray:
    """Nanoseconds since the first trace entry (``time_us`` * 1000), or event positions without ``time_us``."""
    if trace.time_us is None or not len(trace):
        return np.arange(len(src), dtype=np.int64)
    elapsed = (trace.time_us[np.maximum(src, 0)] - trace.time_us[0]) * np.int64(1000)
    return np.where(src >= 0, elapsed, 0).astype(np.int64)


def _stack_table(snapshot: Snapshot, codes: IntArray) -> tuple[tuple[str, ...], npt.NDArray[np.int32]]:
    """The stack strings the events use (outermost frame first) and each event's index into them."""
    used = np.unique(codes[codes >= 0])
    remap = np.full(len(snapshot.stacks) + 1, -1, np.int32)
    remap[used + 1] = np.arange(len(used), dtype=np.int32)
    texts = tuple(snapshot.stack_text(code) or "" for code in used.tolist())
    return texts, remap[codes + 1]


def _reserved(snapshot: Snapshot, device: int, trace: Trace, src_at_peak: int) -> tuple[int | None, int | None]:
    """Peak reserved bytes over the trace and reserved bytes at the allocated peak, rebuilt
    backwards from the segments at dump time through the segment entries (as
    ``MemoryViz.simulate_memory`` does); None without segments."""
    reserved = snapshot.reserved_bytes(device)
    if reserved is None:
        return None, None
    grow = np.isin(trace.action, (SEGMENT_ALLOC, SEGMENT_MAP))
    shrink = np.isin(trace.action, (SEGMENT_FREE, SEGMENT_UNMAP))
    delta = np.where(grow, trace.size, 0) - np.where(shrink, trace.size, 0)
    after = reserved - int(delta.sum()) + np.cumsum(delta)
    before = reserved - int(delta.sum())
    peak = max(before, int(after.max())) if len(after) else reserved
    return peak, (int(after[src_at_peak]) if src_at_peak >= 0 else before)


def _metadata(
    snapshot: Snapshot, device: int, trace: Trace, pairs: Pairs, keys: IntArray, facts: _Facts
) -> dict[str, Any]:
    """The JSON-safe facts of the module docstring."""
    segments = snapshot.segments_on(device)
    reserved_peak, reserved_at_peak = _reserved(snapshot, device, trace, facts.peak_src)
    settings = snapshot.allocator_settings
    limit = settings.get("trace_alloc_max_entries")
    overflowed = bool(len(pairs.orphans)) or settings.get("trace_alloc_overflowed") is True
    overflowed |= isinstance(limit, int) and 0 < limit <= len(trace)
    return {
        "source": "pytorch-snapshot",
        "layout": snapshot.layout,
        "device": device,
        "file": snapshot.source,
        "categories": "recorded" if facts.recorded else "none",
        "reserved_bytes": snapshot.reserved_bytes(device),
        "reserved_peak_bytes": reserved_peak,
        "reserved_at_peak_bytes": reserved_at_peak,
        "segments_allocated_bytes": sum(s.allocated_bytes for s in segments) if snapshot.has_segments else None,
        "segments_requested_bytes": sum(s.requested_bytes for s in segments) if snapshot.has_segments else None,
        "preexisting_bytes": facts.preexisting,
        "trace_overflowed": overflowed,
        "trace_entries": len(trace),
        "unknown_actions": dict(trace.unknown_actions),
        "oom": _ooms(trace, keys),
        "annotations": _annotations(snapshot, device, trace),
    }


def _ooms(trace: Trace, keys: IntArray) -> list[dict[str, Any]]:
    """``oom`` entries with the index of the last timeline event before each (-1: none)."""
    return [
        {
            "event": int(np.searchsorted(keys, 2 * oom.index + 1)) - 1,
            "time_us": oom.time_us,
            "requested_bytes": oom.requested_bytes,
            "device_free_bytes": oom.device_free_bytes,
            "stream": oom.stream,
        }
        for oom in trace.ooms
    ]


def _annotations(snapshot: Snapshot, device: int, trace: Trace) -> list[dict[str, Any]]:
    """``external_annotations`` of the device, then the trace's ``annotate`` entries (stage ``annotate``)."""
    result: list[dict[str, Any]] = [
        {"name": a.name, "stage": a.stage, "time_us": a.time_us}
        for a in snapshot.annotations
        if a.device in (None, device)
    ]
    for position in np.flatnonzero(trace.action == ANNOTATE).tolist():
        code = int(trace.user_metadata[position])
        time = int(trace.time_us[position]) if trace.time_us is not None else None
        result.append({"name": snapshot.strings[code] if code >= 0 else "", "stage": "annotate", "time_us": time})
    return result
