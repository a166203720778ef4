"""DeepSpeed ZeRO-3's report terms: its gathered parameters instant by instant and its optimizer
step's sub-group gradients, from the rules of :mod:`vramlens.estimator.zero3`."""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.categories import Category
from vramlens.estimator.fsdp import AddTerm, Unsharded
from vramlens.estimator.layout import StageView
from vramlens.estimator.stage_memory import StageMemory
from vramlens.estimator.zero3 import (
    gathered_elements,
    inflight_gradients,
    step_sub_group,
    zero3_model,
)
from vramlens.resolve._memo import memo
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.zero import ZeroSettings
from vramlens.workload.options import Recompute

__all__ = ["zero3_step_gradients", "zero3_unsharded"]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Zero3Inputs:
    """What :func:`_unsharded` reads besides the model: its memo key (no batch, no sequence length)."""

    layer_range: range
    first: bool
    last: bool
    layer_elements: int
    adapters: int
    full: bool
    tp: int
    recomputed: bool
    compute_bytes: int
    grad_bytes: int
    settings: ZeroSettings


def zero3_unsharded(ctx: TrainingContext, stage: StageView, add: AddTerm, notes: list[str]) -> Unsharded:
    """DeepSpeed ZeRO-3: the parameters its coordinator keeps gathered at each instant and the full
    gradients in flight (:mod:`vramlens.estimator.zero3`), with its report term and assumed sizes
    (memoized on the spec: a planner varies batch and length, not these)."""
    assert ctx.zero is not None
    settings = ctx.zero
    key = _Zero3Inputs(
        layer_range=stage.layer_range, first=stage.first, last=stage.last, layer_elements=stage.layer_elements,
        adapters=sum(g.elements for g in stage.trainable if g.name == "LoRA adapters"), full=ctx.full,
        tp=ctx.workload.parallel.tp, recomputed=ctx.workload.recompute is Recompute.FULL and ctx.workload.recompute_every == 1,
        compute_bytes=ctx.compute_bytes, grad_bytes=ctx.grad_bytes, settings=settings,
    )  # fmt: skip
    found = memo(ctx.spec, key, lambda: _unsharded(ctx, stage, settings))
    if settings.note:
        notes.append(settings.note)
    a, loss = ctx.compute_bytes, found.loss
    add(
        "ZeRO-3 gathered parameters (prefetched up to stage3_max_live_parameters, kept within the reuse distance)",
        Category.TEMPORARY,
        loss,
        lambda: f"{loss // a:,} elements at the loss x {a} B ({found.how})",
        alive="from the first layers' forward into the backward",
    )
    return found


def _unsharded(ctx: TrainingContext, stage: StageView, settings: ZeroSettings) -> Unsharded:
    """The bytes of each instant: gathered elements x the compute dtype, gradients in flight x theirs."""
    a, g = ctx.compute_bytes, ctx.grad_bytes
    model = zero3_model(ctx, stage, settings)
    gathered = gathered_elements(model, settings)
    # the largest trained layer tensor; with LoRA a layer's adapters (the model's last entry), a bound on one
    trained = model.largest if ctx.full else (model.layer[-1] if model.layer else 0)
    layer, first, end = inflight_gradients(model, trained, edges_trained=ctx.full, bucket=settings.reduce_bucket)
    how = (
        f"ZeRO-3 coordinator: persistent {model.persistent:,} elements + of the rest at most max(kept by "
        f"stage3_max_reuse_distance {settings.max_reuse:,}, stage3_max_live_parameters {settings.max_live:,} + one "
        f"tensor {model.largest:,}), x {a} B; full gradients in flight x {g} B"
    )
    return Unsharded(
        forward_layer=gathered.forward_layer * a,
        loss=gathered.loss * a,
        backward_start=gathered.loss * a,
        first_layers=gathered.first_layers * a + first * g,
        last_layer=gathered.last_layer * a + layer * g,
        end=gathered.end * a + end * g,
        how=how,
    )


def zero3_step_gradients(ctx: TrainingContext, mem: StageMemory, d_state: int) -> None:
    """DeepSpeed ZeRO-3 steps one sub group at a time: its gradients flattened in their dtype beside
    their fp32 copy (:func:`vramlens.estimator.zero3.step_sub_group`)."""
    assert ctx.zero is not None
    masters = [group for group in mem.stage.trainable if group.master_bytes]
    partition = sum(group.elements for group in masters) // d_state
    largest = max(group.largest_tensor or group.elements for group in masters) // d_state
    sub, g, size = step_sub_group(partition, largest, ctx.zero.sub_group), ctx.grad_bytes, ctx.zero.sub_group
    formula = f"min(partition {partition:,}, sub_group_size {size:,} + one tensor {largest:,})"
    mem.add(
        "fp32 gradients of the largest optimizer sub group (ZeRO-3)",
        Category.TEMPORARY,
        sub * 4,
        lambda: f"{formula} x 4 B",
        into="step_temp_bytes",
        alive="inside optimizer.step(), one sub group at a time",
    )
    mem.add(
        "the sub group's flattened gradients, cast to fp32 (ZeRO-3 _prepare_fp32_grad_for_sub_group)",
        Category.TEMPORARY,
        sub * g,
        lambda: f"{formula} x {g} B",
        into="step_temp_bytes",
        alive="inside optimizer.step(), during the cast",
    )
