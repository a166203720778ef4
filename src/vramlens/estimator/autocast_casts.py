"""Autocast's bf16 weight copies in a full fine-tune of fp32 weights, and how many backward keeps.

torch.autocast caches each weight's cast for the forward region (``torch/csrc/autograd/autocast_mode.cpp``
``cached_casts``, cleared when the outermost autocast region exits); the copies a layer saved for
backward stay alive until that layer's backward, so recompute decides how many remain.
"""

from __future__ import annotations

from vramlens.categories import Category
from vramlens.estimator.stage_memory import StageMemory
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.derived import checkpointed_layers
from vramlens.workload.options import Recompute

__all__ = ["autocast_casts"]


def autocast_casts(ctx: TrainingContext, mem: StageMemory) -> None:
    """Autocast weight copies (full fine-tuning of fp32 weights under autocast)."""
    stage, a, spec = mem.stage, ctx.compute_bytes, ctx.spec
    if ctx.autocast and ctx.full:
        linear = stage.trainable_elements - stage.layers * spec.norms_per_layer * spec.hidden_size
        mem.add(
            "autocast bf16 weight copies (autocast cache, until the forward ends)",
            Category.TEMPORARY,
            linear * a,
            lambda: f"{linear:,} weights x {a} B",
            into="casts_bytes",
            alive="the forward (autocast cache)",
        )
        mem.casts_backward_bytes = _casts_in_backward(ctx, mem.casts_bytes, stage.layers)
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
