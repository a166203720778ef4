"""The last stage's logits and loss terms (:func:`logits_terms`), shared by the hand-written and the traced families."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from vramlens.categories import Category
from vramlens.estimator.logits import LogitsMemory, logits_memory, logits_per_tokens
from vramlens.estimator.lora_head import LoraHead, training_lora_head, with_lora_head
from vramlens.estimator.loss_outputs import fp32_model_outputs, loss_chunks, model_logits_bytes
from vramlens.estimator.qlora import head_weight_cast_bytes, with_head_weight_cast
from vramlens.estimator.stage_memory import StageMemory
from vramlens.estimator.trl_head import fused_head, fused_head_memory
from vramlens.resolve.context import TrainingContext
from vramlens.workload.options import Framework, LossImpl
from vramlens.workload.versions import older_than, rule_note

__all__ = ["LossAmounts", "LossPlan", "logits_terms", "loss_memory", "loss_plan"]


@dataclass(frozen=True, kw_only=True, slots=True)
class LossPlan:
    """What the logits and loss terms read besides the tokens: the loss path (TRL's fused head, or
    the logits and a cross-entropy, :func:`~vramlens.estimator.logits.logits_memory` with every
    argument but the tokens), a LoRA adapter on the head, the head's weight copy after k-bit
    preparation (bytes) and the note on an old transformers' up-cast. It reads the sequence length
    (a chunked loss's chunks), not the batch."""

    note: str | None
    logits: partial[LogitsMemory] | None
    """``logits_memory`` but for ``tokens``; None for TRL's fused head (which reads the batch too)."""
    head: LoraHead | None
    cast_bytes: int
    per_tokens: Callable[[int], LogitsMemory] | None = field(default=None, compare=False, repr=False)
    """``logits`` as :func:`~vramlens.estimator.logits.logits_per_tokens` (the loss path chosen once)."""

    def amounts(self, ctx: TrainingContext) -> LossAmounts:
        """The logits and loss bytes of ``ctx``'s tokens (see :class:`LossAmounts`)."""
        tokens, head, head_input = ctx.tokens, self.head, 0
        per_tokens = self.per_tokens
        logits = fused_head_memory(fused_head(ctx)) if per_tokens is None else per_tokens(tokens)  # type: ignore[arg-type]
        if head is not None:
            logits = with_lora_head(logits, head, tokens)
            head_input = int(head.saved * tokens)
        kept, cast = with_head_weight_cast(logits, self.cast_bytes)
        return LossAmounts(logits=logits, kept=kept, head_input=head_input, cast_bytes=cast)

    def fill(self, mem: StageMemory, amounts: LossAmounts) -> None:
        """Add the terms of ``amounts`` to ``mem`` (see :func:`logits_terms`)."""
        if self.note is not None:
            mem.notes.append(self.note)
        if (head := self.head) is not None:
            mem.add(
                "LoRA head input (saved)",
                Category.ACTIVATIONS,
                amounts.head_input,
                head.formula,
                into="head_side_bytes",
                alive="from the head's forward to its backward",
            )
        mem.logits = amounts.logits
        mem.add(
            "logits and loss (at the loss)",
            Category.TEMPORARY,
            amounts.logits.forward_end,
            amounts.logits.formula,
            alive="from the head's forward to the loss's backward",
        )
        mem.logits, mem.head_cast_bytes = amounts.kept, amounts.cast_bytes
        mem.add(
            "LM head bf16 weight copy (fp32 head after k-bit preparation)",
            Category.TEMPORARY,
            mem.head_cast_bytes,
            "V x h x 2 B",
            alive="from the head's forward to its backward",
        )


class LossAmounts(NamedTuple):
    """The logits and loss of one workload: the loss's memory, the same with the head's weight copy
    (what the phases read), the LoRA head's saved input and the weight copy, bytes."""

    logits: LogitsMemory
    kept: LogitsMemory
    head_input: int
    cast_bytes: int


def loss_plan(ctx: TrainingContext, targets: frozenset[str] = frozenset()) -> LossPlan:
    """The :class:`LossPlan` of ``ctx`` (the last stage; ``targets``: the LoRA targets, which may name the head)."""
    fp32_outputs = fp32_model_outputs(ctx)
    upcast = ctx.profile.name in (Framework.HF, Framework.PLAIN) and older_than(ctx.workload.versions, "loss_upcast")
    tp = ctx.workload.parallel.tp
    logits = per_tokens = None
    if ctx.loss is not LossImpl.CHUNKED_LOGPROB:  # TRL's fused head: trl_head.fused_head
        arguments = {
            "vocab": ctx.spec.vocab_size // tp,
            "hidden": ctx.spec.hidden_size,
            "logits_bytes": model_logits_bytes(ctx),
            "keeps_logits": ctx.profile.keeps_logits,
            "chunks": loss_chunks(ctx),
            "kept_bytes": 4 if fp32_outputs else None,
            "loss_parallel": tp > 1 and ctx.profile.name is Framework.TORCHTITAN,
            "compiled": ctx.compiled_loss,
            "softcap": ctx.spec.final_logit_softcap is not None,
        }
        logits = partial(logits_memory, ctx.loss, **arguments)  # type: ignore[arg-type]
        per_tokens = logits_per_tokens(ctx.loss, **arguments)  # type: ignore[arg-type]
    return LossPlan(
        note=rule_note(ctx.workload.versions, "loss_upcast") if upcast else None,
        logits=logits,
        per_tokens=per_tokens,
        head=training_lora_head(ctx, targets, loss_chunks=loss_chunks(ctx)),
        cast_bytes=head_weight_cast_bytes(ctx, ctx.spec.vocab_size // tp),
    )


def logits_terms(ctx: TrainingContext, mem: StageMemory, targets: frozenset[str] = frozenset()) -> None:
    """The last stage's logits and loss, the LM head's bf16 weight copy after k-bit preparation, a LoRA head."""
    plan = loss_plan(ctx, targets)
    plan.fill(mem, plan.amounts(ctx))


def loss_memory(ctx: TrainingContext) -> LogitsMemory:
    """The logits and loss bytes of ``ctx``'s loss path at the step's instants (without a LoRA head)."""
    return loss_plan(ctx).amounts(ctx).logits
