"""Activations and buffers outside the decoder layers that depend on whose modules build them.

* The final norm (on the last stage) keeps its fp32 input and rsqrt per token, and, when it
  trains, its normalized output: in the residual stream's dtype for transformers' RMSNorm (fp32
  under autocast over fp32 weights, :func:`vramlens.estimator.final_norm.stream_bytes`), in fp32 for
  torchtune's (``F.rms_norm`` on ``x.float()`` with a bf16 scale takes ATen's composite path;
  :attr:`vramlens.resolve.styles.NormStyle.TORCHTUNE`).
* Under ``kernels: liger`` the final norm is ``LigerRMSNorm``: its input (the residual stream's
  dtype) and one fp32 rstd per token (:mod:`vramlens.resolve.kernels`).
* Rotary tables: transformers computes one (cos, sin) pair per forward in the residual stream's dtype
  (``2 x head_dim`` elements per token, first stage); torchtune's ``RotaryPositionalEmbeddings``
  holds one fp32 ``rope_cache`` buffer of ``max_seq_len x head_dim`` elements for the whole run
  (torchtune/modules/position_embeddings.py; the builders pass the model's max positions).

Units: bytes per token, or bytes for the buffer.
"""

from __future__ import annotations

from vramlens.estimator.final_norm import stream_bytes
from vramlens.resolve.context import TrainingContext
from vramlens.resolve.frameworks import layer_style
from vramlens.resolve.kbit import kbit_prepared
from vramlens.resolve.kernels import liger_layers
from vramlens.resolve.styles import HfStyle, NormStyle

__all__ = ["final_norm_per_token", "rotary_per_token", "rotary_buffer_bytes"]

FP32 = 4


def _style(ctx: TrainingContext) -> HfStyle | None:
    """The layer style of a native family under the workload's framework; None for a family
    described from its transformers code (a traced recipe), whose modules are transformers'."""
    return None if ctx.spec.generic is not None else layer_style(ctx.spec.model_type, ctx.profile)


def final_norm_per_token(ctx: TrainingContext) -> float:
    """Bytes per token the final norm keeps for backward (before tensor parallelism divides it)."""
    h, a = ctx.spec.hidden_size, ctx.compute_bytes
    if liger_layers(ctx.workload.kernels):  # LigerRMSNorm: its input (the residual stream) and fp32 rstd
        residual = FP32 if ctx.autocast and (ctx.full or kbit_prepared(ctx.workload, ctx.profile)) else a
        return residual * h + FP32
    style = _style(ctx)
    if style is not None and style.norm == NormStyle.TORCHTUNE:
        return FP32 * h + FP32 + (FP32 * h if ctx.full and a != FP32 else 0)
    # LlamaRMSNorm's ``weight * normalized.to(input_dtype)`` keeps the normalized tensor in the stream's dtype.
    normalized = stream_bytes(ctx) if style is None or style.norm == NormStyle.RMS else a
    return FP32 * h + FP32 + (normalized * h if ctx.full else 0)


def rotary_per_token(ctx: TrainingContext) -> float:
    """Bytes per token of the per-forward rotary (cos, sin) tables, in the residual stream's dtype
    (``cos.to(dtype=x.dtype)`` with ``x`` the embedding's output: fp32 under autocast over fp32
    weights); 0 where the table is a buffer."""
    style = _style(ctx)
    if style is not None and style.rope_buffer:
        return 0.0
    return 2 * stream_bytes(ctx) * ctx.spec.head_dim


#: torchtune rotary tables whose rows are ``[cos, sin]`` of the doubled frequencies, ``2 x head_dim``
#: elements per position (``Qwen2RotaryPositionalEmbeddings``, ``Phi3RotaryPositionalEmbeddings``:
#: ``torch.cat([freqs.cos(), freqs.sin()], dim=-1)``); every other family's table is ``[max_seq_len,
#: head_dim // 2, 2]``, ``head_dim`` elements (``RotaryPositionalEmbeddings``, ``Llama3ScaledRoPE``).
_DOUBLE_WIDTH_TABLES = frozenset({"qwen2", "phi3"})


def _one_table_in_lora(ctx: TrainingContext) -> bool:
    """torchtune's LoRA builders build one rotary table per layer (``lora_<family>_self_attention``
    constructs its own: llama2, llama3, mistral, gemma, gemma2, qwen2, phi3) except Llama 3.1 and
    later (``lora_llama3_1`` / ``lora_llama3_2`` build one and pass it to every layer), which the
    config marks with ``rope_scaling.rope_type: llama3`` (torchtune 0.6.1 ``models/*/_component_builders.py``)."""
    scaling = (ctx.spec.config or {}).get("rope_scaling")
    kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
    return ctx.spec.model_type == "llama" and kind == "llama3"


def rotary_buffer_bytes(ctx: TrainingContext) -> int:
    """Bytes of the rotary buffers held for the whole run (torchtune's fp32 rope caches, sized for
    the model's max positions as its builders' ``max_seq_len``); else 0."""
    style = _style(ctx)
    if style is None or not style.rope_buffer:
        return 0
    width = (2 if ctx.spec.model_type in _DOUBLE_WIDTH_TABLES else 1) * ctx.spec.head_dim
    tables = 1 if ctx.full or _one_table_in_lora(ctx) else ctx.spec.num_layers
    return FP32 * ctx.spec.max_position_embeddings * width * tables
