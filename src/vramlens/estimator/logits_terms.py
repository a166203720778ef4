"""The last stage's logits and loss terms (:func:`logits_terms`), shared by the hand-written and the traced families."""

from __future__ import annotations

from vramlens.categories import Category
from vramlens.estimator.logits import LogitsMemory, logits_memory
from vramlens.estimator.lora_head import training_lora_head, with_lora_head
from vramlens.estimator.loss_outputs import fp32_model_outputs, loss_chunks, model_logits_bytes
from vramlens.estimator.qlora import with_head_weight_cast
from vramlens.estimator.stage_memory import StageMemory
from vramlens.estimator.trl_head import fused_head, fused_head_memory
from vramlens.resolve.context import TrainingContext
from vramlens.workload.options import Framework
from vramlens.workload.versions import older_than, rule_note

__all__ = ["logits_terms", "loss_memory"]


def _loss_memory(ctx: TrainingContext, *, fp32_outputs: bool) -> LogitsMemory:
    """The loss path's logits memory: TRL's fused head, or the logits and a cross-entropy."""
    fused = fused_head(ctx)
    if fused is not None:
        return fused_head_memory(fused)
    tp = ctx.workload.parallel.tp
    return logits_memory(
        ctx.loss,
        tokens=ctx.tokens,
        vocab=ctx.spec.vocab_size // tp,
        hidden=ctx.spec.hidden_size,
        logits_bytes=model_logits_bytes(ctx),
        keeps_logits=ctx.profile.keeps_logits,
        chunks=loss_chunks(ctx),
        kept_bytes=4 if fp32_outputs else None,
        loss_parallel=tp > 1 and ctx.profile.name is Framework.TORCHTITAN,
        compiled=ctx.compiled_loss,
        softcap=ctx.spec.final_logit_softcap is not None,
    )


def loss_memory(ctx: TrainingContext) -> LogitsMemory:
    """The logits and loss bytes of ``ctx``'s loss path at the step's instants (without a LoRA head)."""
    return _loss_memory(ctx, fp32_outputs=fp32_model_outputs(ctx))


def logits_terms(ctx: TrainingContext, mem: StageMemory, targets: frozenset[str] = frozenset()) -> None:
    """The last stage's logits and loss, the LM head's bf16 weight copy after k-bit preparation, a LoRA head."""
    fp32_outputs = fp32_model_outputs(ctx)
    if ctx.profile.name in (Framework.HF, Framework.PLAIN) and older_than(ctx.workload.versions, "loss_upcast"):
        mem.notes.append(rule_note(ctx.workload.versions, "loss_upcast"))
    mem.logits = _loss_memory(ctx, fp32_outputs=fp32_outputs)
    if (head := training_lora_head(ctx, targets, loss_chunks=loss_chunks(ctx))) is not None:
        mem.logits = with_lora_head(mem.logits, head, ctx.tokens)
        mem.add(
            "LoRA head input (saved)",
            Category.ACTIVATIONS,
            head.saved * ctx.tokens,
            head.formula,
            into="non_layer_bytes",
            alive="from the head's forward to its backward",
        )
    mem.add(
        "logits and loss (at the loss)",
        Category.TEMPORARY,
        mem.logits.forward_end,
        mem.logits.formula,
        alive="from the head's forward to the loss's backward",
    )
    mem.logits, mem.head_cast_bytes = with_head_weight_cast(ctx, mem.logits)
    mem.add(
        "LM head bf16 weight copy (fp32 head after k-bit preparation)",
        Category.TEMPORARY,
        mem.head_cast_bytes,
        "V x h x 2 B",
        alive="from the head's forward to its backward",
    )
