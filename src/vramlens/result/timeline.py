"""``Timeline``: a columnar store of memory events, shared by every engine (no torch import).

One row per event: an allocation (positive ``nbytes``) or a free (negative ``nbytes``) of
one storage. Columns are numpy arrays of equal length; strings (phases, modules, stacks)
live in tables and the columns hold indexes into them (-1 = none). Everything derived
(the live-bytes curve, the peak, the breakdown at an instant, per-phase and per-module
peaks) is computed with vectorised numpy, so 10**7 events cost about 0.3 GB and well
under a second per query.

Live bytes at event ``i`` are ``base_bytes + cumsum(nbytes)[i]``: the total after the
event has happened. ``base_bytes`` is memory that existed before the first event and is
not itemised (0 when pre-existing tensors are recorded as events, as the tracker does).

Events are built with :class:`TimelineBuilder` (cheap appends into ``array`` buffers) and
frozen into a :class:`Timeline`. Saved files are described in ``docs/timeline-format.md``
and handled by :mod:`vramlens.trace.timeline_io`.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from vramlens.allocator._blocks import K_MIN_BLOCK_SIZE
from vramlens.categories import CATEGORY_ORDER, Category
from vramlens.errors import InputError

__all__ = ["CATEGORY_ORDER", "Timeline", "TimelineBuilder", "allocated_timeline"]


_COLUMNS = ("time", "nbytes", "category", "phase", "module", "stack", "storage")
Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True, eq=False)
class Timeline:
    """Memory events of one run, in order. Immutable; build with :class:`TimelineBuilder`."""

    time: Int64Array
    """When each event happened: nanoseconds since the start, or the event's sequence number
    (see ``time_unit``)."""
    nbytes: Int64Array
    """Signed bytes: positive for an allocation, negative for a free."""
    category: npt.NDArray[np.int8]
    """Index into :data:`CATEGORY_ORDER`."""
    phase: npt.NDArray[np.int32]
    """Index into ``phases`` (-1: outside any phase)."""
    module: npt.NDArray[np.int32]
    """Index into ``modules``: the innermost module running at the event (-1: none)."""
    stack: npt.NDArray[np.int32]
    """Index into ``stacks`` (-1: not captured)."""
    storage: Int64Array
    """Identity of the storage (or allocator block) the event belongs to."""
    phases: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    stacks: tuple[str, ...] = ()
    """Python stacks, one string per distinct stack, frames separated by newlines."""
    base_bytes: int = 0
    """Bytes live before the first event and not itemised."""
    time_unit: str = "event"
    """``ns`` or ``event``."""
    level: str = "tensor"
    """What the bytes are: ``tensor`` (raw storage bytes) or ``allocated`` (allocator-rounded)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """JSON-safe free-form facts about the run (source, model, device, ...)."""
    stream: npt.NDArray[np.int8] | None = None
    """The CUDA stream each event's storage was allocated on (:class:`vramlens.allocator.streams.Stream`
    ids; the caching allocator keeps each stream's freed blocks apart); None: all on the default stream."""

    def __post_init__(self) -> None:
        n = len(self.nbytes)
        for name in (*_COLUMNS, "stream") if self.stream is not None else _COLUMNS:
            column = getattr(self, name)
            if not isinstance(column, np.ndarray) or column.ndim != 1 or len(column) != n:
                raise InputError(f"timeline.{name}: must be a 1-D array of {n} events")
        _check_index(self.category, len(CATEGORY_ORDER), "category")
        _check_index(self.phase, len(self.phases), "phase")
        _check_index(self.module, len(self.modules), "module")
        _check_index(self.stack, len(self.stacks), "stack")
        if self.time_unit not in ("ns", "event"):
            raise InputError(f"timeline.time_unit: {self.time_unit!r}; accepted: ns, event")
        if self.level not in ("tensor", "allocated"):
            raise InputError(f"timeline.level: {self.level!r}; accepted: tensor, allocated")

    def __len__(self) -> int:
        return len(self.nbytes)

    @cached_property
    def live_bytes(self) -> Int64Array:
        """Live bytes after each event (int64, one entry per event)."""
        curve = np.cumsum(self.nbytes, dtype=np.int64)
        if self.base_bytes:
            curve += self.base_bytes
        curve.setflags(write=False)
        return curve

    @property
    def peak_index(self) -> int:
        """The first event at which live bytes reach their maximum (-1 for an empty timeline)."""
        return int(np.argmax(self.live_bytes)) if len(self) else -1

    @property
    def peak_bytes(self) -> int:
        """Highest live total (``base_bytes`` for an empty timeline)."""
        return int(self.live_bytes.max()) if len(self) else self.base_bytes

    @property
    def end_bytes(self) -> int:
        """Live bytes after the last event."""
        return int(self.live_bytes[-1]) if len(self) else self.base_bytes

    def breakdown_at(self, index: int | None = None) -> dict[Category, int]:
        """Live bytes per category after event ``index`` (default: the peak). Zero categories omitted.

        ``base_bytes`` is not itemised and so is not in the breakdown.
        """
        if index is None:
            index = self.peak_index
        if not -1 <= index < len(self):
            raise InputError(f"index: {index} is outside the timeline's {len(self)} events")
        upto = slice(0, index + 1)
        sums = np.bincount(self.category[upto], weights=None, minlength=len(CATEGORY_ORDER))
        result: dict[Category, int] = {}
        for code in np.flatnonzero(sums):
            mask = self.category[upto] == code
            total = int(self.nbytes[upto][mask].sum(dtype=np.int64))
            if total:
                result[CATEGORY_ORDER[code]] = total
        return result

    def category_curve(self, category: Category) -> Int64Array:
        """Live bytes of one category after each event."""
        code = CATEGORY_ORDER.index(Category(category))
        return np.cumsum(np.where(self.category == code, self.nbytes, 0), dtype=np.int64)

    def phase_peaks(self) -> dict[str, int]:
        """Highest live total reached during each phase's events, in table order (absent phases omitted)."""
        return _group_max(self.phase, self.live_bytes, self.phases)

    def module_peaks(self) -> dict[str, int]:
        """Highest live total reached while each module was the innermost one running."""
        return _group_max(self.module, self.live_bytes, self.modules)

    def phase_spans(self) -> list[tuple[str, int, int]]:
        """Contiguous runs of one phase as ``(name, first event, last event)``, in order."""
        if not len(self):
            return []
        starts = np.flatnonzero(np.diff(self.phase, prepend=np.int32(-2)))
        ends = np.append(starts[1:] - 1, len(self) - 1)
        return [
            (self.phases[code] if code >= 0 else "", int(start), int(end))
            for code, start, end in zip(self.phase[starts].tolist(), starts.tolist(), ends.tolist(), strict=True)
        ]

    def peak_of(self, start: int, stop: int) -> tuple[int, int]:
        """``(peak bytes, event index)`` over events ``start..stop-1``."""
        if not 0 <= start < stop <= len(self):
            raise InputError(f"range: {start}..{stop} is outside the timeline's {len(self)} events")
        window = self.live_bytes[start:stop]
        offset = int(np.argmax(window))
        return int(window[offset]), start + offset


