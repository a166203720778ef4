"""Per-layer activation bytes under each recompute policy, and the saved-tensor recipe inputs.

``saved`` is what stays on the GPU per layer for backward; ``transient`` is what
a recomputed layer briefly re-creates during its backward (0 without recompute).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from vramlens.errors import InputError
from vramlens.estimator.activations import ffn_saved_parts, layer_saved_parts
from vramlens.estimator.eager_attention import eager_transients
from vramlens.estimator.expert_lora import wraps_experts
from vramlens.estimator.mixers import KERNEL_ASSUMPTION, STATE_MIXERS, mixer_after_scan_parts, mixer_backward_working
from vramlens.estimator.qlora import adapter_inputs_shared, base_output_bytes
from vramlens.estimator.saved_parts import GATHERED, HEADS, SEQUENCE, LayerRecipe, Part, TrainState
from vramlens.estimator.training_cache import training_cache_parts
from vramlens.model.modules import all_layer_linears
from vramlens.model.spec import FfnKind, LayerKind, LayerSpec, MixerKind
from vramlens.resolve._memo import memo
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.derived import checkpointed_layers, seq_per_rank
from vramlens.resolve.frameworks import NormImpl, layer_style
from vramlens.resolve.kbit import kbit_prepared
from vramlens.resolve.kernels import liger_layers
from vramlens.resolve.styles import hf_style
from vramlens.workload.options import AttentionImpl, Framework, Kernels, Method, Recompute

__all__ = [
    "LayerActivations",
    "eager_attention_working",
    "layer_activations",
    "layer_kind",
    "layer_recipe",
    "scan_backward_beyond",
    "train_state",
]


def train_state(ctx: TrainingContext, targets: frozenset[str]) -> TrainState:
    """Which linears keep inputs and which norms train, for the workload's method."""
    if ctx.method is Method.FULL:
        names = frozenset(s.name for s in all_layer_linears(ctx.spec))
        return TrainState(norms=True, needs_input=names, adapters=frozenset())
    lora = ctx.workload.lora
    # Frozen base linears keep nothing; adapters keep their own input cast, or over PEFT's
    # 4-bit layers under autocast the input itself, once (qlora.py).
    shared = adapter_inputs_shared(ctx)
    return TrainState(
        norms=False,
        needs_input=targets if shared else frozenset(),
        adapters=targets,
        lora_rank=lora.rank,
        lora_dropout=lora.dropout,
        adapter_bytes=4 if ctx.profile.adapters_fp32 else ctx.compute_bytes,
        adapter_input_copies=not shared,
        experts_adapted=wraps_experts(ctx),
    )


def layer_recipe(ctx: TrainingContext, state: TrainState, notes: list[str]) -> LayerRecipe:
    """The layer recipe of the workload's layers (``notes`` gathers what it assumes)."""
    return LayerRecipe(
        spec=ctx.spec,
        style=layer_style(ctx.spec.model_type, ctx.profile),
        compute_bytes=ctx.compute_bytes,
        # fp32 residual stream: fp32 weights under autocast (full training, or QLoRA's k-bit preparation)
        autocast=ctx.autocast and (ctx.method is Method.FULL or kbit_prepared(ctx.workload, ctx.profile)),
        autocast_adapters=ctx.autocast,
        attention=ctx.attention,
        math_unmasked=ctx.math_unmasked,
        seq=seq_per_rank(ctx.workload),
        linears=all_layer_linears(ctx.spec),
        train=state,
        fused_norm=ctx.profile.norm is NormImpl.FUSED or ctx.workload.compile or liger_layers(ctx.workload.kernels),
        fused_pointwise=ctx.workload.compile or liger_layers(ctx.workload.kernels),
        moe_capacity=ctx.workload.moe_capacity_factor or 1.0,
        linear_out_bytes=base_output_bytes(ctx),
        training_cache=_training_cache(ctx),
    )


