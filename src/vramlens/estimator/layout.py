"""Which parameters live on the busiest rank, which of them train, and in what dtype.

Pipeline parallelism gives a rank ``layers / pp`` layers (the first stage also
holds the embedding, the last the final norm and head); tensor parallelism
splits attention and MLP matrices and the vocabulary ``tp`` ways (norms stay
replicated); expert parallelism splits routed experts ``ep`` ways. Sharding
(ZeRO/FSDP) is applied later, per term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vramlens.errors import InputError
from vramlens.estimator.expert_lora import PEFT_MOVED_NAMES, expert_adapter_elements, wraps_experts
from vramlens.estimator.lora_head import EMBED_NAMES, HEAD_NAMES, head_adapter_elements
from vramlens.estimator.memo_keys import LayoutInputs
from vramlens.estimator.qlora import unquantized_bytes
from vramlens.estimator.vision import tower_targets, vision_frozen_bytes, vision_trained
from vramlens.estimator.weight_format import format_for_quant
from vramlens.model.modules import LinearShape, all_layer_linears, layer_kinds, layer_linears
from vramlens.model.params import ffn_parameters, mixer_parameters, norm_parameters
from vramlens.model.spec import FfnKind, LayerKind
from vramlens.resolve._memo import memo
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.kbit import BNB_4BIT_QUANTS
from vramlens.resolve.styles import hf_style
from vramlens.workload.options import Method, PipelineSchedule, Quant
from vramlens.workload.spec import ALL_LINEAR

__all__ = [
    "micro_batches_in_flight",
    "EMBED_NAMES",
    "ParamLayout",
    "StageView",
    "TrainableGroup",
    "effective_quant",
    "lora_targets",
    "param_layout",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainableGroup:
    """Trainable elements sharing one dtype policy."""

    name: str
    elements: int
    param_bytes: float
    grad_bytes: int
    state_bytes: int
    master_bytes: int = 0
    largest_tensor: int = 0
    """Elements of the largest single tensor (per-tensor optimizer temporaries)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageView:
    """Parameters of one pipeline stage on one rank (elements and bytes, before sharding)."""

    name: str
    layer_range: range
    """Indices of the decoder layers on this stage."""
    moe_layers: int
    first: bool
    last: bool
    frozen_bytes: float
    """Bytes of frozen weights (quantization scales included)."""
    trainable: tuple[TrainableGroup, ...]
    layer_elements: int
    """Elements of the largest layer on this rank (FSDP gathers one layer at a time)."""
    largest_linear: int
    """Elements of the largest linear weight (a dequantized copy is a temporary)."""

    @property
    def layers(self) -> int:
        """Decoder layers on this stage."""
        return len(self.layer_range)

    @property
    def trainable_elements(self) -> int:
        return sum(group.elements for group in self.trainable)


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamLayout:
    """The stages worth evaluating (first and last pipeline stage; one when pp = 1)."""

    stages: tuple[StageView, ...]
    adapters_per_layer: int
    targets: frozenset[str]


#: Modules PEFT refuses to put LoRA on, by model_type: the Mamba mixers' ``out_proj`` and ``conv1d``
#: (peft/tuners/tuners_utils.py ``_check_lora_target_modules_mamba``, PEFT 0.21); ``all-linear``
#: includes ``out_proj``, so it fails there too.
PEFT_REFUSED = {
    model_type: frozenset({"out_proj", "conv1d"})
    for model_type in ("falcon_h1", "mamba", "mamba2", "falcon_mamba", "nemotron_h")
}


def _check_peft(ctx: TrainingContext, chosen: frozenset[str]) -> frozenset[str]:
    refused = chosen & PEFT_REFUSED.get(ctx.spec.model_type, frozenset())
    if refused and ctx.profile.adapters_fp32:  # the PEFT-based profile
        names = {shape.name for shape in all_layer_linears(ctx.spec)} - refused
        raise InputError(
            f"lora.targets: PEFT refuses LoRA on {', '.join(sorted(refused))} of {ctx.spec.model_type} models (Mamba "
            f"layers); list the targets without it, from: {', '.join(sorted(names))}"
        )
    return chosen


