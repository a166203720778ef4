"""A stage's weights as allocator requests, tensor by tensor (:mod:`vramlens.estimator.step_shape`).

Each weight of a decoder layer is its own request (linears, biases, norms; the rest of a layer,
routed experts or a state mixer's tensors, in two), as ``from_pretrained`` makes them: a frozen,
unquantized base's weights at their own sizes, what else is frozen (the final norm, a vision
tower) in a tensor of its own; a quantized base's layers share its frozen bytes in proportion.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.estimator.layout import StageView, effective_quant
from vramlens.estimator.qlora import unquantized_bytes
from vramlens.model.modules import layer_linears
from vramlens.model.params import norm_parameters
from vramlens.model.spec import LayerKind
from vramlens.resolve._memo import memo
from vramlens.resolve.context import TrainingContext
from vramlens.workload.options import Quant

__all__ = ["resident_weights", "unsharded_params"]


def _layer_weights(ctx: TrainingContext, kind: LayerKind, layer_elements: int) -> list[int]:
    """Elements of each weight of one layer of ``kind`` on this rank: linears (and biases), norms, and
    the rest (routed experts as fused 3-D gate/up and down tensors, the router; a state mixer's
    convolution and vectors) in two tensors (memoized on the spec)."""
    key = _LayerWeights(kind=kind, layer_elements=layer_elements, tp=ctx.workload.parallel.tp)
    return memo(ctx.spec, key, lambda: _weights_of_layer(ctx, kind, layer_elements))


@dataclass(frozen=True, kw_only=True, slots=True)
class _LayerWeights:
    """The memo key of :func:`_layer_weights`."""

    kind: LayerKind
    layer_elements: int
    tp: int


def _weights_of_layer(ctx: TrainingContext, kind: LayerKind, layer_elements: int) -> list[int]:
    spec, tp = ctx.spec, ctx.workload.parallel.tp
    weights: list[int] = []
    for s in layer_linears(spec, kind):
        weights.append(s.in_features * s.out_features // tp)
        if s.bias:
            weights.append(s.out_features // tp)
    weights.extend([norm_parameters(spec.norm, spec.hidden_size)] * spec.norms_per_layer)
    rest = layer_elements - sum(weights)
    if rest > 0:
        weights.extend([2 * rest // 3, rest - 2 * rest // 3])
    return weights


def _adapters(ctx: TrainingContext, kind: LayerKind, targets: frozenset[str]) -> list[int]:
    """Elements of the LoRA A (r x in) and B (out x r) matrices of one layer of ``kind``."""
    rank, tp = ctx.workload.lora.rank, ctx.workload.parallel.tp
    found: list[int] = []
    for s in layer_linears(ctx.spec, kind):
        if s.name in targets:
            found.extend([rank * s.in_features, s.out_features // tp * rank])
    return found


def _layer_tensors(
    ctx: TrainingContext,
    stage: StageView,
    targets: frozenset[str],
    kinds: list[LayerKind],
    d_param: int,
    edges_frozen: float,
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """(resident weights in bytes, trained tensors in elements) of each layer kind: a frozen,
    unquantized base's weights at their own sizes; a quantized base's layers share the stage's
    frozen bytes less the vocabulary matrices' (``edges_frozen``, resident in their own tensors)."""
    layer_params, layer_trained = [], []
    for kind in kinds:
        weights = _layer_weights(ctx, kind, stage.layer_elements)
        if ctx.full:
            layer_params.append(tuple(w * ctx.param_bytes // d_param for w in weights))
            layer_trained.append(tuple(weights))
        else:
            plain = effective_quant(ctx) is Quant.NONE
            frozen = (
                ctx.frozen_bytes
                if plain
                else max(0.0, stage.frozen_bytes - edges_frozen) / max(stage.layers, 1) / max(sum(weights), 1)
            )
            layer_params.append(tuple(int(w * frozen) // d_param for w in weights if w))
            layer_trained.append(tuple(_adapters(ctx, kind, targets)))
    return layer_params, layer_trained


def _frozen_rest(
    ctx: TrainingContext,
    stage: StageView,
    kinds: list[LayerKind],
    layer_params: list[tuple[int, ...]],
    edges: int,
    d_param: int,
) -> int:
    """Bytes of a frozen, unquantized base that are in neither the decoder layers' weights nor the
    vocabulary matrices (the final norm; a vision tower, a projector), resident in tensors of their
    own: 0 for full training and quantized bases (whose layers share the frozen bytes)."""
    if ctx.full or effective_quant(ctx) is not Quant.NONE or not kinds:
        return 0
    layers = sum(sum(layer_params[i % len(kinds)]) for i in range(stage.layers))
    return max(0, int(stage.frozen_bytes) // d_param - edges - layers)


def unsharded_params(
    ctx: TrainingContext, stage: StageView, kinds: list[LayerKind], trained: list[tuple[int, ...]], a: int
) -> tuple[tuple[int, ...], ...]:
    """Each layer kind's unsharded parameters in the compute dtype, one tensor per parameter as
    FSDP2's copy-out makes them (``FSDPParam.alloc_all_gather_outputs``): the weights, and with
    LoRA the adapters beside them."""
    found = []
    for kind, adapters in zip(kinds, trained, strict=True):
        weights = _layer_weights(ctx, kind, stage.layer_elements)
        found.append(tuple(e * a for e in (*weights, *(() if ctx.full else adapters)) if e))
    return tuple(found) or ((),)


def resident_weights(
    ctx: TrainingContext, stage: StageView, targets: frozenset[str], kinds: list[LayerKind], d_param: int
) -> tuple[tuple[int, ...], list[tuple[int, ...]], list[tuple[int, ...]]]:
    """(the weights outside the layers in bytes: the embedding on the first stage, the head on the
    last unless tied, then the rest of a frozen base; each layer kind's resident weights in bytes;
    each layer kind's trained tensors in elements) on this rank, ``d_param`` ways sharded."""
    spec = ctx.spec
    table = spec.vocab_size * spec.hidden_size // ctx.workload.parallel.tp
    edges = [table] if stage.first else []
    if stage.last and not (spec.tie_word_embeddings and stage.first):
        edges.append(table)
    edge_bytes = ctx.param_bytes if ctx.full else unquantized_bytes(ctx)
    layer_params, layer_trained = _layer_tensors(ctx, stage, targets, kinds, d_param, sum(edges) * edge_bytes)
    rest = _frozen_rest(ctx, stage, kinds, layer_params, int(sum(edges) * edge_bytes) // d_param, d_param)
    return (*(int(e * edge_bytes) // d_param for e in edges), *([rest] if rest else [])), layer_params, layer_trained
