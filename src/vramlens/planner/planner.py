"""``plan()``: which training configurations fit a GPU with headroom, fastest first.

The planner takes the user's workload and searches precision, recompute, sharding, tp/pp,
CPU offload, 8-bit optimizers, loss implementations and micro-batch x grad_accum splits
(keeping the global batch ``batch x grad_accum x dp`` fixed), and with
``allow_method_change`` also LoRA, QLoRA and pure bf16. See :mod:`vramlens.planner.candidates`
for the space and :mod:`vramlens.planner.search` for the pruning. The step-time ranking comes
from :func:`vramlens.estimator.time.step_time` (a roofline-style model: it orders
configurations, it does not promise seconds).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from vramlens.errors import InputError
from vramlens.estimator import estimate_resolved
from vramlens.hardware import GpuSpec, resolve_gpu
from vramlens.model.resolve import load_model
from vramlens.model.spec import ModelSpec
from vramlens.planner.budget import PlanBudget, budget_scope, default_budget
from vramlens.planner.candidates import groups
from vramlens.planner.model import Candidate, Plan, workload_changes
from vramlens.planner.search import (
    Evaluated,
    Progress,
    TimeModel,
    fits_at_most_saving,
    fits_with_headroom,
    pareto,
    search,
)
from vramlens.result.report import MemoryReport
from vramlens.workload.load import load_workload
from vramlens.workload.options import Mode, Shard
from vramlens.workload.spec import Workload

__all__ = ["default_time_model", "plan", "prepare", "smallest_gpus"]

Source = Workload | Mapping[str, Any] | str | os.PathLike[str]
#: GPU counts tried first when looking for the smallest setup that fits (powers of two: every
#: tp/pp degree the planner offers divides them); the counts between the first that fits and
#: half of it are then tried too (see :func:`smallest_gpus`).
GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: GPUs per node: beyond one node, setups grow by whole nodes (DGX/HGX A100 and H100 have 8).
NODE_GPUS = 8


def default_time_model(workload: Workload, report: MemoryReport) -> float:
    """Seconds per optimizer step from :func:`vramlens.estimator.time.step_time`."""
    from vramlens.estimator.time import step_time

    return float(step_time(workload, report).seconds)


def _check_headroom(headroom: float) -> None:
    if not 0.0 <= headroom < 1.0:
        raise InputError(f"headroom: must be a fraction in [0, 1) (e.g. 0.1 keeps 10% free), got {headroom}")


def _with_gpus(user: Workload, gpus: int) -> Workload:
    """The user's workload on ``gpus`` GPUs: same tp/pp when they divide, DDP for extra ranks."""
    base = user.parallel
    tp, pp = (base.tp, base.pp) if gpus % (base.tp * base.pp * base.cp) == 0 else (1, 1)
    shard = base.shard
    dp = gpus // (tp * pp * base.cp) if gpus % (tp * pp * base.cp) == 0 else 0
    if dp > 1 and shard is Shard.NONE:
        shard = Shard.DDP
    degree = base.shard_degree if base.shard_degree is not None and dp % base.shard_degree == 0 else None
    if shard is Shard.HSDP and degree is None:
        shard = Shard.FSDP
    parallel = dataclasses.replace(base, gpus=gpus, tp=tp, pp=pp, shard=shard, shard_degree=degree)
    return dataclasses.replace(user, parallel=parallel)


def prepare(workload: Source, *, gpu: str | None, gpus: int | None) -> tuple[Workload, ModelSpec, GpuSpec]:
    """The user's validated training workload (model loaded once, gpu/gpus applied), spec and GPU."""
    user = load_workload(workload)
    if user.mode is not Mode.TRAIN:
        raise InputError("mode: the planner searches training configurations; use mode: train")
    name = gpu if gpu is not None else user.gpu
    if name is None:
        raise InputError("gpu: the planner needs a GPU (e.g. --gpu a100-80gb, or a size such as 24GiB)")
    if gpus is not None and gpus < 1:
        raise InputError(f"gpus: must be an integer >= 1, got {gpus}")
    spec, device = load_model(user.model), resolve_gpu(name)
    user = dataclasses.replace(user, model=spec, gpu=name)
    return _with_gpus(user, gpus if gpus is not None else user.parallel.gpus), spec, device


def _user_estimate(spec: ModelSpec, user: Workload, gpu: GpuSpec) -> MemoryReport | None:
    try:
        return estimate_resolved(spec, user, gpu)
    except InputError:
        return None


def any_fits(spec: ModelSpec, user: Workload, gpu: GpuSpec, gpus: int, *, headroom: float, method_change: bool) -> bool:
    """Whether some group fits ``gpus`` GPUs at its most memory-saving knob settings."""
    user = _with_gpus(user, gpus)
    return any(
        fits_at_most_saving(spec, user, group, gpu, headroom)
        for group in groups(user, gpus, allow_method_change=method_change)
    )


