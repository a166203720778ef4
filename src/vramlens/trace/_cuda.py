"""CUDA memory history for ``vramlens.track(device="cuda")`` (needs the [torch] extra and a GPU).

On CUDA the dispatch-mode tracker (:mod:`vramlens.trace.tracker`) runs exactly as on CPU
(categories, modules, phases), and the CUDA caching allocator records its own history
around the block: ``torch.cuda.memory._record_memory_history(context="alloc",
stacks="python", max_entries=...)`` on entry, ``torch.cuda.memory._snapshot()`` on exit.
The snapshot's ``device_traces[N]`` ``alloc`` / ``free_completed`` entries (address,
requested size, ``time_us``) become :class:`~vramlens.trace._allocator.AllocatorEvent` s
and are merged by :func:`~vramlens.trace._allocator.merge_allocator_events`, as the CPU
allocator's events are: an entry at the address and size of a tracked storage is that
storage; every other allocation (cuBLAS workspaces, an operator's internal buffers) is a
``temporary``, so the merged timeline's peak is the allocator's peak of requested bytes.

Clocks: ``time_us`` is Unix-epoch microseconds from c10's approximate clock, converted by
``ApproximateClockToUnixTimeConverter`` in ``c10/cuda/CUDACachingAllocator.cpp`` (the
profiler's clock); the tracker stamps with ``time.time_ns()`` when allocator events are on,
so both are on the system clock (microsecond resolution on the allocator's side).

Which tracked storages are on the device: the ones whose data pointer the allocator knows
(an entry of the device's trace, or an active block of its segments). With unified virtual
addressing, host and device pointers never coincide, so CPU tensors (AdamW's ``step``
counters, a CPU batch) are left out of the CUDA timeline.

The raw snapshot is kept (``tracker.snapshot``, ``tracker.save_snapshot(path)``) and the
timeline's metadata carries reserved bytes (segments) and ``torch.cuda.max_memory_*``
(peak statistics are reset when tracking starts). Allocations are not tagged through
``_set_memory_metadata``: the tag is thread-local, so the backward pass (autograd's device
threads) would need hooks of its own, and the merge already gives every event its category.

NOTE: this path is UNTESTED ON A REAL GPU. Its tests (``tests/trace/test_cuda_recorder.py``)
replace ``torch.cuda``'s functions with fakes whose snapshots are built from real CPU runs.
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np

from vramlens._extras import require
from vramlens.errors import InputError
from vramlens.result.timeline import Timeline
from vramlens.trace._allocator import CLOCK_TOLERANCE_NS, AllocatorEvent, AllocatorRecorder, merge_allocator_events

torch = require("torch", purpose="vramlens' tensor tracker")
from vramlens.trace.tracker import MemoryTracker  # noqa: E402

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "CudaHistoryRecorder",
    "CudaMemoryTracker",
    "device_addresses",
    "resolve_device",
    "trace_events",
    "tracker_for",
]

#: Ring-buffer size of the allocator's history: a few training steps of a large model
#: (torchtitan#3628: 100k entries hold about 2-3 steps); at most a few GB of host memory.
DEFAULT_MAX_ENTRIES = 1_000_000
_ACCEPTED = "accepted: cpu, cuda, cuda:N (None: the model's device, else the inputs', else cpu)"
_COLUMNS = ("time", "nbytes", "category", "phase", "module", "stack", "storage")


def resolve_device(device: Any, model: Any = None, inputs: Any = None) -> str:
    """``"cpu"`` or ``"cuda:N"`` for ``device`` (a string, ``torch.device`` or CUDA ordinal);
    None: the device of the model's first parameter (or buffer), else of the first input
    tensor, else cpu (fake and meta tensors count as cpu: the plain tracker handles them).
    Raises :class:`InputError` for other devices and for CUDA where it is unavailable."""
    if device is None:
        found = _found_device(model, inputs)
        name = "cpu" if found is None else str(found)
    elif isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        name = f"cuda:{device}"
    else:
        name = str(device)
    kind, _, index = name.partition(":")
    if kind == "cpu" and (not index or index.isdigit()):
        return "cpu"
    if kind != "cuda" or (index and not index.isdigit()):
        raise InputError(f"device: {name!r} is not supported; {_ACCEPTED}")
    if not torch.cuda.is_available():
        raise InputError(f"device: {name!r} needs CUDA, but torch.cuda.is_available() is False here; {_ACCEPTED}")
    ordinal = int(index) if index else int(torch.cuda.current_device())
    count = int(torch.cuda.device_count())
    if ordinal >= count:
        raise InputError(f"device: {name!r} names no GPU (this machine has {count}); {_ACCEPTED}")
    return f"cuda:{ordinal}"


def _found_device(model: Any, inputs: Any) -> Any:
    """The device of the model's first parameter or buffer, else of the first input tensor;
    None when there is none, or when it is a fake or meta tensor."""
    from torch.utils._pytree import tree_leaves

    first = None
    if model is not None and hasattr(model, "parameters"):
        first = next(iter(model.parameters()), None)
        if first is None:
            first = next(iter(model.buffers()), None)
    if first is None and inputs is not None:
        first = next((leaf for leaf in tree_leaves(inputs) if isinstance(leaf, torch.Tensor)), None)
    if first is None or first.is_meta or type(first).__name__ == "FakeTensor":
        return None
    return first.device


def tracker_for(
    device: Any, model: Any = None, inputs: Any = None, *, capture_stacks: bool = False, allocator_events: bool = False
) -> MemoryTracker:
    """A new (unregistered) tracker for ``device`` (see :func:`resolve_device`): the CPU
    tracker, or :class:`CudaMemoryTracker` (whose memory history plays the part that
    ``allocator_events`` plays on CPU, so that flag is not needed there)."""
    chosen = resolve_device(device, model, inputs)
    if chosen == "cpu":
        return MemoryTracker(capture_stacks=capture_stacks, allocator_events=allocator_events)
    return CudaMemoryTracker(chosen, capture_stacks=capture_stacks)


def trace_events(snapshot: dict[str, Any], index: int, since_ns: int = 0) -> list[AllocatorEvent]:
    """Allocator events of device ``index``'s trace: ``alloc`` (+size) and ``free_completed``
    (-size) entries stamped at or after ``since_ns`` (Unix ns), in trace order (which is time
    order). ``size`` is the requested size, as a storage's ``nbytes()``."""
    found = []
    for entry in device_trace(snapshot, index):
        action = entry.get("action")
        if action not in ("alloc", "free_completed") or "time_us" not in entry:
            continue
        time_ns = int(entry["time_us"]) * 1000
        if time_ns >= since_ns:
            size = int(entry["size"])
            found.append(
                AllocatorEvent(time_ns=time_ns, ptr=int(entry["addr"]), nbytes=size if action == "alloc" else -size)
            )
    return found