def lora_targets(ctx: TrainingContext) -> frozenset[str]:
    """Module names that get LoRA adapters; errors name ``lora.targets`` for unknown modules. The LM
    head is a target when named (:data:`HEAD_NAMES`); ``all-linear`` leaves it out, as PEFT does."""
    if ctx.method not in (Method.LORA, Method.QLORA):
        return frozenset()
    names = {shape.name for shape in all_layer_linears(ctx.spec)}
    tower = {s.name for s in ctx.spec.vision.linears} if ctx.spec.vision is not None else set()
    targets = ctx.workload.lora.targets
    if targets == ALL_LINEAR:
        if not hf_style(ctx.spec.model_type).all_linear_lora:
            raise InputError(
                f"lora.targets: all-linear on {ctx.spec.model_type} wraps its MoE router, an nn.Linear subclass that "
                "returns a tuple, and PEFT's LoRA forward fails; list the modules, e.g. "
                "[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]"
            )
        if wraps_experts(ctx):  # PEFT moves these names to the experts' parameters (expert_lora.py)
            names = {n for n in names if n.rsplit(".", 1)[-1] not in PEFT_MOVED_NAMES}
        return _check_peft(ctx, frozenset(names | tower))
    chosen = set()
    for target in targets:
        matches = {n for n in names if n == target or n.endswith("." + target)} | tower_targets(ctx.spec, target)
        if not matches and target in HEAD_NAMES:
            matches = {target}
        if not matches:
            raise InputError(
                f"lora.targets: {ctx.spec.name} has no linear module {target!r}; its modules are "
                f"{', '.join(sorted(names | tower))} and the head (lm_head)"
            )
        chosen |= matches
    return _check_peft(ctx, frozenset(chosen))


