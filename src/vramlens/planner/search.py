"""The planner's search: which configurations fit a GPU with headroom, ranked by step time.

For each structural group (:mod:`vramlens.planner.candidates`) the search first estimates the most
memory-saving point of the knob grid; if even that does not fit, the whole group is skipped
(monotonicity: every knob axis only lowers the peak, checked by a property test; the one
exception, the step into gradient accumulation, is searched apart: see :func:`search_group`). Otherwise it
finds the *fitting frontier* (:mod:`vramlens.planner.grid`): the fitting points with no fitting
point one step less memory-saving on any axis. Points beyond the frontier are implied to fit
and are not estimated: they only use less memory and, by the same step, as much time or more
(where the time model prices a step as free, e.g. 8-bit optimizer state or a chunked loss, the
tie goes to the configuration with fewer changes: those change the numerics). Every kept point
was estimated on its own.

Kept points are then timed (``time_model``), points dominated in (device peak, step time) are
dropped, and the rest are returned fastest first. Fits means ``device peak <= capacity x
(1 - headroom)`` (the device level: what nvidia-smi shows, allocator slack and CUDA context
included). The model is loaded once and put into every workload (``dataclasses.replace``), so
a configuration costs one estimate (~0.15 ms) plus, if kept, one time estimate.

The search estimates one GPU's reserved level with the closed form (``reserved_replay: false``,
20-90x faster than replaying the whole step and monotone along the knob axes as the pruning
needs). When the workload asks for the replay (``reserved_replay: true``, the default,
:func:`vramlens.estimator.reserved.replays_whole_step`), only the points the search keeps are
estimated with it, and each stays only if it still fits: a plan's figures are those ``vramlens
estimate`` prints for the same configuration, at a few replays' cost instead of thousands.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vramlens.errors import InputError
from vramlens.estimator import estimate_resolved
from vramlens.hardware import GpuSpec
from vramlens.model.spec import ModelSpec
from vramlens.planner.budget import spend
from vramlens.planner.candidates import RECOMPUTE_CHAINS, Group, Knobs, apply_knobs, groups, knob_axes
from vramlens.planner.grid import minimal_fitting
from vramlens.result.report import MemoryReport
from vramlens.workload.spec import Workload

__all__ = ["Evaluated", "SearchResult", "fits_at_most_saving", "fits_with_headroom", "pareto", "search", "search_group"]

TimeModel = Callable[[Workload, MemoryReport], float]
Progress = Callable[[int, int], None]


def fits_with_headroom(report: MemoryReport, headroom: float) -> bool:
    """The device level's safe figure (:attr:`MemoryReport.fit_bytes`) fits the GPU and its point
    estimate leaves ``headroom`` of it free (False without a capacity)."""
    if report.capacity_bytes is None:
        return False
    return report.fit_bytes <= report.capacity_bytes and report.device_bytes <= report.capacity_bytes * (1.0 - headroom)


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
    spend()  # the plan's budget: stops a search that is too large or cancelled
    counter.estimated += 1
    report = _estimate(spec, workload, gpu)
    return report if report is not None and fits_with_headroom(report, headroom) else None


def fits_at_most_saving(
    spec: ModelSpec, user: Workload, group: Group, gpu: GpuSpec, headroom: float, counter: _Counter | None = None
) -> bool:
    """Whether ``group`` fits at the most memory-saving point of its knob grid, with or without
    gradient accumulation (if neither fits, no point of the group does: see :func:`search_group`);
    with the closed-form reserved level, as the search."""
    user = dataclasses.replace(user, reserved_replay=False)
    return any(_ends_fit(spec, user, group, gpu, headroom, counter or _Counter()))


def _ends_fit(
    spec: ModelSpec, user: Workload, group: Group, gpu: GpuSpec, headroom: float, counter: _Counter
) -> tuple[bool, bool]:
    """At the most memory-saving column: (the smallest micro-batch fits, one micro-batch with
    no gradient accumulation fits)."""
    *heads, micro = knob_axes(spec, user, group)
    top = tuple(axis[-1] for axis in heads)
    smallest = _fits(spec, gpu, headroom, _build(user, group, (*top, micro[-1])), counter) is not None
    if len(micro) == 1:
        return smallest, smallest
    return smallest, _fits(spec, gpu, headroom, _build(user, group, (*top, micro[0])), counter) is not None


#: The order in which a group's no-accumulation points are searched: the head axes with
#: recompute (the longest) moved last, so that it is the bisected axis.
SINGLE_ORDER = (1, 2, 3, 0)


def search_group(
    spec: ModelSpec,
    user: Workload,
    group: Group,
    gpu: GpuSpec,
    headroom: float,
    counter: _Counter,
) -> tuple[list[tuple[Workload, MemoryReport]], int]:
    """The fitting frontier of one group (:func:`vramlens.planner.grid.minimal_fitting`), and how
    many grid points it covered.

    The micro-batch axis has two parts. Index 0 runs the rank's samples as one micro-batch (no
    gradient accumulation): gradients do not exist yet when backward starts, so its peak may be
    *below* that of a smaller micro-batch that accumulates, whose gradients from the previous
    micro-batch sit beside the activations (Mixtral-8x7B on one GPU: 848 GiB at 4x1, 933 GiB
    at 2x2). So the no-accumulation points form their own monotone grid (recompute, loss,
    optimizer, offload) and the accumulating ones (indices 1..) another; each is searched
    only if its most memory-saving point fits, once per recompute chain
    (:data:`~vramlens.planner.candidates.RECOMPUTE_CHAINS`; a point both chains reach is
    estimated once). Each accumulating frontier point's no-accumulation twin (same knobs, the
    rank's samples in one micro-batch) is estimated too and kept when it fits: it is faster,
    and where gradients outweigh the extra activations also smaller, so it can dominate a
    frontier point while lying beyond its own grid's frontier.
    """
    *heads, last = knob_axes(spec, user, group)
    total = len(last) * math.prod(len(axis) for axis in heads)
    smallest, whole = _ends_fit(spec, user, group, gpu, headroom, counter)
    found: dict[tuple[object, ...], tuple[Workload, MemoryReport] | None] = {}

    def fits(values: tuple[object, ...]) -> bool:
        if values not in found:  # the chains share their first and last recompute settings
            workload = _build(user, group, values)
            report = _fits(spec, gpu, headroom, workload, counter)
            found[values] = (workload, report) if report is not None and workload is not None else None
        return found[values] is not None

    frontier: dict[tuple[object, ...], None] = {}  # ordered set
    for chain in RECOMPUTE_CHAINS:
        heads[0] = list(chain)
        frontier |= dict.fromkeys(_chain_frontier(heads, last, fits, smallest=smallest, whole=whole))
    if whole:  # an accumulating point's no-accumulation twin is faster; it may also be smaller
        twins = [(*values[:-1], last[0]) for values in frontier if values[-1] != last[0]]
        frontier |= dict.fromkeys(twin for twin in twins if fits(twin))
    return [point for values in frontier if (point := found[values]) is not None], total


def _chain_frontier(
    heads: list[list[object]],
    last: list[object],
    fits: Callable[[tuple[object, ...]], bool],
    *,
    smallest: bool,
    whole: bool,
) -> list[tuple[object, ...]]:
    """The frontier of one recompute chain: its accumulating grid, then its no-accumulation grid."""

    def accumulating(point: tuple[int, ...]) -> tuple[object, ...]:
        return (*(axis[i] for axis, i in zip(heads, point[:-1], strict=True)), last[point[-1] + 1])

    def single(point: tuple[int, ...]) -> tuple[object, ...]:
        index = dict(zip(SINGLE_ORDER, point, strict=True))
        return (*(axis[index[n]] for n, axis in enumerate(heads)), last[0])

    values = []
    if smallest and len(last) > 1:
        sizes = (*(len(axis) for axis in heads), len(last) - 1)
        values += [accumulating(p) for p in minimal_fitting(sizes, lambda p: fits(accumulating(p)))]
    if whole:
        sizes = tuple(len(heads[n]) for n in SINGLE_ORDER)
        values += [single(p) for p in minimal_fitting(sizes, lambda p: fits(single(p)))]
    return values


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
    """The fitting frontier over every group for ``gpus`` GPUs, each point estimated again as
    ``user`` says (see the module docstring) and timed."""
    user = dataclasses.replace(user, model=spec)
    closed = dataclasses.replace(user, reserved_replay=False)
    all_groups = groups(closed, gpus, allow_method_change=allow_method_change)
    counter = _Counter()
    considered = 0
    frontier: list[Evaluated] = []
    for done, group in enumerate(all_groups, start=1):
        found, covered = search_group(spec, closed, group, gpu, headroom, counter)
        considered += covered
        kept = [again for w, r in found if (again := _as_user(spec, user, w, r, gpu, headroom)) is not None]
        frontier.extend(Evaluated(workload=w, report=r, seconds=time_model(w, r)) for w, r in kept)
        if progress is not None:
            progress(done, len(all_groups))
    return SearchResult(frontier=tuple(frontier), considered=considered, estimated=counter.estimated)


def _as_user(
    spec: ModelSpec, user: Workload, workload: Workload, report: MemoryReport, gpu: GpuSpec, headroom: float
) -> tuple[Workload, MemoryReport] | None:
    """A kept point estimated with the user's ``reserved_replay``; None if it then does not fit."""
    if not user.reserved_replay:
        return workload, report
    workload = dataclasses.replace(workload, reserved_replay=True)
    again = _estimate(spec, workload, gpu)
    return (workload, again) if again is not None and fits_with_headroom(again, headroom) else None


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
