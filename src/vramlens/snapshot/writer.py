"""Export any :class:`~vramlens.result.timeline.Timeline` as a PyTorch memory snapshot (no torch import).

``save_snapshot(timeline, "run.pickle")`` writes what ``torch.cuda.memory._dump_snapshot`` writes
(the 2.1+ layout of ``docs/research/profilers-and-snapshot-format.md``), so the file opens in
pytorch.org/memory_viz, ``python -m torch.cuda._memory_viz stats|trace|trace_plot|segment_plot``
and every third-party viewer. The pickle holds only dict, list, str, int, float, bool, None and
the ``(0, 0)`` pool-id tuples (protocol 4, the highest the official JS reader accepts).

What is written, for device ``device`` (``device_traces`` has an empty list for each lower one):

* one ``alloc`` entry per allocation and ``free_requested`` + ``free_completed`` per free, with
  the timeline's bytes as the requested ``size`` (zero-byte events are dropped: the CUDA
  allocator hands out no block for them);
* addresses from replaying the events through vramlens' model of the caching allocator
  (:mod:`vramlens.allocator._caching`: 512-byte rounding, small/large pools, 2/20 MiB segments,
  best fit, splitting and merging), so ``segment_alloc`` entries, block addresses and the final
  ``segments`` (blocks live at the end as ``active_allocated`` with rounded ``size`` and
  ``requested_size``, the rest ``inactive``) follow PyTorch's allocator rules. Expandable
  segments are not modeled; stream 0 only. Storages whose first event is a free are placed
  before the trace begins (they existed before recording), and so is the rest of ``base_bytes``
  (which counts them), as one block that is never freed;
* ``time_us``: the timeline's nanoseconds // 1000 when ``time_unit == "ns"``; omitted for
  ``"event"`` timelines (as in snapshots before 2.2), so a reader keeps their event order;
* ``frames`` from the stack strings (``"file:line in name"``, reversed: the snapshot lists
  the innermost frame first);
* ``user_metadata``: the vramlens tag ``"vramlens;phase=...;module=...;category=..."`` of each
  event, which the viewer prints under every allocation and which vramlens' reader turns back
  into categories, phases and modules (no category when ``metadata["categories"]`` is
  ``"none"``; inferred categories are written as they are, so a reader sees them as recorded); ``category`` (the vramlens category name) on tensor
  entries and ``"unknown"`` on segment entries, which the viewer's "Active Memory Timeline"
  uses to colour the bands and draw a legend (the field ``_memory_viz._profile_to_snapshot``
  writes; older viewers crash unless ``"unknown"`` is among the categories);
* ``external_annotations``: a START/END pair per phase span (what ``record_function`` scopes
  give with ``global_record_annotations``), for tools that read them; the viewer itself shows
  phases only through ``user_metadata``;
* ``allocator_settings``: PyTorch's defaults (the settings the replay used);
* ``oom`` entries re-emitted from ``timeline.metadata["oom"]`` (as the snapshot reader writes it).
"""

from __future__ import annotations

import os
import pickle
import re
from bisect import bisect_right
from pathlib import Path
from typing import Any

from vramlens.errors import InputError
from vramlens.result.timeline import CATEGORY_ORDER, Timeline
from vramlens.snapshot._unpickle import paused_gc

__all__ = ["save_snapshot", "timeline_to_snapshot"]

#: Where synthesised addresses start (a typical CUDA virtual address), so none is 0.
ADDRESS_BASE = 0x7F0000000000
PICKLE_PROTOCOL = 4
_FRAME = re.compile(r"^(?P<file>.*):(?P<line>\d+) in (?P<name>.*)$")
_SEGMENT_CATEGORY = "unknown"
_CATEGORY_NAMES = tuple(category.value for category in CATEGORY_ORDER)
#: roundup_power2_divisions keys in ``allocator_settings``: interval starts in MiB (Module.cpp).
_ROUNDUP_KEYS = tuple(str(1 << i) for i in range(16))