def device_trace(snapshot: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """The trace entries of device ``index`` (empty when the snapshot has none)."""
    traces = snapshot.get("device_traces") or []
    return list(traces[index]) if index < len(traces) else []


def device_addresses(snapshot: dict[str, Any], index: int) -> set[int]:
    """Every block address the allocator of device ``index`` knows: addresses in its trace and
    the blocks of its segments (blocks lie back to back from the segment's address)."""
    found = {int(entry["addr"]) for entry in device_trace(snapshot, index) if "addr" in entry}
    for segment in snapshot.get("segments", []):
        if segment.get("device") != index:
            continue
        address = int(segment["address"])
        for block in segment.get("blocks", []):
            found.add(int(block.get("address", address)))
            address += int(block["size"])
    return found


class CudaHistoryRecorder(AllocatorRecorder):
    """Records the CUDA caching allocator's history while a tracker is entered (the same
    ``start``/``stop``/``events`` as the CPU :class:`AllocatorRecorder`). UNTESTED on a real GPU."""

    def __init__(self, index: int, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        super().__init__()
        self.index = index
        self.max_entries = max_entries
        self.snapshot: dict[str, Any] | None = None
        self.addresses: set[int] = set()
        self._since_ns: int | None = None
        self._facts: dict[str, Any] = {"trace_entries": 0, "trace_overflowed": False, "oom": []}
        self._facts |= {"max_memory_allocated_bytes": 0, "max_memory_reserved_bytes": 0}

    def start(self) -> None:
        """Reset the device's peak statistics and turn the memory history on. A history the
        user was recording is replaced (and turned off by :meth:`stop`)."""
        torch.cuda.reset_peak_memory_stats(self.index)
        self._since_ns = time.time_ns()
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=self.max_entries
        )

    def stop(self) -> None:
        """Take the snapshot, turn the history off and keep this stretch's events."""
        if self._since_ns is None:
            return
        since, self._since_ns = self._since_ns, None
        try:
            snapshot = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        self.snapshot = snapshot
        since -= CLOCK_TOLERANCE_NS
        trace = device_trace(snapshot, self.index)
        facts = self._facts
        facts["trace_entries"] += len(trace)
        facts["trace_overflowed"] = facts["trace_overflowed"] or len(trace) >= self.max_entries
        facts["oom"] += [_oom(entry) for entry in trace if entry.get("action") == "oom" and _stamp(entry) >= since]
        facts["max_memory_allocated_bytes"] = max(
            facts["max_memory_allocated_bytes"], int(torch.cuda.max_memory_allocated(self.index))
        )
        facts["max_memory_reserved_bytes"] = max(
            facts["max_memory_reserved_bytes"], int(torch.cuda.max_memory_reserved(self.index))
        )
        self.events.extend(trace_events(snapshot, self.index, since))
        self.events.sort(key=lambda event: event.time_ns)
        self.addresses |= device_addresses(snapshot, self.index)

    def metadata(self) -> dict[str, Any]:
        """JSON-safe facts for the timeline: the device, reserved and allocated bytes of its
        segments at the last snapshot, the peak statistics, the trace's size and OOMs."""
        segments = [s for s in (self.snapshot or {}).get("segments", []) if s.get("device") == self.index]
        return {
            "device": f"cuda:{self.index}",
            "reserved_bytes": sum(int(s["total_size"]) for s in segments),
            "segments_allocated_bytes": sum(int(s.get("allocated_size", 0)) for s in segments),
            "max_entries": self.max_entries,
            **{key: [dict(o) for o in value] if key == "oom" else value for key, value in self._facts.items()},
        }


def _stamp(entry: dict[str, Any]) -> int:
    """A trace entry's time in Unix ns (0 when it has none)."""
    return int(entry.get("time_us", 0)) * 1000


def _oom(entry: dict[str, Any]) -> dict[str, Any]:
    """An ``oom`` trace entry in the contract's metadata form (``event`` filled in later)."""
    return {
        "event": -1,
        "time_us": int(entry.get("time_us", 0)),
        "requested_bytes": int(entry.get("size", 0)),
        "device_free_bytes": int(entry.get("device_free", 0)),
        "stream": int(entry.get("stream", 0)),
    }


class CudaMemoryTracker(MemoryTracker):  # type: ignore[no-untyped-call]
    """:class:`MemoryTracker` plus the CUDA caching allocator's memory history of one device
    (see the module doc). ``timeline()`` holds that device's storages only, merged with the
    allocator's events; ``snapshot`` is the raw ``_snapshot()`` dict of the last exit.
    UNTESTED on a real GPU (tested with a faked ``torch.cuda``)."""

    def __init__(
        self, device: str = "cuda:0", *, capture_stacks: bool = False, max_entries: int = DEFAULT_MAX_ENTRIES
    ) -> None:
        # allocator_events=True: stamp events with the system clock, as the allocator does.
        super().__init__(capture_stacks=capture_stacks, allocator_events=True)
        self.device = resolve_device(device)
        self._history = CudaHistoryRecorder(int(self.device.partition(":")[2]), max_entries)
        self._recorder = self._history

    @property
    def snapshot(self) -> dict[str, Any] | None:
        """The raw snapshot (``torch.cuda.memory._snapshot()``) taken when the block last ended."""
        return self._history.snapshot

    def save_snapshot(self, path: str | Path) -> Path:
        """Write the raw snapshot as a pickle (protocol 4, what ``_dump_snapshot`` writes and
        pytorch.org/memory_viz reads); returns the path."""
        if self._history.snapshot is None:
            raise InputError("save_snapshot: nothing recorded yet; leave a `with tracker:` block first")
        target = Path(path)
        with target.open("wb") as handle:
            pickle.dump(self._history.snapshot, handle, protocol=4)
        return target

    def timeline(self, metadata: dict[str, Any] | None = None) -> Timeline:
        """The device's events: tracked storages on it, merged with the allocator's history."""
        timeline = self._tracked_timeline(metadata)
        history = self._history
        if history.snapshot is None:
            return timeline
        on_device = [serial for serial, ptr in self._pointers.items() if ptr in history.addresses]
        mask = np.isin(timeline.storage, np.array(on_device, dtype=np.int64))
        timeline = dataclasses.replace(timeline, **{name: getattr(timeline, name)[mask] for name in _COLUMNS})
        merged = merge_allocator_events(timeline, self._pointers, self._start_ns, history.events)
        facts = history.metadata()
        for oom in facts["oom"]:
            at = oom["time_us"] * 1000 - self._start_ns
            oom["event"] = int(np.searchsorted(merged.time, at, side="right")) - 1
        return dataclasses.replace(merged, metadata={**merged.metadata, **facts})