def _check_index(column: npt.NDArray[Any], size: int, name: str) -> None:
    if len(column) and (int(column.min()) < (0 if name == "category" else -1) or int(column.max()) >= size):
        raise InputError(f"timeline.{name}: codes must index the {name} table of {size} entries")


def _group_max(codes: npt.NDArray[np.int32], values: Int64Array, names: tuple[str, ...]) -> dict[str, int]:
    if not len(codes) or not names:
        return {}
    result = np.full(len(names) + 1, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(result, codes.astype(np.int64) + 1, values)
    return {name: int(result[i + 1]) for i, name in enumerate(names) if result[i + 1] != np.iinfo(np.int64).min}


class TimelineBuilder:
    """Collects events one at a time (cheap appends) and freezes them into a :class:`Timeline`.

    Strings are interned: ``code(table, name)`` returns the table index of a name, adding
    it on first use.
    """

    def __init__(self, *, time_unit: str = "event", level: str = "tensor") -> None:
        self.time_unit = time_unit
        self.level = level
        self._columns = {name: array("q") for name in ("time", "nbytes", "storage")}
        self._codes = {name: array("i") for name in ("phase", "module", "stack")}
        self._category = array("b")
        self._tables: dict[str, dict[str, int]] = {"phase": {}, "module": {}, "stack": {}}
        # Bound appends of each column, looked up once (the per-event path is hot).
        self._time, self._nbytes, self._storage = (self._columns[name].append for name in ("time", "nbytes", "storage"))
        self._phase, self._module, self._stack = (self._codes[name].append for name in ("phase", "module", "stack"))
        self._category_append = self._category.append

    def __len__(self) -> int:
        return len(self._category)

    def code(self, table: str, name: str | None) -> int:
        """Index of ``name`` in ``table`` (phase, module or stack), added if new; -1 for None."""
        if name is None:
            return -1
        names = self._tables[table]
        found = names.get(name)
        if found is None:
            found = names[name] = len(names)
        return found

    def add(
        self, *, time: int, nbytes: int, category: int, storage: int, phase: int = -1, module: int = -1, stack: int = -1
    ) -> None:
        """Append one event. ``category`` is an index into :data:`CATEGORY_ORDER`; the other
        codes come from :meth:`code`."""
        self.append(time, nbytes, category, storage, phase, module, stack)

    def append(self, time: int, nbytes: int, category: int, storage: int, phase: int, module: int, stack: int) -> None:
        """:meth:`add` with positional arguments (the tracker's per-event path)."""
        self._time(time)
        self._nbytes(nbytes)
        self._storage(storage)
        self._category_append(category)
        self._phase(phase)
        self._module(module)
        self._stack(stack)

    def build(self, *, base_bytes: int = 0, metadata: dict[str, Any] | None = None) -> Timeline:
        """Freeze the events collected so far (the builder stays usable)."""
        tables = {name: tuple(names) for name, names in self._tables.items()}
        return Timeline(
            time=np.array(self._columns["time"], dtype=np.int64),
            nbytes=np.array(self._columns["nbytes"], dtype=np.int64),
            category=np.array(self._category, dtype=np.int8),
            phase=np.array(self._codes["phase"], dtype=np.int32),
            module=np.array(self._codes["module"], dtype=np.int32),
            stack=np.array(self._codes["stack"], dtype=np.int32),
            storage=np.array(self._columns["storage"], dtype=np.int64),
            phases=tables["phase"],
            modules=tables["module"],
            stacks=tables["stack"],
            base_bytes=base_bytes,
            time_unit=self.time_unit,
            level=self.level,
            metadata=dict(metadata or {}),
        )


def allocated_timeline(timeline: Timeline) -> Timeline:
    """The timeline with every event rounded to whole 512-byte blocks (the allocator's
    ``kMinBlockSize``; level ``allocated``)."""
    sizes = np.abs(timeline.nbytes)
    rounded = np.sign(timeline.nbytes) * (-(-sizes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)
    return replace(timeline, nbytes=rounded.astype(np.int64), level="allocated")
