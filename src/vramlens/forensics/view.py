"""``vramlens view``: everything a memory record tells, computed (rendering: :mod:`vramlens.report.view_text`).

:func:`build_view` turns an opened :class:`~vramlens.forensics.sources.Source` (or a bare
:class:`~vramlens.result.timeline.Timeline`) into a :class:`ViewReport`:

* the peak at each memory level known for the source: ``tensor`` (requested/raw bytes),
  ``allocated`` (each allocation rounded up to the CUDA caching allocator's 512-byte blocks,
  as :func:`vramlens.result.timeline.allocated_timeline` does; a snapshot's trace holds
  requested sizes, so its block sizes are rebuilt the same way), ``reserved`` measured (a
  snapshot's segments at dump time) and modelled (the events replayed through
  :func:`vramlens.allocator.replay`), ``device`` only when the record has it;
* the breakdown at the allocated peak by category and by module, the phases, the largest
  allocations live at the peak, leaks across steps and OOM forensics
  (:mod:`vramlens.forensics.live`, :mod:`vramlens.forensics.oom`);
* a :class:`~vramlens.result.report.MemoryReport` (engine ``measured`` or ``snapshot``) whose
  ``to_dict()`` is the JSON contract of WORKLOAD.md, extended by :meth:`ViewReport.to_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from vramlens.allocator import ReplayResult, replay
from vramlens.categories import Category
from vramlens.errors import InputError
from vramlens.forensics.live import (
    Leak,
    LiveAllocation,
    find_leaks,
    lifetimes,
    live_allocations,
    module_breakdown,
    step_ends,
)
from vramlens.forensics.oom import OomForensics, explain_oom
from vramlens.forensics.sources import Source, SourceFormat
from vramlens.result.report import MemoryReport, PhaseMemory
from vramlens.result.timeline import CATEGORY_ORDER, Timeline, allocated_timeline
from vramlens.units import format_bytes

__all__ = ["NO_PHASE", "Levels", "ViewReport", "build_view", "categories_status"]

#: Phase name of events recorded outside any phase (snapshots without annotations).
NO_PHASE = "(no phase)"
_ENGINES = ("estimate", "simulate", "measured", "snapshot")


@dataclass(frozen=True, kw_only=True, slots=True)
class Levels:
    """Peak bytes at each memory level, None where the record cannot tell."""

    tensor_bytes: int | None
    """Peak of requested (raw storage) bytes; None for allocated-level timelines."""
    allocated_bytes: int
    allocated_source: str
    reserved_at_dump_bytes: int | None
    """Sum of the snapshot's segments when it was dumped (measured)."""
    reserved_peak_bytes: int | None
    """Peak reserved over the trace, rebuilt from the segments and the segment entries (measured;
    metadata ``reserved_peak_bytes`` of :func:`vramlens.snapshot.snapshot_timeline`)."""
    allocated_at_dump_bytes: int | None
    """The snapshot's own block sizes of the active blocks at dump time (measured)."""
    cuda_max_allocated_bytes: int | None
    """``torch.cuda.max_memory_allocated()`` as a CUDA recorder stored it (metadata
    ``max_memory_allocated_bytes``; since the process began or the last peak reset)."""
    replayed_reserved_bytes: int | None
    """Peak reserved of the events replayed through vramlens' caching-allocator model."""
    device_bytes: int | None

    @property
    def reserved_bytes(self) -> int:
        """The report's reserved peak: the measured peak (segments and segment entries), else at
        least the segments at dump; never below the allocated peak; allocated when no segments
        are known."""
        measured = self.reserved_peak_bytes if self.reserved_peak_bytes is not None else self.reserved_at_dump_bytes
        return max(measured or 0, self.allocated_bytes)


