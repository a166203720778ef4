"""Direct answers built on the planner: the fewest GPUs that fit, and the cheapest change.

The largest micro-batch or context that fits is :mod:`vramlens.estimator.capacity`'s
(:func:`vramlens.max_batch`, :func:`vramlens.max_context`); these answers reuse the same
estimator, so they agree with ``vramlens estimate`` by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramlens.errors import InputError
from vramlens.estimator import estimate_resolved
from vramlens.hardware import resolve_gpu
from vramlens.model.resolve import load_model
from vramlens.planner.model import Candidate, Change
from vramlens.planner.planner import Source, default_time_model, plan, prepare, smallest_gpus
from vramlens.planner.search import Progress, TimeModel, fits_with_headroom
from vramlens.workload.load import load_workload, workload_to_dict
from vramlens.workload.spec import Workload

__all__ = ["STEP_FAMILIES", "ChangeStep", "CheapestChange", "cheapest_change", "min_gpus"]


def min_gpus(
    workload: Source, gpu: str | None = None, *, headroom: float = 0.10, allow_method_change: bool = False
) -> int | None:
    """The smallest number of ``gpu`` on which some configuration the planner tries fits with
    ``headroom`` (see :func:`vramlens.planner.planner.smallest_gpus`: 1-8, then whole 8-GPU nodes,
    up to 1024); None if not even 1024 do."""
    user, spec, device = prepare(workload, gpu=gpu, gpus=1)
    return smallest_gpus(spec, user, device, headroom=headroom, method_change=allow_method_change)


#: Keys that only make sense changed together: one step of a cheapest-change path each.
#: (A layout that changes the data-parallel degree also takes the micro-batch split with it,
#: or the global batch would change in between.)
STEP_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("method", ("method", "quant", "lora.")),
    ("precision", ("precision",)),
    ("parallelism", ("parallel.tp", "parallel.pp", "parallel.shard", "parallel.shard_degree")),
    ("offload", ("parallel.offload",)),
    ("recompute", ("recompute", "recompute_every")),
    ("micro-batch", ("batch", "grad_accum")),
    ("optimizer", ("optimizer",)),
    ("loss", ("loss",)),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ChangeStep:
    """One step from the user's workload towards the cheapest change, applied on top of the
    steps before it."""

    name: str
    """The family of settings (``recompute``, ``parallelism``, ``micro-batch``, ...)."""
    changes: tuple[Change, ...]
    peak_bytes: int
    """Device-level peak per GPU after this step (bytes)."""
    saved_bytes: int
    """Peak before this step minus peak after it (bytes; negative if the step costs memory)."""
    time_factor: float
    """Step time after this step over the user's step time (1.2 = 20% slower than yours)."""
    fits: bool
    """Whether the workload after this step fits with the requested headroom."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "changes": [{"key": k, "old": old, "new": new} for k, old, new in self.changes],
            "peak_bytes": self.peak_bytes,
            "saved_bytes": self.saved_bytes,
            "time_factor": round(self.time_factor, 4),
            "fits": self.fits,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class CheapestChange:
    """The plan entry with the fewest changes (then the fastest), as a path of steps."""

    candidate: Candidate
    steps: tuple[ChangeStep, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate.to_dict(), "steps": [step.to_dict() for step in self.steps]}


def _families(changes: tuple[Change, ...]) -> list[tuple[str, tuple[Change, ...]]]:
    """The changes grouped into :data:`STEP_FAMILIES` (micro-batch joins a dp-changing layout)."""
    grouped: dict[str, list[Change]] = {}
    for change in changes:
        name = next((n for n, keys in STEP_FAMILIES if any(change[0].startswith(k) for k in keys)), change[0])
        grouped.setdefault(name, []).append(change)
    if "parallelism" in grouped and "micro-batch" in grouped:
        grouped["parallelism"] += grouped.pop("micro-batch")
    return [(name, tuple(group)) for name, group in grouped.items()]


def _apply(workload: Workload, changes: tuple[Change, ...]) -> Workload:
    """``workload`` with ``changes`` (dotted keys) applied and validated (InputError if invalid)."""
    overrides: dict[str, Any] = {}
    for key, _, new in changes:
        block, _, name = key.rpartition(".")
        (overrides.setdefault(block, {}) if block else overrides)[name] = new
    return load_workload(workload_to_dict(workload, keep_model_object=True), overrides)


def _path(user: Workload, candidate: Candidate, model: TimeModel, headroom: float) -> tuple[ChangeStep, ...]:
    """Greedy: at each step apply the family that lowers the peak most (among those valid on
    their own at that point); families that are never valid alone go last, together."""
    spec, gpu = load_model(user.model), resolve_gpu(str(user.gpu))
    own = estimate_resolved(spec, user, gpu)
    base_seconds, current, peak = model(user, own), user, own.device_bytes
    left, steps = _families(candidate.changes), []
    while left:
        tried = []
        for name, changes in left:
            try:
                changed = _apply(current, changes)
                tried.append((estimate_resolved(spec, changed, gpu), name, changes, changed))
            except InputError:
                continue
        if not tried:  # only valid together (e.g. offload needs a sharded layout)
            changes = tuple(c for _, group in left for c in group)
            changed = _apply(current, changes)
            tried = [(estimate_resolved(spec, changed, gpu), " + ".join(n for n, _ in left), changes, changed)]
        report, name, changes, current = min(tried, key=lambda t: t[0].device_bytes)
        left = [(n, c) for n, c in left if c[0] not in changes]
        fits = fits_with_headroom(report, headroom)
        factor = model(current, report) / base_seconds if base_seconds > 0 else 1.0
        steps.append(
            ChangeStep(
                name=name,
                changes=changes,
                peak_bytes=report.device_bytes,
                saved_bytes=peak - report.device_bytes,
                time_factor=factor,
                fits=fits,
            )
        )
        peak = report.device_bytes
    return tuple(steps)


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
    """The plan entry with the fewest changes from the user's workload (ties: the fastest), as
    a path of steps from the user's settings to it, each with its memory saved and the step
    time so far; None if nothing fits."""
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
    steps = _path(result.workload, best, time_model or default_time_model, headroom)
    return CheapestChange(candidate=best, steps=steps)
