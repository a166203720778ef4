"""PEFT's LoRA on the fused 3-D MoE experts and the router weight (``lora.targets: all-linear``).

Read for this module (peft 0.21, transformers 5): ``target_modules="all-linear"`` on a family
whose v4 checkpoints PEFT converts (``peft/utils/transformers_weight_conversion.py``:
``_MODEL_TO_CONVERSION_PATTERN`` maps the model type to ``mixtral`` or ``qwen2_moe``, and
``_MOE_TARGET_MODULE_MAPPING`` has that pattern) resolves to the attention linears plus the v4
names ``gate``, ``gate_proj``/``up_proj``/``down_proj`` (``w1``/``w3``/``w2``), which
``_convert_peft_config_moe`` turns into ``target_parameters`` ``gate.weight``, ``gate_up_proj``
(rank and alpha doubled: two fused projections) and ``down_proj``. Those names leave
``target_modules``, so the ``nn.Linear`` namesakes (shared experts, dense MLP layers) get no
adapter. Each targeted parameter gets a ``lora.ParamWrapper`` (``peft/tuners/lora/layer.py``):

* a 3-D ``[E, out, in]`` stack: ``lora_A`` is ``Linear(in, r * E)``, ``lora_B`` ``Linear(r * E,
  out)`` (fp32: PEFT's ``autocast_adapter_dtype``); in forward ``_LoraFactorsProxy`` folds them
  into the weight with ``torch.baddbmm(W, lhs, rhs, alpha=scaling)`` (autocast off), ``lhs`` and
  ``rhs`` being the factors cast to the weight's dtype (copies unless the weight is fp32). The
  merged stack is cached for the experts' forward (``nn.utils.parametrize.cached``);
  ``grouped_mm`` keeps it for the input's gradient and, the merged weight needing a gradient,
  its inputs too; ``baddbmm`` keeps ``lhs`` and ``rhs``. Backward makes the merged stack's
  gradient in the weight's dtype;
* the 2-D router weight ``[E, h]``: ``_LoraParameterProxy`` adds ``scaling * B @ A`` (fp32, cast
  to the weight's dtype) to the weight; ``F.linear`` keeps the sum and the router's input (under
  autocast their bf16 casts).

Checked on a tiny Qwen3-MoE with saved-tensor hooks and a tracked step
(``tests/estimator/test_expert_lora.py``) and on Qwen3-30B-A3B against the simulator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vramlens.categories import Category
from vramlens.estimator.qlora import unquantized_bytes
from vramlens.model.spec import ModelSpec
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.derived import checkpointed_layers
from vramlens.resolve.frameworks import layer_style
from vramlens.resolve.kbit import FP32
from vramlens.workload.options import Method, Recompute
from vramlens.workload.spec import ALL_LINEAR

if TYPE_CHECKING:
    from vramlens.estimator.stage_memory import StageMemory

__all__ = [
    "PEFT_MOVED_NAMES",
    "expert_adapter_elements",
    "expert_merges",
    "factor_copy_elements",
    "kept_merged_layers",
    "merged_elements",
    "merged_layer_bytes",
    "wraps_experts",
]

#: The v4 module names PEFT's conversion moves from ``target_modules`` to ``target_parameters``
#: (``_MOE_TARGET_MODULE_MAPPING`` keys of both patterns): a linear of that leaf name gets no adapter.
PEFT_MOVED_NAMES = frozenset({"gate", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3"})


def wraps_experts(ctx: TrainingContext) -> bool:
    """PEFT's all-linear LoRA adapts this MoE model's router weight and 3-D experts
    (:attr:`vramlens.resolve.styles.HfStyle.peft_wraps_experts`: PEFT converts the family)."""
    lora = ctx.method in (Method.LORA, Method.QLORA) and ctx.workload.lora.targets == ALL_LINEAR
    peft = ctx.profile.adapters_fp32 and ctx.profile.own_modules is None  # PEFT on transformers' modules
    return (
        lora and peft and ctx.spec.moe is not None and layer_style(ctx.spec.model_type, ctx.profile).peft_wraps_experts
    )


def expert_adapter_elements(spec: ModelSpec, rank: int) -> int:
    """Adapter elements of one MoE layer: the router's ``r x (h + E)`` and, per expert, rank
    ``2r`` on ``gate_up_proj`` (``h`` in, ``2i`` out) and ``r`` on ``down_proj`` (``i`` in, ``h``
    out): ``lora_A`` is ``in x rE``, ``lora_B`` ``rE x out`` (``ParamWrapper.update_layer``)."""
    moe = spec.moe
    assert moe is not None
    h, i, e = spec.hidden_size, moe.expert_intermediate_size, moe.num_experts
    return rank * (h + e) + e * (2 * rank * (h + 2 * i) + rank * (i + h))


def merged_elements(spec: ModelSpec) -> int:
    """Elements of one MoE layer's merged weights: ``gate_up_proj`` ``E x 2i x h``, ``down_proj``
    ``E x h x i`` and the router ``E x h`` (each base + delta, a new tensor every forward)."""
    moe = spec.moe
    assert moe is not None
    h, i, e = spec.hidden_size, moe.expert_intermediate_size, moe.num_experts
    return e * (3 * i * h + h)


def factor_copy_elements(spec: ModelSpec, rank: int) -> int:
    """Elements of the LoRA factors ``baddbmm`` keeps, cast to the experts' dtype (copies of the fp32
    adapters when the experts are not fp32): ``E x 2i x 2r`` and ``E x 2r x h`` for ``gate_up_proj``,
    ``E x h x r`` and ``E x r x i`` for ``down_proj`` (``ParamWrapper.get_delta_factors``)."""
    moe = spec.moe
    assert moe is not None
    h, i, e = spec.hidden_size, moe.expert_intermediate_size, moe.num_experts
    return e * (2 * rank * (2 * i + h) + rank * (h + i))


def merged_layer_bytes(ctx: TrainingContext) -> float:
    """Bytes one MoE layer keeps for backward of its merged weights: the merged stacks and router
    weight in the experts' dtype (:func:`unquantized_bytes`: fp32 after k-bit preparation), the
    ``baddbmm`` factor copies when that dtype is not the adapters' fp32, and the router's bf16 (or,
    for an fp32 router, fp32) cast of its merged weight when it is not already in that dtype."""
    spec, pb = ctx.spec, unquantized_bytes(ctx)
    moe = spec.moe
    assert moe is not None
    adapter_bytes = FP32 if ctx.profile.adapters_fp32 else ctx.compute_bytes
    copies = factor_copy_elements(spec, ctx.workload.lora.rank) if pb != adapter_bytes else 0
    router = moe.num_experts * spec.hidden_size
    style = layer_style(spec.model_type, ctx.profile)
    cast = FP32 if style.router_fp32 else (ctx.compute_bytes if ctx.autocast else pb)
    return (merged_elements(spec) + copies) * pb + (router * cast if cast != pb else 0)


def kept_merged_layers(ctx: TrainingContext, layers: int, moe_layers: int) -> float:
    """MoE layers whose merged weights stay saved from their forward to their backward: all without
    recompute, none when checkpointed (the layer's forward frees them), the MoE share of the layers
    full recompute leaves un-checkpointed."""
    policy = ctx.workload.recompute
    if policy is Recompute.OFFLOAD or not layers:
        return 0.0
    if policy is Recompute.FULL:
        return moe_layers * (layers - checkpointed_layers(ctx.workload, layers)) / layers
    return float(moe_layers)


def expert_merges(ctx: TrainingContext, mem: StageMemory) -> None:
    """The merged expert weights as weight copies alive in forward (``casts_bytes``: the layers that
    keep them) and in backward (``casts_backward_bytes``: those and, under recompute, the
    recomputed layer's)."""
    stage = mem.stage
    if not wraps_experts(ctx) or not stage.moe_layers:
        return
    one = merged_layer_bytes(ctx)
    kept = kept_merged_layers(ctx, stage.layers, stage.moe_layers)
    mem.add(
        "merged expert weights (PEFT LoRA on the 3-D experts, kept for backward)",
        Category.ACTIVATIONS,
        kept * one,
        lambda: f"{kept:g} MoE layers x {one:,.0f} B (E x (3 i h + h) merged + factor copies, expert dtype)",
        into="casts_bytes",
        alive="from the layer's forward to its backward",
    )
    recomputed = one if ctx.workload.recompute.whole_layer else 0.0
    mem.casts_backward_bytes += int(kept * one + recomputed)
    mem.formulas["casts_backward_bytes"] = lambda: f"merged expert weights of {kept:g} layers + a recomputed layer's"
    if ctx.spec.layers[stage.layer_range[0]].moe:  # the first layer's, in its backward (the others' are freed)
        mem.casts_last_layer_bytes += int(one)
        mem.formulas["casts_last_layer_bytes"] = lambda: f"the first layer's merged expert weights {one:,.0f} B"