def _training_cache(ctx: TrainingContext) -> bool:
    """The text model fills a KV cache in the training forward (:attr:`HfStyle.training_cache`):
    its config's ``use_cache`` is true (transformers' default; a nested ``text_config``'s own key,
    else the flat config's) and gradient checkpointing, which turns it off, is not on."""
    if not hf_style(ctx.spec.model_type).training_cache or ctx.workload.recompute.whole_layer:
        return False
    config = ctx.spec.config or {}
    text = config.get("text_config")
    return (text if isinstance(text, Mapping) else config).get("use_cache", True) is not False


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerActivations:
    """Activation bytes per token for the layers of one rank."""

    saved_per_token: float
    """Sum over this rank's layers of what each keeps for backward."""
    transient_per_token: float
    """What one recomputed layer re-creates during backward (largest layer)."""
    full_layer_parts: tuple[Part, ...]
    """The saved tensors of one full (not recomputed) layer, for the explanation."""
    parts_by_kind: tuple[tuple[LayerKind, tuple[Part, ...]], ...] = ()
    """The saved tensors of one full layer of each :func:`layer_kind` of this rank (the allocator
    pattern, :mod:`vramlens.estimator.step_shape`)."""
    notes: tuple[str, ...]
    masks_per_token: float = 0.0
    """Attention masks alive while the layers run forward but kept by no one for backward
    (without recompute; a checkpointed layer keeps its mask argument, counted in ``saved``)."""
    mixer_backward_per_token: float = 0.0
    """A state mixer's backward working set beyond the layer bytes counted beside it
    (:func:`scan_backward_beyond`; the largest over this rank's layer kinds, at least 0)."""


def _per_token(parts: list[Part], tp: int, sequence_parallel: bool) -> float:
    """Bytes per token on one tensor-parallel rank (see the split kinds in activations.py)."""
    divisor = {HEADS: tp, SEQUENCE: tp if sequence_parallel else 1, GATHERED: 1}
    return sum(p.bytes_per_token / divisor[p.split] for p in parts)


def _selective_titan(recipe: LayerRecipe, kind: LayerKind) -> float:
    """torchtitan op-level SAC: keeps the layer input, every other matmul output and the SDPA outputs."""
    if kind.mixer is not MixerKind.ATTENTION:  # the op-level policy is torchtitan's for its attention models
        raise InputError(
            f"framework: torchtitan's selective recompute is modelled for attention layers; {recipe.spec.name} has "
            f"{kind.mixer.value} layers (use framework hf or recompute full)"
        )
    spec, a = recipe.spec, recipe.compute_bytes
    q = spec.num_heads * spec.head_dim
    kv = spec.num_kv_heads * spec.head_dim
    inner = (
        spec.moe.expert_intermediate_size * spec.moe.experts_per_token
        if (kind.ffn is FfnKind.MOE and spec.moe)
        else (spec.mlp.intermediate_size if spec.mlp else 0)
    )
    return a * (2 * spec.hidden_size + 2 * q + kv + inner) + 4 * spec.num_heads


def layer_kind(layer: LayerSpec, seq: int) -> LayerKind:
    """What decides a layer's saved tensors at sequence length ``seq``: its mixer, its FFN, whether
    its attention is masked and whether it is rotary (:meth:`vramlens.model.components.LayerSpec.kind_at`)."""
    return layer.kind_at(seq)


def _kinds(ctx: TrainingContext, layer_range: range) -> dict[LayerKind, int]:
    """Count this rank's layers by :func:`layer_kind`."""
    counts: dict[LayerKind, int] = {}
    for index in layer_range:
        key = layer_kind(ctx.spec.layers[index], ctx.workload.seq)
        counts[key] = counts.get(key, 0) + 1
    return counts


@dataclass(frozen=True, kw_only=True, slots=True)
class ActivationInputs:
    """What the layer recipe reads from a training context besides the model: the memo key of
    :func:`layer_activations`."""

    state: TrainState
    layer_range: range
    compute_bytes: int
    autocast: bool
    method: Method
    attention: AttentionImpl
    math_unmasked: bool
    seq: int
    cp: int
    tp: int
    compile: bool
    kernels: Kernels
    moe_capacity_factor: float | None
    recompute: Recompute
    recompute_every: int
    framework: Framework
    kbit_prepared: bool

    @classmethod
    def of(cls, ctx: TrainingContext, state: TrainState, layer_range: range) -> ActivationInputs:
        workload = ctx.workload
        return cls(
            state=state, layer_range=layer_range, compute_bytes=ctx.compute_bytes, autocast=ctx.autocast,
            method=ctx.method, attention=ctx.attention, math_unmasked=ctx.math_unmasked, seq=workload.seq,
            cp=workload.parallel.cp,
            tp=workload.parallel.tp, compile=workload.compile, kernels=workload.kernels,
            moe_capacity_factor=workload.moe_capacity_factor,
            recompute=workload.recompute, recompute_every=workload.recompute_every, framework=ctx.profile.name,
            kbit_prepared=kbit_prepared(workload, ctx.profile),
        )  # fmt: skip