def save_snapshot(timeline: Timeline, path: str | os.PathLike[str], *, device: int = 0) -> Path:
    """Write ``timeline`` as a PyTorch memory snapshot pickle (protocol 4) at ``path``; returns the path.

    See the module docstring for what the file holds; :func:`timeline_to_snapshot` gives the dict.
    """
    data = timeline_to_snapshot(timeline, device=device)
    target = Path(path)
    try:
        target.write_bytes(pickle.dumps(data, protocol=PICKLE_PROTOCOL))
    except OSError as error:
        raise InputError(f"{target}: cannot write the snapshot: {error.strerror or error}") from None
    return target


def timeline_to_snapshot(timeline: Timeline, *, device: int = 0) -> dict[str, Any]:
    """The snapshot dict (``segments``, ``device_traces``, ``allocator_settings``,
    ``external_annotations``) for ``timeline`` on CUDA device ``device`` (an int >= 0)."""
    if not isinstance(timeline, Timeline):
        raise InputError(f"timeline: expected a vramlens Timeline, got {type(timeline).__name__}")
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise InputError(f"device: {device!r}; accepted: an integer >= 0")
    writer = _TraceWriter(timeline, device)
    with paused_gc():  # its generation-2 passes made 10**6 events 3.5x slower (13.8 s against 3.9 s)
        trace = writer.run()
        segments = writer.segments_at_end()
    return {
        "segments": segments,
        "device_traces": [[] for _ in range(device)] + [trace],
        "allocator_settings": _allocator_settings(),
        "external_annotations": _annotations(timeline, device),
    }


def parse_frames(stack: str) -> list[dict[str, Any]]:
    """Snapshot frames (innermost first) of a vramlens stack string (outermost first,
    ``"file:line in name"`` per line); a line of another form becomes ``{filename: line, line: 0,
    name: ""}``."""
    frames: list[dict[str, Any]] = []
    for text in reversed(stack.split("\n")) if stack else ():
        match = _FRAME.match(text)
        if match is None:
            frames.append({"filename": text, "line": 0, "name": ""})
        else:
            frames.append({"filename": match["file"], "line": int(match["line"]), "name": match["name"]})
    return frames


def vramlens_tag(phase: str | None, module: str | None, category: str | None) -> str:
    """The ``user_metadata`` tag of an event: ``"vramlens;phase=<p>;module=<m>;category=<c>"``
    (a key is left out when its value is None; ';' in a value becomes ',')."""
    parts = ["vramlens"]
    for key, value in (("phase", phase), ("module", module), ("category", category)):
        if value is not None:
            parts.append(f"{key}={value.replace(';', ',')}")
    return ";".join(parts)


