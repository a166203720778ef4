"""Direct answers built on the planner: the fewest GPUs that fit, and the cheapest change.

The largest micro-batch or context that fits is :mod:`vramlens.estimate.capacity`'s
(:func:`vramlens.max_batch`, :func:`vramlens.max_context`); these answers reuse the same
estimator, so they agree with ``vramlens estimate`` by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramlens.errors import InputError
from vramlens.estimate import estimate_resolved
from vramlens.model.resolve import load_model
from vramlens.plan.model import Candidate, Change
from vramlens.plan.planner import Source, default_time_model, plan, prepare, smallest_gpus
from vramlens.plan.search import Progress, TimeModel
from vramlens.workload.load import load_workload, workload_to_dict
from vramlens.workload.spec import Workload

__all__ = ["ChangeEffect", "CheapestChange", "cheapest_change", "min_gpus"]


def min_gpus(
    workload: Source, gpu: str | None = None, *, headroom: float = 0.10, allow_method_change: bool = False
) -> int | None:
    """The smallest number of ``gpu`` on which some configuration the planner tries fits with
    ``headroom`` (see :func:`vramlens.plan.planner.smallest_gpus`: 1-8, then whole 8-GPU nodes,
    up to 1024); None if not even 1024 do."""
    user, spec, device = prepare(workload, gpu=gpu, gpus=1)
    return smallest_gpus(spec, user, device, headroom=headroom, method_change=allow_method_change)


@dataclass(frozen=True, kw_only=True, slots=True)
class ChangeEffect:
    """One change applied alone to the user's workload."""

    key: str
    old: Any
    new: Any
    saved_bytes: int | None
    """Device-level peak of the user's workload minus the peak with only this change (bytes);
    None when the change is not valid alone (e.g. CPU offload without a ZeRO strategy)."""
    time_factor: float | None
    """Step time with only this change over the user's step time (1.2 = 20% slower)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheapestChange:
    """The plan entry with the fewest changes (then the fastest), and each change's effect."""

    candidate: Candidate
    effects: tuple[ChangeEffect, ...]


def _nested(key: str, value: Any) -> dict[str, Any]:
    block, _, name = key.rpartition(".")
    return {block: {name: value}} if block else {name: value}


def _alone(user: Workload, change: Change, model: TimeModel, base: tuple[int, float]) -> ChangeEffect:
    key, old, new = change
    try:
        changed = load_workload(workload_to_dict(user, keep_model_object=True), _nested(key, new))
        report = estimate_resolved(load_model(changed.model), changed, None)
    except InputError:
        return ChangeEffect(key=key, old=old, new=new, saved_bytes=None, time_factor=None)
    seconds = model(changed, report)
    factor = seconds / base[1] if base[1] > 0 else None
    return ChangeEffect(key=key, old=old, new=new, saved_bytes=base[0] - report.device_bytes, time_factor=factor)


def cheapest_change(
    workload: Source,
    *,
    gpu: str | None = None,
    gpus: int | None = None,
    headroom: float = 0.10,
    allow_method_change: bool = False,
    time_model: TimeModel | None = None,
    progress: Progress | None = None,
) -> CheapestChange | None:
    """The plan entry with the fewest changes from the user's workload (ties: the fastest),
    with the memory saved and the time cost of each change on its own; None if nothing fits."""
    result = plan(
        workload,
        gpu=gpu,
        gpus=gpus,
        headroom=headroom,
        allow_method_change=allow_method_change,
        progress=progress,
        time_model=time_model,
    )
    if not result.candidates:
        return None
    best = min(result.candidates, key=lambda c: (len(c.changes), c.relative_step_time))
    model = time_model or default_time_model
    user = result.workload
    own = estimate_resolved(load_model(user.model), user, None)
    base = (own.device_bytes, model(user, own))
    return CheapestChange(candidate=best, effects=tuple(_alone(user, c, model, base) for c in best.changes))
