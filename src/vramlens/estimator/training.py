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

from dataclasses import dataclass

from vramlens.categories import Category
from vramlens.estimator.layout import param_layout
from vramlens.estimator.margins import runtime_spread, safe_levels
from vramlens.estimator.quantities import StageMemory, stage_memory
from vramlens.estimator.reserved import TrainingSlack, allocator_settings, training_slack
from vramlens.estimator.runtime import CUBLAS_WORKSPACE_BYTES, communicators, runtime_parts
from vramlens.estimator.vision import vision_notes
from vramlens.hardware import GpuSpec
from vramlens.model.spec import ModelSpec
from vramlens.resolve.context import TrainingContext, resolve_training
from vramlens.result.report import MemoryReport, PhaseMemory, SafeLevels
from vramlens.units import format_bytes
from vramlens.workload.options import Shard
from vramlens.workload.spec import Workload
from vramlens.workload.versions import older_than, rule_note

__all__ = ["estimate_training", "training_phases"]

_C = Category


def _phase(name: str, note: str, parts: dict[Category, int]) -> PhaseMemory:
    clean = {category: int(value) for category, value in parts.items() if value}
    return PhaseMemory(name=name, allocated_bytes=sum(clean.values()), breakdown=clean, note=note)


def _base(mem: StageMemory) -> dict[Category, int]:
    return {_C.PARAMETERS: mem.params, _C.OPTIMIZER_STATE: mem.states, _C.OTHER: CUBLAS_WORKSPACE_BYTES}


def _kept_gradients(ctx: TrainingContext, mem: StageMemory) -> int:
    """Gradients alive before a micro-step's backward: the unsharded ones FSDP accumulates without
    gradient sync (the sharded ones appear at the last micro-step), else with gradient
    accumulation the earlier micro-steps' (sharded) gradients; none on a single micro-step."""
    if mem.unsharded.accumulated_grads:
        return mem.unsharded.accumulated_grads
    return mem.grads if ctx.workload.grad_accum > 1 and not ctx.in_backward_step else 0


def _forward(ctx: TrainingContext, mem: StageMemory) -> PhaseMemory:
    logits = mem.logits.forward_end if mem.logits else 0
    unsharded = mem.unsharded
    # A quantized base's dequantized weight exists inside a layer's linear, not at the loss.
    at_loss = max(logits + unsharded.loss, mem.forward_working + mem.dequant + unsharded.forward_layer)
    parts = _base(mem) | {
        _C.GRADIENTS: _kept_gradients(ctx, mem) + mem.grad_buckets,
        _C.ACTIVATIONS: mem.activations + mem.non_layer,
        _C.INPUTS: mem.inputs,
        _C.TEMPORARY: at_loss + mem.casts,
    }
    return _phase("forward", "end of forward: the loss, or the last layer's working set", parts)


def tied_embedding_grad_bytes(ctx: TrainingContext) -> int:
    """Bytes of one contribution to a tied embedding's gradient (vocab x hidden x grad bytes),
    when the tied matrix is trained in full on one unsharded rank; else 0.

    The matrix gets two gradient contributions (LM head first, embedding last). The
    autograd engine buffers the head's until the embedding's arrives and sums them into a
    new tensor (``InputBuffer::accumulate``), so at the embedding's backward both
    contributions and their sum are alive. Seen in simulated and tracked CPU runs of tied
    models (e.g. Llama-3.2-1B: three 1002 MiB fp32 tensors at once).
    """
    parallel = ctx.workload.parallel
    unsharded = parallel.shard in (Shard.NONE, Shard.DDP, Shard.ZERO1)
    if not (ctx.spec.tie_word_embeddings and ctx.full and unsharded and parallel.tp == 1 and parallel.pp == 1):
        return 0
    return ctx.spec.vocab_size * ctx.spec.hidden_size * ctx.grad_bytes


