"""The training estimate: per-GPU memory of one optimizer step, phase by phase.

A step is three instants on the busiest rank, each the sum of what is alive then:

* ``forward`` - at the loss: weights, optimizer state (and gradients when they are
  accumulated over micro-batches), every layer's saved activations, the logits and
  loss tensors, autocast weight casts, gathered FSDP shards, dequantized weights;
* ``backward`` - the largest of its start (the loss gradient beside all activations),
  its first layers (a recomputed layer and the gradient working set), its last layer
  (the first layer's activations beside every other gradient) and its end (all gradients);
* ``optimizer_step`` - weights, state, gradients and the step's temporaries.

With ``optimizer_in_backward`` there is no separate step: each gradient is used
and freed as soon as it exists. The reserved level adds the caching allocator's slack
(:mod:`vramlens.estimator.reserved`), the device level the memory outside the allocator
(:mod:`vramlens.estimator.runtime`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vramlens._records import maker
from vramlens.categories import Category
from vramlens.estimator.layout import ParamLayout, param_layout
from vramlens.estimator.margins import runtime_spread, safe_levels
from vramlens.estimator.memo_keys import SizeFreeInputs
from vramlens.estimator.quantities import StageMemory, stage_memory, stage_plan
from vramlens.estimator.reserved import TrainingSlack, allocator_settings, layer_churn, training_slack
from vramlens.estimator.runtime import communicators, runtime_parts, runtime_terms
from vramlens.estimator.stage_plan import StagePlan
from vramlens.estimator.step_phases import training_phases
from vramlens.estimator.vision import vision_notes
from vramlens.hardware import GpuSpec
from vramlens.model.spec import ModelSpec
from vramlens.resolve._memo import memo
from vramlens.resolve.context import TrainingContext, resize_training, resolve_training
from vramlens.result.report import MemoryReport, PhaseMemory, SafeLevels, Term
from vramlens.units import format_bytes
from vramlens.workload.options import Shard
from vramlens.workload.spec import Parallelism, Workload
from vramlens.workload.versions import older_than, rule_note

__all__ = ["Levels", "estimate_training", "levels", "reference_estimate"]

_C = Category


@dataclass(frozen=True, kw_only=True, slots=True)
class Levels:
    """The levels above an allocated peak: the allocator slack, the memory outside the allocator,
    the reserved and device peaks and each level's safe figure."""

    slack: TrainingSlack
    runtime: _Runtime
    reserved: int
    device: int
    safe: SafeLevels


def levels(
    ctx: TrainingContext,
    mem: StageMemory,
    allocated: int,
    breakdown: Mapping[Category, int],
    targets: frozenset[str],
    plan: _Plan | None,
) -> Levels:
    """Reserved (allocator slack), device (runtime parts) and the safe figures above the allocated
    peak ``allocated`` (``breakdown``: its bytes by category)."""
    workload = ctx.workload
    slack = training_slack(ctx, mem, targets, allocator_settings(workload.alloc_conf))
    outside = plan.runtime if plan is not None else None
    if outside is None or outside.paged_bytes != mem.paged_states_bytes:
        eager = older_than(workload.versions, "lazy_module_loading")
        key = RuntimeInputs(parallel=workload.parallel, paged_bytes=mem.paged_states_bytes, eager_modules=eager)
        outside = memo(ctx.spec, key, lambda: _runtime(key))
        if plan is not None:
            plan.runtime = outside
    reserved = allocated + slack.total_bytes
    device = reserved + outside.total_bytes
    safe = safe_levels(
        allocated=allocated,
        reserved=reserved,
        device=device,
        breakdown=breakdown,
        allocator_spread=slack.spread_bytes,
        runtime_spread=outside.spread_bytes,
        sharded=workload.parallel.shard in (Shard.FSDP, Shard.HSDP, Shard.ZERO3),
    )
    return _levels(slack=slack, runtime=outside, reserved=reserved, device=device, safe=safe)


#: :class:`Levels` made as its ``__init__`` would, faster (one per estimate).
_levels = maker(Levels)


def _reserved_notes(ctx: TrainingContext, slack: TrainingSlack) -> str:
    """The report's line on the reserved level (and the runtime's version rule)."""
    workload = ctx.workload
    note = _reserved_note(slack, workload.alloc_conf, sharded=workload.parallel.shard is not Shard.NONE)
    if older_than(workload.versions, "lazy_module_loading"):
        note += f"; {rule_note(workload.versions, 'lazy_module_loading')}"
    return note


@dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeInputs:
    """What the device level's runtime parts read: their memo key."""

    parallel: Parallelism
    paged_bytes: int
    eager_modules: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class _Runtime:
    paged_bytes: int
    parts: tuple[tuple[str, int], ...]
    total_bytes: int
    spread_bytes: int
    terms: tuple[Term, ...]


def _runtime(key: RuntimeInputs) -> _Runtime:
    """Memory outside the allocator (:func:`runtime_parts`), its margin and its terms."""
    runtime = runtime_parts(key.parallel, paged_bytes=key.paged_bytes, eager_modules=key.eager_modules)
    return _Runtime(
        paged_bytes=key.paged_bytes,
        parts=tuple(runtime.items()),
        total_bytes=sum(runtime.values()),
        spread_bytes=runtime_spread(runtime, len(communicators(key.parallel))),
        terms=runtime_terms(runtime, key.parallel, eager_modules=key.eager_modules),
    )


def _slack_terms(slack: TrainingSlack, mem: StageMemory, alloc_conf: str) -> tuple[Term, ...]:
    """The reserved level's terms above the allocated peak: the allocator slack's parts (those not 0)."""
    conf = alloc_conf or "default PYTORCH_CUDA_ALLOC_CONF"

    def churn() -> str:
        saved, working, params = layer_churn(mem)
        return (
            f"fitted fractions x churn of saved activations {saved:,} B, backward working sets {working:,} B, "
            f"parameter-sized tensors {params:,} B (reserved.py LAYER_SLACK_FRACTION, {conf})"
        )

    parts: list[tuple[str, int, Callable[[], str]]] = [
        (
            "vocabulary-sized tensors (replayed)",
            slack.vocabulary_bytes,
            lambda: (
                f"logits, loss, head and embedding requests of the step replayed through the caching-allocator "
                f"model ({conf}), less what the layers' gradients reuse"
            ),
        ),
        (
            "the whole step (replayed)" if slack.replayed else "decoder layers' churn (fitted fractions)",
            slack.layers_bytes,
            (
                lambda: (
                    f"every request of the step (each layer's saved tensors, working sets, gradients, optimizer "
                    f"state and temporaries, logits and loss) replayed through the caching-allocator model ({conf})"
                )
            )
            if slack.replayed
            else churn,
        ),
    ]
    return tuple(
        Term(
            name=f"allocator slack: {name}",
            category=_C.ALLOCATOR_SLACK,
            bytes=value,
            explain=explain,
            alive="cached blocks, from the first step on",
        )
        for name, value, explain in parts
        if value
    )


