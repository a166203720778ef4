"""The planner's search: which configurations fit a GPU with headroom, ranked by step time.

For each structural group (:mod:`vramlens.plan.candidates`) the search first estimates the most
memory-saving point of the knob grid; if even that does not fit, the whole group is skipped
(monotonicity: every knob axis only lowers the peak). Otherwise it finds the *fitting
frontier*: the fitting points with no fitting point one step less memory-saving on any axis.
Points beyond the frontier are implied to fit and are not estimated: they would only use less
memory and (by the same step) more time, and the requested headroom already is the user's
memory margin. (Where the time model prices a step as free, e.g. 8-bit optimizer state or a
chunked loss, the tie goes to the configuration with fewer changes.) The micro-batch axis is bisected per choice of the other axes, bounded by what
the less memory-saving neighbours already found. Every kept point was estimated on its own.

Kept points are then timed (``time_model``), points dominated in (device peak, step time) are
dropped, and the rest are returned fastest first. Fits means ``device peak <= capacity x
(1 - headroom)`` (the device level: what nvidia-smi shows, allocator slack and CUDA context
included). The model is loaded once and put into every workload (``dataclasses.replace``), so
a configuration costs one estimate (~0.15 ms) plus, if kept, one time estimate.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vramlens.errors import InputError
from vramlens.estimate import estimate_resolved
from vramlens.hardware import GpuSpec
from vramlens.model.spec import ModelSpec
from vramlens.plan.candidates import Group, Knobs, apply_knobs, groups, knob_axes
from vramlens.report.model import MemoryReport
from vramlens.workload.spec import Workload

__all__ = ["Evaluated", "SearchResult", "fits_at_most_saving", "fits_with_headroom", "pareto", "search", "search_group"]

TimeModel = Callable[[Workload, MemoryReport], float]
Progress = Callable[[int, int], None]


def fits_with_headroom(report: MemoryReport, headroom: float) -> bool:
    """Device-level peak <= capacity x (1 - headroom) (False without a capacity)."""
    if report.capacity_bytes is None:
        return False
    return report.device_bytes <= report.capacity_bytes * (1.0 - headroom)


@dataclass(frozen=True, kw_only=True, slots=True)
class Evaluated:
    """A fitting frontier configuration, estimated and timed."""

    workload: Workload
    report: MemoryReport
    seconds: float
    """The time model's step time (seconds per optimizer step, global batch unchanged)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchResult:
    """What a search saw: the fitting frontier and its counts."""

    frontier: tuple[Evaluated, ...]
    considered: int
    """Configurations covered (estimated, implied to fit, or skipped with their group)."""
    estimated: int
    """Configurations the estimator ran on."""


def _estimate(spec: ModelSpec, workload: Workload, gpu: GpuSpec) -> MemoryReport | None:
    try:
        return estimate_resolved(spec, workload, gpu)
    except InputError:
        return None


def _build(user: Workload, group: Group, point: tuple[object, ...]) -> Workload | None:
    recompute, loss, optimizer, offload, micro = point
    knobs = Knobs(recompute=recompute, loss=loss, optimizer=optimizer, offload=offload, micro_batch=micro)  # type: ignore[arg-type]
    try:
        return apply_knobs(user, group, knobs)
    except InputError:
        return None


@dataclass(kw_only=True, slots=True)
class _Counter:
    estimated: int = 0


def _fits(
    spec: ModelSpec, gpu: GpuSpec, headroom: float, workload: Workload | None, counter: _Counter
) -> MemoryReport | None:
    if workload is None:
        return None
    counter.estimated += 1
    report = _estimate(spec, workload, gpu)
    return report if report is not None and fits_with_headroom(report, headroom) else None


def fits_at_most_saving(
    spec: ModelSpec, user: Workload, group: Group, gpu: GpuSpec, headroom: float, counter: _Counter | None = None
) -> bool:
    """Whether ``group`` fits at the most memory-saving point of its knob grid (if not, no point
    of the group fits: every knob axis only lowers the peak)."""
    top = tuple(axis[-1] for axis in knob_axes(user, group))
    return _fits(spec, gpu, headroom, _build(user, group, top), counter or _Counter()) is not None


