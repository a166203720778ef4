"""What the model's forward hands the loss: the bytes of its logits and of the logits the training loop
keeps, and the chunks a chunked loss splits them into (used by the stage terms and the reserved model)."""

from __future__ import annotations

from vramlens.estimator.fsdp import casts_outputs
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.derived import seq_per_rank
from vramlens.resolve.frameworks import MixedStyle
from vramlens.resolve.styles import hf_style
from vramlens.workload.options import Framework
from vramlens.workload.versions import older_than

__all__ = ["fp32_model_outputs", "loss_chunks", "model_logits_bytes"]


def fp32_model_outputs(ctx: TrainingContext) -> bool:
    """The logits the loop keeps are fp32: accelerate converts the outputs of an autocast model
    (unless FSDP2's root casts them back), Lightning Fabric converts every output
    (``FrameworkProfile.outputs_fp32``), or transformers before 4.46 up-cast them in the
    forward (:data:`vramlens.workload.versions.VERSION_RULES` ``loss_upcast``)."""
    converted = ctx.workload.precision.mixed and ctx.profile.mixed is MixedStyle.AUTOCAST and not casts_outputs(ctx)
    upcast = ctx.profile.name in (Framework.HF, Framework.PLAIN) and older_than(ctx.workload.versions, "loss_upcast")
    return converted or upcast or ctx.profile.outputs_fp32


def model_logits_bytes(ctx: TrainingContext) -> int:
    """Bytes per logit the model's forward returns: the compute dtype's, or 4 where the family's code
    up-casts its logits (Nemotron-H: ``self.lm_head(hidden_states).float()``; ``HfStyle.logits_fp32``).
    A model read from its code has no style: the compute dtype's, as the generic route assumes. 4 where
    the framework converts the outputs to fp32 before the loss (``FrameworkProfile.outputs_fp32``)."""
    if ctx.profile.outputs_fp32:
        return 4
    if ctx.spec.generic is None and hf_style(ctx.spec.model_type).logits_fp32:
        return 4
    return ctx.compute_bytes


def loss_chunks(ctx: TrainingContext) -> float:
    """Tokens over those of the largest loss chunk (LitGPT's fixed-length chunks: seq / min(seq, positions))."""
    positions = ctx.profile.chunked_loss_positions
    if positions is None:
        return ctx.profile.chunked_loss_chunks
    seq = seq_per_rank(ctx.workload)
    return seq / min(seq, positions)
