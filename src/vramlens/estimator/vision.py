"""The vision tower and projector of a multimodal model in a text-only step.

vramlens models batches of text tokens. transformers' multimodal models leave the vision
tower and projector trainable (every parameter requires grad), but on text-only batches
they compute nothing and receive no gradient:

* torch optimizers (HF Trainer, accelerate, torchtune, torchtitan, LitGPT) create state
  only for parameters with a gradient, so the tower and projector hold their weights only,
  as when they are frozen (LLaMA-Factory's default ``freeze_vision_tower``);
* DeepSpeed and Megatron (``MixedStyle.MASTER_WEIGHTS``) allocate gradient buffers, master
  weights and optimizer state for every trainable parameter up front: there they count as
  trained;
* under LoRA, PEFT puts adapters on the tower's and projector's linears when the targets
  match them (``all-linear`` always does): the adapters exist, in the adapter dtype, but get
  no gradient; under QLoRA bitsandbytes quantizes those linears too.

Image tokens (the tower's activations, their share of the sequence) are not modelled.
"""

from __future__ import annotations

from vramlens.estimator.qlora import unquantized_bytes
from vramlens.estimator.weight_format import format_for_quant
from vramlens.model.spec import ModelSpec, TowerLinear
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.frameworks import MixedStyle
from vramlens.workload.options import Quant

__all__ = ["tower_targets", "vision_adapter_elements", "vision_frozen_bytes", "vision_notes", "vision_trained"]


def tower_targets(spec: ModelSpec, target: str) -> set[str]:
    """Names of the tower's and projector's linears PEFT matches with ``target`` (the module
    path equals it or ends with ``.target``)."""
    if spec.vision is None:
        return set()
    return {s.name for s in spec.vision.linears if s.name == target or s.name.endswith("." + target)}


def vision_trained(ctx: TrainingContext) -> bool:
    """Full fine-tuning under a framework that allocates gradients and optimizer state for every
    trainable parameter up front (DeepSpeed, Megatron), so the tower counts as trained."""
    return ctx.spec.vision is not None and ctx.full and ctx.profile.mixed is MixedStyle.MASTER_WEIGHTS


def vision_adapter_elements(ctx: TrainingContext, targets: frozenset[str]) -> int:
    """Elements of the LoRA adapters PEFT puts on the targeted tower and projector linears."""
    vision = ctx.spec.vision
    if vision is None or ctx.full:
        return 0
    rank = ctx.workload.lora.rank
    return sum(rank * (s.in_features + s.out_features) * s.count for s in vision.linears if s.name in targets)


def _quantized_linears(quant: Quant, linears: tuple[TowerLinear, ...]) -> tuple[float, int]:
    """(bytes of the quantized linear weights, their elements) in the frozen weights' format."""
    fmt = format_for_quant(quant) if quant is not Quant.NONE else None
    if fmt is None:
        return 0.0, 0
    stored = sum(s.count * fmt.linear_bytes(s.out_features, s.in_features) for s in linears)
    return stored, sum(s.count * s.in_features * s.out_features for s in linears)


def vision_frozen_bytes(ctx: TrainingContext, targets: frozenset[str], quant: Quant) -> float:
    """Bytes the tower and projector hold without gradient or optimizer state (see the module
    doc): their weights in the model's dtype (linears in ``quant``, the frozen weights' format,
    under QLoRA) and, under LoRA, the adapters on their linears in the adapter dtype. 0 when
    :func:`vision_trained`."""
    vision = ctx.spec.vision
    if vision is None or vision_trained(ctx):
        return 0.0
    if ctx.full:
        return float(vision.parameters * ctx.param_bytes)
    quantized, elements = _quantized_linears(quant, vision.linears)
    adapter_bytes = 4 if ctx.profile.adapters_fp32 else ctx.compute_bytes
    rest = (vision.parameters - elements) * unquantized_bytes(ctx)
    return quantized + rest + vision_adapter_elements(ctx, targets) * adapter_bytes


def vision_notes(ctx: TrainingContext) -> list[str]:
    """The assumptions to report for a multimodal model."""
    vision = ctx.spec.vision
    if vision is None:
        return []
    if vision_trained(ctx):
        held = f"trained: {ctx.profile.name} allocates their gradients and optimizer state up front"
    elif ctx.full:
        held = (
            "weights only: transformers leaves them trainable, but text-only batches give them no gradient, so "
            "torch optimizers keep no state for them (as when they are frozen)"
        )
    else:
        held = "frozen; PEFT's adapters on their targeted linears get no gradient"
    return [
        f"vision tower and projector ({vision.kind}, {vision.parameters:,} parameters): {held}; "
        "batches are text only, image tokens and the tower's activations are not modelled"
    ]