def _first_fitting(fits: Callable[[int], bool], high: int) -> int:
    """The smallest index in [0, high] that fits, given that ``high`` fits (monotone axis)."""
    low = -1  # invariant: low does not fit (or is -1), high fits
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle
    return high


def search_group(
    spec: ModelSpec,
    user: Workload,
    group: Group,
    gpu: GpuSpec,
    headroom: float,
    counter: _Counter,
) -> tuple[list[tuple[Workload, MemoryReport]], int]:
    """The fitting frontier of one group, and how many grid points it covered.

    The last axis (micro-batch) is searched by bisection in each *column* (a choice of the
    other axes); a column's first fitting index is at most that of every column one step
    less memory-saving on one axis (monotonicity), and its first fitting point is on the
    frontier only if it is strictly earlier than in each of those columns.
    """
    axes = knob_axes(user, group)
    *heads, last = axes
    total = len(last)
    for axis in heads:
        total *= len(axis)
    if not fits_at_most_saving(spec, user, group, gpu, headroom, counter):
        return [], total
    first: dict[tuple[int, ...], int] = {}  # column -> first fitting micro-batch index (len(last): none)
    reports: dict[tuple[tuple[int, ...], int], tuple[Workload, MemoryReport]] = {}
    frontier: list[tuple[Workload, MemoryReport]] = []
    for column in sorted(itertools.product(*(range(len(a)) for a in heads)), key=sum):
        before = [(*column[:i], column[i] - 1, *column[i + 1 :]) for i in range(len(column)) if column[i]]
        bound = min((first[c] for c in before), default=len(last))

        def fits(index: int, column: tuple[int, ...] = column) -> bool:
            point = (*tuple(a[i] for a, i in zip(heads, column, strict=True)), last[index])
            workload = _build(user, group, point)
            report = _fits(spec, gpu, headroom, workload, counter)
            if report is not None and workload is not None:
                reports[(column, index)] = (workload, report)
            return report is not None

        # most columns gain nothing over their predecessors: one estimate (bound - 1) shows it
        found = _first_fitting(fits, bound - 1) if bound > 0 and fits(bound - 1) else bound
        first[column] = found
        if found < bound:  # nothing one step less memory-saving fits at this micro-batch
            frontier.append(reports[(column, found)])
    return frontier, total


def search(
    spec: ModelSpec,
    user: Workload,
    gpu: GpuSpec,
    *,
    gpus: int,
    headroom: float,
    allow_method_change: bool,
    time_model: TimeModel,
    progress: Progress | None = None,
) -> SearchResult:
    """The fitting frontier over every group for ``gpus`` GPUs, each point timed."""
    user = dataclasses.replace(user, model=spec)
    all_groups = groups(user, gpus, allow_method_change=allow_method_change)
    counter = _Counter()
    considered = 0
    frontier: list[Evaluated] = []
    for done, group in enumerate(all_groups, start=1):
        found, covered = search_group(spec, user, group, gpu, headroom, counter)
        considered += covered
        frontier.extend(Evaluated(workload=w, report=r, seconds=time_model(w, r)) for w, r in found)
        if progress is not None:
            progress(done, len(all_groups))
    return SearchResult(frontier=tuple(frontier), considered=considered, estimated=counter.estimated)


def pareto(points: Sequence[Evaluated]) -> list[Evaluated]:
    """Points not dominated in (device peak, seconds), fastest first.

    A point is dominated when another has lower-or-equal peak and lower-or-equal time and is
    strictly better in one; exact ties are kept once (the first seen).
    """
    ordered = sorted(points, key=lambda p: (p.seconds, p.report.device_bytes))
    kept: list[Evaluated] = []
    best_peak: int | None = None
    for point in ordered:
        if best_peak is None or point.report.device_bytes < best_peak:
            kept.append(point)
            best_peak = point.report.device_bytes
    return kept
