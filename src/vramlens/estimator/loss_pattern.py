"""The logits and loss tensors of a step, in the order the loss code allocates and frees them.

The same implementations and byte counts as :mod:`vramlens.estimator.logits` (which gives the
totals at the loss and at the start of backward), written as allocator requests so that the
caching-allocator replay (:mod:`vramlens.estimator.reserved`) sees the vocabulary-sized tensors
one by one: they are the largest requests of most fine-tuning steps, and a freed one that is too
small for the next is what leaves the allocator holding memory it cannot reuse.

A script is a list of ``("+", name, bytes)`` (allocate) and ``("-", name, 0)`` (free) steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.workload.options import LossImpl

__all__ = ["LossScript", "Step", "loss_script"]

Step = tuple[str, str, int]


@dataclass(frozen=True, kw_only=True, slots=True)
class LossScript:
    """Forward (head output to loss) and backward (loss to the head's input gradient)."""

    forward: tuple[Step, ...]
    backward: tuple[Step, ...]
    """Ends with the logits' gradient ``dlogits`` alive; the caller runs the head's backward and frees it."""


#: Chunks of a chunked loss written out one by one; more are merged into this many (same total bytes).
MAX_CHUNKS = 16


def loss_script(
    loss: LossImpl,
    *,
    tokens: int,
    vocab: int,
    hidden: int,
    logits_bytes: int,
    kept_bytes: int,
    chunks: float,
    compiled: bool,
    loss_parallel: bool,
    softcap: bool,
) -> LossScript:
    """The loss's requests for ``tokens`` tokens of ``vocab`` logits (``logits_bytes`` each);
    ``kept_bytes`` per logit are kept as the model's output through backward (0: none)."""
    a, v, t = logits_bytes, vocab, tokens
    if loss is LossImpl.FUSED_LINEAR:
        return _fused_linear(t, hidden, a)
    if loss is LossImpl.CHUNKED:
        return _chunked(t, v, a, kept_bytes, chunks)
    if loss_parallel:
        return _vocab_parallel(t, v, a, kept_bytes)
    if compiled:
        return _compiled(t, v, a, kept_bytes)
    return _full(t, v, a, kept_bytes, softcap=softcap)


def _kept(t: int, v: int, a: int, kept: int) -> list[Step]:
    """The model output the loop keeps: the logits themselves, or a converted copy (accelerate's fp32)."""
    if not kept:
        return [("-", "logits", 0)]
    if kept == a:
        return []
    return [("+", "output", kept * v * t), ("-", "logits", 0)]


def _full(t: int, v: int, a: int, kept: int, *, softcap: bool) -> LossScript:
    """transformers ``ForCausalLMLoss``: ``logits.float()``, log-softmax (kept), NLL; backward: the
    log-probabilities' gradient, the logits' fp32 gradient, its cast to the logits dtype. With
    soft-capping (``tanh(logits / cap) * cap``) the tanh output is kept and the capped logits
    replace the head's."""
    n = a * v * t
    forward: list[Step] = [("+", "logits", n)]
    if softcap:
        forward = [("+", "raw", n), ("+", "scaled", n), ("-", "raw", 0), ("+", "tanh", n), ("-", "scaled", 0)]
        forward += [("+", "logits", n)]
    if a != 4:
        forward += [("+", "upcast", 4 * v * t), ("+", "logp", 4 * v * t), ("-", "upcast", 0)]
    else:
        forward += [("+", "logp", 4 * v * t)]
    forward += _kept(t, v, a, kept)
    fp32_grad = "dfp32" if a != 4 else "dlogits"
    backward: list[Step] = [("+", "dlogp", 4 * v * t), ("+", fp32_grad, 4 * v * t), ("-", "dlogp", 0)]
    backward += [("-", "logp", 0)]
    if a != 4:
        backward += [("+", "dlogits", n), ("-", "dfp32", 0)]
    if softcap:
        backward += [("-", "tanh", 0)]
    return LossScript(forward=tuple(forward), backward=tuple(backward))


def _chunked(t: int, v: int, a: int, kept: int, chunks: float) -> LossScript:
    """torchtune / LitGPT: the logits exist in full; each chunk is up-cast, log-softmaxed (kept)
    and its up-cast freed; backward forms each chunk's two fp32 gradients, casts, then concatenates."""
    count = max(1, round(chunks))
    shown = min(count, MAX_CHUNKS)
    chunk = 4 * v * t // count * (count // shown)
    forward: list[Step] = [("+", "logits", a * v * t)]
    for i in range(shown):
        forward += [("+", f"up{i}", chunk), ("+", f"logp{i}", chunk), ("-", f"up{i}", 0)]
    forward += _kept(t, v, a, kept)
    backward: list[Step] = []
    for i in reversed(range(shown)):
        backward += [("+", f"g{i}", chunk), ("+", f"d{i}", chunk), ("-", f"g{i}", 0), ("-", f"logp{i}", 0)]
        backward += [("+", f"c{i}", chunk * a // 4), ("-", f"d{i}", 0)]
    backward += [("+", "dlogits", a * v * t)] + [("-", f"c{i}", 0) for i in range(shown)]
    return LossScript(forward=tuple(forward), backward=tuple(backward))


def _compiled(t: int, v: int, a: int, kept: int) -> LossScript:
    """Inductor-fused cross-entropy: one fp32 log-sum-exp per token (4 B/token, not carried past the
    forward here, as in :mod:`vramlens.estimator.logits`); backward writes the gradient in the logits
    dtype in one kernel."""
    forward: list[Step] = [("+", "logits", a * v * t), ("+", "lse", 4 * t), ("-", "lse", 0)]
    forward += [] if kept == a else _kept(t, v, a, kept)
    backward: list[Step] = [("+", "dlogits", a * v * t)]
    if kept == a:
        backward += [("-", "logits", 0)]
    return LossScript(forward=tuple(forward), backward=tuple(backward))


def _vocab_parallel(t: int, v: int, a: int, kept: int) -> LossScript:
    """DTensor ``loss_parallel``: the up-cast, shifted logits and their exponential in forward, one
    fp32 tensor kept; a zeroed gradient, the exponential, their sum and the product in backward."""
    n = 4 * v * t
    forward: list[Step] = [("+", "logits", a * v * t), ("+", "upcast", n), ("+", "shifted", n), ("+", "exp", n)]
    forward += [("-", "upcast", 0), ("-", "shifted", 0), *_kept(t, v, a, kept)]
    backward: list[Step] = [("+", "zero", n), ("+", "sum", n), ("+", "dfp32", n), ("-", "zero", 0), ("-", "sum", 0)]
    backward += [("-", "exp", 0), ("+", "dlogits", a * v * t), ("-", "dfp32", 0)]
    return LossScript(forward=tuple(forward), backward=tuple(backward))


def _fused_linear(t: int, h: int, a: int) -> LossScript:
    """Liger / CCE: a chunk's fp32 logits and gradient (about ``tokens x 8h`` bytes) and the input
    gradient, computed in the forward and kept."""
    forward: list[Step] = [("+", "dinput", a * h * t), ("+", "chunk", 8 * h * t), ("-", "chunk", 0)]
    backward: list[Step] = [("+", "dlogits", 0)]
    return LossScript(forward=tuple(forward), backward=tuple([*backward, ("-", "dinput", 0)]))
