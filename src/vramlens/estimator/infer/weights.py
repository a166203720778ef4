"""Inference weights on one rank, at their storage format.

Decoder layers hold their linears (quantized when a format is given, unless
skipped), biases, norms and MoE routers in the compute dtype. Tensor
parallelism splits attention heads, MLP inner widths and routed experts
(``ep`` splits experts instead) and the vocabulary of embedding and head; norms
and routers are replicated; an MLA latent projection is replicated too. The
first pipeline stage holds the embedding, the last the final norm and the head
(a tied head is the embedding itself unless the two are on different stages).
vLLM pads each rank's vocabulary slice to a multiple of 64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vramlens.estimator.infer.context import InferenceContext
from vramlens.estimator.infer.engines import VLLM
from vramlens.estimator.infer.kv_cache import kv_heads_per_rank
from vramlens.estimator.weight_format import Scheme
from vramlens.model.components import FfnKind, LayerKind, MlpKind
from vramlens.model.modules import LinearShape, layer_kinds, layer_linears
from vramlens.model.params import ffn_parameters, mixer_parameters, norm_parameters
from vramlens.workload.options import Engine

__all__ = ["StageWeights", "stage_weights"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StageWeights:
    """Weight bytes of one pipeline stage on one rank."""

    name: str
    layers: range
    layer_bytes: int
    """All decoder layers of the stage."""
    embedding_bytes: int
    head_bytes: int
    """Final norm, LM head (and parts outside the decoder such as a vision tower)."""
    first: bool
    last: bool

    @property
    def total(self) -> int:
        return self.layer_bytes + self.embedding_bytes + self.head_bytes


def _expert_shapes(ctx: InferenceContext) -> list[LinearShape]:
    moe = ctx.spec.moe
    assert moe is not None
    h, i = ctx.spec.hidden_size, moe.expert_intermediate_size
    up = [LinearShape(name="experts.up", in_features=h, out_features=i, group="moe")]
    if moe.expert_kind is MlpKind.GATED:
        up.append(LinearShape(name="experts.gate", in_features=h, out_features=i, group="moe"))
    return [*up, LinearShape(name="experts.down", in_features=i, out_features=h, group="moe")]


def _split(ctx: InferenceContext, shape: LinearShape) -> tuple[int, int]:
    """(out, in) of one rank's slice: column-parallel layers split outputs, row-parallel inputs.
    K/V projections keep whole heads: one replicated head per rank when tp exceeds the KV heads."""
    tp, attention = ctx.tp, ctx.spec.attn
    if shape.group in ("attn_out", "mlp_out") or shape.name == "experts.down":
        return shape.out_features, shape.in_features // tp
    if shape.name in ("kv_a_proj_with_mqa", "q_a_proj"):
        return shape.out_features, shape.in_features  # MLA down-projections are replicated
    if shape.group == "attn_in" and attention.mla is None:
        kv = kv_heads_per_rank(attention.num_kv_heads, tp) * attention.head_dim
        q = attention.num_heads // tp * attention.head_dim
        out = {"q_proj": q, "k_proj": kv, "v_proj": kv}.get(shape.name, q + 2 * kv)
        return out, shape.in_features
    return shape.out_features // tp, shape.in_features


def _linear_bytes(
    ctx: InferenceContext, shapes: list[LinearShape], copies: float, layer: int | None
) -> tuple[float, int]:
    """(bytes on one rank, elements counted as ``parameters // tp``) of ``copies`` of each shape
    in decoder layer ``layer``; the element count is what the parameter counts subtract."""
    fmt = ctx.weights
    total, elements = 0.0, 0
    for shape in shapes:
        out, inp = _split(ctx, shape)
        elements += round(copies * shape.out_features * shape.in_features / ctx.tp)
        if fmt is not None and fmt.quantizes(shape.name, shape.group, layer):
            total += copies * fmt.linear_bytes(out, inp)
        else:
            total += copies * out * inp * ctx.compute_bytes
    return total, elements


def _layer_bytes(ctx: InferenceContext, kind: LayerKind, layer: int | None = None) -> float:
    """Bytes of one decoder layer of ``kind`` on one rank (``layer``: its index, for layer-specific skips)."""
    spec, tp, ep = ctx.spec, ctx.tp, ctx.workload.parallel.ep
    h = spec.hidden_size
    elements = sum(mixer_parameters(spec, kind.mixer).values()) // tp
    elements += spec.norms_per_layer * norm_parameters(spec.norm, h)
    shapes = list(layer_linears(spec, kind))
    linear, linear_elements = _linear_bytes(ctx, shapes, 1, layer)
    ffn = ffn_parameters(spec, kind.ffn)
    if kind.ffn is FfnKind.MOE and spec.moe is not None:
        elements += ffn["moe_experts"] // (ep * tp) + ffn["moe_shared"] // tp + ffn["moe_router"]
        experts, expert_elements = _linear_bytes(ctx, _expert_shapes(ctx), spec.moe.num_experts / ep, layer)
        linear += experts
        linear_elements += expert_elements
    else:
        elements += sum(ffn.values()) // tp
    rest = max(elements - linear_elements, 0)  # norms, biases, routers, q/k norms, SSM vectors and convolutions
    return linear + rest * ctx.compute_bytes + _fp32_expert_bias_bytes(ctx, kind.ffn is FfnKind.MOE)


def _fp32_expert_bias_bytes(ctx: InferenceContext, moe_layer: bool) -> float:
    """transformers' MXFP4 experts (``Mxfp4GptOssExperts``) keep their biases in float32: the
    bytes beyond the compute dtype they are counted in above, on one rank (experts split ``ep``)."""
    moe, fmt = ctx.spec.moe, ctx.weights
    if not (moe_layer and moe is not None and moe.expert_bias and fmt is not None and fmt.scheme is Scheme.MXFP4):
        return 0.0
    widths = 2 * moe.expert_intermediate_size if moe.expert_kind is MlpKind.GATED else moe.expert_intermediate_size
    per_expert = widths // ctx.tp + ctx.spec.hidden_size
    return moe.num_experts / ctx.workload.parallel.ep * per_expert * max(4 - ctx.compute_bytes, 0)


def _vocab_rows(ctx: InferenceContext) -> int:
    """Embedding rows per rank; vLLM pads the vocabulary to a multiple of 64, then splits it."""
    vocab = ctx.spec.vocab_size
    if ctx.engine is Engine.VLLM:
        pad = VLLM.lm_head_vocab_padding
        vocab = math.ceil(vocab / pad) * pad
    return math.ceil(vocab / ctx.tp)


def _stage(ctx: InferenceContext, name: str, layers: range, *, first: bool, last: bool) -> StageWeights:
    spec = ctx.spec
    counts: dict[LayerKind, int] = {}
    for index in layers:
        counts[spec.layers[index].kind] = counts.get(spec.layers[index].kind, 0) + 1
    per_layer = {kind: _layer_bytes(ctx, kind) for kind in counts}
    layer_bytes = 0.0
    for kind in layer_kinds(spec):  # dense before MoE: a fixed order of the float sums
        layer_bytes += counts.get(kind, 0) * per_layer.get(kind, 0.0)
    special = ctx.weights.skipped_layers if ctx.weights is not None else frozenset()
    for index in special & set(layers):
        kind = spec.layers[index].kind
        layer_bytes += _layer_bytes(ctx, kind, index) - per_layer[kind]
    table = _vocab_rows(ctx) * spec.hidden_size * ctx.compute_bytes
    breakdown = spec.parameter_breakdown
    embedding = table + breakdown.position_embedding * ctx.compute_bytes if first else 0
    head = 0
    if last:
        untied_head = not spec.tie_word_embeddings or not first
        head = (breakdown.final_norm + breakdown.outside_decoder) * ctx.compute_bytes + (table if untied_head else 0)
        head += (spec.vocab_size if spec.lm_head_bias else 0) * ctx.compute_bytes // ctx.tp
    return StageWeights(
        name=name,
        layers=layers,
        layer_bytes=round(layer_bytes),
        embedding_bytes=embedding,
        head_bytes=head,
        first=first,
        last=last,
    )


def stage_weights(ctx: InferenceContext) -> tuple[StageWeights, ...]:
    """The stages worth evaluating: all layers (pp = 1), or the first and last pipeline stages."""
    layers, pp = ctx.spec.num_layers, ctx.workload.parallel.pp
    if pp == 1:
        return (_stage(ctx, "all layers", range(layers), first=True, last=True),)
    per_stage = math.ceil(layers / pp)
    last_start = per_stage * (pp - 1)
    return (
        _stage(ctx, "first pipeline stage", range(per_stage), first=True, last=False),
        _stage(ctx, "last pipeline stage", range(min(last_start, layers - 1), layers), first=False, last=True),
    )
