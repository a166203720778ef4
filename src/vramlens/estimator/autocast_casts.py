"""Autocast's bf16 weight copies in a full fine-tune of fp32 weights, and how many backward keeps.

torch.autocast caches each weight's cast for the forward region (``torch/csrc/autograd/autocast_mode.cpp``
``cached_casts``, cleared when the outermost autocast region exits); the copies a layer saved for
backward stay alive until that layer's backward, so recompute decides how many remain.
"""

from __future__ import annotations

from vramlens.categories import Category
from vramlens.estimator.mlp_working import mlp_out_elements
from vramlens.estimator.stage_memory import StageMemory
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.derived import checkpointed_layers
from vramlens.workload.options import Recompute

__all__ = ["autocast_casts", "uncast_edge_elements"]


def uncast_edge_elements(ctx: TrainingContext, *, first: bool, last: bool) -> int:
    """Trainable elements outside the layers that autocast never casts: an untied token embedding
    and learned positions (``embedding`` is not on autocast's lower-precision op list; a tied table
    is cast once, by the LM head's ``linear``) on the first stage, the final norm (``mul``) on the
    last. A tracked CPU run of the tiny Llama (mixed-bf16) holds the layers' and the head's copies
    and none of the embedding's; the simulator agrees (a Llama-3.2-1B-shaped model, untied)."""
    breakdown, tp = ctx.spec.parameter_breakdown, ctx.workload.parallel.tp
    edges = 0
    if first:
        edges += breakdown.position_embedding + (0 if ctx.spec.tie_word_embeddings else breakdown.embedding // tp)
    if last:
        edges += breakdown.final_norm
    return edges


def autocast_casts(ctx: TrainingContext, mem: StageMemory) -> None:
    """Autocast weight copies (full fine-tuning of fp32 weights under autocast): every trainable
    weight but the layers' norms and :func:`uncast_edge_elements`."""
    stage, a, spec = mem.stage, ctx.compute_bytes, ctx.spec
    if ctx.autocast and ctx.full:
        linear = stage.trainable_elements - stage.layers * spec.norms_per_layer * spec.hidden_size
        linear -= uncast_edge_elements(ctx, first=stage.first, last=stage.last)
        mem.add(
            "autocast bf16 weight copies (autocast cache, until the forward ends)",
            Category.TEMPORARY,
            linear * a,
            lambda: f"{linear:,} weights x {a} B",
            into="casts_bytes",
            alive="the forward (autocast cache)",
        )
        mem.casts_backward_bytes = _casts_in_backward(ctx, mem.casts_bytes, stage.layers)
        if ctx.workload.recompute is Recompute.NONE:  # every copy is alive in backward: some are freed early
            tp = ctx.workload.parallel.tp
            mem.autocast_head_copy_bytes = spec.vocab_size * spec.hidden_size // tp * a if stage.last else 0
            mem.autocast_down_copy_bytes = mlp_out_elements(spec) // tp * a
        mem.formulas["casts_backward_bytes"] = _casts_backward_formula(ctx, stage.layers)


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
