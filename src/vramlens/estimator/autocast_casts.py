"""Autocast's bf16 weight copies in a full fine-tune of fp32 weights, and how many backward keeps.

torch.autocast caches each weight's cast for the forward region (``torch/csrc/autograd/autocast_mode.cpp``
``cached_casts``, cleared when the outermost autocast region exits); the copies a layer saved for
backward stay alive until that layer's backward, so recompute decides how many remain.
"""

from __future__ import annotations

from vramlens.categories import Category
from vramlens.estimator.layout import StageView
from vramlens.estimator.mlp_working import mlp_out_elements
from vramlens.estimator.stage_memory import StageMemory
from vramlens.model.params import ffn_parameters, norm_parameters
from vramlens.model.spec import FfnKind
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.derived import checkpointed_layers
from vramlens.workload.options import Recompute

__all__ = ["autocast_casts"]


def autocast_casts(ctx: TrainingContext, mem: StageMemory) -> None:
    """Autocast weight copies (full fine-tuning of fp32 weights under autocast)."""
    if not (ctx.autocast and ctx.full):
        return
    a, layers = ctx.compute_bytes, mem.stage.layers
    layer_elements, head = _cast_elements(ctx, mem.stage)
    mem.add(
        "autocast bf16 weight copies (autocast cache, until the forward ends)",
        Category.TEMPORARY,
        (layer_elements + head) * a,
        lambda: f"({layer_elements:,} layer + {head:,} head) weights x {a} B",
        into="casts_bytes",
        alive="the forward (autocast cache)",
    )
    mem.casts_backward_bytes = _casts_in_backward(ctx, mem.casts_bytes, layers)
    mem.formulas["casts_backward_bytes"] = _casts_backward_formula(ctx, layers)
    if ctx.workload.recompute is Recompute.NONE:  # every copy is alive in backward: some are freed early
        tp = ctx.workload.parallel.tp
        mem.autocast_head_copy_bytes = head * a
        mem.autocast_down_copy_bytes = mlp_out_elements(ctx.spec) // tp * a
    mem.casts_last_layer_bytes = layer_elements * a // max(layers, 1)
    mem.formulas["casts_last_layer_bytes"] = lambda: f"{layer_elements:,} layer weights x {a} B / {layers} layers"


def _cast_elements(ctx: TrainingContext, stage: StageView) -> tuple[int, int]:
    """(elements of the stage's layer weights autocast casts, of the head's): the matmuls' weights
    and biases (``F.linear`` is on autocast's lower-precision list). Not the norms' weights (an
    elementwise product keeps their dtype) nor the input embedding (``F.embedding`` is on no list:
    a lookup in the fp32 table) nor the routed experts' 3-D weights (``grouped_mm`` is on no list
    either: fp32 experts compute in fp32, :func:`vramlens.estimator.moe_parts.expert_bytes`); the LM
    head's weight is cast where the head runs (the tied table too: once, as the head's weight)."""
    spec, parallel = ctx.spec, ctx.workload.parallel
    table = spec.vocab_size * spec.hidden_size // parallel.tp
    tables = stage.first + (stage.last and not (spec.tie_word_embeddings and stage.first))  # trained tables
    final_norm = norm_parameters(spec.norm, spec.hidden_size) if stage.last else 0
    norms = stage.layers * spec.norms_per_layer * norm_parameters(spec.norm, spec.hidden_size)
    experts = ffn_parameters(spec, FfnKind.MOE)["moe_experts"] // (parallel.ep * parallel.tp) if spec.is_moe else 0
    positions = spec.parameter_breakdown.position_embedding if stage.first else 0  # learned positions: a lookup
    layers = stage.trainable_elements - tables * table - final_norm - norms - stage.moe_layers * experts - positions
    return max(0, layers), table if stage.last else 0


def _casts_in_backward(ctx: TrainingContext, casts: int, layers: int) -> int:
    """Autocast weight casts alive in backward: those saved by layers that were not
    checkpointed (the cache itself is cleared when the forward's autocast region exits),
    plus one recomputed layer's casts."""
    if ctx.workload.recompute is Recompute.NONE or layers == 0:
        return casts
    if ctx.workload.recompute is Recompute.FULL:
        kept = layers - checkpointed_layers(ctx.workload, layers)
        return int(casts * (kept + 1) / layers)
    return int(casts / layers)


def _casts_backward_formula(ctx: TrainingContext, layers: int) -> str:
    if ctx.workload.recompute is Recompute.NONE or layers == 0:
        return "every layer's autocast weight copies (saved for backward)"
    if ctx.workload.recompute is Recompute.FULL:
        every = ctx.workload.recompute_every
        return f"copies x (layers not checkpointed {layers} - ceil({layers} / {every}) + one recomputed) / {layers}"
    return f"one recomputed layer's copies: copies / {layers}"