@dataclass(frozen=True, kw_only=True, eq=False)
class ViewReport:
    """What one memory record says (see the module docstring)."""

    path: str
    format: str
    levels: Levels
    peak_index: int
    categories: str
    """``recorded``, ``inferred`` or ``unknown``."""
    modules: tuple[tuple[str, int], ...]
    """Allocated bytes live at the peak by allocating module, largest first (at most ``modules``)."""
    top_allocations: tuple[LiveAllocation, ...]
    steps: tuple[int, ...]
    """Last event of each step found (see :func:`~vramlens.forensics.live.step_ends`)."""
    steps_rule: str
    leaks: tuple[Leak, ...]
    """The ``top`` leaks with the largest growth per step."""
    leaks_found: int
    ooms: tuple[OomForensics, ...]
    report: MemoryReport
    identities: bool
    """Whether the record has allocations (False: per-category totals only)."""

    @property
    def timeline(self) -> Timeline:
        """The record's events (the report keeps them)."""
        assert self.report.timeline is not None
        return self.report.timeline

    def to_dict(self) -> dict[str, Any]:
        """The MemoryReport dict plus ``source``, ``modules``, ``top_allocations``, ``steps``,
        ``leaks`` and ``oom``; ``peak.device_bytes`` is null when the device level is unknown."""
        data = self.report.to_dict()
        levels = self.levels
        data["levels"].update(
            tensor_peak_bytes=levels.tensor_bytes,
            allocated_source=levels.allocated_source,
            reserved_at_dump_bytes=levels.reserved_at_dump_bytes,
            reserved_peak_measured_bytes=levels.reserved_peak_bytes,
            allocated_at_dump_bytes=levels.allocated_at_dump_bytes,
            max_memory_allocated_bytes=levels.cuda_max_allocated_bytes,
            replayed_reserved_peak_bytes=levels.replayed_reserved_bytes,
        )
        data["source"] = {"path": self.path, "format": self.format, "categories": self.categories}
        data["modules"] = [{"module": name, "bytes": value} for name, value in self.modules]
        data["top_allocations"] = [item.to_dict() for item in self.top_allocations]
        data["steps"] = {
            "count": len(self.steps),
            "found_by": self.steps_rule,
            "last_events": list(self.steps),
            "leaks_found": self.leaks_found,
        }
        data["leaks"] = [leak.to_dict() for leak in self.leaks]
        data["oom"] = [oom.to_dict() for oom in self.ooms]
        return data


def categories_status(timeline: Timeline) -> str:
    """``recorded`` / ``inferred`` from the record's metadata; without it, ``recorded`` when any
    event has a category other than ``other``, else ``unknown``."""
    stated = timeline.metadata.get("categories")
    if stated in ("recorded", "inferred"):
        return str(stated)
    if stated == "none":
        return "unknown"
    other = CATEGORY_ORDER.index(Category.OTHER)
    return "recorded" if bool(np.any(timeline.category != other)) else "unknown"


def build_view(
    source: Source | Timeline,
    *,
    top: int = 10,
    modules: int = 10,
    leak_steps: int = 2,
    replay_allocator: bool = True,
) -> ViewReport:
    """Compute the view of ``source`` (a Timeline is viewed as a vramlens timeline named "timeline").

    ``top``: allocations listed at the peak and at each OOM; ``modules``: modules listed;
    ``leak_steps``: step ends an allocation must survive to count as a leak;
    ``replay_allocator``: replay the events through the caching-allocator model (about 2 s per
    10**6 events) for the modelled reserved peak and the cached bytes at OOMs.
    """
    if isinstance(source, Timeline):
        source = Source(path="timeline", format=SourceFormat.TIMELINE, timeline=source, identities=True)
    timeline = source.timeline
    if not len(timeline):
        raise InputError(f"{source.path}: has no memory events; nothing to view")
    whole = timeline.level == "allocated" or not source.identities
    rounded = timeline if whole else allocated_timeline(timeline)
    peak = rounded.peak_index
    lives = lifetimes(timeline) if source.identities else None
    notes = list(source.notes)
    replayed = _replay(source, notes) if replay_allocator and source.identities else None
    levels = _levels(timeline, rounded, replayed, rounding=not whole)
    steps, rule = step_ends(timeline) if lives is not None else ((), "no allocations in this record")
    leaks = find_leaks(timeline, lives, steps, min_steps=leak_steps) if lives is not None else ()
    ooms = timeline.metadata.get("oom") or []
    if not isinstance(ooms, list) or not all(isinstance(entry, Mapping) for entry in ooms):
        raise InputError(f"{source.path}: metadata.oom must be a list of objects")
    return ViewReport(
        path=source.path,
        format=source.format.value,
        levels=levels,
        peak_index=peak,
        categories=categories_status(timeline),
        modules=tuple(module_breakdown(rounded, lives, peak).items())[:modules] if lives is not None else (),
        top_allocations=live_allocations(timeline, lives, peak, top) if lives is not None else (),
        steps=steps,
        steps_rule=rule,
        leaks=leaks[:top],
        leaks_found=len(leaks),
        ooms=tuple(
            explain_oom(entry, timeline=timeline, rounded=rounded, lives=lives, replayed=replayed, top=top)
            for entry in ooms
        ),
        report=_memory_report(source, rounded, levels, notes),
        identities=source.identities,
    )


