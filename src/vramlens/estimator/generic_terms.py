"""The quantities of a training step for a model described from its code, from its recipes.

The same :class:`~vramlens.estimator.quantities.StageMemory` the hand-written families fill,
with the layer terms read from the traced recipe (:mod:`vramlens.estimator.generic`):

* activations: what each layer still holds at the loss, its batch-dependent part;
* autocast copies: the part that does not depend on the batch (alive from the forward to
  the end of the step when saved for backward);
* outside the layers: embedding output, position tables, masks, the final norm;
* the forward and backward working sets: the largest layer's, as traced (with layer
  checkpointing, the recomputed layer is part of its backward working set).

Weights, optimizer state, gradients, sharding buffers, logits and loss are the
estimator's own terms (:mod:`vramlens.estimator.quantities`).
"""

from __future__ import annotations

from vramlens.categories import Category
from vramlens.estimator.generic import recipe_counts, training_recipe
from vramlens.estimator.layout import StageView, micro_batches_in_flight
from vramlens.estimator.logits_terms import logits_terms
from vramlens.estimator.quantities import (
    WHOLE_STEP,
    StageMemory,
    _dequantized,
    _optimizer_temporaries,
    _unsharded,
    _weights_and_state,
)
from vramlens.model.generic.recipe import TrainingRecipe
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.derived import checkpointed_layers
from vramlens.workload.options import Recompute, Shard

__all__ = ["generic_stage_memory"]

_PARAM_SHARDED = {Shard.ZERO3, Shard.FSDP, Shard.HSDP}


def _layer_bytes(
    ctx: TrainingContext, counts: dict[int, int], kept: TrainingRecipe, checkpointed: TrainingRecipe | None
) -> tuple[float, float, float]:
    """(activations, autocast copies at the loss, copies in backward) of the stage's layers: with
    ``recompute_every`` k, one layer in k keeps only its checkpoint (``checkpointed``)."""
    b, s = ctx.workload.batch, ctx.workload.seq
    layers = sum(counts.values())
    share = 0.0
    if checkpointed is not None:
        share = checkpointed_layers(ctx.workload, layers) / layers if layers else 0.0
    activations = forward_copies = backward_copies = 0.0
    for kind, count in counts.items():
        for recipe, weight in ((kept, 1.0 - share), (checkpointed, share)):
            if recipe is None or not weight:
                continue
            at_loss, at_backward = recipe.kinds[kind].end_of_forward, recipe.kinds[kind].start_of_backward
            activations += weight * count * (at_loss.at(b, s) - at_loss.constant)
            forward_copies += weight * count * at_loss.constant
            backward_copies += weight * count * at_backward.constant
    return activations, forward_copies, backward_copies


def _recipes(ctx: TrainingContext) -> tuple[TrainingRecipe, TrainingRecipe | None, TrainingRecipe]:
    """(the layers that keep everything, the checkpointed ones, the one whose working set counts)."""
    policy = ctx.workload.recompute
    if policy is Recompute.NONE:
        plain = training_recipe(ctx, recompute=False)
        return plain, None, plain
    checkpointed = training_recipe(ctx, recompute=True)
    if policy is Recompute.FULL and ctx.workload.recompute_every > 1:
        return training_recipe(ctx, recompute=False), checkpointed, checkpointed
    return checkpointed, None, checkpointed


def _layer_terms(ctx: TrainingContext, mem: StageMemory) -> None:
    stage, workload = mem.stage, ctx.workload
    b, s = workload.batch, workload.seq
    counts = recipe_counts(ctx.spec, stage.layer_range)
    kept, checkpointed, working = _recipes(ctx)
    in_flight = micro_batches_in_flight(workload.parallel.pp_schedule, workload.parallel.pp, workload.grad_accum)
    in_flight = in_flight if stage.first else 1
    activations, copies, copies_backward = _layer_bytes(ctx, counts, kept, checkpointed)
    if workload.recompute is Recompute.OFFLOAD:
        # Checkpointed inputs live in CPU memory; two layers' inputs are in flight on the GPU.
        largest = max((kept.kinds[k].end_of_forward.at(b, s) - kept.kinds[k].end_of_forward.constant) for k in counts)
        activations = 2 * largest
        mem.notes.append(
            "recompute offload: two checkpointed layer inputs in flight on the GPU, the rest in CPU memory"
        )
    mem.add(
        "activations (saved for backward, traced)",
        Category.ACTIVATIONS,
        activations * in_flight,
        lambda: f"traced per layer kind at {b} x {s} tokens, {sum(counts.values())} layers, {in_flight:g} in flight",
        into="activations_bytes",
        alive="from each layer's forward to its backward",
    )
    head = kept.head_constant if stage.last else 0
    mem.add(
        "autocast weight copies and other batch-independent layer tensors (traced)",
        Category.TEMPORARY,
        copies + head,
        "traced: what the layers hold at the loss whatever the batch",
        into="casts_bytes",
        alive="the forward (and backward where saved)",
    )
    mem.casts_backward_bytes = int(copies_backward + head)
    mem.formulas["casts_backward_bytes"] = "traced: what the layers hold at the start of backward whatever the batch"
    mem.casts_last_layer_bytes = int(copies) // max(stage.layers, 1)
    mem.formulas["casts_last_layer_bytes"] = "traced: one layer's share of what the layers hold whatever the batch"
    _outside_terms(ctx, mem, kept)
    kinds = list(counts)
    mem.working_bytes = int(max((working.kinds[k].backward_working.at(b, s) for k in kinds), default=0))
    mem.forward_working_bytes = int(max((working.kinds[k].forward_transient.at(b, s) for k in kinds), default=0))
    mem.formulas["working_bytes"] = f"traced: the largest layer kind's backward working set at {b} x {s} tokens"
    mem.formulas["forward_working_bytes"] = f"traced: the largest layer kind's forward transients at {b} x {s} tokens"
    mem.end_working_bytes = (
        0  # the traced working sets are the layers'; none is left when only the embedding's backward runs
    )
    if workload.recompute is not Recompute.NONE:
        mem.notes.append("recompute: the recomputed layer is traced inside its backward working set")
    mem.notes.extend(kept.notes)


def _outside_terms(ctx: TrainingContext, mem: StageMemory, kept: TrainingRecipe) -> None:
    """What the traced step holds outside the decoder layers, and the inputs."""
    b, s = ctx.workload.batch, ctx.workload.seq
    mem.add(
        "activations outside the layers (embedding output, position tables, masks, final norm; traced)",
        Category.ACTIVATIONS,
        kept.outside_forward.at(b, s),
        "traced outside the decoder layers",
        into="non_layer_bytes",
        alive="from the forward to the end of backward",
    )
    mem.add(
        "inputs (ids, labels)",
        Category.INPUTS,
        16 * ctx.tokens,
        lambda: f"{ctx.tokens:,} tokens x 2 int64",
        into="inputs_bytes",
        alive=WHOLE_STEP,
    )


def generic_stage_memory(ctx: TrainingContext, stage: StageView, targets: frozenset[str]) -> StageMemory:
    """Every quantity of one pipeline stage of a model described from its code."""
    mem = StageMemory(stage=stage)
    _weights_and_state(ctx, mem)
    _layer_terms(ctx, mem)
    if stage.last:
        logits_terms(ctx, mem)
    _unsharded(ctx, mem)
    _dequantized(ctx, mem)
    _optimizer_temporaries(ctx, mem)
    mem.notes.append(
        f"{ctx.spec.model_type}: layers traced from transformers' code (recipe), no native vramlens family"
    )
    return mem