class _TraceWriter:
    """Builds the trace of one device while replaying the events through the allocator model."""

    def __init__(self, timeline: Timeline, device: int) -> None:
        from vramlens.allocator._blocks import K_LARGE_BUFFER, ROUNDUP_INTERVALS
        from vramlens.allocator._caching import CachingAllocatorModel

        self.timeline = timeline
        self.device = device
        self.model = CachingAllocatorModel(
            divisions_by_interval=(0,) * ROUNDUP_INTERVALS, max_non_split_rounding=K_LARGE_BUFFER
        )
        self.frames = [parse_frames(stack) for stack in timeline.stacks]
        self.no_frames: list[dict[str, Any]] = []
        self.tags: dict[tuple[int, int, int], str] = {}
        #: A timeline whose metadata says it has no categories gets none in its tags either.
        self.named = timeline.metadata.get("categories") != "none"
        self.live: dict[int, tuple[Any, int, list[dict[str, Any]]]] = {}
        self.resident: list[tuple[Any, int, list[dict[str, Any]]]] = []  # base_bytes: never freed
        self.segments: list[tuple[int, int, bool, list[dict[str, Any]]]] = []
        self.trace: list[dict[str, Any]] = []

    def run(self) -> list[dict[str, Any]]:
        """Every trace entry, in event order (OOM entries inserted where the metadata says)."""
        timeline = self.timeline
        times = _times_us(timeline)
        self._prologue()
        ends: list[int] = []
        columns = zip(
            timeline.nbytes.tolist(),
            timeline.storage.tolist(),
            timeline.category.tolist(),
            timeline.phase.tolist(),
            timeline.module.tolist(),
            timeline.stack.tolist(),
            times,
            strict=True,
        )
        for index, (nbytes, storage, category, phase, module, stack, time_us) in enumerate(columns):
            frames = self.frames[stack] if stack >= 0 else self.no_frames
            extra = {"user_metadata": self._tag(phase, module, category)}
            if self.named:
                extra["category"] = _CATEGORY_NAMES[category]
            if time_us is not None:
                extra["time_us"] = time_us
            if nbytes > 0:
                self._alloc(index, storage, nbytes, frames, extra)
            elif nbytes < 0:
                self._free(index, storage, frames, extra)
            ends.append(len(self.trace))
        _insert_ooms(self.trace, ends, timeline.metadata.get("oom"))
        return self.trace

    def _prologue(self) -> None:
        """Place what lived before the first event: the storages first seen freed, then the rest
        of ``base_bytes`` (which counts those storages too) as one block that is never freed."""
        seen: set[int] = set()
        before = 0
        for nbytes, storage in zip(self.timeline.nbytes.tolist(), self.timeline.storage.tolist(), strict=True):
            if storage not in seen and nbytes < 0:
                self.live[storage] = (self._malloc(-nbytes, self.no_frames)[0], -nbytes, self.no_frames)
                before -= nbytes
            seen.add(storage)
        rest = self.timeline.base_bytes - before
        if rest > 0:
            self.resident.append((self._malloc(rest, self.no_frames)[0], rest, self.no_frames))

    def _malloc(self, nbytes: int, frames: list[dict[str, Any]]) -> tuple[Any, int]:
        """A block from the allocator model and the bytes of the segment created for it (0: none).

        Without a capacity the model never releases segments, so ``reserved`` grows exactly when
        ``alloc_block`` made a segment, and the block split off its front starts at its address."""
        before = self.model.reserved
        block = self.model.malloc(nbytes, 0)
        assert block is not None  # no capacity: the model never runs out of memory
        grown = self.model.reserved - before
        if grown:
            self.segments.append((block.addr, grown, block.pool.small, frames))
        return block, grown

    def _alloc(self, index: int, storage: int, nbytes: int, frames: Any, extra: dict[str, Any]) -> None:
        """``alloc`` (after ``segment_alloc`` when the block needed a new segment)."""
        if storage in self.live:
            raise InputError(f"timeline.storage: event {index} allocates storage {storage}, which is still live")
        block, grown = self._malloc(nbytes, frames)
        address = ADDRESS_BASE + block.addr
        if grown:
            segment_extra = {**extra, "category": _SEGMENT_CATEGORY} if self.named else extra
            self.trace.append(_entry("segment_alloc", address, grown, frames, segment_extra))
        self.live[storage] = (block, nbytes, frames)
        self.trace.append(_entry("alloc", address, nbytes, frames, extra))

    def _free(self, index: int, storage: int, frames: Any, extra: dict[str, Any]) -> None:
        """``free_requested`` and ``free_completed`` (one stream: the block is free at once)."""
        found = self.live.pop(storage, None)
        if found is None:
            raise InputError(f"timeline.storage: event {index} frees storage {storage}, which is not live")
        block, nbytes, _ = found
        address = ADDRESS_BASE + block.addr
        self.trace.append(_entry("free_requested", address, nbytes, frames, extra))
        self.trace.append(_entry("free_completed", address, nbytes, frames, extra))
        self.model.free(block)

    def _tag(self, phase: int, module: int, category: int) -> str:
        """The vramlens tag of an event, built once per (phase, module, category): one shared
        string object, which the pickle memo then writes once."""
        key = (phase, module, category)
        tag = self.tags.get(key)
        if tag is None:
            timeline = self.timeline
            tag = self.tags[key] = vramlens_tag(
                timeline.phases[phase] if phase >= 0 else None,
                timeline.modules[module] if module >= 0 else None,
                _CATEGORY_NAMES[category] if self.named else None,
            )
        return tag

    def segments_at_end(self) -> list[dict[str, Any]]:
        """The ``segments`` list: every segment with its blocks tiling it, in address order."""
        blocks = [
            (block.addr, block.size, "active_allocated", nbytes, frames)
            for block, nbytes, frames in [*self.live.values(), *self.resident]
        ]
        blocks += [
            (block.addr, block.size, "inactive", 0, self.no_frames)
            for pool in self.model.pools()
            for block in pool.blocks
        ]
        blocks.sort(key=lambda item: item[0])
        starts = [segment[0] for segment in sorted(self.segments)]
        grouped: list[list[dict[str, Any]]] = [[] for _ in starts]
        for addr, size, state, requested, frames in blocks:
            grouped[bisect_right(starts, addr) - 1].append(
                {
                    "address": ADDRESS_BASE + addr,
                    "size": size,
                    "requested_size": requested,
                    "state": state,
                    "frames": frames,
                }
            )
        return [
            _segment(self.device, segment, group) for segment, group in zip(sorted(self.segments), grouped, strict=True)
        ]