def pending_embedding_grad_bytes(ctx: TrainingContext, mem: StageMemory) -> int:
    """Bytes of the input embedding's gradient, which autograd makes only after the first
    layer's backward: absent from "last layer of backward" (an untied matrix trained in full on
    one unsharded rank without TP/PP; else 0). Seen in tracked CPU runs of checkpointed steps
    (tests/experiments: the peak is inside the first layer's backward, the embedding's 2 MiB
    gradient not yet there)."""
    parallel = ctx.workload.parallel
    unsharded = parallel.shard in (Shard.NONE, Shard.DDP, Shard.ZERO1)
    if ctx.spec.tie_word_embeddings or not (ctx.full and mem.stage.first and unsharded):
        return 0
    if parallel.tp != 1 or parallel.pp != 1:
        return 0
    return ctx.spec.vocab_size * ctx.spec.hidden_size * ctx.grad_bytes


def _backward(ctx: TrainingContext, mem: StageMemory) -> PhaseMemory:
    in_backward = ctx.in_backward_step
    accumulated = _kept_gradients(ctx, mem)
    all_grads = 0 if in_backward else mem.grads
    outputs = mem.logits.outputs if mem.logits else 0
    start_logits = mem.logits.backward_start if mem.logits else 0
    u = mem.unsharded
    # The loop's kept model outputs live until backward returns, so they are in the last layer's
    # and the end's working set too, where a checkpointed single-GPU step peaks, and the input
    # embedding's gradient is not there yet at the last layer (tracked CPU runs and the simulator,
    # tests/experiments). Under FSDP (``u``) the simulator's last layer stays at the formula
    # without both (llama-3.1-8b, 8 GPUs, bf16, recompute full: 11.3895 GB), so FSDP keeps it.
    fsdp = bool(u.last_layer or u.end)
    kept_to_end = 0 if fsdp else outputs
    pending = 0 if in_backward else mem.layer_grads + (0 if fsdp else pending_embedding_grad_bytes(ctx, mem))
    candidates = {
        "start of backward: loss gradient beside all activations": (
            accumulated + mem.grad_buckets,
            mem.activations + mem.non_layer,
            start_logits + mem.casts_backward + u.backward_start,
        ),
        "first layers of backward: a recomputed layer and the gradient working set": (
            accumulated + mem.grad_buckets + (0 if in_backward else mem.head_grads),
            mem.activations + mem.non_layer + mem.recompute,
            outputs + mem.working + mem.casts_backward + mem.dequant + u.first_layers,
        ),
        "end of backward: every gradient": (
            all_grads + mem.grad_buckets,
            mem.non_layer,
            kept_to_end + (mem.working if mem.end_working is None else mem.end_working) + mem.dequant + u.end,
        ),
        "last layer of backward: the first layer's activations beside every other gradient": (
            all_grads - pending + mem.grad_buckets,
            mem.non_layer + (mem.recompute or mem.activations // max(mem.stage.layers, 1)),
            kept_to_end + mem.working + mem.casts_backward + mem.dequant + u.last_layer,
        ),
    }
    if u.end and ctx.spec.tie_word_embeddings and outputs:
        # FSDP: the tied embedding's backward (u.end: the gathered tail, the head's gradient, the
        # embedding's, their sum, a reduce-scatter input) while the loop still holds the logits;
        # the tied matrix's sharded gradient comes after it.
        candidates["end of backward: the tied embedding's backward (FSDP) beside the kept logits"] = (
            all_grads - (0 if in_backward else mem.head_grads) + mem.grad_buckets,
            mem.non_layer,
            outputs + u.end,
        )
    tied = tied_embedding_grad_bytes(ctx)
    if tied:
        candidates["end of backward: the tied embedding's two gradient contributions and their sum"] = (
            all_grads + mem.grad_buckets,
            mem.non_layer,
            outputs + 2 * tied + u.end,
        )
    note, (grads, acts, temp) = max(candidates.items(), key=lambda item: sum(item[1]))
    parts = _base(mem) | {_C.GRADIENTS: grads, _C.ACTIVATIONS: acts, _C.INPUTS: mem.inputs, _C.TEMPORARY: temp}
    return _phase("backward", note, parts)


def _optimizer(mem: StageMemory) -> PhaseMemory:
    parts = _base(mem) | {_C.GRADIENTS: mem.grads + mem.grad_buckets, _C.TEMPORARY: mem.step_temp}
    return _phase("optimizer_step", "optimizer.step(): every gradient and the step's temporaries", parts)


def training_phases(ctx: TrainingContext, mem: StageMemory) -> list[PhaseMemory]:
    """The phases of one step on one stage."""
    phases = [_forward(ctx, mem), _backward(ctx, mem)]
    if not ctx.in_backward_step:
        phases.append(_optimizer(mem))
    return phases


@dataclass(frozen=True, kw_only=True, slots=True)
class _Levels:
    reserved: int
    device: int
    runtime: dict[str, int]
    safe: SafeLevels
    note: str


def _levels(ctx: TrainingContext, mem: StageMemory, peak: PhaseMemory, targets: frozenset[str]) -> _Levels:
    """Reserved (allocator slack), device (runtime parts) and the safe figures above the allocated peak."""
    workload = ctx.workload
    slack = training_slack(ctx, mem, targets, allocator_settings(workload.alloc_conf))
    eager = older_than(workload.versions, "lazy_module_loading")
    runtime = runtime_parts(workload.parallel, paged_bytes=mem.paged_states, eager_modules=eager)
    reserved = peak.allocated_bytes + slack.total_bytes
    device = reserved + sum(runtime.values())
    safe = safe_levels(
        allocated=peak.allocated_bytes,
        reserved=reserved,
        device=device,
        breakdown=peak.breakdown,
        allocator_spread=slack.spread_bytes,
        runtime_spread=runtime_spread(runtime, len(communicators(workload.parallel))),
        sharded=workload.parallel.shard in (Shard.FSDP, Shard.HSDP, Shard.ZERO3),
    )
    note = _reserved_note(slack, workload.alloc_conf)
    if eager:
        note += f"; {rule_note(workload.versions, 'lazy_module_loading')}"
    return _Levels(reserved=reserved, device=device, runtime=runtime, safe=safe, note=note)


def _reserved_note(slack: TrainingSlack, alloc_conf: str) -> str:
    conf = f" under {alloc_conf}" if alloc_conf else ""
    if slack.replayed:
        return (
            f"reserved: slack {format_bytes(slack.total_bytes)}{conf} = the whole step replayed through the "
            "caching-allocator model, FSDP's collective buffers in their streams' pools"
        )
    return (
        f"reserved: slack {format_bytes(slack.total_bytes)}{conf} = replayed vocabulary tensors "
        f"{format_bytes(slack.vocabulary_bytes)} + layer churn x fitted fractions {format_bytes(slack.layers_bytes)}"
    )


def estimate_training(spec: ModelSpec, workload: Workload, *, gpu: GpuSpec | None = None) -> MemoryReport:
    """Per-GPU memory of one training step of ``workload`` on ``spec`` (busiest rank),
    checked against ``gpu`` when one is given."""
    ctx = resolve_training(spec, workload)
    if spec.generic is not None:
        from vramlens.estimator.generic import generic_layout
        from vramlens.estimator.generic_terms import generic_stage_memory

        layout, memory = generic_layout(ctx), generic_stage_memory
    else:
        layout, memory = param_layout(ctx), stage_memory
    best: tuple[int, StageMemory, list[PhaseMemory]] | None = None
    for stage in layout.stages:
        mem = memory(ctx, stage, layout.targets)
        phases = training_phases(ctx, mem)
        highest = max(phase.allocated_bytes for phase in phases)
        if best is None or highest > best[0]:
            best = (highest, mem, phases)
    assert best is not None
    allocated, mem, phases = best
    peak = max(phases, key=lambda phase: phase.allocated_bytes)
    levels = _levels(ctx, mem, peak, layout.targets)
    notes = [*ctx.assumptions, *vision_notes(ctx), *dict.fromkeys(mem.notes), levels.note]
    if len(layout.stages) > 1:
        notes.append(f"pipeline parallel: reporting the {mem.stage.name}, the busier of the first and last stages")
    return MemoryReport(
        engine="estimate",
        model=spec.name,
        workload=workload,
        phases=tuple(phases),
        peak_phase=peak.name,
        allocated_bytes=allocated,
        reserved_bytes=levels.reserved,
        device_bytes=levels.device,
        runtime=levels.runtime,
        safe=levels.safe,
        terms=tuple(mem.terms),
        assumptions=tuple(notes),
        gpu=gpu.name if gpu else None,
        capacity_bytes=gpu.memory_bytes if gpu else None,
    )
