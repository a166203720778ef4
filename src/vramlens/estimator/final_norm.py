"""The final norm's own instants in a training step: transformers' ``LlamaRMSNorm`` between the last
decoder layer and the LM head (:attr:`vramlens.resolve.styles.NormStyle.RMS`, eager ops).

Its saved tensors (the fp32 input, the rsqrt per token, the normalized tensor) are the head side of
:func:`vramlens.estimator.outside_layers.final_norm_per_token`. Besides those, tracked CPU runs of
the tiny Llama's training step (bf16 and mixed-bf16, a 64-token vocabulary so that the layers, not
the logits, set the peak; tests/estimator/test_training_hf.py) show three instants of its own:

* its forward: ``hidden.to(float32)``, ``pow(2).mean(-1)``, ``rsqrt``, ``hidden * rsqrt`` and
  ``weight * normalized.to(input_dtype)`` (transformers' modeling_llama.py ``LlamaRMSNorm.forward``),
  its high point the output (:func:`norm_forward_high`);
* the loss: the norm's output is the causal-LM forward's ``hidden_states`` (``outputs.last_hidden_state``)
  until it returns; when the head casts it (autocast over fp32 weights) the head keeps its bf16 copy
  and the fp32 output is another tensor;
* its backward, the first after the head's: autograd's formulas for those ops (``mul``, ``rsqrt``,
  ``mean`` as ``grad.expand() / h``, ``pow`` as ``grad * 2 * x``) make fp32 tensors of the hidden
  width one after the other, five alive at its high point beside the saved fp32 input and rsqrt
  whatever the stream's dtype (the incoming gradient is cast to fp32 first).

Units: bytes per token, before tensor parallelism (the caller divides them as the final norm's).
Other norms (LayerNorm's fused kernel, Liger's, torchtune's, a traced family's) are not written
here: their amounts are 0 and the step's other instants stand.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlens.estimator.saved_parts import FP32, STAT
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.kbit import kbit_prepared
from vramlens.resolve.kernels import liger_layers
from vramlens.resolve.styles import NormStyle, hf_style

__all__ = [
    "FinalNormPerToken",
    "final_norm_amounts",
    "norm_backward_high",
    "norm_forward_high",
    "output_held_at_loss",
    "stream_bytes",
]

#: fp32 tensors of the hidden width alive at once inside the RMSNorm's backward (tracked runs).
BACKWARD_FP32_TENSORS = 5


@dataclass(frozen=True, slots=True)
class FinalNormPerToken:
    """The final norm's instants, bytes per token (see the module docstring)."""

    forward: float = 0.0
    """Inside its forward: the last layer's output, its saved tensors and its intermediates (and the
    embedding's output where no norm keeps it, :func:`norm_forward_high`)."""
    held_at_loss: float = 0.0
    """At the loss, beyond the head side: the norm's output that the model's forward still holds."""
    backward: float = 0.0
    """Inside its backward: its saved fp32 input and rsqrt, and the gradients it makes."""


def stream_bytes(ctx: TrainingContext) -> int:
    """Bytes per element of the residual stream: fp32 under autocast over fp32 weights (the embedding's
    output is fp32 and every residual add keeps it so), else the compute dtype. The same rule as the
    layers' (:func:`vramlens.estimator.activations.layer_saved_parts`)."""
    fp32 = ctx.autocast and (ctx.full or kbit_prepared(ctx.workload, ctx.profile))
    return FP32 if fp32 else ctx.compute_bytes


def norm_forward_high(h: int, stream: int) -> float:
    """The high point of ``LlamaRMSNorm.forward`` on a stream of ``stream`` bytes per element, bytes
    per token, at its output: the input, its fp32 copy (none on an fp32 stream), mean and rsqrt, the
    fp32 normalized tensor (the local ``hidden_states`` holds it to the return), its cast back to the
    stream's dtype and the output. On a stream that is not fp32 the embedding's output is there too:
    ``LlamaModel.forward`` holds ``inputs_embeds`` until it returns, and the first layer's norm kept
    an fp32 copy of it, not it (on an fp32 stream that norm keeps it: a saved activation)."""
    if stream == FP32:
        return FP32 * h + 2 * STAT + 2 * FP32 * h
    embedding = stream * h
    return embedding + stream * h + FP32 * h + 2 * STAT + FP32 * h + 2 * stream * h


def output_held_at_loss(h: int, stream: int, compute: int) -> float:
    """The final norm's output alive at the loss beside the head's saved input, bytes per token: the
    fp32 output when the head casts it to the compute dtype (autocast over an fp32 stream), else none
    (the head keeps the output itself)."""
    return float(FP32 * h) if stream == FP32 and compute != FP32 else 0.0


def norm_backward_high(h: int) -> float:
    """The high point of the RMSNorm's backward, bytes per token: its saved fp32 input and rsqrt and
    :data:`BACKWARD_FP32_TENSORS` fp32 gradients of the hidden width (the normalized tensor and the
    head's input are freed by then)."""
    return FP32 * h + STAT + BACKWARD_FP32_TENSORS * FP32 * h


def final_norm_amounts(ctx: TrainingContext) -> FinalNormPerToken:
    """The final norm's instants for ``ctx`` on one rank (a full fine-tune with transformers'
    ``LlamaRMSNorm``; zeros for anything else), divided by tensor parallelism as the final norm's
    saved tensors are (sequence-parallel)."""
    own = ctx.profile.own_modules is not None  # torchtune's, LitGPT's norms
    if not ctx.full or own or ctx.spec.generic is not None or liger_layers(ctx.workload.kernels):
        return FinalNormPerToken()
    if hf_style(ctx.spec.model_type).norm != NormStyle.RMS:
        return FinalNormPerToken()
    h, stream, tp = ctx.spec.hidden_size, stream_bytes(ctx), ctx.workload.parallel.tp
    return FinalNormPerToken(
        forward=norm_forward_high(h, stream) / tp,
        held_at_loss=output_held_at_loss(h, stream, ctx.compute_bytes) / tp,
        backward=norm_backward_high(h) / tp,
    )