def _segment(
    device: int, segment: tuple[int, int, bool, list[dict[str, Any]]], blocks: list[dict[str, Any]]
) -> dict[str, Any]:
    """One ``segments`` entry (keys as ``_cuda_memorySnapshot`` writes them, Module.cpp)."""
    addr, size, small, frames = segment
    active = [block for block in blocks if block["state"] == "active_allocated"]
    allocated = sum(block["size"] for block in active)
    return {
        "device": device,
        "address": ADDRESS_BASE + addr,
        "total_size": size,
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": sum(block["requested_size"] for block in active),
        "stream": 0,
        "segment_type": "small" if small else "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": frames,
        "blocks": blocks,
    }


def _entry(action: str, addr: int, size: int, frames: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """A trace entry: the keys every 2.1+ entry has, plus ``extra`` (time, metadata, category)."""
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames, "compile_context": "", **extra}


def _times_us(timeline: Timeline) -> list[int | None]:
    """``time_us`` per event: nanoseconds // 1000, or None for event-ordered timelines."""
    if timeline.time_unit != "ns":
        return [None] * len(timeline)
    return (timeline.time // 1000).tolist()  # type: ignore[no-any-return]


def _annotations(timeline: Timeline, device: int) -> list[dict[str, Any]]:
    """START/END ``external_annotations`` per phase span (needs times in ns)."""
    if timeline.time_unit != "ns":
        return []
    result: list[dict[str, Any]] = []
    for name, first, last in timeline.phase_spans():
        if name:
            for stage, index in (("START", first), ("END", last)):
                result.append(
                    {"name": name, "stage": stage, "device": device, "time_us": int(timeline.time[index]) // 1000}
                )
    return result


def _allocator_settings() -> dict[str, Any]:
    """PyTorch's default ``allocator_settings`` (the settings the replay models)."""
    return {
        "PYTORCH_CUDA_ALLOC_CONF": "",
        "max_split_size": -1,  # int64_t(SIZE_MAX): no limit
        "garbage_collection_threshold": 0.0,
        "expandable_segments": False,
        "roundup_power2_divisions": dict.fromkeys(_ROUNDUP_KEYS, 0),
    }


def _insert_ooms(trace: list[dict[str, Any]], ends: list[int], found: Any) -> None:
    """Insert ``oom`` entries after the event each one names (``metadata["oom"]`` of the reader);
    malformed records are skipped."""
    if not isinstance(found, list):
        return
    records = [record for record in found if isinstance(record, dict) and isinstance(record.get("event"), int)]
    for record in sorted(records, key=lambda item: item["event"], reverse=True):
        event = record["event"]
        position = ends[event] if 0 <= event < len(ends) else 0
        entry: dict[str, Any] = {
            "action": "oom",
            "device_free": int(record.get("device_free_bytes") or 0),
            "size": int(record.get("requested_bytes") or 0),
            "stream": int(record.get("stream") or 0),
            "frames": [],
            "compile_context": "",
            "user_metadata": "",
        }
        if isinstance(record.get("time_us"), int):
            entry["time_us"] = record["time_us"]
        trace.insert(position, entry)
