"""What a PyTorch memory snapshot holds, normalised across layouts (numpy only, no torch).

The reader (:mod:`vramlens.snapshot.reader`) turns every layout of
``docs/snapshot-format.md`` into these types:

* :class:`Segment` / :class:`Block`: the allocator's state when the snapshot was taken
  (``segments``), with every block's address filled in (2.0 and 1.13 files give none);
* :class:`Trace`: one device's ``device_traces`` entries as numpy columns, so 10**6 entries
  cost tens of MB and vectorised passes instead of 10**6 dicts;
* :class:`Annotation`: ``external_annotations`` (``record_function`` scopes such as
  ``ProfilerStep#3``);
* :class:`Snapshot`: all of it, plus the interned stacks and strings the columns point at.

Stacks are kept as the snapshot lists them, innermost frame first; the converter reverses
them into vramlens' stack strings (outermost first).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from vramlens.errors import InputError

if TYPE_CHECKING:
    from vramlens.result.timeline import Timeline

__all__ = [
    "ACTIONS",
    "ACTIVE_STATES",
    "MAX_SIZE",
    "Annotation",
    "Block",
    "Frame",
    "OomEntry",
    "Segment",
    "Snapshot",
    "Trace",
    "action_code",
]

#: Trace actions vramlens understands; a trace's ``action`` column holds the index into this
#: tuple, or -1 for an action it does not know (vendor additions such as Ascend's
#: ``workspace_snapshot``), which every consumer ignores. Source: the ``TraceEntry::Action``
#: names of c10/cuda/CUDACachingAllocator.h as ``action_to_str`` writes them
#: (torch/csrc/cuda/memory_snapshot.cpp), plus ``annotate`` (``_annotate_memory``, PR #190575).
ACTIONS: tuple[str, ...] = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
    "annotate",
)
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP = range(7)
SNAPSHOT, OOM, ANNOTATE = 7, 8, 9
UNKNOWN = -1
_ACTION_CODES = {name: code for code, name in enumerate(ACTIONS)}

#: Block states that hold memory: in use, or freed but waiting for another stream
#: (``record_stream``). C++ writes ``active_pending_free``; the ``_snapshot`` docstring says
#: ``active_awaiting_free``; both are read as ``active_pending_free``.
ACTIVE_STATES = ("active_allocated", "active_pending_free")

Int64Array = npt.NDArray[np.int64]
#: Largest byte count read (1 PiB): sums over millions of entries then stay far inside int64.
MAX_SIZE = 1 << 50


def action_code(name: str) -> int:
    """Index of ``name`` in :data:`ACTIONS`, or -1 for an action vramlens does not know."""
    return _ACTION_CODES.get(name, UNKNOWN)


@dataclass(frozen=True, kw_only=True, slots=True)
class Frame:
    """One stack frame as the snapshot records it."""

    filename: str
    line: int
    name: str

    def text(self) -> str:
        """``"{filename}:{line} in {name}"``, the frame format of vramlens stack strings."""
        return f"{self.filename}:{self.line} in {self.name}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Block:
    """A piece of a segment: handed out (``active_*``) or cached free (``inactive``)."""

    address: int
    size: int
    """Bytes the block spans (the allocator's rounded size)."""
    requested_size: int
    """Bytes the caller asked for (``size`` for inactive blocks of old files)."""
    state: str
    """``active_allocated``, ``active_pending_free`` or ``inactive``."""
    stack: int = -1
    """Index into :attr:`Snapshot.stacks` of the allocation's stack (-1: none recorded)."""

    @property
    def active(self) -> bool:
        """Whether the block holds memory of a live (or not yet released) allocation."""
        return self.state in ACTIVE_STATES


@dataclass(frozen=True, kw_only=True, slots=True)
class Segment:
    """One ``cudaMalloc`` (or one expandable-segment range) and its blocks, in address order."""

    device: int
    address: int
    total_size: int
    stream: int = 0
    segment_type: str = "large"
    pool_id: tuple[int, int] = (0, 0)
    is_expandable: bool = False
    stack: int = -1
    blocks: tuple[Block, ...] = ()

    @property
    def allocated_bytes(self) -> int:
        """Bytes of ``active_allocated`` blocks (rounded sizes: PyTorch's ``allocated_size``)."""
        return sum(block.size for block in self.blocks if block.state == "active_allocated")

    @property
    def requested_bytes(self) -> int:
        """Requested bytes of the active blocks (allocated or pending free)."""
        return sum(block.requested_size for block in self.blocks if block.active)


@dataclass(frozen=True, kw_only=True, slots=True)
class OomEntry:
    """An ``oom`` trace entry: the allocator could not find ``requested_bytes``."""

    index: int
    """Position of the entry in its device's trace."""
    requested_bytes: int
    device_free_bytes: int | None
    """What the driver reported free (``device_free``)."""
    stream: int
    time_us: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Annotation:
    """One ``external_annotations`` record: a ``record_function`` scope starting or ending."""

    name: str
    stage: str
    """``START`` or ``END`` (upper-cased)."""
    device: int | None
    time_us: int | None


@dataclass(frozen=True, kw_only=True, eq=False, slots=True)
class Trace:
    """One device's trace entries as columns (equal-length numpy arrays, entry order kept).

    Unknown actions stay as rows with action -1, so positions match the file's entries.
    """

    action: npt.NDArray[np.int8]
    """Index into :data:`ACTIONS` (-1: unknown action, ignored)."""
    addr: npt.NDArray[np.uint64]
    """Block or segment address (0 where the entry has none, e.g. ``oom``, ``snapshot``)."""
    size: Int64Array
    """Requested bytes for allocations and frees, mapped bytes for segment entries."""
    stream: Int64Array
    time_us: Int64Array | None
    """Microseconds on the profiler clock (2.2+); None when any entry lacks ``time_us``."""
    stack: npt.NDArray[np.int32]
    """Index into :attr:`Snapshot.stacks` (-1: no frames)."""
    user_metadata: npt.NDArray[np.int32]
    """Index into :attr:`Snapshot.strings` of the entry's ``user_metadata`` (-1: empty)."""
    category: npt.NDArray[np.int32] | None = None
    """Index into :attr:`Snapshot.strings` of a ``category`` field (profiler-derived or
    vramlens-written snapshots; -1: none); None when no entry has one."""
    ooms: tuple[OomEntry, ...] = ()
    unknown_actions: Mapping[str, int] = field(default_factory=dict)
    """Actions vramlens ignored, with their counts."""

    def __len__(self) -> int:
        """Number of entries."""
        return len(self.action)

    @classmethod
    def empty(cls) -> Trace:
        """A trace with no entries."""
        return cls(
            action=np.zeros(0, np.int8),
            addr=np.zeros(0, np.uint64),
            size=np.zeros(0, np.int64),
            stream=np.zeros(0, np.int64),
            time_us=None,
            stack=np.zeros(0, np.int32),
            user_metadata=np.zeros(0, np.int32),
        )


@dataclass(frozen=True, kw_only=True, eq=False, slots=True)
class Snapshot:
    """A PyTorch memory snapshot (any layout), read safely by :func:`~vramlens.snapshot.load_snapshot`."""

    layout: str
    """``1.13-segments`` (a bare list of segments), ``2.0`` (blocks with ``history``) or
    ``2.1+`` (blocks with ``address`` and ``frames``)."""
    segments: tuple[Segment, ...] = ()
    traces: Mapping[int, Trace] = field(default_factory=dict)
    """Device ordinal -> its trace (devices whose trace is empty are left out)."""
    devices: tuple[int, ...] = ()
    """Devices with segments or trace entries, ascending."""
    allocator_settings: Mapping[str, Any] = field(default_factory=dict)
    annotations: tuple[Annotation, ...] = ()
    stacks: tuple[tuple[Frame, ...], ...] = ()
    """Distinct stacks, innermost frame first (as in the file)."""
    strings: tuple[str, ...] = ()
    """Distinct ``user_metadata`` and ``category`` strings."""
    has_segments: bool = True
    """Whether the file had a ``segments`` list (False: a trace-only dict)."""
    source: str = "<snapshot>"
    """The file it came from (or ``<bytes>``, ``<dict>``), for messages."""

    def trace(self, device: int = 0) -> Trace:
        """The trace of ``device`` (empty when it has none)."""
        return self.traces.get(device) or Trace.empty()

    def segments_on(self, device: int = 0) -> tuple[Segment, ...]:
        """The segments of ``device``."""
        return tuple(segment for segment in self.segments if segment.device == device)

    def reserved_bytes(self, device: int = 0) -> int | None:
        """Bytes the allocator held on ``device`` when the snapshot was taken (None without segments)."""
        if not self.has_segments:
            return None
        return sum(segment.total_size for segment in self.segments_on(device))

    def stack_text(self, index: int) -> str | None:
        """A stack as a vramlens stack string (frames outermost first, one per line); None for -1."""
        if index < 0:
            return None
        return "\n".join(frame.text() for frame in reversed(self.stacks[index]))

    def check_device(self, device: int) -> None:
        """Raise a one-line :class:`InputError` when ``device`` has nothing in this snapshot
        (an empty snapshot still has an empty device 0)."""
        if device not in (self.devices or (0,)):
            known = ", ".join(map(str, self.devices)) or "none"
            raise InputError(f"device: {device} has no segments or trace entries in {self.source}; devices: {known}")

    def timeline(self, device: int = 0) -> Timeline:
        """The snapshot's allocations on ``device`` as a :class:`~vramlens.result.timeline.Timeline`
        (same as :func:`vramlens.snapshot.snapshot_timeline`)."""
        from vramlens.snapshot.convert import snapshot_timeline

        return snapshot_timeline(self, device)