def _quantized_bytes(shape: LinearShape, quant: Quant, tp: int) -> float:
    """Bytes of one frozen quantized linear weight with its scales (weight_format.py)."""
    fmt = format_for_quant(quant)
    assert fmt is not None
    return fmt.linear_bytes(shape.out_features // tp, shape.in_features)


def effective_quant(ctx: TrainingContext) -> Quant:
    """The frozen weights' format: QLoRA without a ``quant`` means NF4 with double quantization."""
    if ctx.method is Method.QLORA and ctx.workload.quant is Quant.NONE:
        return Quant.NF4_DQ
    return ctx.workload.quant


def _ffn_elements(ctx: TrainingContext, kind: LayerKind) -> int:
    """One layer's FFN elements on this rank: routed experts split ``ep x tp`` ways, the router replicated."""
    tp, ep = ctx.workload.parallel.tp, ctx.workload.parallel.ep
    counts = ffn_parameters(ctx.spec, kind.ffn)
    if kind.ffn is FfnKind.MOE:
        return counts["moe_experts"] // (ep * tp) + counts["moe_shared"] // tp + counts["moe_router"]
    return sum(counts.values()) // tp


def _layer_weights(ctx: TrainingContext, kind: LayerKind, targets: frozenset[str]) -> tuple[float, int, int, int, int]:
    """(frozen bytes, trainable elements, adapter elements, layer elements, largest linear) of one layer."""
    spec, tp, ep = ctx.spec, ctx.workload.parallel.tp, ctx.workload.parallel.ep
    h = spec.hidden_size
    mixer = sum(mixer_parameters(spec, kind.mixer).values()) // tp
    norms = spec.norms_per_layer * norm_parameters(spec.norm, h)
    elements = mixer + _ffn_elements(ctx, kind) + norms
    shapes = layer_linears(spec, kind)
    largest = max((s.in_features * s.out_features // tp for s in shapes), default=0)
    moe_layer = kind.ffn is FfnKind.MOE
    if ctx.full:
        return 0.0, elements, 0, elements, largest
    quant = effective_quant(ctx)
    rank = ctx.workload.lora.rank
    adapters = sum(rank * (s.in_features + s.out_features) for s in shapes if s.name in targets)
    if moe_layer and wraps_experts(ctx):
        adapters += expert_adapter_elements(spec, rank)
    if quant is Quant.NONE:
        return elements * ctx.frozen_bytes, 0, adapters, elements, largest
    # Weights only: biases stay unquantized, with the norms in ``rest``.
    linear = sum(s.in_features * s.out_features // tp for s in shapes)
    quantized = sum(_quantized_bytes(s, quant, tp) for s in shapes)
    if moe_layer and spec.moe is not None and quant not in BNB_4BIT_QUANTS:
        # bitsandbytes converts nn.Linear only: transformers 5's fused 3-D experts stay unquantized.
        expert_shape = LinearShape(
            name="expert", in_features=h, out_features=spec.moe.expert_intermediate_size, group="moe"
        )
        count = 3 * spec.moe.num_experts // ep
        quantized += count * _quantized_bytes(expert_shape, quant, tp)
        linear += count * expert_shape.in_features * expert_shape.out_features // tp
    rest = elements - linear
    return quantized + rest * unquantized_bytes(ctx), 0, adapters, elements, largest


def _modules_to_save(ctx: TrainingContext, *, first: bool, last: bool) -> int:
    """Elements of the trained copies PEFT makes of ``lora.modules_to_save`` (embedding, head)."""
    spec, tp = ctx.spec, ctx.workload.parallel.tp
    table = spec.vocab_size * spec.hidden_size // tp
    elements = 0
    for name in ctx.workload.lora.modules_to_save:
        if name in EMBED_NAMES:
            elements += table if first else 0
        elif name in HEAD_NAMES:
            elements += table if last else 0
        else:
            accepted = ", ".join(sorted(EMBED_NAMES | HEAD_NAMES))
            raise InputError(f"lora.modules_to_save: unknown module {name!r}; accepted: {accepted}")
    return elements


def _edge_elements(ctx: TrainingContext, *, first: bool, last: bool) -> int:
    """Embedding (+ learned positions) on the first stage, final norm and LM head on the last."""
    spec, tp = ctx.spec, ctx.workload.parallel.tp
    breakdown = spec.parameter_breakdown
    elements = 0
    if first:
        elements += breakdown.embedding // tp + breakdown.position_embedding
    if last:
        elements += breakdown.final_norm + breakdown.extra
        head = (
            spec.vocab_size * spec.hidden_size // tp
            if (spec.tie_word_embeddings and not first)
            else breakdown.lm_head // tp
        )
        elements += head
    return elements


def adapter_groups(ctx: TrainingContext, adapters: int, head: bool) -> list[TrainableGroup]:
    """LoRA adapters of the layers and, when ``head``, the adapter on the LM head (fp32 under PEFT):
    a group of their own, so that FSDP's per-layer units do not count the head's."""
    dtype = 4 if ctx.profile.adapters_fp32 else ctx.compute_bytes
    sizes = {"LoRA adapters": adapters}
    if head:
        rank, vocab = ctx.workload.lora.rank, ctx.spec.vocab_size // ctx.workload.parallel.tp
        sizes["LoRA adapter on the LM head"] = head_adapter_elements(rank, ctx.spec.hidden_size, vocab)
    return [
        TrainableGroup(name=name, elements=elements, param_bytes=dtype, grad_bytes=dtype, state_bytes=dtype)
        for name, elements in sizes.items()
        if elements
    ]


def _peft_groups(
    ctx: TrainingContext, adapters: int, *, first: bool, last: bool, targets: frozenset[str]
) -> list[TrainableGroup]:
    """Trainable groups of a PEFT run: LoRA adapters (fp32 under PEFT) and the trained copies
    of ``lora.modules_to_save`` (in the frozen weights' dtype)."""
    groups = adapter_groups(ctx, adapters, last and bool(targets & HEAD_NAMES))
    saved = _modules_to_save(ctx, first=first, last=last)
    if saved:
        table = ctx.spec.vocab_size * ctx.spec.hidden_size // ctx.workload.parallel.tp
        groups.append(modules_to_save_group(ctx, saved, largest_tensor=table))
    return groups


def modules_to_save_group(ctx: TrainingContext, elements: int, *, largest_tensor: int) -> TrainableGroup:
    """The trained copies of ``lora.modules_to_save``: ``elements`` parameters in the frozen
    weights' dtype (PEFT copies the module as it is: fp32 after k-bit preparation)."""
    dtype = int(unquantized_bytes(ctx))
    return TrainableGroup(
        name="modules_to_save",
        elements=elements,
        param_bytes=dtype,
        grad_bytes=dtype,
        state_bytes=dtype,
        largest_tensor=largest_tensor,
    )


def _stage(
    ctx: TrainingContext, name: str, layer_range: range, *, first: bool, last: bool, targets: frozenset[str]
) -> StageView:
    frozen = 0.0
    trainable = adapters = 0
    layer_elements = largest = 0
    moe_layers = sum(1 for index in layer_range if ctx.spec.layers[index].moe)
    kinds: dict[LayerKind, int] = {}
    for index in layer_range:
        kind = ctx.spec.layers[index].kind
        kinds[kind] = kinds.get(kind, 0) + 1
    for kind in layer_kinds(ctx.spec):  # dense before MoE: a fixed order of the float sums
        count = kinds.get(kind, 0)
        if not count:
            continue
        f, t, a, elements, big = _layer_weights(ctx, kind, targets)
        frozen, trainable, adapters = frozen + count * f, trainable + count * t, adapters + count * a
        layer_elements, largest = max(layer_elements, elements), max(largest, big)
    edges = _edge_elements(ctx, first=first, last=last)
    if first and ctx.spec.vision is not None:
        # The vision side runs before the first decoder layer (estimate/vision.py).
        frozen += vision_frozen_bytes(ctx, targets, effective_quant(ctx))
        edges += ctx.spec.vision.parameters if vision_trained(ctx) else 0
    if ctx.full:
        table = ctx.spec.vocab_size * ctx.spec.hidden_size // ctx.workload.parallel.tp
        groups = [
            TrainableGroup(
                name="model",
                elements=trainable + edges,
                param_bytes=ctx.param_bytes,
                grad_bytes=ctx.grad_bytes,
                state_bytes=ctx.state_bytes,
                master_bytes=ctx.master_bytes,
                largest_tensor=max(largest, table if (first or last) else 0),
            )
        ]
    else:
        frozen += edges * unquantized_bytes(ctx)
        groups = _peft_groups(ctx, adapters, first=first, last=last, targets=targets)
    return StageView(
        name=name,
        layer_range=layer_range,
        moe_layers=moe_layers,
        first=first,
        last=last,
        frozen_bytes=frozen,
        trainable=tuple(groups),
        layer_elements=layer_elements,
        largest_linear=largest,
    )


def param_layout(ctx: TrainingContext) -> ParamLayout:
    """The first and last pipeline stages of the busiest rank (one stage when pp = 1),
    memoized on the spec by the inputs it reads (:class:`LayoutInputs`)."""
    return memo(ctx.spec, LayoutInputs.of(ctx), lambda: _param_layout(ctx))


def _param_layout(ctx: TrainingContext) -> ParamLayout:
    if ctx.method is Method.FREEZE and not ctx.workload.lora.modules_to_save:
        raise InputError(
            "lora.modules_to_save: method freeze trains only these modules; give at least one (e.g. [lm_head])"
        )
    targets = lora_targets(ctx)
    layers, pp = ctx.spec.num_layers, ctx.workload.parallel.pp
    if pp > layers:
        raise InputError(f"parallel.pp: {pp} pipeline stages for {layers} layers; at most one stage per layer")
    per_stage = math.ceil(layers / pp)
    stages: tuple[StageView, ...]
    if pp == 1:
        stages = (_stage(ctx, "all layers", range(layers), first=True, last=True, targets=targets),)
    else:
        stages = (
            _stage(ctx, "first pipeline stage", range(per_stage), first=True, last=False, targets=targets),
            _stage(
                ctx,
                "last pipeline stage",
                range(layers - (layers - per_stage * (pp - 1)), layers),
                first=False,
                last=True,
                targets=targets,
            ),
        )
    adapters = sum(
        ctx.workload.lora.rank * (s.in_features + s.out_features)
        for s in layer_linears(ctx.spec, ctx.spec.layers[0].kind)
        if s.name in targets
    )
    return ParamLayout(stages=stages, adapters_per_layer=adapters, targets=targets)


def micro_batches_in_flight(schedule: PipelineSchedule, pp: int, micro_batches: int) -> float:
    """Micro-batches whose activations the first pipeline stage holds at its peak.

    * 1F1B: ``min(pp, m)`` (warm-up of ``pp - 1`` forwards, then one forward per backward);
    * interleaved 1F1B with ``v`` model chunks per rank: rank 0 warms up with
      ``(v - 1) * pp + 2 * (pp - 1)`` chunk forwards of ``1 / v`` of its layers (torch
      ``ScheduleInterleaved1F1B`` and Megatron-LM alike), i.e. ``min(pp, m) * (1 + (pp - 1) / (pp * v))``
      micro-batches' worth (Narayanan et al. 2021, section 2.2), with ``v = 2``;
    * GPipe: every micro-batch, ``m``.
    """
    if pp == 1:
        return 1
    if schedule is PipelineSchedule.GPIPE:
        return micro_batches
    steady = min(pp, micro_batches)
    if schedule is PipelineSchedule.INTERLEAVED_1F1B:
        return steady * (1 + (pp - 1) / (pp * 2))
    return steady
