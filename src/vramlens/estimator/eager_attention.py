"""Eager attention's short-lived score tensors: what one layer holds beyond what it keeps for backward.

Eager attention (transformers' ``eager_attention_forward``) writes the ``heads x s`` scores of every
query several times. Units: bytes per token (per query), the caller multiplies by tokens. Read from
the modeling code of transformers 5.x and checked with a tracked CPU training step
(``tests/estimator/test_eager_attention.py``):

* forward, standard families (Llama, Gemma, ...): ``scores = q @ k^T * scaling + mask`` stays
  referenced (the local ``attn_weights``) while ``softmax(..., dtype=float32)`` casts it to fp32
  and writes the fp32 probabilities, then ``.to(q.dtype)`` their kept bf16 copy (under autocast
  the fp32 mask already made the scores fp32);
* forward, gpt-oss (sinks): the masked scores, ``cat([scores, sinks])`` and ``logits - max`` are
  alive together before the softmax writes the kept probabilities: three tensors of the scores'
  dtype (fp32 under autocast, where the fp32 mask and sinks promote them) where the kept ones are
  one (plus their cast to the values' dtype under autocast);
* backward: the probabilities' gradient and the softmax's input gradient are alive together beside
  the kept probabilities (standard families: the fp32 up-cast of the bf16 gradient and the
  softmax's bf16 input gradient; gpt-oss: two tensors of the softmax's dtype).

The MLP's working set of the same layer is freed before attention runs (forward) or after it
(backward), so callers take the larger of the two.

:func:`eager_score_chain` writes the forward's score tensors one by one, in the order the code makes
and frees them, for the allocator replay (:mod:`vramlens.estimator.step_pattern`): a recomputed
layer's first forward runs without grad, so each is freed as soon as the next is made, and the
probabilities stay alive to the end of the layer (``eager_attention_forward`` returns them as
``attn_weights``, which the decoder layer holds until it returns).
"""

from __future__ import annotations

from typing import Final

from vramlens.estimator.loss_pattern import Step
from vramlens.estimator.saved_parts import FP32
from vramlens.model.spec import ModelSpec
from vramlens.resolve.styles import HfStyle

__all__ = ["EAGER_KEPT", "alive_bytes", "eager_score_chain", "eager_transients"]

#: The saved parts (:mod:`vramlens.estimator.activations`) that eager attention's score chain with grad
#: leaves alive for backward: the probabilities (with their fp32 softmax output where it is cast) and
#: Gemma 2's soft-cap tanh.
EAGER_KEPT: Final = ("attention probabilities", "attention soft-cap tanh")


def eager_transients(
    spec: ModelSpec, style: HfStyle, *, compute_bytes: int, autocast: bool, seq: int, tp: int = 1, kept: bool = True
) -> tuple[float, float]:
    """(forward, backward) bytes per token of eager attention's transient score tensors (see module doc).

    ``kept``: the layer keeps its probabilities for backward (no recompute), so the forward figure is
    what exceeds them; under full recompute nothing is kept and the forward figure is every score
    tensor alive at once.
    """
    a = compute_bytes
    scores = spec.num_heads // tp * seq
    masked = FP32 if autocast else a  # scores + mask: the fp32 mask promotes them under autocast
    if spec.attn.sinks:
        probabilities = masked + (a if masked != a else 0)
        # Forward: the masked scores, the concatenated and the max-subtracted logits; or the last two,
        # the probabilities and their cast to the values' dtype (locals are rebound only after it).
        # Backward: two gradients of the softmax's dtype; a bf16 cast of the probabilities is freed.
        peak, backward = max(3 * masked, 2 * masked + probabilities), 3 * masked - probabilities
    elif style.eager_softmax_fp32 and a != FP32:
        probabilities = FP32 + a
        # softmax(dtype=float32) casts bf16 scores to fp32 first: the masked scores, that cast and
        # the fp32 probabilities. Backward: the fp32 cast of the bf16 gradient and the softmax's
        # input gradient, less the bf16 probabilities freed by then.
        peak, backward = masked + FP32 + (FP32 if masked != FP32 else 0), FP32 + a
    else:
        probabilities = a
        peak, backward = masked + probabilities, 2 * a
    forward = peak - probabilities if kept else peak
    return forward * scores, backward * scores


def eager_score_chain(
    spec: ModelSpec,
    style: HfStyle,
    *,
    compute_bytes: int,
    autocast: bool,
    seq: int,
    tokens: int,
    tp: int = 1,
    grad: bool = False,
) -> tuple[Step, ...]:
    """Eager attention's score tensors of ``tokens`` queries, in code order (``("+", name, bytes)``
    makes one, ``("-", name, 0)`` frees it; the probabilities, ``probs``, are left alive). Read from
    transformers 5.x ``eager_attention_forward`` (Llama, Gemma 2, ...): ``matmul(q, k^T) * scaling``,
    Gemma 2's soft-cap ``/ cap``, ``tanh``, ``* cap``, ``+ mask`` (each a new tensor, the previous
    freed when the local is rebound), ``softmax(dtype=float32)`` (an fp32 up-cast of bf16 scores,
    then the fp32 output, the up-cast freed), ``.to(q.dtype)``. The same dtypes as
    :func:`eager_transients`, whose no-grad peak (masked scores, up-cast, fp32 output) the chain
    reaches. With ``grad`` autograd keeps the tanh's and the softmax's outputs (left alive too).
    Empty for gpt-oss's sinks (a chain of its own, not written here)."""
    if spec.attn.sinks:
        return ()
    a = compute_bytes
    n = spec.num_heads // tp * seq * tokens  # score elements
    masked = FP32 if autocast else a
    softmax = FP32 if style.eager_softmax_fp32 else masked
    steps: list[Step] = [("+", "scores", a * n), ("+", "scaled", a * n), ("-", "scores", 0)]
    last = "scaled"
    if spec.attn.logit_softcap:
        for name in ("divided", "tanh", "capped"):
            steps += [("+", name, a * n)] + ([] if grad and last == "tanh" else [("-", last, 0)])
            last = name
    steps += [("+", "masked", masked * n), ("-", last, 0)]
    output = "softmax" if softmax != a else "probs"  # .to(q.dtype) is a no-op when the dtypes agree
    if softmax != masked:
        steps += [("+", "upcast", softmax * n), ("+", output, softmax * n), ("-", "upcast", 0)]
    else:
        steps += [("+", output, softmax * n)]
    if softmax != a:
        steps += [("+", "probs", a * n)] + ([] if grad else [("-", "softmax", 0)])
    return (*steps, ("-", "masked", 0))


def alive_bytes(steps: tuple[Step, ...]) -> int:
    """Bytes a chain of steps leaves alive: what it makes and does not free."""
    alive: dict[str, int] = {}
    for op, name, nbytes in steps:
        if op == "+":
            alive[name] = nbytes
        else:
            alive.pop(name, None)
    return sum(alive.values())
