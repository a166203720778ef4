"""Eager attention's score tensors as the allocator is asked for them, for the step pattern
(:mod:`vramlens.estimator.step_layers`): the chain of a layer's forward that keeps them for backward,
and the chain of a recomputed layer's first (no-grad) forward. Both are
:func:`~vramlens.estimator.eager_attention.eager_score_chain` of the layer recipe; SDPA's math backend
(fp32 queries with grouped KV heads on CUDA, :func:`vramlens.resolve.attention.on_cuda_backend`) makes the
same tensors in the same order in the layers no mask reaches.
"""

from __future__ import annotations

from vramlens.estimator.eager_attention import eager_score_chain
from vramlens.estimator.loss_pattern import Step
from vramlens.estimator.recompute import layer_kind, layer_recipe
from vramlens.estimator.saved_parts import LayerRecipe, TrainState
from vramlens.model.spec import LayerKind
from vramlens.resolve.context import TrainingContext

__all__ = ["forward_score_chain", "recomputed_score_chain"]


def recomputed_score_chain(ctx: TrainingContext, state: TrainState, layer_range: range) -> tuple[Step, ...]:
    """Eager attention's score tensors in the first (no-grad) forward of a layer that full recompute
    re-runs in backward, in code order (:func:`~vramlens.estimator.eager_attention.eager_score_chain`);
    empty unless every layer of the range keeps what eager attention keeps (eager attention, or SDPA's
    math backend in a layer no mask reaches: :meth:`LayerRecipe.eager_like`) and the layers are
    recomputed whole (a hybrid's Mamba, linear-attention or masked layers make no such scores)."""
    if not ctx.workload.recompute.whole_layer or not layer_range:
        return ()
    recipe = layer_recipe(ctx, state, [])
    kinds = {layer_kind(ctx.spec.layers[index], ctx.workload.seq) for index in layer_range}
    if not all(kind.attends and recipe.eager_like(sliding=kind.sliding) for kind in kinds):
        return ()
    return _score_chain(ctx, recipe, grad=False)


def forward_score_chain(ctx: TrainingContext, state: TrainState, kind: LayerKind) -> tuple[Step, ...]:
    """Eager attention's score tensors in the forward of a layer of ``kind`` that keeps them for
    backward (autograd keeps the probabilities, and Gemma 2's soft-cap tanh), in code order; empty
    where the layer's attention is a fused kernel (or it does not attend). SDPA's math backend makes
    the same tensors in the same order: ``q @ k^T`` scaled, the mask added, the softmax."""
    recipe = layer_recipe(ctx, state, [])
    if not kind.attends or not recipe.eager_like(sliding=kind.sliding):
        return ()
    return _score_chain(ctx, recipe, grad=True)


def _score_chain(ctx: TrainingContext, recipe: LayerRecipe, *, grad: bool) -> tuple[Step, ...]:
    return eager_score_chain(
        ctx.spec,
        recipe.style,
        compute_bytes=recipe.compute_bytes,
        autocast=recipe.autocast,
        seq=recipe.seq,
        tokens=ctx.tokens,
        tp=ctx.workload.parallel.tp,
        grad=grad,
    )