def layer_activations(
    ctx: TrainingContext, state: TrainState, layer_range: range, *, memoized: bool = True
) -> LayerActivations:
    """Saved and recomputed activation bytes per token for the layers in ``layer_range``.

    Memoized on the spec (unless ``memoized`` is false): the result depends only on what
    ``_recipe`` reads from the context (listed in the key), the layer range, the recompute
    policy and tp (planners call this thousands of times).
    """
    if not memoized:
        return _build_layer_activations(ctx, state, layer_range)
    key = ActivationInputs.of(ctx, state, layer_range)
    return memo(ctx.spec, key, lambda: _build_layer_activations(ctx, state, layer_range))


def _build_layer_activations(ctx: TrainingContext, state: TrainState, layer_range: range) -> LayerActivations:
    notes: list[str] = []
    recipe = layer_recipe(ctx, state, notes)
    return _layer_activations(ctx, recipe, layer_range, notes)


def _layer_activations(
    ctx: TrainingContext, recipe: LayerRecipe, layer_range: range, notes: list[str]
) -> LayerActivations:
    tp = ctx.workload.parallel.tp
    sp = tp > 1
    kinds = _kinds(ctx, layer_range)
    layers = len(layer_range)
    if any(key.mixer in STATE_MIXERS for key in kinds):
        notes.append(KERNEL_ASSUMPTION)
    full = {
        key: _per_token(layer_saved_parts(recipe, key) + training_cache_parts(recipe, key), tp, sp) for key in kinds
    }
    total_full = sum(full[key] * count for key, count in kinds.items())
    largest = max(full.values()) if full else 0.0
    policy = ctx.workload.recompute
    residual = 4 if recipe.autocast else ctx.compute_bytes
    checkpoint = residual * ctx.spec.hidden_size / (tp if sp else 1)
    if policy is Recompute.NONE:
        saved, transient = total_full, 0.0
    elif policy is Recompute.FULL:
        checkpointed = checkpointed_layers(ctx.workload, layers)
        saved = checkpointed * checkpoint + (layers - checkpointed) * total_full / max(layers, 1)
        transient = largest
    elif policy is Recompute.OFFLOAD:
        saved, transient = min(2, layers) * checkpoint, largest  # a pipeline stage may hold one layer
        notes.append(
            "recompute offload: checkpointed layer inputs live in CPU memory; two layers' inputs in flight on the GPU"
        )
    elif ctx.profile.name is Framework.TORCHTITAN:
        saved = sum(_selective_titan(recipe, key) / tp * count for key, count in kinds.items())
        transient = largest
    else:
        flash = replace(recipe, attention=AttentionImpl.FLASH)
        kept = {
            key: _per_token(layer_saved_parts(flash, key) + training_cache_parts(recipe, key), tp, sp) for key in kinds
        }
        saved = sum(kept[key] * count for key, count in kinds.items())
        # What one layer re-creates in backward: its attention internals beyond what is kept.
        transient = max((max(0.0, full[key] - kept[key]) for key in kinds), default=0.0)
        notes.append("recompute selective: the attention core is recomputed; projections and MLP outputs are kept")
    mixer_backward = _mixer_backward(ctx, recipe, full, transient if policy.whole_layer else None)
    example = max(kinds, key=lambda key: full[key]) if kinds else LayerKind()
    by_kind = tuple((key, tuple(layer_saved_parts(recipe, key) + training_cache_parts(recipe, key))) for key in kinds)
    parts = tuple(layer_saved_parts(recipe, example) + training_cache_parts(recipe, example))
    masks = _mask_bytes(ctx, recipe, kinds)
    # Eager adds its masks to the scores and SDPA turns them into a per-call bias: autograd keeps
    # neither; they live in the model's forward until it returns, unless a checkpoint keeps them
    # as a layer input (found against the simulator on SmolLM3 and gpt-oss with sliding windows).
    checkpointed = policy is not Recompute.NONE
    return LayerActivations(
        saved_per_token=saved + (masks if checkpointed else 0.0),
        transient_per_token=transient,
        full_layer_parts=parts,
        parts_by_kind=by_kind,
        notes=tuple(notes),
        masks_per_token=0.0 if checkpointed else masks,
        mixer_backward_per_token=mixer_backward,
    )


def _mixer_backward(
    ctx: TrainingContext, recipe: LayerRecipe, full: dict[LayerKind, float], recomputed: float | None
) -> float:
    """The largest :func:`scan_backward_beyond` over the layer kinds (``full``: each kind's saved
    bytes per token on one rank; ``recomputed``: the transient counted for a recomputed layer, None
    when the layer being differentiated is counted once, in ``saved``)."""
    tp = ctx.workload.parallel.tp
    a = recipe.compute_bytes
    return max(
        (
            scan_backward_beyond(
                working=mixer_backward_working(ctx.spec, {key.mixer}, seq=recipe.seq, compute_bytes=a) / tp,
                freed=_per_token(ffn_saved_parts(recipe, key) + mixer_after_scan_parts(recipe, key.mixer), tp, tp > 1),
                held_beyond_layer=0.0 if recomputed is None else recomputed - layer_bytes,
            )
            for key, layer_bytes in full.items()
        ),
        default=0.0,
    )