def _replay(source: Source, notes: list[str]) -> ReplayResult | None:
    """The events through the caching-allocator model with the run's own settings (or defaults)."""
    timeline = source.timeline
    try:
        return replay(timeline.nbytes, timeline.storage, settings=source.allocator)
    except ValueError as error:
        notes.append(f"allocator replay skipped: {error}")
        return None


def _levels(timeline: Timeline, rounded: Timeline, replayed: ReplayResult | None, *, rounding: bool) -> Levels:
    """The peak at each level (module docstring); ``rounding``: whether allocated was rebuilt by
    rounding each allocation (else the record's bytes are taken as they are)."""
    if rounding:
        source = "each allocation rounded up to 512-byte blocks (kMinBlockSize)"
    elif timeline.level == "allocated":
        source = "the record's own allocated sizes"
    else:
        source = "the record's bytes as they are (per-category totals: no allocations to round)"
    return Levels(
        tensor_bytes=timeline.peak_bytes if timeline.level == "tensor" else None,
        allocated_bytes=rounded.peak_bytes,
        allocated_source=source,
        reserved_at_dump_bytes=_count(timeline, "reserved_bytes"),
        reserved_peak_bytes=_count(timeline, "reserved_peak_bytes") or _count(timeline, "max_memory_reserved_bytes"),
        cuda_max_allocated_bytes=_count(timeline, "max_memory_allocated_bytes") or None,
        allocated_at_dump_bytes=_count(timeline, "segments_allocated_bytes"),
        replayed_reserved_bytes=replayed.peak_reserved_bytes if replayed is not None else None,
        device_bytes=_count(timeline, "device_bytes"),
    )


def _count(timeline: Timeline, key: str) -> int | None:
    """An integer of the record's metadata (bytes), None when absent or not an integer."""
    value = timeline.metadata.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _phase_memories(rounded: Timeline) -> tuple[list[PhaseMemory], str]:
    """Each phase at its allocated high point, in table order (events outside phases form
    ``NO_PHASE`` when they hold the peak or no phase exists), and the name of the peak's phase.
    Vectorised: :func:`_first_highest` finds every phase's first highest event, one cumulative
    sum per category gives the breakdowns there (thousands of annotated phases cost no more)."""
    live, codes = rounded.live_bytes, rounded.phase.astype(np.int64)
    first = _first_highest(live, codes)
    peak_code = int(codes[rounded.peak_index])
    named = first[codes[first] >= 0]
    ats = np.concatenate([named, first[codes[first] < 0]]) if peak_code < 0 or not len(named) else named
    breakdowns = _breakdowns_at(rounded, ats)
    found = []
    for at, breakdown in zip(ats.tolist(), breakdowns, strict=True):
        code = int(codes[at])
        module = rounded.modules[rounded.module[at]] if rounded.module[at] >= 0 else "-"
        name = rounded.phases[code] if code >= 0 else NO_PHASE
        found.append(
            PhaseMemory(name=name, allocated_bytes=int(live[at]), breakdown=breakdown, note=f"event {at} in {module}")
        )
    return found, rounded.phases[peak_code] if peak_code >= 0 else NO_PHASE


