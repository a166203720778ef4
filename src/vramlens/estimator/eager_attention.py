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
"""

from __future__ import annotations

from vramlens.estimator.saved_parts import FP32
from vramlens.model.spec import ModelSpec
from vramlens.resolve.styles import HfStyle

__all__ = ["eager_transients"]


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