def scan_backward_beyond(*, working: float, freed: float, held_beyond_layer: float) -> float:
    """What the high point inside a state mixer's backward adds to the bytes the estimate already
    counts for the layer being differentiated, bytes per token on one rank (at least 0).

    Backward runs a layer in reverse: its feed-forward half and the mixer's tensors kept after the
    scan (the gate, ``out_proj``'s input) are released before the scan's backward starts, so the
    scan's gradient buffers (``working``, :func:`~vramlens.estimator.mixers.mixer_backward_working`)
    sit beside the layer less those (``freed``). Where the estimate counts more than this layer at
    that instant (``held_beyond_layer``: under full recompute the largest recomputed layer, which may
    be another kind, e.g. Jamba's Mamba + MoE layer beside its Mamba + MLP one), that excess covers
    part of the working set too. Source: the simulated Jamba step (tests/simulator/test_agreement.py),
    whose backward peaks in the first step of a Mamba 1 scan's reversed token loop with its layer's
    MLP, gate and ``out_proj`` inputs already freed."""
    return max(0.0, working - freed - held_beyond_layer)


def _mask_bytes(ctx: TrainingContext, recipe: LayerRecipe, kinds: dict[LayerKind, int]) -> float:
    """Materialized 4-D attention masks ([batch, 1, seq, seq], one per mask kind, shared by the attention
    layers): eager attention always builds them, additive in the compute dtype; SDPA only for masked
    (sliding-window or chunked) layers, boolean (``masking_utils.sdpa_mask``: one byte per element);
    flash attention (flash_attention_2, which applies the window itself) never. Layers without
    attention (Mamba, linear attention) read no 4-D mask."""
    attending = [key for key in kinds if key.attends]
    if not attending:
        return 0.0
    sliding = any(key.sliding for key in attending)
    if recipe.attention is AttentionImpl.EAGER:
        count = 2 if sliding and len({key.sliding for key in attending}) > 1 else 1
        return count * recipe.compute_bytes * recipe.seq
    count = 1 if sliding and recipe.attention is not AttentionImpl.FLASH else 0
    return count * recipe.seq


def eager_attention_working(ctx: TrainingContext, state: TrainState, layer_range: range) -> tuple[float, float, float]:
    """Eager attention's score tensors in the last attention layer of ``layer_range``, bytes per token on
    one rank: (forward beyond the kept probabilities, backward, forward with nothing kept), the first two
    less what that layer's feed-forward half and the layers after it keep (not yet alive when its
    attention runs forward, already freed when its attention runs backward; a hybrid's last layers may
    be Mamba or linear attention). See :mod:`vramlens.estimator.eager_attention`."""
    if ctx.attention is not AttentionImpl.EAGER and not ctx.math_unmasked:
        return 0.0, 0.0, 0.0
    workload = ctx.workload
    recipe = layer_recipe(ctx, state, [])
    kinds = {index: layer_kind(ctx.spec.layers[index], workload.seq) for index in layer_range}
    attending = [index for index, kind in kinds.items() if kind.attends and recipe.eager_like(sliding=kind.sliding)]
    if not attending:
        return 0.0, 0.0, 0.0
    tp = workload.parallel.tp
    last = attending[-1]
    after = _per_token(ffn_saved_parts(recipe, layer_kind(ctx.spec.layers[last], workload.seq)), tp, tp > 1)
    if workload.recompute is Recompute.NONE:  # under recompute later layers keep only their checkpoints
        for index in range(last + 1, layer_range[-1] + 1):
            after += _per_token(layer_saved_parts(recipe, layer_kind(ctx.spec.layers[index], workload.seq)), tp, tp > 1)
    a, autocast, seq = recipe.compute_bytes, recipe.autocast, recipe.seq
    over_kept, backward = eager_transients(ctx.spec, recipe.style, compute_bytes=a, autocast=autocast, seq=seq, tp=tp)
    everything = eager_transients(
        ctx.spec, recipe.style, compute_bytes=a, autocast=autocast, seq=seq, tp=tp, kept=False
    )[0]
    return max(0.0, over_kept - after), max(0.0, backward - after), everything
