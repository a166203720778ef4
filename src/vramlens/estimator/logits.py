"""Logits and loss memory: often the largest single tensors of a fine-tuning step.

Per token, with ``V`` the vocabulary on this rank and ``a`` the logits dtype bytes:

* ``full`` (transformers ``ForCausalLMLoss``, torchtitan): the head writes ``a*V``
  logits, ``logits.float()`` makes a ``4V`` copy, and ``log_softmax`` keeps its
  ``4V`` output for backward: ``(a+8)V`` at the loss. Backward starts with the
  ``4V`` gradient of the log-probabilities and the ``4V`` gradient of the logits
  next to the kept ``4V``: ``12V``, plus ``a*V`` when the model's output keeps the
  logits alive (transformers returns them in ``outputs.logits``).
* ``full`` under ``torch.compile`` (torchtitan compiles its loss with the model since
  2025-04, ``build_cross_entropy_loss``): Inductor fuses the up-cast, log-softmax and
  NLL into reductions that keep one fp32 log-sum-exp per token, and the backward into
  one kernel writing the gradient in the logits dtype: ``a*V`` at the loss and
  ``2a*V`` (logits and their gradient) at the start of backward.
* ``chunked`` (torchtune, LitGPT): bf16 logits ``a*V`` exist in full; the fp32
  up-cast (forward) and the two gradients (backward) exist one chunk at a time; the
  kept log-probabilities add up to ``4V``.
* vocabulary-parallel (torchtitan with TP, ``torch.distributed.tensor.parallel.loss_parallel``):
  DTensor's log-softmax keeps the shifted logits and their exponential beside the fp32
  input (``(a+12)V`` in forward), and its backward builds a zeroed gradient, the
  exponential, their sum and the product (``16V``).
* final logit soft-capping (Gemma 2, ``full`` loss): transformers writes
  ``logits = tanh(logits / cap) * cap`` as three ops; ``tanh`` keeps its ``a*V`` output
  for backward beside the capped logits, one more ``a*V`` from the loss to the start of
  backward (``Gemma2ForCausalLM.forward``, modeling_gemma2.py).
* ``fused-linear`` (Liger, Apple CCE): logits exist only for a chunk of about
  ``tokens * h / V`` tokens (Liger's chunk size), so per token about ``8h`` bytes of
  fp32 logits and gradient, plus the ``a*h`` input gradient computed in the forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from vramlens._records import maker
from vramlens.workload.options import LossImpl

__all__ = ["LogitsMemory", "logits_memory", "logits_per_tokens"]


@dataclass(frozen=True, kw_only=True, slots=True)
class LogitsMemory:
    """Logits/loss bytes at three instants of a step (whole micro-batch on this rank)."""

    forward_end: int
    """At the loss computation (highest point of the forward)."""
    kept: int
    """Between forward and backward (what the loss keeps, and kept model outputs)."""
    backward_start: int
    """While the loss gradient is formed (highest point at the start of backward)."""
    outputs: int
    """Model outputs the training loop holds through the whole backward pass (``outputs.logits``)."""
    formula: str


#: :class:`LogitsMemory` made as its ``__init__`` would, faster (one per estimate).
_logits = maker(LogitsMemory)


def logits_memory(
    loss: LossImpl,
    *,
    tokens: int,
    vocab: int,
    hidden: int,
    logits_bytes: int,
    keeps_logits: bool,
    chunks: float,
    kept_bytes: int | None = None,
    loss_parallel: bool = False,
    compiled: bool = False,
    softcap: bool = False,
) -> LogitsMemory:
    """Logits and loss memory for ``tokens`` tokens of ``vocab`` logits each.

    ``kept_bytes`` is the dtype of the logits the model output keeps (accelerate's
    mixed precision converts model outputs to fp32: 4), default the logits dtype.
    ``chunks`` is the tokens divided by the tokens of the largest chunk (not always an integer).
    ``softcap``: the model soft-caps its final logits (counted for the ``full`` loss).
    """
    per_tokens = logits_per_tokens(
        loss,
        vocab=vocab,
        hidden=hidden,
        logits_bytes=logits_bytes,
        keeps_logits=keeps_logits,
        chunks=chunks,
        kept_bytes=kept_bytes,
        loss_parallel=loss_parallel,
        compiled=compiled,
        softcap=softcap,
    )
    return per_tokens(tokens)


def logits_per_tokens(
    loss: LossImpl,
    *,
    vocab: int,
    hidden: int,
    logits_bytes: int,
    keeps_logits: bool,
    chunks: float,
    kept_bytes: int | None = None,
    loss_parallel: bool = False,
    compiled: bool = False,
    softcap: bool = False,
) -> Callable[[int], LogitsMemory]:
    """``tokens -> logits_memory(loss, tokens=tokens, ...)`` for these arguments: which loss path, and
    the bytes the model output keeps per token, worked out once (:func:`logits_memory`)."""
    kept_output = (kept_bytes or logits_bytes) * vocab if keeps_logits else 0
    if loss is LossImpl.FUSED_LINEAR:
        return lambda tokens: _fused_linear(tokens, hidden, logits_bytes)
    if loss is LossImpl.CHUNKED:
        return lambda tokens: _chunked(tokens, vocab, logits_bytes, kept_output, chunks)
    if loss_parallel:
        return lambda tokens: _vocab_parallel(tokens, vocab, logits_bytes, kept_output)
    if compiled:
        return lambda tokens: _compiled(tokens, vocab, logits_bytes, kept_output)
    return lambda tokens: _full(tokens, vocab, logits_bytes, kept_output, softcap=softcap)


def _fused_linear(tokens: int, hidden: int, a: int) -> LogitsMemory:
    chunk = 8 * hidden + a * hidden
    return _logits(
        forward_end=tokens * chunk,
        kept=tokens * a * hidden,
        backward_start=tokens * a * hidden,
        outputs=0,
        formula=f"fused linear cross-entropy: tokens x (8h + {a}h) = {tokens} x {chunk} B",
    )


def _chunked(tokens: int, v: int, a: int, kept_output: int, chunks: float) -> LogitsMemory:
    # Forward, at the last chunk: the logits, every chunk's kept log-probabilities and
    # this chunk's fp32 up-cast. Backward: the kept log-probabilities and one chunk's
    # two gradients (of the log-probabilities and of the up-cast logits).
    chunks = max(chunks, 1)
    return _logits(
        forward_end=int(tokens * (a * v + 4 * v + 4 * v / chunks)),
        kept=tokens * (4 * v + kept_output),
        backward_start=int(tokens * (4 * v + 8 * v / chunks + kept_output)),
        outputs=tokens * kept_output,
        formula=f"chunked cross-entropy ({chunks:g} chunks): forward tokens x ({a}V + 4V + 4V/{chunks:g}), V={v}",
    )


def _vocab_parallel(tokens: int, v: int, a: int, kept_output: int) -> LogitsMemory:
    return _logits(
        forward_end=tokens * (a + 12) * v,
        kept=tokens * (4 * v + kept_output),
        backward_start=tokens * (16 * v + kept_output),
        outputs=tokens * kept_output,
        formula=f"vocab-parallel cross-entropy (torch loss_parallel): forward tokens x ({a}+12)V, "
        f"backward tokens x 16V, V={v} per rank",
    )


def _compiled(tokens: int, v: int, a: int, kept_output: int) -> LogitsMemory:
    # A kept output in the logits dtype is the logits themselves; accelerate's fp32 copy is another tensor.
    extra = 0 if kept_output == a * v else kept_output
    return _logits(
        forward_end=tokens * (a * v + 4),
        kept=tokens * (a * v + extra),
        backward_start=tokens * (2 * a * v + extra),
        outputs=tokens * kept_output,
        formula=f"compiled cross-entropy: forward tokens x {a}V, backward start tokens x {2 * a}V "
        f"(logits and their gradient), V={v}",
    )


def _full(tokens: int, v: int, a: int, kept_output: int, *, softcap: bool) -> LogitsMemory:
    upcast = 0 if a == 4 else 4  # logits.float() is a no-op for fp32 logits
    tanh = a * v if softcap else 0  # the soft-cap's tanh output, kept for backward
    return _logits(
        forward_end=tokens * ((a + upcast + 4) * v + tanh),
        kept=tokens * (4 * v + kept_output + tanh),
        backward_start=tokens * (12 * v + kept_output + tanh),
        outputs=tokens * kept_output,
        formula=_full_formula(v, a, upcast, kept_output, softcap),
    )


@lru_cache(maxsize=256)
def _full_formula(v: int, a: int, upcast: int, kept_output: int, softcap: bool) -> str:
    """The full loss's formula (no token count in it: written once per model and dtypes)."""
    kept_text = f"+{kept_output // v}" if kept_output else ""
    cap_text = f" + {a}V soft-cap tanh" if softcap else ""
    return f"full logits: forward tokens x ({a}+{upcast}+4)V, backward start tokens x (12{kept_text})V{cap_text}, V={v}"
