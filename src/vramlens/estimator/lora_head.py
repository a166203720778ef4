"""LoRA on the output projection (``lora.targets`` naming the LM head).

PEFT (``target_modules=[..., "lm_head"]``), torchtune (``apply_lora_to_output``) and LitGPT
(``lora_head``) wrap the head like any linear: ``result + lora_B(lora_A(x)) * scaling``. On the
head ``lora_B`` writes a vocabulary-sized tensor, so the branch is a logits-sized term. Per token,
with ``V`` the vocabulary on this rank, ``h`` the hidden size, ``r`` the rank, ``a`` the head
output (logits) dtype, ``d`` the adapter matmul dtype and ``p`` the dtype of the sum (torch's
promotion of ``a`` and ``d``):

* parameters ``r * (h + V)`` in the adapter dtype, with their gradients and optimizer state;
* saved for backward: ``lora_A``'s input (PEFT casts the final hidden state to the adapter dtype,
  a copy of ``d_in * h`` bytes; without a cast, the hidden state itself, which the frozen head
  alone would not keep) and ``lora_B``'s rank-``r`` input;
* forward, before the loss: the base logits ``aV``, the scaled adapter output ``dV`` and their
  sum ``pV`` are alive at once (``(a + d + p) V``); PEFT casts the sum back to ``a``
  (``result.to(torch_result_dtype)``). With chunked heads (torchtune, LitGPT) one chunk at a time;
* backward, at the head: the logits' gradient up-cast to ``p`` (``ToCopyBackward``), the
  autograd engine's cast of it back to ``a`` for the base branch, and the scaled branch's
  gradient ``dV``: ``(a + p + d) V`` (``(a + d) V`` when ``p == a``: no casts).

Source: peft 0.21 ``tuners/lora/layer.py`` ``Linear.forward``; torchtune ``LoRALinear.forward``;
checked against a tracked CPU run of PEFT and the simulator (tests/estimator/test_lora_head.py).
The ``lora_A``/``lora_B`` autocast weight copies (``r (h + V)`` bf16) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vramlens.errors import InputError
from vramlens.estimator.logits import LogitsMemory
from vramlens.estimator.loss_pattern import LossScript, Step
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.kbit import kbit_prepared
from vramlens.workload.options import LossImpl, Method, Recompute

__all__ = [
    "EMBED_NAMES",
    "HEAD_NAMES",
    "LoraHead",
    "check_head_loss",
    "head_adapter_elements",
    "lora_head",
    "only_the_head_trains",
    "training_lora_head",
    "with_head_script",
    "with_lora_head",
]

#: Names of the output projection across frameworks (transformers ``lm_head``, GPT-NeoX
#: ``embed_out``, torchtune ``output``).
HEAD_NAMES = frozenset({"lm_head", "embed_out", "output"})
#: Names of the input embedding across frameworks (transformers, GPT-2, GPT-NeoX, BLOOM, torchtune).
EMBED_NAMES = frozenset({"embed_tokens", "wte", "embed_in", "word_embeddings", "tok_embeddings"})


@dataclass(frozen=True, kw_only=True, slots=True)
class LoraHead:
    """Bytes per token of a LoRA adapter on the LM head (see the module docstring)."""

    saved: int
    """Kept from the head's forward to its backward."""
    forward_peak: float
    """Head logits and the adapter branch at the forward's head, the earlier chunks' logits included."""
    backward_peak: float
    """Logits' gradient and the adapter branch's gradients at the head's backward."""
    formula: str
    dtypes: tuple[int, int, int]
    """Bytes per element of the base logits, the adapter branch and their sum (``a``, ``d``, ``p``)."""
    input_grad: bool
    """The head's input needs a gradient, so the base branch's is made (cast back to ``a``)."""


def head_adapter_elements(rank: int, hidden: int, vocab: int) -> int:
    """Parameters of one LoRA adapter on an ``hidden -> vocab`` head: ``r * (h + V)``."""
    return rank * (hidden + vocab)


def lora_head(
    *,
    hidden: int,
    vocab: int,
    rank: int,
    logits_bytes: int,
    input_bytes: int,
    adapter_bytes: int,
    autocast: bool,
    dropout: bool,
    chunks: float,
    input_grad: bool,
) -> LoraHead:
    """The head adapter's bytes per token.

    ``logits_bytes``: the base head's output dtype; ``input_bytes``: the final hidden state's;
    ``adapter_bytes``: the adapter weights' (4 under PEFT); ``autocast``: an autocast region runs
    the adapter matmuls in bf16 (``d = 2``); ``chunks``: the head runs on ``1/chunks`` of the
    tokens at a time (chunked output of torchtune / LitGPT; 1 otherwise); ``input_grad``: the
    final hidden state needs a gradient (false when only the head trains: autograd then skips the
    sum's gradient for the base output, its cast back to ``a``).
    """
    a = logits_bytes
    d = 2 if autocast else adapter_bytes
    p = max(a, d)
    cast = d  # PEFT casts to the adapter dtype; autocast then casts back to bf16 for the matmul
    copies = autocast or cast != input_bytes or dropout
    kept_input = cast * hidden if copies else input_bytes * hidden
    saved = kept_input + (hidden if dropout else 0) + cast * rank
    chunks = max(chunks, 1.0)
    forward = a * vocab * (chunks - 1) / chunks + (a + d + p) * vocab / chunks
    branch = (a if input_grad else 0) + p + d if p != a else a + d
    backward = a * vocab * (chunks - 1) / chunks + branch * vocab / chunks
    return LoraHead(
        saved=saved,
        forward_peak=forward,
        backward_peak=backward,
        formula=(
            f"LoRA on the head: saved {saved} B/token (lora_A input {kept_input} B, lora_B input {cast * rank} B); "
            f"forward ({a}+{d}+{p})V, backward {branch}V per token"
            f"{f' (one chunk of {chunks:g} at a time)' if chunks > 1 else ''}, V={vocab}"
        ),
        dtypes=(a, d, p),
        input_grad=input_grad,
    )


