"""Recommendations: changes to an RLHF setup that lower its device-level peak, each re-estimated.

Candidates (each applied alone, then the offloads together):

* offload a model that the peak phase does not run (sleep/wake on CPU between its phases);
* shard the models with ZeRO-3 across their group (when a group has more GPUs than TP);
* full activation recompute, or micro-batch 1, when a training phase is the peak;
* disaggregate: move the largest model the peak phase does not run to its own GPU group;
* lower a vLLM rollout's ``gpu_memory_utilization`` when generation is the peak;
* with ``plan``, when a training phase is the peak and does not fit: the planner's cheapest change
  (:func:`vramlens.planner.cheapest_change`) for that model's training alone on its GPUs,
  mapped back to the role's keys (shard, tp, ZeRO-Offload, recompute, precision, optimizer,
  micro-batch) and re-estimated for the whole step.

* keep a trained model's optimizer state on the CPU (ZeRO-3 with CPU offload) when its
  training phase is the peak;
* **combinations**: from the user's setup, apply the single change that lowers the peak most,
  re-estimate, and repeat from the new peak's own candidates until the step fits or nothing
  lowers it further (:func:`combined`; the seed's 70B PPO step fits only with every model
  offloaded, the optimizer states on the CPU and micro-batch 1 together).

Each is kept only if it lowers the peak; those that make the step fit come first, then by
bytes saved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

from vramlens.errors import InputError
from vramlens.rlhf.report import Recommendation, RlhfReport
from vramlens.rlhf.setup import ModelRole, Placement, RlhfSetup
from vramlens.units import GiB

__all__ = ["recommendations"]

_MAX = 6
#: Changes a combination applies at most.
_STEPS = 6
Candidate = tuple[str, tuple[tuple[str, Any, Any], ...], Callable[[], RlhfSetup]]


def _with_role(setup: RlhfSetup, role: str, **changes: Any) -> RlhfSetup:
    if role == "rollout":
        return replace(setup, rollout=replace(setup.rollout, **changes))
    model = setup.role(role)
    if model is None:
        raise InputError(f"{role}: this step has no {role} model")
    changed: dict[str, Any] = {role: replace(model, **changes)}
    return replace(setup, **changed)


def _idle_colocated(report: RlhfReport) -> list[str]:
    """Roles on the GPU in the peak phase that it does not run and that could sleep instead."""
    peak = report.peak
    roles = []
    for role, state in peak.models.items():
        if state.busy or state.where != "gpu" or state.group != peak.gpu_group or not state.bytes:
            continue
        if report.setup.placement_of(role) is Placement.COLOCATED:
            roles.append(role)
    return roles


def _offloads(report: RlhfReport) -> Iterator[Candidate]:
    setup = report.setup
    idle = _idle_colocated(report)
    for role in idle:
        change = ((f"{role}.placement", "colocated", "offload"),)
        yield (
            f"offload the {role} to CPU between its phases",
            change,
            partial(_with_role, setup, role, placement=Placement.OFFLOAD),
        )
    if len(idle) > 1:

        def all_off() -> RlhfSetup:
            changed = setup
            for role in idle:
                changed = _with_role(changed, role, placement=Placement.OFFLOAD)
            return changed

        changes = tuple((f"{role}.placement", "colocated", "offload") for role in idle)
        yield f"offload every model the {report.peak_phase} phase does not run ({', '.join(idle)})", changes, all_off


def _trained_changes(report: RlhfReport) -> Iterator[Candidate]:
    setup = report.setup
    shardable = [m for m in setup.models if m.shard in ("none", "ddp", "zero1", "zero2") and _dp(setup, m) > 1]
    if shardable:

        def shard_all() -> RlhfSetup:
            changed = setup
            for model in shardable:
                changed = _with_role(changed, model.role, shard="zero3")
            return changed

        changes = tuple((f"{m.role}.shard", m.shard, "zero3") for m in shardable)
        yield f"shard {', '.join(m.role for m in shardable)} with ZeRO-3 across their GPUs", changes, shard_all
    if not report.peak_phase.endswith("_training"):
        return
    role = report.peak_phase.removesuffix("_training")
    model = setup.role(role)
    if model is not None and model.recompute != "full":
        change: tuple[tuple[str, Any, Any], ...] = ((f"{role}.recompute", model.recompute, "full"),)
        yield (
            f"recompute the {role}'s activations (full checkpointing)",
            change,
            lambda: _with_role(setup, role, recompute="full"),
        )
    if setup.micro_batch > 1:
        change = (("micro_batch", setup.micro_batch, 1),)
        yield "train with micro-batch 1 (more gradient accumulation)", change, lambda: replace(setup, micro_batch=1)
    if model is not None and model.method == "full" and model.cpu_offload == "none":
        shard = model.shard if model.shard in ("zero1", "zero2", "zero3", "fsdp", "hsdp") else "zero3"
        change = ((f"{role}.shard", model.shard, shard), (f"{role}.cpu_offload", "none", "optimizer"))
        yield (
            f"keep the {role}'s optimizer state on the CPU ({shard} with CPU offload)",
            change,
            lambda: _with_role(setup, role, shard=shard, cpu_offload="optimizer"),
        )


def _dp(setup: RlhfSetup, model: ModelRole) -> int:
    gpus = model.gpus if model.placement is Placement.SEPARATE and model.gpus else setup.shared_gpus
    return max(1, gpus // model.tp)


def _disaggregate(report: RlhfReport) -> Iterator[Candidate]:
    setup = report.setup
    idle = [r for r in _idle_colocated(report) if r != "rollout" or setup.rollout.own_weights]
    if not idle or setup.gpus < 2:
        return
    role = max(idle, key=lambda r: report.peak.models[r].bytes)
    tp = setup.rollout.tp if role == "rollout" else (setup.role(role) or setup.actor).tp
    gpus = tp if tp < setup.shared_gpus else setup.shared_gpus // 2
    if gpus < 1:
        return
    change = ((f"{role}.placement", "colocated", "separate"), (f"{role}.gpus", None, gpus))
    text = f"put the {role} on its own {gpus} GPU(s)"
    yield text, change, lambda: _with_role(setup, role, placement=Placement.SEPARATE, gpus=gpus)


def _vllm(report: RlhfReport) -> Iterator[Candidate]:
    setup, rollout = report.setup, report.setup.rollout
    if report.peak_phase != "generation" or rollout.engine != "vllm" or rollout.gpu_memory_utilization <= 0.2:
        return
    new = round(max(0.2, rollout.gpu_memory_utilization - 0.2), 2)
    change = (("rollout.gpu_memory_utilization", rollout.gpu_memory_utilization, new),)
    text = f"give vLLM gpu_memory_utilization {new} (a smaller KV pool)"
    yield text, change, lambda: _with_role(setup, "rollout", gpu_memory_utilization=new)


#: Planner change keys -> (role key, or "" for a setup key).
_PLAN_KEYS = {
    "parallel.shard": "shard", "parallel.tp": "tp", "parallel.offload": "cpu_offload", "recompute": "recompute",
    "precision": "precision", "optimizer": "optimizer", "batch": "",
}  # fmt: skip


def _planned(report: RlhfReport) -> Iterator[Candidate]:
    setup = report.setup
    if report.fits or not report.peak_phase.endswith("_training"):
        return
    role = report.peak_phase.removesuffix("_training")
    model = setup.role(role)
    if model is None:
        return
    from vramlens.planner import cheapest_change
    from vramlens.rlhf.models import group_gpus, group_of, training_workload

    workload = {"model": model.model, **training_workload(setup, model)}
    gpus = group_gpus(setup, group_of(setup, role))
    answer = cheapest_change(workload, gpu=setup.gpu, gpus=gpus, headroom=0.0)
    if answer is None or any(key not in _PLAN_KEYS for key, _, _ in answer.candidate.changes):
        return
    pairs = 2 if setup.algo.value == "dpo" else 1
    role_changes = {_PLAN_KEYS[k]: new for k, _, new in answer.candidate.changes if _PLAN_KEYS[k]}
    batch = next((new for k, _, new in answer.candidate.changes if k == "batch"), None)
    changes = tuple(
        (f"{role}.{name}", getattr(model, name), new)
        if name
        else ("micro_batch", setup.micro_batch, max(1, new // pairs))
        for name, new in ((_PLAN_KEYS[k], new) for k, _, new in answer.candidate.changes)
    )

    def build() -> RlhfSetup:
        changed = _with_role(setup, role, **role_changes)
        return replace(changed, micro_batch=max(1, batch // pairs)) if batch is not None else changed

    listed = ", ".join(f"{key} {new}" for key, _, new in changes)
    yield f"planner, {role} training alone: {listed}", changes, build


def _evaluate(report: RlhfReport, candidate: Candidate) -> Recommendation | None:
    from vramlens.rlhf.engine import step_memory

    text, changes, build = candidate
    try:
        phases, capacity = step_memory(build())
    except InputError:
        return None
    after = max(p.device_bytes for p in phases)
    saved = report.peak_device_bytes - after
    if saved <= 0:
        return None
    verdict = "fits" if after <= capacity else "still over"
    line = f"{text}: peak {report.peak_device_bytes / GiB:.1f} -> {after / GiB:.1f} GiB per GPU ({verdict})"
    return Recommendation(text=line, saves_bytes=saved, changes=changes)


def _candidates(report: RlhfReport, *, plan: bool) -> list[Candidate]:
    candidates = [*_offloads(report), *_trained_changes(report), *_disaggregate(report), *_vllm(report)]
    if plan:
        candidates += _planned(report)
    return candidates


def combined(report: RlhfReport) -> Recommendation | None:
    """A combination of changes found greedily: the single candidate that lowers the peak most,
    applied, the step re-estimated, then the new peak phase's own candidates, until the step fits
    or nothing lowers it (at most :data:`_STEPS` changes). None unless it takes two changes or more."""
    from vramlens.rlhf.engine import rlhf_estimate

    current, texts, changes = report, [], []  # type: ignore[var-annotated]
    for _ in range(_STEPS):
        if current.fits:
            break
        best: tuple[int, Candidate, RlhfSetup] | None = None
        for candidate in _candidates(current, plan=False):
            try:
                setup = candidate[2]()
                after = max(p.device_bytes for p in step_memory_phases(setup))
            except InputError:
                continue
            if after < current.peak_device_bytes and (best is None or after < best[0]):
                best = (after, candidate, setup)
        if best is None:
            break
        texts.append(best[1][0])
        changes.extend(best[1][1])
        current = rlhf_estimate(best[2], recommend=False)
    if len(texts) < 2 or current.peak_device_bytes >= report.peak_device_bytes:
        return None
    verdict = "fits" if current.fits else "still over"
    line = (
        f"together: {'; '.join(texts)}: peak {report.peak_device_bytes / GiB:.1f} -> "
        f"{current.peak_device_bytes / GiB:.1f} GiB per GPU ({verdict})"
    )
    return Recommendation(text=line, saves_bytes=report.peak_device_bytes - current.peak_device_bytes,
                          changes=tuple(changes))  # fmt: skip


def step_memory_phases(setup: RlhfSetup) -> tuple[Any, ...]:
    """The phases of a step (the engine's :func:`~vramlens.rlhf.engine.step_memory`)."""
    from vramlens.rlhf.engine import step_memory

    return step_memory(setup)[0]


def recommendations(report: RlhfReport, *, plan: bool = False) -> tuple[Recommendation, ...]:
    """The changes that lower the peak, those that make it fit first, then by bytes saved
    (``plan``: with the planner's cheapest change for a training phase that does not fit), and
    the best combination of them when no single one makes the step fit."""
    found = [r for r in (_evaluate(report, c) for c in _candidates(report, plan=plan)) if r is not None]
    need = report.peak_device_bytes - report.capacity_bytes
    if not report.fits and not any(r.saves_bytes >= need for r in found):
        together = combined(report)
        if together is not None:
            found.append(together)
    found.sort(key=lambda r: (r.saves_bytes < need, -r.saves_bytes))
    return tuple(found[:_MAX])