def smallest_gpus(
    spec: ModelSpec, user: Workload, gpu: GpuSpec, *, headroom: float, method_change: bool, start: int = 1
) -> int | None:
    """The smallest GPU count (>= start) on which some configuration fits, or None.

    Powers of two (:data:`GPU_COUNTS`) first; below the first that fits, every count down to
    half of it is tried too, one by one up to a node (:data:`NODE_GPUS`) and by whole nodes
    beyond (3 or 6 GPUs can fit where 2 or 4 do not; 24 where 16 do not). Not exhaustive below
    that: a count that fits only through batch divisibility (e.g. 3 GPUs where 4 fail) is missed.
    """

    def fits(count: int) -> bool:
        return any_fits(spec, user, gpu, count, headroom=headroom, method_change=method_change)

    found = next((n for n in GPU_COUNTS if n >= start and fits(n)), None)
    if found is None:
        return None
    between = (n for n in range(max(found // 2 + 1, start), found) if n <= NODE_GPUS or n % NODE_GPUS == 0)
    return next((n for n in between if fits(n)), found)


def _impossible(spec: ModelSpec, user: Workload, gpu: GpuSpec, *, headroom: float, allow_method_change: bool) -> str:
    gpus = user.parallel.gpus
    label = f"{gpus} x {gpu.display_name}"
    text = f"nothing fits {label} with {headroom:.0%} headroom, even with every memory saving the planner tries"
    more = smallest_gpus(spec, user, gpu, headroom=headroom, method_change=allow_method_change, start=gpus + 1)
    parts = [text]
    if more is not None:
        parts.append(f"the smallest setup that fits: {more} x {gpu.display_name} (sharded)")
    if not allow_method_change and any_fits(spec, user, gpu, gpus, headroom=headroom, method_change=True):
        parts.append(f"with a method change (LoRA/QLoRA, allow_method_change) it fits {label}")
    if more is None and len(parts) == 1:
        parts.append(f"not even {GPU_COUNTS[-1]} x {gpu.display_name} fit")
    return "; ".join(parts)


def _candidates(
    user: Workload, points: list[Evaluated], reference: float, max_candidates: int | None
) -> tuple[Candidate, ...]:
    chosen = points if max_candidates is None else points[:max_candidates]
    return tuple(
        Candidate(
            workload=point.workload,
            report=point.report,
            headroom_bytes=(point.report.capacity_bytes or 0) - point.report.fit_bytes,
            step_seconds=point.seconds,
            relative_step_time=point.seconds / reference if reference > 0 else 1.0,
            changes=workload_changes(user, point.workload),
        )
        for point in chosen
    )


def _ranked(frontier: tuple[Evaluated, ...], own: Evaluated | None) -> tuple[list[Evaluated], float, str]:
    """The Pareto front (with the user's own point when it fits), the reference seconds and its name."""
    points = pareto([*frontier, own] if own is not None else list(frontier))
    if own is not None:
        return points, own.seconds, "your configuration"
    return points, (points[0].seconds if points else 0.0), "the fastest that fits"


def plan(
    workload: Source,
    *,
    gpu: str | None = None,
    gpus: int | None = None,
    headroom: float = 0.10,
    allow_method_change: bool = False,
    max_candidates: int | None = None,
    progress: Progress | None = None,
    time_model: TimeModel | None = None,
    budget: PlanBudget | None = None,
) -> Plan:
    """Training configurations of ``workload`` that fit ``gpus`` x ``gpu`` with ``headroom`` free.

    ``gpu``/``gpus`` default to the workload's. ``headroom`` is the fraction of each GPU's
    capacity kept free (device level). ``max_candidates`` caps the returned list.
    ``progress(done, total)`` is called after each structural group. ``time_model(workload,
    report) -> seconds`` ranks configurations (default: :func:`vramlens.estimator.time.step_time`).
    ``budget`` bounds the work and can cancel it (:mod:`vramlens.planner.budget`; default
    :func:`~vramlens.planner.budget.default_budget`): past it, a one-line :class:`PlanTooLarge`.
    Returns the Pareto front in (device peak, step time), fastest first; when nothing fits,
    ``candidates`` is empty and ``impossible`` names the smallest setup that would fit.
    """
    _check_headroom(headroom)
    if max_candidates is not None and max_candidates < 1:
        raise InputError(f"max_candidates: must be an integer >= 1, got {max_candidates}")
    with budget_scope(budget or default_budget()):
        return _plan(
            workload,
            gpu=gpu,
            gpus=gpus,
            headroom=headroom,
            allow_method_change=allow_method_change,
            max_candidates=max_candidates,
            progress=progress,
            time_model=time_model,
        )


def _plan(
    workload: Source,
    *,
    gpu: str | None,
    gpus: int | None,
    headroom: float,
    allow_method_change: bool,
    max_candidates: int | None,
    progress: Progress | None,
    time_model: TimeModel | None,
) -> Plan:
    """:func:`plan` within its budget."""
    user, spec, device = prepare(workload, gpu=gpu, gpus=gpus)
    model: Callable[[Workload, MemoryReport], float] = time_model or default_time_model
    result = search(
        spec,
        user,
        device,
        gpus=user.parallel.gpus,
        headroom=headroom,
        allow_method_change=allow_method_change,
        time_model=model,
        progress=progress,
    )
    own = _user_estimate(spec, user, device)
    own_point = None
    if own is not None and fits_with_headroom(own, headroom):  # the user's configuration is a candidate
        own_point = Evaluated(workload=user, report=own, seconds=model(user, own))
    points, reference, label = _ranked(result.frontier, own_point)
    impossible = None
    if not points:
        impossible = _impossible(spec, user, device, headroom=headroom, allow_method_change=allow_method_change)
    return Plan(
        workload=user,
        gpu=device.name,
        gpus=user.parallel.gpus,
        headroom=headroom,
        candidates=_candidates(user, points, reference, max_candidates),
        reference=label,
        user_fits=own_point is not None,
        considered=result.considered,
        estimated=result.estimated,
        impossible=impossible,
        explored=tuple(
            (p.report.device_bytes, p.seconds / reference if reference > 0 else 1.0) for p in result.frontier
        ),
    )