def check_head_loss(loss: LossImpl) -> None:
    """A fused linear cross-entropy (Liger, CCE) reads the head's weight and never runs the
    head module, so an adapter on it would be skipped: refused."""
    if loss is LossImpl.CHUNKED_LOGPROB:
        raise InputError(
            "lora.targets: TRL's fused LM head (loss chunked-logprob) reads lm_head.weight directly, so an adapter "
            "on the head would not run; leave the head out of lora.targets"
        )
    if loss is LossImpl.FUSED_LINEAR:
        raise InputError(
            "lora.targets: an adapter on the LM head needs the head to run; loss fused-linear reads its weight "
            "directly (Liger, CCE); use loss full or chunked, or leave the head out of lora.targets"
        )


def training_lora_head(ctx: TrainingContext, targets: frozenset[str], *, loss_chunks: float) -> LoraHead | None:
    """The head adapter of a training step whose ``targets`` name the head (None otherwise); the
    head runs chunk by chunk (``loss_chunks``) under a chunked loss. The final hidden state is
    fp32 under autocast on fp32 weights (QLoRA's k-bit preparation)."""
    if not targets & HEAD_NAMES:
        return None
    check_head_loss(ctx.loss)
    fp32_stream = ctx.autocast and kbit_prepared(ctx.workload, ctx.profile)
    return lora_head(
        hidden=ctx.spec.hidden_size,
        vocab=ctx.spec.vocab_size // ctx.workload.parallel.tp,
        rank=ctx.workload.lora.rank,
        logits_bytes=ctx.compute_bytes,
        input_bytes=4 if fp32_stream else ctx.compute_bytes,
        adapter_bytes=4 if ctx.profile.adapters_fp32 else ctx.compute_bytes,
        autocast=ctx.autocast,
        dropout=ctx.workload.lora.dropout > 0,
        chunks=loss_chunks if ctx.loss is LossImpl.CHUNKED else 1.0,
        input_grad=not only_the_head_trains(ctx, targets),
    )


def only_the_head_trains(ctx: TrainingContext, targets: frozenset[str]) -> bool:
    """Nothing before the LM head needs a gradient, so autograd records no decoder layer: ``freeze``, or
    LoRA on the head alone without recompute (with it, PEFT makes the embedding's output require a
    gradient), without a trained embedding. Checked against the simulator (``test_lora_head.py``)."""
    head_lora = ctx.method is Method.LORA and not targets - HEAD_NAMES and ctx.workload.recompute is Recompute.NONE
    return (ctx.method is Method.FREEZE or head_lora) and not EMBED_NAMES & set(ctx.workload.lora.modules_to_save)


def with_lora_head(logits: LogitsMemory, head: LoraHead, tokens: int) -> LogitsMemory:
    """``logits`` with the head adapter's branch: the forward peaks at the head or at the loss,
    the backward at the loss's gradient or at the head's, the loop's kept outputs beside both."""
    return replace(
        logits,
        forward_end=max(logits.forward_end, int(tokens * head.forward_peak)),
        backward_start=max(logits.backward_start, int(tokens * head.backward_peak) + logits.outputs),
        formula=f"{logits.formula}; {head.formula}",
    )


def with_head_script(script: LossScript, head: LoraHead, *, vocab: int, tokens: int) -> LossScript:
    """``script`` with the head adapter's vocabulary-sized requests (for the allocator replay):
    the head's output, the branch and the sum (cast back) in place of the logits' allocation,
    and after the loss's backward the branch's gradients (:func:`lora_head`). A chunked loss
    (the first request not the whole logits) is returned unchanged."""
    a, d, p = (size * vocab * tokens for size in head.dtypes)
    if not script.forward or script.forward[0] != ("+", "logits", a):
        return script
    forward: list[Step] = [("+", "head", a), ("+", "lora_b", d), ("+", "scaled", d), ("-", "lora_b", 0)]
    if p == a:
        forward += [("+", "logits", a), ("-", "scaled", 0), ("-", "head", 0)]
        backward: list[Step] = [("+", "dscaled", d), ("-", "dscaled", 0)]
    else:
        forward += [("+", "sum", p), ("-", "scaled", 0), ("-", "head", 0), ("+", "logits", a), ("-", "sum", 0)]
        # ToCopyBackward up-casts the logits' gradient; the engine casts it back for the base branch
        # when the head's input needs a gradient.
        cast_back: list[Step] = [("+", "dlogits", a)] if head.input_grad else []
        backward = [("+", "dsum", p), ("-", "dlogits", 0), *cast_back, ("+", "dscaled", d)]
        backward += [("-", "dscaled", 0), ("-", "dsum", 0)]
    return LossScript(forward=(*forward, *script.forward[1:]), backward=(*script.backward, *backward))