def _reserved_note(slack: TrainingSlack, alloc_conf: str, *, sharded: bool) -> str:
    conf = f" under {alloc_conf}" if alloc_conf else ""
    if slack.replayed:
        pools = ", FSDP's collective buffers in their streams' pools" if sharded else ""
        return (
            f"reserved: slack {format_bytes(slack.total_bytes)}{conf} = the whole step replayed through the "
            f"caching-allocator model{pools}"
        )
    return (
        f"reserved: slack {format_bytes(slack.total_bytes)}{conf} = replayed vocabulary tensors "
        f"{format_bytes(slack.vocabulary_bytes)} + layer churn x fitted fractions {format_bytes(slack.layers_bytes)}"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanInputs:
    """The memo key of a training estimate's :class:`_Plan`: every workload key but the sizes
    (:data:`~vramlens.estimator.memo_keys.SIZE_KEYS`)."""

    workload: tuple[object, ...]


@dataclass(kw_only=True, slots=True)
class _Plan:
    """What a training estimate reads besides the batch and the sequence length, for one model and
    one set of the workload's other keys: the context resolved for the first such workload (the
    others' are it resized: :func:`~vramlens.resolve.context.resize_training`), the parameter
    layout, each stage's plan once made, and the memory outside the allocator once computed."""

    context: TrainingContext
    layout: ParamLayout
    stages: list[StagePlan | None]
    runtime: _Runtime | None = None
    fast: object = None
    """The plan's :class:`~vramlens.estimator.fast_estimate.FastEstimate` once made (see
    :func:`estimate_training`)."""


def _plan(spec: ModelSpec, workload: Workload) -> tuple[TrainingContext, _Plan]:
    """The workload's context and plan (made by resolving the workload: its errors come first)."""
    key = PlanInputs(workload=SizeFreeInputs.workload_keys(workload))
    plan = memo(spec, key, lambda: _new_plan(spec, workload))
    if plan.context.workload is workload:
        return plan.context, plan
    return resize_training(plan.context, workload), plan


def _new_plan(spec: ModelSpec, workload: Workload) -> _Plan:
    ctx = resolve_training(spec, workload)
    layout = param_layout(ctx)
    return _Plan(context=ctx, layout=layout, stages=[None] * len(layout.stages))


def _stage_memories(ctx: TrainingContext, plan: _Plan | None) -> tuple[ParamLayout, list[StageMemory]]:
    """The layout and each stage's quantities (a model described from its code: its traced recipe)."""
    if plan is None:
        from vramlens.estimator.generic import generic_layout
        from vramlens.estimator.generic_terms import generic_stage_memory

        layout = generic_layout(ctx)
        return layout, [generic_stage_memory(ctx, stage, layout.targets) for stage in layout.stages]
    layout, found = plan.layout, []
    for index, stage in enumerate(layout.stages):
        made = plan.stages[index]
        if made is None:
            made = plan.stages[index] = stage_plan(ctx, stage, layout.targets)
        found.append(stage_memory(ctx, stage, layout.targets, made))
    return layout, found


def estimate_training(spec: ModelSpec, workload: Workload, *, gpu: GpuSpec | None = None) -> MemoryReport:
    """Per-GPU memory of one training step of ``workload`` on ``spec`` (busiest rank),
    checked against ``gpu`` when one is given.

    From the third workload with the same size-free keys on, the figures come from the stage
    plans' quantities and a trace of the phases (:mod:`vramlens.estimator.fast_estimate`), and the
    terms, formulas and notes are made when first read, by :func:`reference_estimate` (and checked
    to give the same figures)."""
    if spec.generic is not None:
        return reference_estimate(resolve_training(spec, workload), None, gpu)[0]
    ctx, plan = _plan(spec, workload)
    fast = plan.fast
    if fast is not None and fast is not _SEEN and fast is not _NONE:
        report = fast.estimate(ctx, plan, gpu)  # type: ignore[attr-defined]
        if report is not None:
            return report  # type: ignore[no-any-return]
    report, memories = reference_estimate(ctx, plan, gpu)
    if fast is None:
        plan.fast = _SEEN
    elif fast is _SEEN:
        from vramlens.estimator.fast_estimate import FastEstimate

        plan.fast = FastEstimate.of(ctx, memories) or _NONE
    elif fast is not _NONE:
        fast.learn(ctx, memories)  # type: ignore[attr-defined]
    return report


#: ``_Plan.fast`` before its fast estimate exists: not seen yet is None; seen once; none can be made.
_SEEN, _NONE = object(), object()


def reference_estimate(
    ctx: TrainingContext, plan: _Plan | None, gpu: GpuSpec | None
) -> tuple[MemoryReport, list[StageMemory]]:
    """The estimate made term by term (and each stage's quantities)."""
    layout, memories = _stage_memories(ctx, plan)
    best: tuple[int, StageMemory, list[PhaseMemory]] | None = None
    for mem in memories:
        phases = training_phases(ctx, mem)
        highest = max(phase.allocated_bytes for phase in phases)
        if best is None or highest > best[0]:
            best = (highest, mem, phases)
    assert best is not None
    allocated, mem, phases = best
    peak = max(phases, key=lambda phase: phase.allocated_bytes)
    found = levels(ctx, mem, peak.allocated_bytes, peak.breakdown, layout.targets, plan)
    notes = [*ctx.assumptions, *vision_notes(ctx), *dict.fromkeys(mem.notes), _reserved_notes(ctx, found.slack)]
    if len(layout.stages) > 1:
        notes.append(f"pipeline parallel: reporting the {mem.stage.name}, the busier of the first and last stages")
    report = MemoryReport(
        engine="estimate",
        model=ctx.spec.name,
        workload=ctx.workload,
        phases=tuple(phases),
        peak_phase=peak.name,
        allocated_bytes=allocated,
        reserved_bytes=found.reserved,
        device_bytes=found.device,
        runtime=dict(found.runtime.parts),
        safe=found.safe,
        terms=tuple(mem.terms),
        allocator_terms=_slack_terms(found.slack, mem, ctx.workload.alloc_conf),
        runtime_terms=found.runtime.terms,
        assumptions=tuple(notes),
        gpu=gpu.name if gpu else None,
        capacity_bytes=gpu.memory_bytes if gpu else None,
    )
    return report, memories