def _first_highest(live: npt.NDArray[np.int64], codes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """For each distinct code, ascending, the first position where ``live`` is highest among the
    positions of that code: two scatter passes (``ufunc.at``), linear in the events."""
    offset = codes - codes.min()
    size = int(offset.max()) + 1
    highest = np.full(size, np.iinfo(np.int64).min)
    np.maximum.at(highest, offset, live)
    hits = np.flatnonzero(live == highest[offset])
    firsts = np.full(size, len(live))
    np.minimum.at(firsts, offset[hits], hits)
    return firsts[firsts < len(live)]


def _breakdowns_at(timeline: Timeline, indexes: npt.NDArray[np.int64]) -> list[dict[Category, int]]:
    """Live bytes per category after each of ``indexes`` (``base_bytes`` as ``other``)."""
    found: list[dict[Category, int]] = [{} for _ in range(len(indexes))]
    for code in np.unique(timeline.category).tolist():
        curve = np.cumsum(np.where(timeline.category == code, timeline.nbytes, 0))[indexes]
        for breakdown, value in zip(found, curve.tolist(), strict=True):
            if value:
                breakdown[CATEGORY_ORDER[code]] = int(value)
    return [_with_base(breakdown, timeline.base_bytes) for breakdown in found]


def _with_base(breakdown: dict[Category, int], base: int) -> dict[Category, int]:
    """Memory live before the first event is not itemised: it counts as ``other``."""
    if base:
        breakdown[Category.OTHER] = breakdown.get(Category.OTHER, 0) + base
    return breakdown


def _memory_report(source: Source, rounded: Timeline, levels: Levels, notes: list[str]) -> MemoryReport:
    """The MemoryReport of the record (engine: snapshot, or the record's own, else measured)."""
    metadata = source.timeline.metadata
    phases, peak_phase = _phase_memories(rounded)
    engine = metadata.get("engine") if metadata.get("engine") in _ENGINES else "measured"
    if source.format is SourceFormat.SNAPSHOT:
        engine = "snapshot"
    workload = metadata.get("workload")
    model = metadata.get("model")
    return MemoryReport(
        engine=str(engine),
        model=model if isinstance(model, str) else _stem(source.path),
        workload=dict(workload) if isinstance(workload, Mapping) else {},
        phases=tuple(phases),
        peak_phase=peak_phase,
        allocated_bytes=levels.allocated_bytes,
        reserved_bytes=levels.reserved_bytes,
        device_bytes=levels.device_bytes if levels.device_bytes is not None else levels.reserved_bytes,
        device_known=levels.device_bytes is not None,
        assumptions=tuple([*notes, *_level_notes(source, levels)]),
        timeline=source.timeline,
    )


def _stem(path: str) -> str:
    """The file name without its format suffixes (``run.raw.json.gz`` -> ``run``)."""
    name = Path(path).name
    while (suffix := Path(name).suffix.lower()) in (".gz", ".json", ".raw", ".npz", ".pkl", ".pickle"):
        name = name[: -len(suffix)]
    return name or Path(path).name


def _level_notes(source: Source, levels: Levels) -> list[str]:
    """What each level is and where it came from (the report's assumptions)."""
    notes = []
    if levels.tensor_bytes is not None:
        notes.append(
            f"tensor peak {format_bytes(levels.tensor_bytes)} (requested bytes); allocated: {levels.allocated_source}"
        )
    if levels.reserved_peak_bytes is not None:
        how = (
            "the snapshot's segments at dump time and the trace's segment entries"
            if _count(source.timeline, "reserved_peak_bytes") is not None
            else "torch.cuda.max_memory_reserved() as the recorder read it"
        )
        notes.append(f"reserved: the measured peak ({format_bytes(levels.reserved_peak_bytes)}), from {how}")
    elif levels.reserved_at_dump_bytes is not None:
        notes.append(
            f"reserved: the snapshot's segments at dump time ({format_bytes(levels.reserved_at_dump_bytes)}); "
            "the peak during the run was at least that and at least the allocated peak"
        )
    else:
        notes.append("reserved: no allocator segments in this record, so reserved_bytes repeats allocated")
    if levels.replayed_reserved_bytes is not None:
        notes.append(
            f"the allocator replay (vramlens' model of the CUDA caching allocator) reserves "
            f"{format_bytes(levels.replayed_reserved_bytes)} at its peak"
        )
    if source.timeline.metadata.get("trace_overflowed") is True:
        notes.append("the snapshot's trace overflowed its ring buffer: allocations older than it count as pre-existing")
    if levels.device_bytes is None:
        notes.append("device level not recorded (nvidia-smi adds the CUDA context and libraries): left unknown")
    return notes
